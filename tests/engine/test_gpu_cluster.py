"""GPU placement on a SIMULATED GPU cluster (``ray.cluster_utils.Cluster`` nodes with
``num_gpus``; Ray assigns GPU ids, there is no device). One subprocess (its own cluster) runs
every scenario of ``_gpu_script.py``; the tests read its report.

What is checked here is Ray's GPU accounting as bcer drives it (which GPU each node got, how
many nodes overlapped on a GPU, one actor per GPU loading its bundle once); what a real
device does (CUDA kernels, GPU memory) cannot be checked on this machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_cluster")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("_gpu_script.py")), str(out)],
                          capture_output=True, text=True, timeout=380, cwd=ROOT, env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(line[len("RESULT "):])


def test_gpu_nodes_spread_over_every_gpu_of_the_cluster(report):
    p = report["placement"]
    assert p["cluster"]["GPU"] == 4.0
    whole = p["whole"]
    assert whole["statuses"] == ["succeeded"] and whole["devices"] == ["device=cuda"]
    assert whole["gpu_runs"] == whole["cases"] == 8
    # 8 whole-GPU nodes on 2 nodes x 2 GPUs: every (node, GPU) pair was used, never two at once
    assert whole["distinct_gpus"] == 4
    assert len({k.split("/")[0] for k in whole["peak_per_gpu"]}) == 2
    assert whole["max_peak"] == 1 and whole["gpu_requests"] == ["1.0"]
    assert whole["provenance_has_placement"]  # node id + GPU ids are in provenance.json


def test_gpu_concurrency_k_shares_each_gpu_at_most_k_ways(report):
    k2 = report["placement"]["k2"]
    assert k2["statuses"] == ["succeeded"] and k2["gpu_requests"] == ["0.5"]  # whole GPU -> 1/K
    assert k2["distinct_gpus"] == 4
    assert k2["max_peak"] <= 2  # the bound, from the run intervals the tasks recorded
    assert k2["max_peak"] == 2, "16 nodes on 4 GPUs with K=2: some GPU should have run two at once"


def test_fractional_requests_share_a_gpu(report):
    q = report["placement"]["quarter"]
    assert q["gpu_requests"] == ["0.25"] and q["statuses"] == ["succeeded"]
    assert 2 <= q["max_peak"] <= 4  # four quarter-GPU nodes fit one GPU: they did share


def test_one_bundle_actor_per_gpu_loads_once_and_matches_the_task_path(report):
    a = report["actors"]
    assert a["cluster"]["GPU"] == 2.0 and a["reserved_gpus"] == 2.0
    assert a["served_statuses"] == ["succeeded"] and a["task_statuses"] == ["succeeded"]
    actors = a["actors"]
    assert len(actors) == 2
    # each actor on its own (node, GPU), each loaded the bundle exactly once and served cases
    assert len({(x["node"], tuple(x["gpu_ids"])) for x in actors}) == 2
    assert [x["bundle_loads"] for x in actors] == [1, 1]
    assert sum(x["calls"] for x in actors) == 4 and all(x["calls"] >= 1 for x in actors)
    assert all(x["simulated_gpu"] and x["device"] == "cpu" for x in actors)  # no CUDA here
    assert a["usage"]["actors"] == ["bundle-actor-0", "bundle-actor-1"] and a["usage"]["distinct_gpus"] == 2
    assert a["provenance_names_actor"]
    # the masks the actors wrote are exactly those of plain node tasks on the CPU path
    assert a["identical_masks"] and a["task_devices"] == ["device=cpu"]
    # as tasks, each node first got a simulated GPU torch cannot use; the Reflector moved it to CPU
    assert a["task_repairs"] == ["GPU not usable in the worker: run the CPU path"]


def test_a_killed_model_actor_is_restarted_and_serves_again(report):
    r = report["actors"]["restart"]
    assert r["statuses"] == ["succeeded"] and r["killed_restarted"] and r["kept_same_pid"]
    # the fresh process loaded its bundle once; the survivor never reloaded; both cases were served
    assert r["bundle_loads"] == [1, 1] and r["calls"] == 2
