"""Sequence names for layouts that name channels freely (flat folders, nnU-Net/MSD):
the alias table, the domain the sequences point to, and T2 vs T2w by domain.

``T2`` (brain) and ``T2w`` (prostate) are one contrast under two conventions; datasets write
either (MSD brain says "T2w", MSD prostate says "T2"), so the name follows the domain.
"""
from __future__ import annotations

import re
from typing import Mapping, TypeVar

from ...contracts.sequences import CANONICAL, canonical_sequence

V = TypeVar("V")
LABEL_WORDS = frozenset({"seg", "label", "labels", "mask", "gt", "dseg", "truth"})
_DOMAIN_WORDS = {"brain": ("brain", "glioma", "brats", "tumour", "tumor"), "prostate": ("prostate",),
                 "cardiac": ("heart", "cardiac", "acdc", "ventric")}


def sequence_name(raw: str) -> str | None:
    """Canonical sequence for a free channel/file name (``t1ce``, ``T1w``, ``FLAIR``), or None."""
    return canonical_sequence(raw)


def is_label_word(raw: str) -> bool:
    return str(raw).strip().lower() in LABEL_WORDS


def domain_of(names: set[str], hint_text: str = "") -> str:
    """brain | prostate | cardiac | unknown, from the sequences (then from free text such as
    a dataset name)."""
    if names & {"FLAIR", "T1c"}:
        return "brain"
    if names & {"ADC", "DWI"}:
        return "prostate"
    if "CINE" in names:
        return "cardiac"
    if "T1" in names:
        return "brain"
    text = hint_text.lower()
    hits = [d for d, words in _DOMAIN_WORDS.items() if any(re.search(rf"{w}", text) for w in words)]
    return hits[0] if len(hits) == 1 else "unknown"


def settle_t2(seqs: Mapping[str, V], domain: str) -> dict[str, V]:
    """``seqs`` with T2/T2w named as the domain names it (T2 for brain, T2w otherwise);
    unchanged when both are present."""
    out = dict(seqs)
    if "T2" in out and "T2w" in out:
        return out
    if domain == "brain" and "T2w" in out:
        out["T2"] = out.pop("T2w")
    elif domain in ("prostate", "cardiac") and "T2" in out:
        out["T2w"] = out.pop("T2")
    return out


def known_sequences() -> list[str]:
    return list(CANONICAL)


__all__ = ["LABEL_WORDS", "domain_of", "is_label_word", "known_sequences", "sequence_name", "settle_t2"]
