"""Synthesise phantom cohorts in a dataset layout, and inspect any dataset from its headers.

These back ``bcer data synth`` and ``bcer data inspect``; the generators come from the one table
in ``generators``.
"""
from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..contracts.case import Case, SequenceRef
from ..contracts.errors import ErrorCode, ToolError, did_you_mean
from ..io import sequence_header
from .generators import GENERATORS, family_kwargs, get_generator
from .layouts import detect_layout, get_layout, read_layout
from .phantom import Phantom, Size

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_LAYOUT", "cohort_plan", "iter_cohort", "synth_cohort", "inspect_dataset"]

DEFAULT_LAYOUT: dict[str, str] = {"brain": "brats", "cardiac": "acdc", "prostate": "bids"}
# raw-data layouts hold multi-coil k-space: their phantoms come from make_kspace_case
# (fastMRI files have no time axis, so cine k-space is cut to the ED frame there)
KSPACE_LAYOUTS: dict[str, dict[str, Any]] = {"fastmri": {"frames": "ed"}, "cmrx": {}}

# The case attribute balanced across a cohort (unless the caller fixes it), per domain.
_BALANCE: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]] = {
    "brain": (("grade", "side"), list(itertools.product(("HGG", "LGG"), ("left", "right")))),
    "cardiac": (("group",), [(g,) for g in ("NOR", "DCM", "HCM", "MINF", "RV")]),
    "prostate": (("n_lesions",), [(0,), (1,), (2,)]),
}


def cohort_plan(domain: str, n: int, seed: int = 0, **kw: Any) -> list[dict[str, Any]]:
    """Case ids, seeds and generator arguments of a cohort, without generating anything.

    Case ids are ``<domain>-s<seed>-<index>``; per-case seeds derive from ``seed``. The
    balanced attribute (brain grade x side, cardiac group, prostate lesion count) cycles
    through its values in a seed-shuffled order, so any ``n`` is as balanced as it can be;
    an attribute given in ``kw`` is used for every case instead.
    """
    if n < 1:
        raise ToolError(ErrorCode.value_range, f"cohort size must be >= 1, got {n}", arg="n")
    if domain not in GENERATORS:
        raise ToolError(ErrorCode.value_range, f"unknown phantom domain {domain!r}",
                        hint=did_you_mean(domain, GENERATORS), arg="domain")
    keys, combos = _BALANCE.get(domain, ((), [()]))
    rng = np.random.default_rng([seed, 0x5EED])
    order = [combos[i] for i in rng.permutation(len(combos))]
    seeds = np.random.SeedSequence(seed).generate_state(n, dtype=np.uint32)
    plan = []
    for i in range(n):
        balanced = {k: v for k, v in zip(keys, order[i % len(order)]) if k not in kw}
        plan.append({"case_id": f"{domain}-s{seed}-{i:03d}", "seed": int(seeds[i]),
                     "kwargs": {**balanced, **kw}})
    return plan


def iter_cohort(domain: str, n: int, seed: int = 0, size: Size = "small", kspace: dict[str, Any] | None = None,
                family: str = "base", **kw: Any) -> Iterator[Phantom]:
    """Phantoms of a cohort, one at a time (so a full-size cohort never sits in memory).

    ``kspace`` (options of ``make_kspace_case``, e.g. ``{"R": 8}``) turns every phantom into
    multi-coil k-space with its fully sampled image as reference. ``family`` selects the
    phantom family (see ``generators.FAMILIES``); checked before the first case is made.
    """
    gen = get_generator(domain)
    if kspace is not None:
        from .kspace import make_kspace_case

        def gen(case_id, seed_, size_, **kwargs):  # noqa: F811 - the k-space variant
            return make_kspace_case(case_id, seed_, size_, domain=domain, **kspace, **kwargs)
        fam = family_kwargs(make_kspace_case, family, f"the {domain} k-space generator")
    else:
        fam = family_kwargs(gen, family, f"the {domain} generator")
    for item in cohort_plan(domain, n, seed, **kw):
        yield gen(item["case_id"], item["seed"], size, **fam, **item["kwargs"])


def synth_cohort(domain: str, n: int, out: str | Path, layout: str | None = None, seed: int = 0,
                 size: Size = "small", family: str = "base", **kw: Any) -> list[Case]:
    """Generate ``n`` phantoms of ``domain`` and write them under ``out`` in ``layout``.

    Args:
        domain: brain | cardiac | prostate.
        n: number of cases.
        out: dataset root to write (created if needed).
        layout: layout module name; ``DEFAULT_LAYOUT[domain]`` when None.
        seed: cohort seed (case ids and phantoms are deterministic from it).
        size: "small" (tests) or "full" (realistic).
        family: phantom family, "base" | "randomised" | "heldout" (``FAMILIES``).
        **kw: extra generator arguments (e.g. ``noise=0.03``, ``misalign=True``).

    Returns:
        The written cases as read back by the layout's reader.
    """
    name = layout or DEFAULT_LAYOUT.get(domain)
    if name is None:
        raise ToolError(ErrorCode.value_range, f"no default layout for domain {domain!r}",
                        hint=did_you_mean(domain, DEFAULT_LAYOUT), arg="domain")
    mod = get_layout(name)
    out = Path(out)
    log.info("synthesising %d %s cases (%s, %s family, seed %d) into %s as %s", n, domain, size, family, seed,
             out, name)
    kspace = KSPACE_LAYOUTS.get(name)
    phantoms = iter_cohort(domain, n, seed, size, kspace=kspace, family=family, **kw)
    first = next(phantoms)  # a family the generator lacks fails here, before the layout writes anything
    return mod.write(itertools.chain([first], phantoms), out)


def _describe_ref(ref: SequenceRef) -> dict[str, Any]:
    h = sequence_header(ref)
    return {"path": ref.path, "format": ref.format, "kind": ref.kind.value, "shape": list(h["shape"]),
            "spacing": [round(float(s), 4) for s in h["spacing"]], "orientation": h["orientation"],
            "dtype": h["dtype"]}


def inspect_dataset(root: str | Path, layout: str | None = None,
                    seq: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """One dict per case: sequences with shape/spacing/orientation (from headers only),
    metadata, and which ground truth is available (value keys, label maps, references).
    ``seq`` maps sequences to file patterns (flat) or channels (nnunet)."""
    root = Path(root)
    name = layout or detect_layout(root, seq)
    rows = []
    for case in read_layout(name, root, seq):
        gt = case.ground_truth or {}
        rows.append({
            "case": case.id, "layout": name, "domain": case.domain, "root": case.root,
            "sequences": {s: _describe_ref(r) for s, r in case.sequences.items()},
            "metadata": case.metadata,
            "ground_truth": {"values": sorted(gt.get("values", {})),
                             "labels": sorted(gt.get("labels", {})),
                             "references": sorted(gt.get("references", {}))} if gt else None,
        })
    return rows
