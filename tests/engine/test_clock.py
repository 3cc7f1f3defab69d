"""The node clock: node timeouts count run time, not time queued for a worker."""
from __future__ import annotations

import gc
import time

from bcer.engine.clock import NodeClock, node_clock, report_start


def test_clock_measures_from_the_reported_start():
    c = NodeClock()
    c.start("c1:a:1")
    time.sleep(0.05)
    c.start("c1:a:1")  # a duplicate report keeps the first start
    got = c.running_for(["c1:a:1", "c1:b:1"])
    assert got["c1:a:1"] >= 0.05 and got["c1:b:1"] is None  # b is still queued: not running
    c.forget("c1:")
    assert c.running_for(["c1:a:1"]) == {"c1:a:1": None}
    report_start({"tool": "x"})  # a run without a clock: nothing to report, nothing raised


def test_driver_clock_outlives_its_first_user(ray_local):
    first = node_clock()
    first.start.remote("k:n:1")
    del first
    gc.collect()
    clock = node_clock()
    assert ray_local.get(clock.running_for.remote(["k:n:1"]))["k:n:1"] is not None
