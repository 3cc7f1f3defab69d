"""Events an actor produces outside a running case (planning, repair), held until the engine
writes them into that case's trace.

The Brain plans before the case's ``events.jsonl`` is opened, and the Reflector runs in a Ray
actor; both add plain dicts here (``kind`` + Event fields, ``time`` included) and the engine
drains them per case (``pop``) and emits them through the case's TraceWriter, so the trace
shows every LLM call in order with the nodes it concerned.
"""
from __future__ import annotations

import threading
import time
from typing import Any


class PendingEvents:
    """Thread-safe per-case buffer of event dicts (cases plan concurrently in driver threads)."""

    def __init__(self) -> None:
        self._events: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def add(self, case_id: str, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"kind": kind, "time": time.time(), **{k: v for k, v in fields.items() if v is not None}}
        with self._lock:
            self._events.setdefault(case_id, []).append(event)
        return event

    def pop(self, case_id: str) -> list[dict[str, Any]]:
        """Every pending event of ``case_id``, oldest first; the buffer forgets them."""
        with self._lock:
            return self._events.pop(case_id, [])

    def peek(self, case_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events.get(case_id, []))

    # Ray pickles tiers and planners into actors: the lock is rebuilt, pending events travel.
    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            return {"_events": {k: list(v) for k, v in self._events.items()}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._events = state["_events"]
        self._lock = threading.Lock()


__all__ = ["PendingEvents"]
