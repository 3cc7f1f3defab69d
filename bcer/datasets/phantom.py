"""The in-memory phantom every generator returns, and shared phantom helpers.

A ``Phantom`` holds artifacts (arrays + affines) with canonical sequence names (see
``bcer.contracts.sequences``); layout writers turn it into files, adapters read files back
into ``Case`` objects. ``truth`` is JSON-able ground truth (volumes, grade, ED/ES, EF,
lesions...); ``labels`` holds ground-truth label maps as ``Mask`` artifacts;
``references`` holds clean reference images (denoise/super-resolution/recon truth).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, MutableMapping

import numpy as np

from ..contracts.artifacts import Mask

Size = Literal["small", "full"]


@dataclass
class Phantom:
    case_id: str
    domain: str  # brain | cardiac | prostate
    sequences: dict[str, Any]  # canonical name -> Image | Cine | KSpace
    labels: dict[str, Mask] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    truth: dict[str, Any] = field(default_factory=dict)
    references: dict[str, Any] = field(default_factory=dict)  # clean/fully-sampled truth images


@contextmanager
def swapped(table: MutableMapping[str, Any], key: str, value: Any) -> Iterator[Any]:
    """``table[key] = value`` while the block runs, the old entry restored afterwards even on
    error: the body of each generator's ``family_ranges`` (cardiac, prostate)."""
    before = table[key]
    table[key] = value
    try:
        yield value
    finally:
        table[key] = before

