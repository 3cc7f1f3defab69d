"""GPU placement on a SIMULATED GPU cluster -> benchmarks/results/gpu_placement.json.

There is no physical GPU here: ``ray.cluster_utils.Cluster`` starts nodes that advertise
``num_gpus``; Ray assigns GPU ids (``ray.get_gpu_ids()``, CUDA_VISIBLE_DEVICES) and accounts
for fractional shares exactly as on a real cluster, but nothing runs on a device. What this
measures is bcer's placement as Ray carries it out:

* ``spread``: whole-GPU nodes over head (no GPU) + 2 nodes x 2 GPUs: distinct (node, GPU)
  pairs used and the peak number of nodes that overlapped on one GPU, for K = none, 2, 4
  (``--gpu-concurrency``), and for 0.25-GPU nodes with and without K=2. Peaks come from the
  run intervals the tasks recorded (``bcer.engine.gpu_usage``).
* ``actors``: seg.cardiac with the shipped bundle on head + 2 nodes x 1 GPU, served by one
  actor per GPU (loads per actor, calls per actor) vs. the same cases as plain tasks on the
  CPU path (masks compared; wall times on this shared 2-core machine are indicative only).

Run: ``PYTHONPATH=$PWD python benchmarks/gpu_placement.py [--cases 16] [--seg-cases 8]``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULT = ROOT / "benchmarks" / "results" / "gpu_placement.json"
_KEEP = ("tool", "k", "cases", "wall_s", "statuses", "gpu_requests", "distinct_gpus", "max_peak", "peak_per_gpu",
         "nodes_per_gpu", "fallbacks")


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def spread(out: Path, n: int, sleep_s: float) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    script = importlib.import_module("tests.engine._gpu_script")
    importlib.import_module("tests.engine._gpu_tools")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0, "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=8, num_gpus=2)  # logical CPUs: room for K=4 on both GPUs
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        cases = script._toy_cases(out / "in", n)
        script._toy_cohort(out / "warmup", cases, "xgpu.whole", 0.0, 4)  # start the workers once
        runs = {}
        for name, tool, k in [("whole", "xgpu.whole", None), ("whole_k2", "xgpu.whole", 2),
                              ("whole_k4", "xgpu.whole", 4), ("quarter", "xgpu.quarter", None),
                              ("quarter_k2", "xgpu.quarter", 2)]:
            r = script._toy_cohort(out / name, cases, tool, sleep_s, k)
            runs[name] = {key: r[key] for key in _KEEP}
            runs[name]["peak_within_bound"] = r["max_peak"] <= (k or (4 if tool == "xgpu.quarter" else 1))
        return {"cluster": script._resources(ray), "nodes": "head (2 CPU, 0 GPU) + 2 x (8 CPU, 2 GPU)",
                "sleep_s_per_node": sleep_s, "runs": runs}
    finally:
        ray.shutdown()
        cluster.shutdown()


def actors(out: Path, n: int) -> dict:
    script = importlib.import_module("tests.engine._gpu_script")
    return script.main(out, ("actors",), n_seg=n)["actors"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--seg-cases", type=int, default=8)
    ap.add_argument("--sleep", type=float, default=0.8)
    ap.add_argument("--out", type=Path, default=RESULT)
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="bcer_gpu_bench_") as tmp:
        t0 = time.time()
        result = {"benchmark": "gpu_placement", "simulated": True,
                  "note": ("SIMULATED GPUs: ray.cluster_utils.Cluster nodes with num_gpus on a machine without a GPU. "
                           "GPU ids, fractional shares and per-GPU concurrency are Ray's real accounting; nothing ran "
                           "on a device (bundle actors computed on CPU). Wall times are from a shared 2-core machine."),
                  "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_before": load_before},
                  "spread": spread(Path(tmp) / "spread", a.cases, a.sleep),
                  "actors": actors(Path(tmp) / "actors", a.seg_cases)}
        result["host"]["load_after"] = _load()
        result["wall_s"] = round(time.time() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("simulated", "wall_s")} | {
        "spread": {n: (r["distinct_gpus"], r["max_peak"], r["k"]) for n, r in result["spread"]["runs"].items()},
        "actors": [(x["name"], x["bundle_loads"], x["calls"]) for x in result["actors"]["actors"]]}))


if __name__ == "__main__":
    main()
