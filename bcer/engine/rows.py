"""The row of one case in a cohort: what ``result.json``, ``cohort.parquet``, the summary and
the bench read."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..contracts import Case, ToolError

ROW_FILE = "result.json"


def error_row(case: Case, cfg: Any, err: ToolError, status: str, t0: float) -> dict[str, Any]:
    return {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
            "status": status, "sr": 0, "sr_delivered": 0, "tcr": 0.0, "plausibility": [], "error_code": err.code.value,
            "error_message": err.message, "error_node": err.context.get("node"),
            "duration_s": round(time.time() - t0, 3), "repairs": 0, "planner": cfg.planner.name,
            "deliverables": {}, "measurements": {}, "measurement_rows": []}


def outcome_row(case: Case, cfg: Any, outcome: Any, revisions: int, t0: float) -> dict[str, Any]:
    err = outcome.error or {}
    return {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
            "status": outcome.status, "sr": outcome.sr if outcome.sr is not None else int(outcome.status == "succeeded"),
            "sr_delivered": outcome.sr_delivered,
            "tcr": outcome.tcr if outcome.tcr is not None else float(outcome.status == "succeeded"),
            "plausibility": list(outcome.plausibility),
            "error_code": err.get("code"), "error_message": err.get("message"), "error_node": err.get("node"),
            "duration_s": round(time.time() - t0, 3), "repairs": outcome.repairs, "plan_revisions": revisions,
            "planner": cfg.planner.name, "cache_hits": outcome.cache_hits,
            "deliverables": {k: str(Path(v).relative_to(cfg.out)) if Path(v).is_absolute() else str(v)
                             for k, v in outcome.deliverables.items()},
            "measurements": outcome.measurements, "measurement_rows": outcome.measurement_rows,
            "low_confidence": low_confidence(outcome.measurement_rows)}


def low_confidence(records: list[dict[str, Any]]) -> bool | None:
    """True when a segmentation of the case flagged itself (its confidence score below its
    stated threshold), False when every scored one passed, None when none was scored."""
    flags = [r["value"] for r in records if r.get("measure") == "low_confidence" and r.get("value") is not None]
    return bool(max(flags)) if flags else None


def resumed_row(case_dir: str) -> dict[str, Any] | None:
    """The row of a case finished by an earlier run (``_DONE`` present in ``case_dir``), else None."""
    if not os.path.exists(os.path.join(case_dir, "_DONE")):
        return None
    try:
        with open(os.path.join(case_dir, ROW_FILE), "rb") as fh:
            row = json.loads(fh.read())
    except (OSError, ValueError):  # _DONE without its row (killed between the two): run it again
        return None
    row["resumed"] = True
    return row


__all__ = ["ROW_FILE", "error_row", "low_confidence", "outcome_row", "resumed_row"]
