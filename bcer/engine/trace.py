"""The trace: one ``events.jsonl`` per case (flushed per line, or in batches by the cohort loop;
in a lean cohort only for a case that did not succeed, the others' events going to the cohort's
``events.parquet`` alone), plus executor lifecycle hooks.

Hooks follow Hamilton's lifecycle-adapter style: plain objects with any of the methods below,
called with keyword-only arguments plus ``**future_kwargs`` so that new fields never break
an old hook. A hook that raises is logged and ignored: a progress bar must not fail a case.

- ``on_case_start(*, case, workflow, run_id, **kw)``
- ``on_node_start(*, case, node, attempt, tool, **kw)``   (the node's run began; reported
  when its result arrives, since the whole DAG is handed to Ray at once)
- ``on_node_end(*, case, node, status, duration_s, error, attempt, **kw)``
- ``on_event(*, event, **kw)``                            (every trace line)
- ``on_case_end(*, case, outcome, **kw)``
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Iterable, Protocol

from ..contracts.event import Event

log = logging.getLogger(__name__)
EVENTS_FILE = "events.jsonl"


class ExecutorHook(Protocol):
    """Any subset of these methods; all take keyword-only arguments plus ``**future_kwargs``."""

    def on_node_start(self, *, case: str, node: str, attempt: int, **future_kwargs: Any) -> None: ...

    def on_node_end(self, *, case: str, node: str, status: str, duration_s: float | None,
                    error: dict | None, **future_kwargs: Any) -> None: ...


def call_hooks(hooks: Iterable[Any], method: str, **kwargs: Any) -> None:
    """Call ``method`` on every hook that has it; a failing hook is logged, never raised."""
    for hook in hooks:
        fn = getattr(hook, method, None)
        if fn is None:
            continue
        try:
            fn(**kwargs)
        except Exception:  # a hook is an observer: it cannot be allowed to fail the case
            log.exception("hook %r.%s failed", hook, method)


class TraceWriter:
    """Appends Events to ``<case_dir>/events.jsonl``, one JSON object per line.

    Args:
        case_dir: the case's output folder (created if missing).
        run_id: written on every event.
        case_id: written on every event.
        hooks: objects whose ``on_event(event=...)`` sees every event.
        buffered: keep lines in memory until :meth:`flush` (the cohort loop flushes every
            half second and at case end, so 10,000 cases do not cost a write per event);
            unbuffered writers flush every line.
        persist: write ``events.jsonl`` as the case runs. False (a lean cohort): keep the lines
            in memory (the cohort's tables take them) and write the file only if :meth:`save`
            is called (a case that did not succeed) or the case already has one (an earlier run's
            trace is appended to, never orphaned).

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> with TraceWriter(d, "run1", "c1") as tw:
    ...     _ = tw.emit("case_started")
    >>> [e.kind for e in read_events(Path(d) / EVENTS_FILE)]
    ['case_started']
    """

    def __init__(self, case_dir: str | Path, run_id: str, case_id: str, hooks: Iterable[Any] = (),
                 buffered: bool = False, persist: bool = True):
        self.path = Path(case_dir) / EVENTS_FILE
        if not os.path.isdir(case_dir):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id, self.case_id, self.hooks = run_id, case_id, list(hooks)
        self.buffered = buffered or not persist
        self.lines: list[str] = []  # every line of this run (the cohort's events table takes them)
        try:
            self.had_history = os.stat(self.path).st_size > 0
        except FileNotFoundError:
            self.had_history = False
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._closed = False
        self._fh = open(self.path, "a", encoding="utf-8") if persist or self.had_history else None

    def emit(self, kind: str, **fields: Any) -> Event:
        """Build and append one Event (written at once unless buffered); returns it."""
        event = Event(run=self.run_id, case=self.case_id, kind=kind, **fields)
        line = event.model_dump_json()
        with self._lock:
            if not self._closed:
                self.lines.append(line)
                if self._fh is None:  # lean: kept in ``lines`` only
                    pass
                elif self.buffered:
                    self._pending.append(line)
                else:
                    self._fh.write(line + "\n")
                    self._fh.flush()
        if self.hooks:
            call_hooks(self.hooks, "on_event", event=event)
        return event

    def flush(self) -> None:
        """Write the buffered lines (a crash loses at most what was not flushed yet)."""
        with self._lock:
            if self._fh is None:  # lean: the lines wait in memory for save() or the cohort's tables
                return
            if self._pending and not self._closed:
                self._fh.write("\n".join(self._pending) + "\n")
                self._fh.flush()
            self._pending.clear()

    def save(self) -> None:
        """Write this run's lines to ``events.jsonl`` even in a lean cohort (a case that did not
        succeed keeps its whole trace beside it, where a person looks first)."""
        with self._lock:
            if self._fh is None:
                self._fh = open(self.path, "a", encoding="utf-8")
                self._pending = list(self.lines)
        self.flush()

    def all_lines(self) -> list[str]:
        """Every line of the file: earlier runs of this case, then this run's."""
        self.flush()
        if not self.had_history:
            return list(self.lines)
        with open(self.path, encoding="utf-8") as fh:
            return [ln for ln in fh.read().splitlines() if ln.strip()]

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._closed = True
            if self._fh is not None:
                self._fh.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_events(path: str | Path) -> list[Event]:
    """Events of one ``events.jsonl``; a torn last line (crash mid-write) is skipped with a warning."""
    events: list[Event] = []
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                events.append(Event.model_validate_json(line))
            except ValueError:
                log.warning("skipping unreadable trace line %d of %s", i, path)
    return events


def read_case_trace(case_dir: str | Path) -> list[Event]:
    """A case's events: its ``events.jsonl``, or (a lean cohort's succeeded case) its rows of the
    cohort's ``events.parquet`` beside its folder; [] when neither holds it.

    Raises:
        FileNotFoundError: neither file exists.
    """
    case_dir = Path(case_dir)
    path = case_dir / EVENTS_FILE
    if path.exists():
        return read_events(path)
    table_path = case_dir.parent / "events.parquet"
    if not table_path.exists():
        raise FileNotFoundError(f"no {EVENTS_FILE} in {case_dir} and no events.parquet beside it")
    import pyarrow.parquet as pq

    rows = pq.read_table(table_path, filters=[("case", "==", case_dir.name)]).to_pylist()
    for row in rows:
        for col in ("patch", "data"):  # stored as JSON text
            if row.get(col) is not None:
                row[col] = json.loads(row[col])
    return [Event.model_validate(r) for r in rows]


_COLUMNS: dict[str, str] = {"time": "float64", "run": "string", "case": "string", "node": "string",
                            "kind": "string", "attempt": "int64", "tool": "string",
                            "args_digest": "string", "error_code": "string", "message": "string",
                            "duration_s": "float64", "worker": "string", "patch": "string",
                            "data": "string"}


def events_schema():
    """The fixed schema of ``events.parquet``."""
    import pyarrow as pa

    return pa.schema([(k, getattr(pa, v)()) for k, v in _COLUMNS.items()])


def event_row(line: str) -> dict[str, Any] | None:
    """One trace line as an ``events.parquet`` row (nested dicts as JSON text); None if torn."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    for col in ("patch", "data"):  # nested dicts travel as JSON text
        if row.get(col) is not None:
            row[col] = json.dumps(row[col], default=str)
    return row


def events_table_from_lines(lines: Iterable[str]):
    """A pyarrow Table of trace lines (torn lines skipped)."""
    import pyarrow as pa

    rows = [r for r in map(event_row, lines) if r is not None]
    return pa.Table.from_pylist(rows, schema=events_schema())


def events_table(paths: Iterable[str | Path]):
    """Every event of the given ``events.jsonl`` files as a pyarrow Table (``patch``, ``data`` as JSON text)."""
    import pyarrow as pa

    rows: list[dict[str, Any]] = []
    for p in paths:
        for e in read_events(p):
            row = e.model_dump()
            for col in ("patch", "data"):  # nested dicts travel as JSON text
                row[col] = json.dumps(row[col], default=str) if row[col] is not None else None
            rows.append(row)
    return pa.Table.from_pylist(rows, schema=events_schema())


__all__ = ["EVENTS_FILE", "ExecutorHook", "TraceWriter", "call_hooks", "event_row", "events_schema", "events_table",
           "events_table_from_lines", "read_case_trace", "read_events"]
