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
    """Start times of running node attempts, keyed ``case:node:attempt``."""

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


def node_clock() -> Any:
    """The driver's clock actor (get-or-create)."""
    import ray

    return ray.remote(num_cpus=0)(NodeClock).options(name=_NAME, get_if_exists=True).remote()


def report_start(spec: dict[str, Any]) -> None:
    """Called first thing in a node task: tell the clock (if the run uses one) it started."""
    clock = spec.get("clock")
    if clock is not None:
        try:
            clock.start.remote(spec["clock_key"])
        except Exception:  # a lost clock must not fail the node; the timeout then never fires
            pass


__all__ = ["NodeClock", "node_clock", "report_start"]
