"""BIDS names shared by the layout reader (``datasets.layouts.bids``) and the derivative writer
(``engine.bids_out``): kept here, below both, so writing a cohort's BIDS tree does not import
the phantom generators."""
from __future__ import annotations

import re

from ..contracts.errors import ErrorCode, ToolError


def subject_label(case_id: str) -> str:
    """A BIDS subject label (alphanumeric only) for a case id: ``brain-003`` -> ``brain003``."""
    raw = str(case_id)[4:] if str(case_id).startswith("sub-") else str(case_id)
    label = re.sub(r"[^A-Za-z0-9]", "", raw)
    if not label:
        raise ToolError(ErrorCode.schema, f"case id {case_id!r} gives an empty BIDS label",
                        hint="use letters or digits in case ids", arg="case_id")
    return label


__all__ = ["subject_label"]
