"""End to end as users run a cluster: `ray start --head` on loopback with token auth, then
`ray job submit --working-dir . -- bcer cohort ...`; the job's cohort is complete and valid, and
a cohort whose cases all fail is a FAILED job (bcer's exit code 1), never SUCCEEDED.

The head gets its own ports and temp dir, so it never meets another Ray on the machine, and
it is torn down by killing exactly its own processes (never `ray stop`, which would stop every
Ray session of the machine).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, RAY_AUTH_MODE="token", RAY_USAGE_STATS_ENABLED="0")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `bcer` and `ray` of this venv
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.pop("RAY_ADDRESS", None)
    return env


def _kill_session(temp_dir: Path) -> None:
    import psutil

    procs = [p for p in psutil.process_iter(["cmdline"]) if str(temp_dir) in " ".join(p.info["cmdline"] or [])]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=3)  # then SIGKILL: a raylet can sit out SIGTERM for 10 s
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture
def head(tmp_path):
    temp_dir = Path(f"/tmp/bcer_head_{os.getpid()}_{free_port()}")  # short: Ray's socket paths have a length limit
    ports = {k: free_port() for k in ("gcs", "dashboard", "agent", "client")}
    cmd = ["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={ports['gcs']}", "--num-cpus=2",
           "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
           f"--dashboard-agent-listen-port={ports['agent']}", f"--ray-client-server-port={ports['client']}",
           f"--temp-dir={temp_dir}", "--disable-usage-stats"]
    try:
        started = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        assert (Path.home() / ".ray" / "auth_token").exists()  # the token `ray start --head` wrote
        yield f"http://127.0.0.1:{ports['dashboard']}"
    finally:
        _kill_session(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _submit(address: str, *entrypoint: str, tries: int = 12) -> subprocess.CompletedProcess:
    """`ray job submit`, retried while the node's job agent is still starting (a fresh head)."""
    cmd = ["ray", "job", "submit", "--address", address, "--working-dir", str(ROOT), "--", *entrypoint]
    for _ in range(tries):
        done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=480, cwd=ROOT)
        if "No available agent" not in done.stdout + done.stderr and "Failed to connect" not in done.stderr:
            return done
        time.sleep(5)
    return done


def test_ray_job_submit_runs_a_cohort_on_a_token_auth_head(head, tmp_path):
    from bcer.datasets.synth import synth_cohort

    data, out = tmp_path / "data", tmp_path / "out"
    synth_cohort("brain", 2, data, layout="brats", seed=4, size="small")
    done = _submit(head, "bcer", "cohort", "--data", str(data), "--task", "segment_brain", "--out", str(out))
    log = done.stdout + done.stderr
    assert done.returncode == 0 and "succeeded" in log, log[-3000:]
    rows = [json.loads(p.read_text()) for p in sorted(out.glob("*/_DONE"))]  # a succeeded case's row
    assert [r["status"] for r in rows] == ["succeeded", "succeeded"] and all(r["sr"] == 1 for r in rows)
    assert (out / "cohort.parquet").exists() and all((out / r["case"] / "_DONE").exists() for r in rows)
    desc = json.loads((out / "dataset_description.json").read_text())
    assert desc["bcer"]["summary"]["succeeded"] == 2
    # the same brain cases under a cardiac task: every case is rejected, the job must say FAILED
    bad = _submit(head, "bcer", "cohort", "--data", str(data), "--task", "cardiac_report", "--out", str(tmp_path / "bad"),
                  "--no-report")
    log = bad.stdout + bad.stderr
    # Ray's own words for a FAILED job, and the exit code it read from bcer
    assert bad.returncode != 0 and re.search(r"Job '\S+' failed", log), log[-3000:]
    assert "command failed with exit code 1" in log and "0/2 cases succeeded" in log, log[-3000:]
    assert sorted(json.loads(p.read_text())["status"] for p in (tmp_path / "bad").glob("*/result.json")) == [
        "rejected", "rejected"]
