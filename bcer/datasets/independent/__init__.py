"""An evaluation family independent of the training generators.

Its shape models (``heart``, ``gland``, ``tumour``) and image model (``acquire``) were written
apart from ``bcer.datasets.cardiac``, ``prostate``, ``brain``, ``pelvis``, ``randomise`` and
``degrade`` and import none of them, so a segmenter trained or tuned on those generators
meets shapes, contrasts, grids and orientations it never saw. Every range is fixed in code
and was fixed before any score was looked at. ``write_family`` writes the cases in the
layouts bcer's cohort reads (cardiac: ACDC; prostate: DICOM series; brain: BraTS), one
folder per task, with the truth sidecar the bench scores against.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..layouts import get_layout
from ..phantom import Phantom
from .gland import make_gland_case
from .heart import GROUPS, make_heart_case
from .tumour import make_tumour_case

TASK_LAYOUT = {"cardiac_report": "acdc", "prostate_report": "dicom", "brain_report": "brats"}
_BRAIN_DESIGNS = (("single", "left", "HGG"), ("multifocal", "right", "HGG"), ("midline", "left", "HGG"),
                  ("single", "right", "HGG"), ("multifocal", "left", "HGG"), ("single", "left", "LGG"))


def phantoms(task: str, n: int, seed: int = 0) -> Iterator[Phantom]:
    """``n`` independent cases of ``task`` (designs cycle: the five ACDC groups; 1, 2, 0
    lesions; single, multifocal, midline, ... tumours with one LGG in six)."""
    for i in range(n):
        s = seed * 1000 + i
        if task == "cardiac_report":
            yield make_heart_case(f"ind{i:03d}", s, GROUPS[i % len(GROUPS)])
        elif task == "prostate_report":
            yield make_gland_case(f"ind{i:03d}", s, (1, 2, 0)[i % 3])
        elif task == "brain_report":
            kind, side, grade = _BRAIN_DESIGNS[i % len(_BRAIN_DESIGNS)]
            yield make_tumour_case(f"ind{i:03d}", s, kind, side, grade)
        else:
            raise ValueError(f"no independent cases for task {task!r}; known: {sorted(TASK_LAYOUT)}")


def write_family(out: str | Path, n: int, tasks: tuple[str, ...] = tuple(TASK_LAYOUT), seed: int = 0) -> dict[str, list]:
    """Write ``n`` cases per task under ``out/<task>/<layout>/`` and return the Cases read back."""
    cases = {}
    for task in tasks:
        layout = TASK_LAYOUT[task]
        cases[task] = get_layout(layout).write(phantoms(task, n, seed), Path(out) / task / layout)
    return cases


__all__ = ["TASK_LAYOUT", "make_gland_case", "make_heart_case", "make_tumour_case", "phantoms", "write_family"]
