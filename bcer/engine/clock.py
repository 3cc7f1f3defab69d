"""When did a node really start running? (so a node timeout never counts time spent queued)

A node waits in Ray's queue until a worker with its resources is free; with many cases in
flight that wait can be longer than any sensible ``node_timeout_s``. Each node task reports
its start to one small named actor per driver (``num_cpus=0``); the executor's timeout check
asks it how long each in-flight node has been running, measured on the actor's own clock
(no clock skew between machines), and cancels only nodes that ran past the limit.
"""
from __future__ import annotations

import time
from typing import Any

_NAME = "bcer-node-clock"


class NodeClock:
    """Start times of running node attempts, keyed ``case:node:submission``."""

    def __init__(self) -> None:
        self._t: dict[str, float] = {}

    def start(self, key: str) -> None:
        self._t.setdefault(key, time.time())

    def running_for(self, keys: list[str]) -> dict[str, float | None]:
        """Seconds each key has been running (None: not started yet)."""
        now = time.time()
        return {k: (now - self._t[k]) if k in self._t else None for k in keys}

    def forget(self, prefix: str) -> None:
        for k in [k for k in self._t if k.startswith(prefix)]:
            del self._t[k]


_CLOCKS: dict[str, Any] = {}  # job id -> handle: a non-detached actor lives as long as its creator's handle


def node_clock(fresh: bool = False) -> Any:
    """The driver's clock actor (get-or-create; held for the driver's lifetime). ``fresh``
    replaces a clock that died."""
    import ray

    job = ray.get_runtime_context().get_job_id()
    if fresh or job not in _CLOCKS:
        name = f"{_NAME}-{job}"
        if fresh:
            name += f"-{time.time_ns()}"
        _CLOCKS[job] = ray.remote(num_cpus=0)(NodeClock).options(name=name, get_if_exists=True).remote()
    return _CLOCKS[job]


def report_start(spec: dict[str, Any]) -> None:
    """Called first thing in a node task: tell the clock (if the run uses one) it started."""
    clock = spec.get("clock")
    if clock is not None:
        try:
            clock.start.remote(spec["clock_key"])
        except Exception:  # a lost clock must not fail the node; the timeout then never fires
            pass


__all__ = ["NodeClock", "node_clock", "report_start"]
