"""The phantom cases of each benchmark task, written in the real dataset layouts.

Every task draws its cases from one generator (a clean phantom, or a degraded one for the
short image tasks) and writes them in the layout a real study of that kind would come in,
so the layout readers run on every bench. Where a task accepts two organs (denoise,
superres) the cases alternate between them.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..contracts import Case, ErrorCode, ToolError
from ..datasets.layouts import get_layout
from ..datasets.phantom import Phantom, Size

log = logging.getLogger(__name__)


def _brain(cid: str, seed: int, size: Size, i: int) -> Phantom:
    from ..datasets.brain import make_brain

    grade, side = [("HGG", "left"), ("LGG", "right"), ("HGG", "right"), ("LGG", "left")][i % 4]
    return make_brain(cid, seed, size, grade=grade, side=side)


def _cardiac(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.cardiac import make_cardiac

    # every third case is borderline (EF or volumes near an ACDC threshold), so group
    # accuracy measures the measurements rather than being 1.0 by construction
    return make_cardiac(cid, seed, size, group=("NOR", "DCM", "HCM", "MINF", "RV")[i % 5], borderline=i % 3 == 2,
                        **fam)


def _prostate(cid: str, seed: int, size: Size, i: int) -> Phantom:
    from ..datasets.prostate import make_prostate

    return make_prostate(cid, seed, size, n_lesions=(1, 2, 0)[i % 3])


def _kspace(cid: str, seed: int, size: Size, i: int) -> Phantom:
    from ..datasets.kspace import make_kspace_case

    return make_kspace_case(cid, seed, size, domain="cardiac", frames="ed")


def _kspace_any(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.kspace import make_kspace_case

    # brain, prostate and cardiac k-space; every other file has fastMRI's 2x readout
    # oversampling (and some phase oversampling), so the recon matrix differs from the k-space's
    domain = ("brain", "prostate", "cardiac")[i % 3]
    over = i % 2 == 0
    return make_kspace_case(cid, seed, size, domain=domain, frames="ed", readout_oversampling=2.0 if over else 1.0,
                            phase_oversampling=1.14 if over else 1.0, **fam)


def _denoise(cid: str, seed: int, size: Size, i: int) -> Phantom:
    from ..datasets.degraded import make_denoise_case

    return make_denoise_case(cid, seed, size, domain=("brain", "prostate")[i % 2])


def _superres(cid: str, seed: int, size: Size, i: int) -> Phantom:
    from ..datasets.degraded import make_superres_case

    return make_superres_case(cid, seed, size, domain=("brain", "prostate")[i % 2])


@dataclass(frozen=True)
class TaskData:
    """How the cases of one task are made: generator and layout per case index."""

    make: Callable[[str, int, Size, int], Phantom]
    layouts: tuple[str, ...]
    prefix: str
    extra: dict[str, Any] = field(default_factory=dict)

    def layout(self, i: int) -> str:
        return self.layouts[i % len(self.layouts)]


TASK_DATA: dict[str, TaskData] = {
    # denoise/superres alternate brain and prostate; a thick-slice brain keeps its label maps on
    # the fine grid, which only the DICOM layout stores apart from the series
    "denoise": TaskData(_denoise, ("brats", "bids"), "dn"),
    "superres": TaskData(_superres, ("dicom", "bids"), "sr"),
    "register_prostate": TaskData(_prostate, ("bids",), "rp"),
    "segment_brain": TaskData(_brain, ("brats",), "sb"),
    "recon_cardiac": TaskData(_kspace, ("fastmri",), "rc"),
    "recon": TaskData(_kspace_any, ("fastmri",), "rk"),
    "brain_grade": TaskData(_brain, ("brats",), "bg"),
    "prostate_report": TaskData(_prostate, ("bids",), "pr"),
    "cardiac_report": TaskData(_cardiac, ("acdc",), "cr"),
    "brain_report": TaskData(_brain, ("brats",), "br"),
}


def case_seeds(task: str, n: int, seed: int) -> list[int]:
    """Per-case seeds of a task: deterministic from (task, seed), different across tasks."""
    salt = sum(task.encode())
    return [int(s) % 100_000 for s in np.random.SeedSequence([seed, salt]).generate_state(n)]


def synth_task_cases(task: str, n: int, out: str | Path, size: Size = "small", seed: int = 0) -> list[Case]:
    """Write ``n`` phantom cases for ``task`` under ``out`` and read them back as Cases.

    Raises:
        ToolError: ``value_range`` for an unknown task.
    """
    if task not in TASK_DATA:
        raise ToolError(ErrorCode.value_range, f"no bench data for task {task!r}", arg="task",
                        hint=f"known: {sorted(TASK_DATA)}")
    spec = TASK_DATA[task]
    out = Path(out)
    seeds = case_seeds(task, n, seed)
    cases: dict[str, Case] = {}
    for layout in dict.fromkeys(spec.layout(i) for i in range(n)):
        idx = [i for i in range(n) if spec.layout(i) == layout]
        # a generator, so a full-size cohort is never held in memory at once
        phantoms = (spec.make(f"{spec.prefix}{i:03d}", seeds[i], size, i) for i in idx)
        for c in get_layout(layout).write(phantoms, out / layout):
            cases.setdefault(c.id, c)
    got = cases
    log.info("task %s: %d %s cases in %s", task, len(got), size, out)
    return list(got.values())


__all__ = ["TASK_DATA", "TaskData", "case_seeds", "synth_task_cases"]
