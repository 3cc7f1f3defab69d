"""The trace: one ``events.jsonl`` per case, flushed per line, plus executor lifecycle hooks.

Hooks follow Hamilton's lifecycle-adapter style: plain objects with any of the methods below,
called with keyword-only arguments plus ``**future_kwargs`` so that new fields never break
an old hook. A hook that raises is logged and ignored: a progress bar must not fail a case.

- ``on_case_start(*, case, workflow, run_id, **kw)``
- ``on_node_start(*, case, node, attempt, tool, **kw)``   (node handed to Ray)
- ``on_node_end(*, case, node, status, duration_s, error, attempt, **kw)``
- ``on_event(*, event, **kw)``                            (every trace line)
- ``on_case_end(*, case, outcome, **kw)``
"""
from __future__ import annotations

import json
import logging
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
    """Appends Events to ``<case_dir>/events.jsonl``, one JSON object per line, flushed at once.

    Args:
        case_dir: the case's output folder (created if missing).
        run_id: written on every event.
        case_id: written on every event.
        hooks: objects whose ``on_event(event=...)`` sees every event.

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> with TraceWriter(d, "run1", "c1") as tw:
    ...     _ = tw.emit("case_started")
    >>> [e.kind for e in read_events(Path(d) / EVENTS_FILE)]
    ['case_started']
    """

    def __init__(self, case_dir: str | Path, run_id: str, case_id: str, hooks: Iterable[Any] = ()):
        self.path = Path(case_dir) / EVENTS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.run_id, self.case_id, self.hooks = run_id, case_id, list(hooks)
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", encoding="utf-8")

    def emit(self, kind: str, **fields: Any) -> Event:
        """Build, append and flush one Event; returns it."""
        event = Event(run=self.run_id, case=self.case_id, kind=kind, **fields)
        line = event.model_dump_json()
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
                self._fh.flush()
        call_hooks(self.hooks, "on_event", event=event)
        return event

    def close(self) -> None:
        with self._lock:
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


_COLUMNS: dict[str, str] = {"time": "float64", "run": "string", "case": "string", "node": "string",
                            "kind": "string", "attempt": "int64", "tool": "string",
                            "args_digest": "string", "error_code": "string", "message": "string",
                            "duration_s": "float64", "worker": "string", "patch": "string",
                            "data": "string"}


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
    schema = pa.schema([(k, getattr(pa, v)()) for k, v in _COLUMNS.items()])
    return pa.Table.from_pylist(rows, schema=schema)


__all__ = ["EVENTS_FILE", "ExecutorHook", "TraceWriter", "call_hooks", "events_table", "read_events"]
