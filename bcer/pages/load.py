"""Reading what a run wrote, for the pages: cohort rows, events, bench summary, case files.

Everything here tolerates missing or broken files: a page says what is missing, it never
crashes. Two shapes of output folder are understood:

- a cohort folder (``bcer cohort``/``Study``): ``cohort.parquet`` (or ``<case>/result.json``),
  ``events.parquet`` (or ``<case>/events.jsonl``), one folder per case;
- a bench folder (``bcer bench``/``demo``): ``bench.json`` and ``runs/<task>/`` cohort folders.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class CohortView:
    """One cohort's rows and events, as the pages need them.

    Attributes:
        name: the task id (or the folder name for a custom plan).
        root: the cohort folder (holds the case folders).
        rows: one dict per case (``measurements`` flattened as ``m_*`` keys).
        quality: ``{case: {metric: value}}`` from ``bench.json`` (empty outside a bench).
        problems: what could not be read (shown on the page).
    """

    name: str
    root: Path
    rows: list[dict[str, Any]]
    quality: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    _events: list[dict[str, Any]] | None = None
    _by_case: dict[str, list[dict[str, Any]]] | None = None

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event of every case (loaded on first use)."""
        if self._events is None:
            self._events = read_cohort_events(self.root, self.problems)
        return self._events

    def case_events(self, case: str) -> list[dict[str, Any]]:
        """One case's events: its ``events.jsonl``, else (a lean cohort's succeeded case) its
        rows of the cohort's events."""
        own = read_case_events(self.root / case)
        if own:
            return own
        if self._by_case is None:
            self._by_case = {}
            for e in self.events:
                self._by_case.setdefault(e.get("case"), []).append(e)
        return self._by_case.get(case, [])


@dataclass
class RunView:
    """What ``bcer report OUT`` renders: one cohort, or a bench of several."""

    out: Path
    cohorts: list[CohortView]
    bench: dict[str, Any] | None = None

    @property
    def is_bench(self) -> bool:
        return self.bench is not None


def _json(path: Path, problems: list[str] | None = None) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        if problems is not None:
            problems.append(f"{path.name}: unreadable ({type(e).__name__}: {e})")
        return None


def _parse_jsonish(value: Any) -> Any:
    """Parquet keeps nested row fields as JSON text; give them back as Python values."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _normal_row(row: dict[str, Any]) -> dict[str, Any]:
    row = {k: _parse_jsonish(v) if k in ("deliverables", "plausibility") else v for k, v in row.items()}
    for k, v in (row.pop("measurements", None) or {}).items():
        row.setdefault(f"m_{k}", v)
    row.setdefault("status", "unknown")
    if row.get("sr_delivered") is None:  # cohorts written before plausibility existed
        row["sr_delivered"] = row.get("sr")
    return row


def read_rows(root: Path, problems: list[str]) -> list[dict[str, Any]]:
    """Case rows of a cohort folder: ``cohort.parquet``, else every ``*/result.json``."""
    parquet = root / "cohort.parquet"
    rows: list[dict[str, Any]] = []
    if parquet.exists():
        try:
            import pyarrow.parquet as pq

            rows = pq.read_table(parquet).to_pylist()
        except Exception as e:  # a torn parquet (crash mid-write): fall back to per-case rows
            problems.append(f"cohort.parquet unreadable ({type(e).__name__}); rows read from result.json files")
            rows = []
    if not rows:  # each case's row: result.json (audit, or not succeeded), else a lean _DONE
        for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            for name in ("result.json", "_DONE"):
                row = _json(d / name, problems) if (d / name).exists() else None
                if isinstance(row, dict) and "status" in row:
                    rows.append(row)
                    break
    seen = {r.get("case") for r in rows}
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if (d / "events.jsonl").exists() and d.name not in seen:  # a case that never got its row
            rows.append({"case": d.name, "status": "unknown", "error_message": "no result row was written"})
    return [_normal_row(r) for r in rows]


def read_cohort_events(root: Path, problems: list[str]) -> list[dict[str, Any]]:
    """Events of a cohort: ``events.parquet`` when present, else every ``*/events.jsonl``."""
    parquet = root / "events.parquet"
    if parquet.exists():
        try:
            import pyarrow.parquet as pq

            return pq.read_table(parquet).to_pylist()
        except Exception as e:  # pyarrow's own error types on a damaged file: fall back to the jsonl
            problems.append(f"events.parquet unreadable ({type(e).__name__}); read from events.jsonl")
    events: list[dict[str, Any]] = []
    for p in sorted(root.glob("*/events.jsonl")):
        events.extend(read_case_events(p.parent))
    return events


def read_case_events(case_dir: Path) -> list[dict[str, Any]]:
    """One case's events as dicts; a torn line is skipped."""
    path = case_dir / "events.jsonl"
    out: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _cohort(root: Path, name: str | None = None, quality: dict | None = None) -> CohortView:
    problems: list[str] = []
    rows = read_rows(root, problems)
    desc = _json(root / "dataset_description.json", problems) or {}
    task = (desc.get("bcer") or {}).get("task") or next((r.get("task") for r in rows if r.get("task")), None)
    return CohortView(name=name or task or root.name, root=root, rows=rows, quality=quality or {},
                      description=desc, problems=problems)


def load_run(out: str | Path) -> RunView:
    """The cohort(s) under ``out``.

    Raises:
        FileNotFoundError: ``out`` holds neither a cohort nor a bench.
    """
    out = Path(out).resolve()
    bench = _json(out / "bench.json")
    if isinstance(bench, dict) and (out / "runs").is_dir():
        by_task: dict[str, dict[str, dict]] = {}
        for row in bench.get("cases", []):
            by_task.setdefault(row.get("task"), {})[row.get("case")] = row.get("quality") or {}
        cohorts = [_cohort(d, d.name, by_task.get(d.name)) for d in sorted((out / "runs").iterdir()) if d.is_dir()]
        return RunView(out, cohorts, bench)
    if (out / "cohort.parquet").exists() or any(out.glob("*/result.json")) or any(out.glob("*/events.jsonl")) \
            or any(out.glob("*/_DONE")):
        return RunView(out, [_cohort(out)])
    raise FileNotFoundError(f"{out} holds no bcer cohort (cohort.parquet, */result.json) or bench (bench.json)")


__all__ = ["CohortView", "RunView", "load_run", "read_case_events", "read_cohort_events", "read_rows"]
