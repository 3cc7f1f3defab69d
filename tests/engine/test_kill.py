"""Interrupting the driver: Ctrl-C writes the tables of what finished; SIGKILL mid-cohort and a
rerun resumes (finished cases skipped by ``_DONE``, finished nodes from the cache), with
deliverables identical to a clean run's.

Every signal is sent at a state the test holds the cohort in (hold files in the cases' input
folders, see ``_cohort_script``), never after a delay: however loaded the machine, the cohort
cannot finish before the signal arrives."""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bcer.contracts import Image
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.planning import StaticPlanner
from bcer.io import write_nifti

ROOT = Path(__file__).resolve().parents[2]
script = importlib.import_module("tests.engine._cohort_script")

pytestmark = pytest.mark.timeout(300)
N = 6


def _start(data: Path, out: Path, cache: Path, address: str) -> subprocess.Popen:
    """The driver, its output to a file: a pipe nobody reads fills up (the driver joins a cluster
    whose workers' logs it receives) and blocks the driver's next write, so it could never exit."""
    log = open(out.parent / f"driver-{time.monotonic_ns()}.log", "wb")
    proc = subprocess.Popen([sys.executable, str(Path(script.__file__)), str(data), str(out), str(cache), address],
                            cwd=ROOT, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    proc.log_path = Path(log.name)  # type: ignore[attr-defined]
    log.close()  # the child holds its own copy
    return proc


def _output(proc: subprocess.Popen, last: int = 6000) -> str:
    return proc.log_path.read_bytes().decode(errors="replace")[-last:]  # type: ignore[attr-defined]


def _done(out: Path) -> set[str]:
    return {p.parent.name for p in out.glob("*/_DONE")}


def _wait(proc: subprocess.Popen, until, what: str, limit: float = 240.0) -> None:
    """Poll a state of the run (files it writes) until it holds; fails if the process ends first."""
    t0 = time.monotonic()
    while not until():
        if proc.poll() is not None:
            raise AssertionError(f"cohort process ended before {what}: {_output(proc, 3000)}")
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _exit_within(proc: subprocess.Popen, limit_s: float, what: str) -> None:
    """Wait for the driver to end; if it does not, fail with its output and thread stacks."""
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # faulthandler in _cohort_script: every thread's stack
        time.sleep(1.0)  # let the dump reach the pipe before the kill (diagnostics only)
        _killpg(proc, signal.SIGKILL)
        raise AssertionError(f"driver still running {limit_s} s after {what}:\n"
                             + _output(proc)) from None


def _cached_unfinished(out: Path, cache: Path) -> bool:
    """A node of a case that has no _DONE yet is already in the cache."""
    done = _done(out)
    for entry in cache.rglob("*.entry"):
        try:
            head = json.loads(entry.open("rb").readline())
        except (OSError, ValueError):
            continue
        if head.get("case") not in done:
            return True
    return False


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def _digests(out: Path) -> dict[str, dict]:
    return {d.name: json.loads((d / "provenance.json").read_text())["deliverables"]["m"]["files"]
            for d in sorted(out.iterdir()) if (d / "provenance.json").exists()}


def test_ctrl_c_then_sigkill_then_resume_matches_a_clean_run(ray_local, tmp_path):
    data, out, cache = tmp_path / "data", tmp_path / "out", tmp_path / "cache"
    for i in range(N):
        write_nifti(Image(np.full((5, 4, 3), float(i), np.float32), np.eye(4)), data / f"s{i}" / "t1.nii.gz")

    # 1. Ctrl-C once two cases are done: the tables hold them, in-flight cases get no _DONE.
    #    Cases s2.. are held at node a, so the cohort cannot finish before the signal.
    held_a = [data / f"s{i}" / script.HOLD_A for i in range(2, N)]
    for h in held_a:
        h.touch()
    address = ray_local.get_runtime_context().gcs_address
    proc = _start(data, out, cache, address)
    try:
        _wait(proc, lambda: len(_done(out)) >= 2, "two finished cases")
        proc.send_signal(signal.SIGINT)
        _exit_within(proc, 120, "SIGINT")
    finally:
        _killpg(proc, signal.SIGKILL)
    done_1 = _done(out)
    assert proc.returncode != 0 and 2 <= len(done_1) < N
    table = pq.read_table(out / "cohort.parquet").to_pylist()
    assert {r["case"] for r in table} == done_1 and all(r["status"] == "succeeded" for r in table)

    # 2. resume in a new driver, SIGKILL it while a node of an unfinished case is cached: the last
    #    case is held at node b (its node a finishes and is cached), the others are released
    held_b = data / f"s{N - 1}" / script.HOLD_B
    held_b.touch()
    for h in held_a:
        h.unlink()
    proc = _start(data, out, cache, address)
    try:
        _wait(proc, lambda: (len(_done(out)) > len(done_1) and (out / ".bcer_parts").exists()
                             and _cached_unfinished(out, cache)), "a table part and a cached node of an unfinished case")
        _killpg(proc, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        _killpg(proc, signal.SIGKILL)
    done_2 = _done(out)
    assert len(done_2) < N and (out / ".bcer_parts").exists()  # parts written before the kill survive

    # 3. rerun: finished cases are skipped, finished nodes come from the cache
    held_b.unlink()
    cases = script.cohort_cases(data)
    resumed = run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(script.plan()), cache=cache))
    rows = {r["case"]: r for r in resumed.rows}
    assert {c for c, r in rows.items() if r.get("resumed")} == done_2
    assert all(r["status"] == "succeeded" for r in rows.values())
    ev = [e for e in resumed.events.to_pylist() if e["run"] == resumed.run_id]
    assert not {e["case"] for e in ev} & done_2  # nothing of a finished case ran again
    assert any(e["kind"] == "cache_hit" for e in ev)  # a node finished before the kill was not recomputed

    clean = run_cohort(cases, CohortConfig(out=tmp_path / "clean", planner=StaticPlanner(script.plan())))
    assert all(r["status"] == "succeeded" for r in clean.rows)
    assert _digests(out) == _digests(tmp_path / "clean") and len(_digests(out)) == N
    events = pq.read_table(out / "events.parquet").to_pylist()
    assert {e["case"] for e in events} == {c.id for c in cases}  # every case's trace is in the table
