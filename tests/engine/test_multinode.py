"""Multi-node behaviour on ray.cluster_utils.Cluster (own process: its own Ray cluster)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)


def test_cohort_survives_losing_a_worker_node(tmp_path):
    script = Path(__file__).with_name("_multinode_script.py")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                          timeout=280, cwd=Path(__file__).resolve().parents[2])
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(line[len("RESULT "):])
    assert report["killed"], "the worker node was not removed during the run"
    assert report["statuses"] == {f"c{i}": "succeeded" for i in range(4)}
    # each case's deliverable is exactly what a clean run gives: input value + 1 + 1
    assert report["values"] == {f"c{i}": i + 2.0 for i in range(4)}
    assert len(report["workers"]) >= 2  # the work really was spread over several nodes
    assert report["alive_nodes_after"] == 2  # head + the surviving worker
    assert set(report["clean_statuses"].values()) == {"succeeded"}
    assert report["identical_to_clean_run"]  # file digests equal those of an undisturbed run
