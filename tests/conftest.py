"""Shared fixtures: one local Ray session per test session, in a temp dir of our own, and one
small bench of every task (the bench tests and the page tests read the same run)."""
from __future__ import annotations

import os
import shutil
import tempfile

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_local():
    """A 2-CPU local Ray session shared by every test that needs Ray."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    tmp = tempfile.mkdtemp(prefix="bcer_ray_")
    ray.init(address="local", num_cpus=2, include_dashboard=False, _temp_dir=tmp,
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)  # the session's logs and spilled objects


@pytest.fixture(autouse=True)
def fresh_segment_cost_model():
    """Each test starts with a driver that has seen no tool run (``engine.segments.is_tiny``),
    so which nodes share a task never depends on the tests run before it."""
    from bcer.engine import segments

    segments._SEEN.clear()
    yield
    segments._SEEN.clear()


@pytest.fixture(scope="session")
def bench_all(ray_local, tmp_path_factory):
    """``bcer bench`` of every task, one small case each (seed 3): its report and its folder.
    Readers must not change the folder's runs (a test that needs to, copies them)."""
    from bcer.bench import run_bench

    out = tmp_path_factory.mktemp("bench_all")
    return run_bench("all", 1, out, size="small", seed=3, max_in_flight=2), out
