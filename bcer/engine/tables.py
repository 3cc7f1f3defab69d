"""The cohort's Parquet tables, written as cases finish: ``cohort.parquet`` and ``events.parquet``.

While a cohort runs, finished cases' rows and events go to small Parquet part files under
``OUT/.bcer_parts/`` (a batch every few thousand events or few seconds), so a crash or a
SIGKILL loses nothing finished and the driver holds no growing event list. At the end (and
on Ctrl-C) the parts are consolidated:

- ``cohort.parquet``: one row per case of this invocation (the runner holds those rows; resumed
  cases' rows come from their ``result.json``).
- ``measurements.parquet``: every scalar of every case's deliverables in long form, one row per
  (case, deliverable, row, measure): see :data:`MEASUREMENT_COLUMNS` (``cohort.parquet``'s
  ``m_*`` columns are its wide view).
- ``events.parquet``: every event of every case folder's ``events.jsonl`` (all runs), as before:
  for each case the newest source wins: a part of this or a killed earlier run (a part holds
  the case's whole ``events.jsonl`` as of its end), else the previous ``events.parquet``,
  else (a resumed case no table has seen) its ``events.jsonl``.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Iterable

from .trace import EVENTS_FILE, event_row, events_schema

log = logging.getLogger(__name__)
PARTS = ".bcer_parts"
COHORT_FILE = "cohort.parquet"
EVENTS_PARQUET = "events.parquet"
MEASUREMENTS_FILE = "measurements.parquet"
# column -> (arrow type name, meaning); docs/outputs and the tests read this one definition
MEASUREMENT_COLUMNS: dict[str, tuple[str, str]] = {
    "case": ("string", "case id"),
    "task": ("string", "task contract id (null for a custom plan)"),
    "deliverable": ("string", "deliverable name in the task contract (the file it was read from)"),
    "row": ("string", "the row's name (tumour compartment, chamber, zone, lesion id...); null for one-row "
                      "tables, classifications and values"),
    "row_index": ("int64", "the row's position in the deliverable (null for one-row tables)"),
    "measure": ("string", "column of the deliverable (volume_ml, mean, lv_ef_pct, label, score.<class>...)"),
    "value": ("float64", "the number (booleans as 0/1); null when the measure is a word"),
    "text": ("string", "the word (a side, a zone, a class label); null when the measure is a number"),
    "unit": ("string", "unit of the value as the tool declared it ('' when unitless)"),
}
FLUSH_EVERY_S = 5.0  # a part at least this often while cases finish


def flat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A cohort row with nested fields flattened (``deliverables`` as JSON, ``m_<measurement>``)."""
    flat = {k: v for k, v in row.items() if k not in ("measurements", "measurement_rows", "deliverables",
                                                       "plausibility")}
    flat["deliverables"] = json.dumps(row.get("deliverables", {}))
    flat["plausibility"] = json.dumps(row.get("plausibility", []), default=str)  # mixed value types: JSON text
    for k, v in (row.get("measurements") or {}).items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            flat[f"m_{k}"] = v
    return flat


def rows_table(rows: Iterable[dict[str, Any]]):
    """A pyarrow Table of cohort rows: the union of their columns (missing cells null); a
    column whose values pyarrow cannot type together is stored as text."""
    import pyarrow as pa

    flats = [flat_row(r) for r in rows]
    names: dict[str, None] = {}
    for f in flats:
        names.update(dict.fromkeys(f))
    columns = {}
    for name in names:
        values = [f.get(name) for f in flats]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            columns[name] = pa.array([None if v is None else json.dumps(v, default=str) for v in values])
    return pa.table(columns) if columns else pa.table({})


def measurements_table(rows: Iterable[dict[str, Any]]):
    """The long-form table of every case's measurements (:data:`MEASUREMENT_COLUMNS`)."""
    import pyarrow as pa

    schema = pa.schema([(name, getattr(pa, kind)()) for name, (kind, _) in MEASUREMENT_COLUMNS.items()])
    records = [dict({k: m.get(k) for k in MEASUREMENT_COLUMNS}, case=r["case"], task=r.get("task"))
               for r in rows for m in (r.get("measurement_rows") or ())]
    return pa.Table.from_pylist(records, schema=schema)


def _write_atomic(table, path: Path) -> None:
    import pyarrow.parquet as pq

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class CohortTables:
    """Incremental writer of one cohort folder's tables.

    Args:
        out: the cohort folder.
        run_id: names this run's part files.
        max_events: events buffered before a part is written.
        every_s: a part is also written when this many seconds passed since the last one.
    """

    def __init__(self, out: Path, run_id: str, max_events: int = 20000, every_s: float | None = None):
        self.out, self.run_id = Path(out), run_id
        self.parts = self.out / PARTS
        self.max_events, self.every_s = max_events, FLUSH_EVERY_S if every_s is None else every_s
        self._rows: list[dict[str, Any]] = []
        self._events: list[dict[str, Any]] = []
        self._done: list[tuple[Path, dict[str, Any]]] = []
        self._n = 0
        self._last = time.time()

    def add(self, row: dict[str, Any], event_lines: Iterable[str], done: Path | None = None) -> None:
        """Buffer a finished case's row and events. ``done``: the case folder whose ``_DONE``
        (holding the row) is written once the part holding them is on disk (a lean cohort),
        so a case marked done never lacks its trace, whenever the driver is killed."""
        self._rows.append(row)
        self._events.extend(r for r in map(event_row, event_lines) if r is not None)
        if done is not None:
            self._done.append((done, row))
        if len(self._events) >= self.max_events:
            self.flush()

    def maybe_flush(self, now: float) -> None:
        if (self._rows or self._events or self._done) and now - self._last >= self.every_s:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as one cohort part and one events part."""
        import pyarrow as pa

        self._last = time.time()
        if not self._rows and not self._events and not self._done:
            return
        self.parts.mkdir(parents=True, exist_ok=True)
        stem = f"{time.time_ns():020d}-{self.run_id}-{self._n:05d}"
        self._n += 1
        if self._rows:
            _write_atomic(rows_table(self._rows), self.parts / f"{stem}.cohort.parquet")
        if self._events:
            _write_atomic(pa.Table.from_pylist(self._events, schema=events_schema()),
                          self.parts / f"{stem}.events.parquet")
        self._rows.clear()
        self._events.clear()
        from .outputs import write_done

        for folder, row in self._done:  # after the part: _DONE promises the row and trace are recorded
            try:
                write_done(folder, row)
            except OSError:  # a full disk: no _DONE, so the next run redoes the case
                log.exception("cannot write _DONE of %s", folder)
        self._done.clear()

    def finalize(self, rows: list[dict[str, Any]], case_ids: Iterable[str]) -> None:
        """Write ``cohort.parquet`` (``rows``) and the consolidated ``events.parquet``; drop the parts.

        Args:
            case_ids: cases of this invocation (a resumed one no table has seen is read from
                its ``events.jsonl``).
        """
        self.flush()
        _write_atomic(rows_table(rows), self.out / COHORT_FILE)
        _write_atomic(measurements_table(rows), self.out / MEASUREMENTS_FILE)
        self._consolidate_events(set(case_ids))
        for p in sorted(self.parts.glob("*.parquet")) if self.parts.exists() else ():
            p.unlink(missing_ok=True)
        try:
            self.parts.rmdir()
        except OSError:  # a concurrent writer's part, or not empty for another reason: keep it
            pass

    def _consolidate_events(self, case_ids: set[str]) -> None:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        parts = sorted(self.parts.glob("*.events.parquet")) if self.parts.exists() else []
        seen: set[str] = set()
        take: list[tuple[Path, set[str]]] = []
        for part in reversed(parts):  # newest first: its copy of a case is the most complete
            cases = set(pq.read_table(part, columns=["case"]).column("case").to_pylist())
            new = cases - seen
            if new:
                take.append((part, new))
                seen |= new
        old = self.out / EVENTS_PARQUET
        tmp = self.out / f".{EVENTS_PARQUET}.{os.getpid()}.tmp"
        schema = events_schema()
        writer = pq.ParquetWriter(tmp, schema)
        try:
            if old.exists():
                try:
                    pf = pq.ParquetFile(old)
                    keep_out = pa.array(sorted(seen), pa.string())
                    for batch in pf.iter_batches(batch_size=65536):
                        t = pa.Table.from_batches([batch]).cast(schema)
                        t = t.filter(pc.invert(pc.is_in(t["case"], value_set=keep_out)))
                        seen |= set(pc.unique(t["case"]).to_pylist())
                        if t.num_rows:
                            writer.write_table(t)
                except (OSError, pa.ArrowInvalid) as e:  # a torn table from a crash: events.jsonl rebuild it
                    log.warning("previous %s unreadable (%s): rebuilt from the trace files", old.name, e)
            for part, cases in reversed(take):  # chronological
                t = pq.read_table(part).cast(schema)
                t = t.filter(pc.is_in(t["case"], value_set=pa.array(sorted(cases), pa.string())))
                writer.write_table(t)
            for cid in sorted(case_ids - seen):
                path = self.out / cid / EVENTS_FILE
                if path.exists():
                    rows = [r for r in map(event_row, path.read_text().splitlines()) if r is not None]
                    if rows:
                        writer.write_table(pa.Table.from_pylist(rows, schema=schema))
        finally:
            writer.close()
        os.replace(tmp, old)


__all__ = ["COHORT_FILE", "CohortTables", "EVENTS_PARQUET", "MEASUREMENTS_FILE", "MEASUREMENT_COLUMNS", "PARTS",
           "flat_row", "measurements_table", "rows_table"]
