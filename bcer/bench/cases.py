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


def _brain(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.brain import make_brain

    grade, side = [("HGG", "left"), ("LGG", "right"), ("HGG", "right"), ("LGG", "left")][i % 4]
    return make_brain(cid, seed, size, grade=grade, side=side, **fam)


def _cardiac(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.cardiac import make_cardiac

    # every third case is borderline (EF or volumes near an ACDC threshold), so group
    # accuracy measures the measurements rather than being 1.0 by construction
    return make_cardiac(cid, seed, size, group=("NOR", "DCM", "HCM", "MINF", "RV")[i % 5], borderline=i % 3 == 2,
                        **fam)


def _prostate(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.prostate import make_prostate

    # every third case (two lesions) has a borderline first lesion: ADC near 850, size near
    # 15 mm, TZ T2 ratio near 0.6, or a lesion at the detection limit, so that PI-RADS and
    # detection are not right by construction
    return make_prostate(cid, seed, size, n_lesions=(1, 2, 0)[i % 3], borderline=i % 3 == 1, **fam)


def _kspace(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.kspace import make_kspace_case

    return make_kspace_case(cid, seed, size, domain="cardiac", frames="ed", **fam)


def _kspace_any(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.kspace import make_kspace_case

    # brain, prostate and cardiac k-space; every other file has fastMRI's 2x readout
    # oversampling (and some phase oversampling), so the recon matrix differs from the k-space's
    domain = ("brain", "prostate", "cardiac")[i % 3]
    over = i % 2 == 0
    return make_kspace_case(cid, seed, size, domain=domain, frames="ed", readout_oversampling=2.0 if over else 1.0,
                            phase_oversampling=1.14 if over else 1.0, **fam)


def _denoise(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.degraded import make_denoise_case

    return make_denoise_case(cid, seed, size, domain=("brain", "prostate")[i % 2], **fam)


def _superres(cid: str, seed: int, size: Size, i: int, **fam: Any) -> Phantom:
    from ..datasets.degraded import make_superres_case

    return make_superres_case(cid, seed, size, domain=("brain", "prostate")[i % 2], **fam)


@dataclass(frozen=True)
class TaskData:
    """How the cases of one task are made: generator and layout per case index.

    ``generator`` names the function ``make`` calls ("module:function"): a phantom family other
    than "base" is offered when that function takes ``family``. ``family_layouts`` replaces
    ``layouts`` for those families (prostate: DICOM series, as the scanner exports them)."""

    make: Callable[..., Phantom]
    layouts: tuple[str, ...]
    prefix: str
    generator: str
    family_layouts: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def layout(self, i: int, family: str = "base") -> str:
        names = self.family_layouts if family != "base" and self.family_layouts else self.layouts
        return names[i % len(names)]


_GEN = {"brain": "bcer.datasets.brain:make_brain", "cardiac": "bcer.datasets.cardiac:make_cardiac",
        "prostate": "bcer.datasets.prostate:make_prostate", "kspace": "bcer.datasets.kspace:make_kspace_case",
        "denoise": "bcer.datasets.degraded:make_denoise_case", "superres": "bcer.datasets.degraded:make_superres_case"}

TASK_DATA: dict[str, TaskData] = {
    # denoise/superres alternate brain and prostate; a thick-slice brain keeps its label maps on
    # the fine grid, which only the DICOM layout stores apart from the series
    "denoise": TaskData(_denoise, ("brats", "bids"), "dn", _GEN["denoise"]),
    "superres": TaskData(_superres, ("dicom", "bids"), "sr", _GEN["superres"]),
    "register_prostate": TaskData(_prostate, ("bids",), "rp", _GEN["prostate"], ("dicom",)),
    "segment_brain": TaskData(_brain, ("brats",), "sb", _GEN["brain"]),
    "recon_cardiac": TaskData(_kspace, ("fastmri",), "rc", _GEN["kspace"]),
    "recon": TaskData(_kspace_any, ("fastmri",), "rk", _GEN["kspace"]),
    "brain_grade": TaskData(_brain, ("brats",), "bg", _GEN["brain"]),
    "prostate_report": TaskData(_prostate, ("bids",), "pr", _GEN["prostate"], ("dicom",)),
    "cardiac_report": TaskData(_cardiac, ("acdc",), "cr", _GEN["cardiac"]),
    "brain_report": TaskData(_brain, ("brats",), "br", _GEN["brain"]),
}


def family_options(task: str, family: str) -> dict[str, Any]:
    """Keyword arguments that select ``family`` for ``task``'s generator (``{}`` for base).

    Raises:
        ToolError: ``value_range`` for an unknown task or family, or a family the task's
            generator does not offer.
    """
    import importlib

    from ..datasets.generators import family_kwargs

    if task not in TASK_DATA:
        raise ToolError(ErrorCode.value_range, f"no bench data for task {task!r}", arg="task",
                        hint=f"known: {sorted(TASK_DATA)}")
    module, func = TASK_DATA[task].generator.split(":")
    return family_kwargs(getattr(importlib.import_module(module), func), family, f"task {task!r} ({func})")


def supports_family(task: str, family: str) -> bool:
    """Whether ``task``'s phantom generator offers ``family``."""
    try:
        family_options(task, family)
    except ToolError:
        return False
    return True


def case_seeds(task: str, n: int, seed: int) -> list[int]:
    """Per-case seeds of a task: deterministic from (task, seed), different across tasks."""
    salt = sum(task.encode())
    return [int(s) % 100_000 for s in np.random.SeedSequence([seed, salt]).generate_state(n)]


def synth_task_cases(task: str, n: int, out: str | Path, size: Size = "small", seed: int = 0,
                     family: str = "base") -> list[Case]:
    """Write ``n`` phantom cases of ``family`` for ``task`` under ``out`` and read them back.

    Raises:
        ToolError: ``value_range`` for an unknown task, or a family its generator lacks.
    """
    fam = family_options(task, family)
    spec = TASK_DATA[task]
    out = Path(out)
    seeds = case_seeds(task, n, seed)
    cases: dict[str, Case] = {}
    for layout in dict.fromkeys(spec.layout(i, family) for i in range(n)):
        idx = [i for i in range(n) if spec.layout(i, family) == layout]
        # a generator, so a full-size cohort is never held in memory at once
        phantoms = (spec.make(f"{spec.prefix}{i:03d}", seeds[i], size, i, **fam) for i in idx)
        for c in get_layout(layout).write(phantoms, out / layout):
            cases.setdefault(c.id, c)
    got = cases
    log.info("task %s: %d %s %s-family cases in %s", task, len(got), size, family, out)
    return list(got.values())


__all__ = ["TASK_DATA", "TaskData", "case_seeds", "family_options", "supports_family", "synth_task_cases"]
