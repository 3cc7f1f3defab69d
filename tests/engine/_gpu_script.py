"""Run by test_gpu_cluster (and benchmarks/gpu_placement.py) in its own process: cohorts on a
SIMULATED GPU cluster (``ray.cluster_utils.Cluster`` nodes with ``num_gpus``; Ray assigns GPU
ids and CUDA_VISIBLE_DEVICES, there is no device). Prints ``RESULT <json>``.

``placement``: head (no GPU) + 2 nodes x 2 GPUs; GPU-tagged toy nodes with whole-GPU
requests, with ``gpu_concurrency=K``, and 0.25-GPU requests; per-GPU use read back from
the trace (``bcer.engine.gpu_usage``).
``actors``: head + 2 nodes x 1 GPU; seg.cardiac with the shipped bundle served by one actor
per GPU, then the same cases as plain tasks; masks compared.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _events(out: Path) -> list[dict[str, Any]]:
    from bcer.engine.trace import read_case_trace

    cases = [d for d in sorted(out.iterdir()) if d.is_dir() and (d / "provenance.json").exists()]
    return [e.model_dump() for d in cases for e in read_case_trace(d)]


def _toy_cases(root: Path, n: int) -> list:
    from bcer.contracts import Case, Image, SequenceRef
    from bcer.io import write_nifti

    cases = []
    for i in range(n):
        d = root / f"g{i:02d}"
        d.mkdir(parents=True, exist_ok=True)
        p = write_nifti(Image(np.full((4, 4, 2), float(i), np.float32), np.eye(4)), d / "t1.nii.gz")
        cases.append(Case(id=f"g{i:02d}", root=str(d), sequences={"T1": SequenceRef(path=str(p))}))
    return cases


def _find(obj: Any, key: str) -> list:
    """Every value of ``key`` anywhere in a JSON document."""
    if isinstance(obj, dict):
        return ([obj[key]] if key in obj else []) + [v for x in obj.values() for v in _find(x, key)]
    if isinstance(obj, list):
        return [v for x in obj for v in _find(x, key)]
    return []


def _toy_cohort(out: Path, cases: list, tool: str, sleep_s: float, k: int | None) -> dict[str, Any]:
    from bcer.contracts import PlanSketch
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.gpu_usage import usage_summary
    from bcer.engine.planning import StaticPlanner

    plan = PlanSketch(goal="hold a GPU", steps=[{"id": "hold", "tool": tool,
                                                 "args": {"img": "@seq.T1", "sleep_s": sleep_s}}])
    t0 = time.time()
    res = run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(plan), max_in_flight=len(cases),
                                         gpu_concurrency=k, fuse="never"))
    wall = time.time() - t0
    events = _events(out)
    usage = usage_summary(events)
    devices = sorted({e["message"] for e in events if e["kind"] == "succeeded"})
    fallbacks = sum(e["kind"] == "fallback" for e in events)
    prov = json.loads((out / cases[0].id / "provenance.json").read_text())
    requests = sorted({json.dumps(r) for r in _find(prov, "gpu_request")})
    return {"gpu_requests": requests, "tool": tool, "k": k, "cases": len(cases), "sleep_s": sleep_s, "wall_s": round(wall, 2),
            "statuses": sorted({r["status"] for r in res.rows}), "devices": devices, "fallbacks": fallbacks,
            "provenance_has_placement": "placement" in json.dumps(prov), **usage}


def placement(out: Path, n: int = 16, sleep_s: float = 0.8) -> dict[str, Any]:
    """GPU-tagged toy cohorts on the connected cluster (head + 2 nodes x 2 GPUs)."""
    import ray

    importlib.import_module("tests.engine._gpu_tools")
    cases = _toy_cases(out / "in", n)
    return {"cluster": _resources(ray),
            "whole": _toy_cohort(out / "whole", cases[: n // 2], "xgpu.whole", sleep_s, None),
            "k2": _toy_cohort(out / "k2", cases, "xgpu.whole", sleep_s, 2),
            # quarter GPUs with K=2 (0.25 raised to 1/2) is gpu_share's unit test and a row of
            # benchmarks/gpu_placement.py: K's cap end to end is shown by "k2" above
            "quarter": _toy_cohort(out / "quarter", cases, "xgpu.quarter", sleep_s, None)}


def _resources(ray: Any) -> dict[str, float]:
    return {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}


def _cardiac_cases(root: Path, n: int) -> list:
    from bcer.contracts import Case, SequenceRef
    from bcer.contracts.artifacts import ArtifactKind
    from bcer.datasets.cardiac import make_cardiac
    from bcer.io import write_nifti

    cases = []
    for i in range(n):
        d = root / f"h{i}"
        d.mkdir(parents=True, exist_ok=True)
        cine = make_cardiac(f"h{i}", 9000 + i, size="small").sequences["CINE"]
        p = write_nifti(cine, d / "cine.nii.gz")
        cases.append(Case(id=f"h{i}", root=str(d),
                          sequences={"CINE": SequenceRef(path=str(p), kind=ArtifactKind.cine)}))
    return cases


def _seg_plan() -> tuple[Any, Any]:
    from bcer.contracts import DeliverableSpec, PlanSketch, TaskContract, Validator
    from bcer.tools.seg.bundle import shipped_bundle

    plan = PlanSketch(goal="segment", steps=[{"id": "seg", "tool": "seg.cardiac", "args": {
        "cine": "@seq.CINE", "bundle_dir": str(shipped_bundle()), "roi_size": 64}}])
    contract = TaskContract(id="seg", domain="cardiac", goal="g", inputs=["CINE"], milestones=["segmentation"],
                            deliverables=[DeliverableSpec(name="seg", kind="mask", milestone="segmentation",
                                                          file="seg.nii.gz",
                                                          validators=[Validator(type="nifti_nonempty")])])
    return plan, contract


def _served_cohort(out: Path, cases: list, server: Any) -> Any:
    """The cohort runner with the bundle nodes handed to ``server``."""
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.planning import StaticPlanner

    plan, contract = _seg_plan()
    return run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(plan), contract=contract,
                                          max_in_flight=len(cases), model_server=server,
                                          fuse="always"))  # served nodes still go to the actors


def _task_cohort(out: Path, cases: list) -> Any:
    """The in-task path: the same cohort without a model server, one case at a time (so one
    worker, warm after the first case, runs them: the comparison is about outputs, not speed).
    Each seg node first gets a simulated GPU and device "cuda", which torch cannot use here
    (typed ``resource``, ``no_device``); the Reflector moves it to its CPU path."""
    from bcer.agents.repair.reflector import Reflector
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.planning import StaticPlanner

    plan, contract = _seg_plan()
    return run_cohort(cases, CohortConfig(out=out, planner=StaticPlanner(plan), contract=contract,
                                          max_in_flight=1, repairer=Reflector(), fuse="never"))


def _kill_and_serve(out: Path, cases: list, pool: Any, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """SIGKILL the first actor's process, then serve cases again: Ray restarts that actor (it
    loads its bundle again, one more torch + monai import: the second actor is left alive, to
    show a restart touches only the actor that died) and the cases succeed."""
    import signal

    os.kill(stats[0]["pid"], signal.SIGKILL)
    time.sleep(1.0)
    served = _served_cohort(out, cases, pool)
    after = {a["name"]: a for a in pool.stats()}
    killed, kept = after[stats[0]["name"]], after[stats[1]["name"]]
    return {"statuses": sorted({r["status"] for r in served.rows}),
            "killed_restarted": killed["pid"] != stats[0]["pid"], "kept_same_pid": kept["pid"] == stats[1]["pid"],
            "bundle_loads": [killed["bundle_loads"], kept["bundle_loads"]],
            "calls": killed["calls"] + kept["calls"] - stats[1]["calls"]}


def actors(out: Path, n: int = 4) -> dict[str, Any]:
    """Bundle inference on the connected cluster (head + 2 nodes x 1 GPU): one actor per GPU,
    then the same cases as plain tasks."""
    import ray

    from bcer.agents.model_server import BundleActorPool
    from bcer.engine.gpu_usage import usage_summary
    from bcer.io import read_nifti
    from bcer.tools.seg.bundle import shipped_bundle

    cases = _cardiac_cases(out / "in", n)
    t0 = time.time()
    pool = BundleActorPool({"seg.cardiac": str(shipped_bundle())})
    t_pool = time.time() - t0
    try:
        served = _served_cohort(out / "actor", cases, pool)
        stats = pool.stats()
        reserved = pool.reserved_gpus
        restart = _kill_and_serve(out / "restart", cases[:2], pool, stats)
    finally:
        pool.close()
    t_served = time.time() - t0 - t_pool
    t1 = time.time()
    # one of the four cases as a plain task: a GPU attempt, a repair and a CPU run (11-20 s a case
    # here, the first import of torch and monai in that worker included); the paths run the same
    # deterministic code, so one case shows they agree as well as four at a quarter of the cost
    compared = cases[:1]
    tasks = _task_cohort(out / "task", compared)
    t_tasks = time.time() - t1
    events = _events(out / "actor")
    same = all(np.array_equal(read_nifti(out / "actor" / c.id / "seg.nii.gz").data,
                              read_nifti(out / "task" / c.id / "seg.nii.gz").data) for c in compared)
    task_events = _events(out / "task")
    prov = json.loads((out / "actor" / cases[0].id / "provenance.json").read_text())
    return {"cluster": _resources(ray), "reserved_gpus": reserved,
            "served_statuses": sorted({r["status"] for r in served.rows}),
            "task_statuses": sorted({r["status"] for r in tasks.rows}),
            "actors": [{k: s[k] for k in ("name", "gpu_ids", "device", "simulated_gpu", "bundle_loads",
                                          "calls")} | {"node": s.get("node_id", "")[:12]} for s in stats],
            "usage": usage_summary(events), "identical_masks": same,
            "provenance_names_actor": "bundle-actor-" in json.dumps(prov), "restart": restart,
            "task_devices": sorted({e["message"] for e in task_events if e["kind"] == "succeeded"}),
            "task_repairs": sorted({e["message"] for e in task_events if e["kind"] == "repaired"}),
            "wall_s": {"pool_start": round(t_pool, 2), "served_cohort": round(t_served, 2),
                       "task_cohort_one_at_a_time": round(t_tasks, 2)}}


def main(out: Path, which: tuple[str, ...] = ("placement", "actors"), n_toy: int = 16,
         n_seg: int = 4) -> dict[str, Any]:
    """Both scenarios on one simulated cluster: 2 nodes x 2 GPUs, then 2 nodes x 1 GPU."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 0,
                                                           "include_dashboard": False})
    result: dict[str, Any] = {}
    try:
        if "placement" in which:
            # 4 logical CPUs per node: Ray starts about that many workers per node, and K=2 on two
            # GPUs needs 4 nodes running at once there
            nodes = [cluster.add_node(num_cpus=4, num_gpus=2) for _ in range(2)]
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False)
            result["placement"] = placement(out / "placement", n_toy)
            for node in nodes:
                cluster.remove_node(node)
        if "actors" in which:
            for _ in range(2):
                cluster.add_node(num_cpus=2, num_gpus=1)
            cluster.wait_for_nodes()
            if not ray.is_initialized():
                ray.init(address=cluster.address, log_to_driver=False)
            deadline = time.time() + 60
            while ray.cluster_resources().get("GPU") != 2.0 and time.time() < deadline:
                time.sleep(0.2)  # the removed nodes' GPUs leave the totals a moment later
            result["actors"] = actors(out / "actors", n_seg)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]), tuple(sys.argv[2:]) or ("placement", "actors"))))
