"""Standard derivatives of a finished cohort, beside bcer's own per-case folders.

One call, after the cohort's tables: a BIDS derivative dataset rooted at ``OUT``
(``engine.bids_out``), flat predictions ``OUT/predictions/<case>.nii.gz``
(``engine.derivatives``) and DICOM SEG + SR for cases that came from DICOM
(``engine.dicom_out``). Everything is derived from the case folders' files, so a resumed
cohort exports the same tree as a fresh one; a case that cannot be exported is logged and
skipped, never fatal: the per-case folders stay the record.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..contracts.case import Case
from ..contracts.errors import ToolError
from . import bids_out, dicom_out
from .derivatives import finished_cases, write_predictions

log = logging.getLogger(__name__)

__all__ = ["export_cohort", "write_derivatives"]


def write_derivatives(out: str | Path, cases: Iterable[Case], *, name: str = "bcer derivatives",
                      generated_by: dict[str, Any] | None = None, bids: bool = True, predictions: bool = True,
                      dicom: bool = True) -> dict[str, list[Path]]:
    """Export the finished cases under ``out`` in standard forms.

    Args:
        cases: the cohort's cases; those without ``_DONE`` under ``out`` are left out.
        name: the BIDS dataset's ``Name`` when ``dataset_description.json`` has none yet.
        generated_by: the BIDS ``GeneratedBy`` entry (``Name``, ``Version``); its version
            also goes into the DICOM files.
        bids, predictions, dicom: which forms to write.

    Returns:
        ``{"bids": [...], "predictions": [...], "dicom": [...]}``: the files written.

    >>> write_derivatives("OUT", cases, dicom=False)["predictions"]   # doctest: +SKIP
    [PosixPath('OUT/predictions/case01.nii.gz')]
    """
    out = Path(out)
    done = finished_cases(out, cases)
    written: dict[str, list[Path]] = {"bids": [], "predictions": [], "dicom": []}
    if predictions:
        written["predictions"] = write_predictions(out, done)
    if dicom:
        for one in done:
            try:
                written["dicom"] += dicom_out.export_case(out, one, version=(generated_by or {}).get("Version", "0"))
            except ToolError as e:
                log.warning("derivatives: no DICOM SEG/SR for %s: %s", one.case.id, e)
            except Exception as e:  # highdicom/pydicom on a header they refuse: this case only, logged
                log.warning("derivatives: no DICOM SEG/SR for %s: %s: %s", one.case.id, type(e).__name__, e)
    if bids:
        written["bids"] = bids_out.write_tree(out, done, name=name, generated_by=generated_by or {})
    return written


def export_cohort(out: str | Path, cases: Iterable[Case], **kwargs: Any) -> dict[str, list[Path]]:
    """``write_derivatives`` at the end of a cohort: a failed export is logged, never fatal
    (the per-case folders and tables are already written)."""
    try:
        return write_derivatives(out, cases, **kwargs)
    except (ToolError, OSError, ValueError, KeyError) as e:
        log.warning("derivatives: export under %s stopped: %s", out, e)
        return {}
