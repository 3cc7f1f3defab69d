"""The row of one case in a cohort, one shape whatever happened to the case: it ran to an
outcome, it was rejected or crashed before running (an error row), or an earlier run had
finished it (resumed from its ``result.json``, or from ``_DONE`` in a lean cohort).

``CaseRow`` is what ``result.json``, ``cohort.parquet``, ``CohortResult.summary`` and the bench
read; the public API hands out ``CaseRow.to_dict()``. ``from_dict`` reads rows written by any
version (missing fields take their defaults; a row from before plausibility existed has no
``sr_delivered``, so its ``sr`` stands for it).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..contracts import Case, ToolError

ROW_FILE = "result.json"


@dataclass
class CaseRow:
    """One case of a cohort.

    ``sr`` is delivered AND plausible, ``sr_delivered`` the contract validators alone; without a
    contract both say whether every required node succeeded. ``deliverables`` are paths relative
    to the cohort folder; ``measurement_rows`` the long-form measurements
    (``measurements.parquet``)."""

    case: str
    task: str | None
    run: str
    status: str
    sr: int = 0
    sr_delivered: int | None = None
    tcr: float = 0.0
    plausibility: list[dict[str, Any]] = field(default_factory=list)
    error_code: str | None = None
    error_message: str | None = None
    error_node: str | None = None
    duration_s: float = 0.0
    repairs: int = 0
    plan_revisions: int | None = None   # None: no plan was made (rejected, or crashed planning)
    planner: str | None = None
    cache_hits: int = 0
    deliverables: dict[str, str] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    measurement_rows: list[dict[str, Any]] = field(default_factory=list)
    low_confidence: bool | None = None
    resumed: bool = False

    @classmethod
    def from_error(cls, case: Case, cfg: Any, err: ToolError, status: str, t0: float) -> "CaseRow":
        """A case that never ran to an outcome: rejected at admission or planning, or crashed."""
        return cls(case=case.id, task=_task(cfg), run=cfg.run_id, status=status, sr=0, sr_delivered=0, tcr=0.0,
                   error_code=err.code.value, error_message=err.message, error_node=err.context.get("node"),
                   duration_s=round(time.time() - t0, 3), planner=cfg.planner.name)

    @classmethod
    def from_outcome(cls, case: Case, cfg: Any, outcome: Any, revisions: int, t0: float) -> "CaseRow":
        """A case that ran (``context.CaseOutcome``)."""
        err = outcome.error or {}
        ok = outcome.status == "succeeded"
        return cls(case=case.id, task=_task(cfg), run=cfg.run_id, status=outcome.status,
                   sr=outcome.sr if outcome.sr is not None else int(ok), sr_delivered=outcome.sr_delivered,
                   tcr=outcome.tcr if outcome.tcr is not None else float(ok),
                   plausibility=list(outcome.plausibility), error_code=err.get("code"),
                   error_message=err.get("message"), error_node=err.get("node"),
                   duration_s=round(time.time() - t0, 3), repairs=outcome.repairs, plan_revisions=revisions,
                   planner=cfg.planner.name, cache_hits=outcome.cache_hits,
                   deliverables={k: str(Path(v).relative_to(cfg.out)) if Path(v).is_absolute() else str(v)
                                 for k, v in outcome.deliverables.items()},
                   measurements=outcome.measurements, measurement_rows=outcome.measurement_rows,
                   low_confidence=low_confidence(outcome.measurement_rows))

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> "CaseRow":
        """A row as written (``result.json``) or handed out; unknown keys are ignored."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in row.items() if k in known}
        data.setdefault("task", None)
        data.setdefault("run", "")
        data.setdefault("status", "failed")
        for key, default in (("sr", 0), ("tcr", 0.0), ("repairs", 0), ("cache_hits", 0), ("duration_s", 0.0)):
            if data.get(key) is None:  # written as null by an older version: the field's neutral value
                data[key] = default
        return cls(**data)

    @property
    def delivered(self) -> int:
        """The validators' verdict (a row from before plausibility existed: its ``sr``)."""
        return int(self.sr if self.sr_delivered is None else self.sr_delivered)

    def to_dict(self) -> dict[str, Any]:
        """The row as the public API hands it out (the same keys for every case)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _task(cfg: Any) -> str | None:
    return cfg.contract.id if cfg.contract else None


def low_confidence(records: list[dict[str, Any]]) -> bool | None:
    """True when a segmentation of the case flagged itself (its confidence score below its
    stated threshold), False when every scored one passed, None when none was scored."""
    flags = [r["value"] for r in records if r.get("measure") == "low_confidence" and r.get("value") is not None]
    return bool(max(flags)) if flags else None


def resumed_row(case_dir: str) -> CaseRow | None:
    """The row of a case finished by an earlier run (``_DONE`` present in ``case_dir``), else None.

    A lean cohort's ``_DONE`` holds the row itself; an audited one's row is ``result.json``."""
    done = os.path.join(case_dir, "_DONE")
    if not os.path.exists(done):
        return None
    for path in (done, os.path.join(case_dir, ROW_FILE)):
        try:
            with open(path, "rb") as fh:
                data = json.loads(fh.read())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "status" in data:
            try:
                row = CaseRow.from_dict(data)
            except TypeError:
                continue
            row.resumed = True
            return row
    return None  # _DONE without its row (killed between the two): run it again


__all__ = ["CaseRow", "ROW_FILE", "low_confidence", "resumed_row"]
