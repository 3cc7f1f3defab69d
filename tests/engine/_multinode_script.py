"""Run by test_multinode in its own process: a 3-node simulated cluster loses a worker node
while a cohort runs; every case must still finish with its deliverables."""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(out: Path) -> dict:
    import importlib

    import ray
    from ray.cluster_utils import Cluster

    from bcer.contracts import Case, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract, Validator
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.planning import StaticPlanner
    from bcer.io import write_nifti

    importlib.import_module("tests.engine._exec_tools")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    cases = []
    for i in range(4):
        d = out / "in" / f"c{i}"
        d.mkdir(parents=True)
        p = write_nifti(Image(np.full((6, 6, 3), float(i), np.float32), np.eye(4)), d / "t1.nii.gz")
        cases.append(Case(id=f"c{i}", root=str(d), sequences={"T1": SequenceRef(path=str(p))}))
    plan = PlanSketch(goal="slow steps", steps=[
        {"id": "a", "tool": "xtoy.step_1cpu", "args": {"img": "@seq.T1", "sleep_s": 1.5}},
        {"id": "b", "tool": "xtoy.step_1cpu", "args": {"img": "@node.a.image", "sleep_s": 1.5,
                                                       "hold_file": "HOLD_b"}}])
    contract = TaskContract(id="mn", domain="any", goal="g", inputs=["T1"], milestones=["stepped"],
                            deliverables=[DeliverableSpec(name="out", kind="image", milestone="stepped",
                                                          file="out.nii.gz",
                                                          validators=[Validator(type="nifti_nonempty")])])
    killed = {}

    holds = [Path(c.root) / "HOLD_b" for c in cases]  # every case waits at node b until the node is gone
    for h in holds:
        h.touch()

    def a_finished() -> bool:
        for f in (out / "out").glob("*/events.jsonl"):
            for line in f.read_text().splitlines():
                try:
                    e = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if e.get("kind") == "succeeded" and e.get("node") == "a":
                    return True
        return False

    def kill_mid_run() -> None:
        """Remove a worker node once a node a has finished: the cohort is then surely mid-run
        (every node b is held until the removal), however slow the machine."""
        deadline = time.monotonic() + 200
        while not a_finished() and time.monotonic() < deadline:
            time.sleep(0.05)
        killed["node"] = workers[0].node_id
        cluster.remove_node(workers[0])
        for h in holds:
            h.unlink()

    from bcer.engine.cluster import ensure_ray

    resources = ensure_ray(cluster.address)
    assert resources.get("CPU") == 3.0, resources
    threading.Thread(target=kill_mid_run, daemon=True).start()
    # the driver joins the existing cluster by address, as `bcer cohort --address HOST:PORT` does
    # audit: the watcher above reads each case's events.jsonl while the cohort runs; one task per
    # node (fuse="never"): a chain a -> b run as one segment reports a only when b is done, and b
    # is held until the watcher sees a (it then waited out its 200 s deadline on every run)
    result = run_cohort(cases, CohortConfig(out=out / "out", planner=StaticPlanner(plan), contract=contract,
                                            max_in_flight=4, address=cluster.address, audit=True, fuse="never"))
    report_nodes = len([n for n in ray.nodes() if n["Alive"]])
    events = result.events.to_pylist()
    # the same cohort on the surviving nodes, undisturbed: every deliverable must be byte-identical
    clean = run_cohort(cases, CohortConfig(out=out / "clean", planner=StaticPlanner(plan), contract=contract,
                                           max_in_flight=4, address=cluster.address))

    def digests(root: Path) -> dict:
        return {c.id: json.loads((root / c.id / "provenance.json").read_text())["deliverables"]["out"]["files"]
                for c in cases if (root / c.id / "provenance.json").exists()}

    same = digests(out / "out") == digests(out / "clean") and len(digests(out / "clean")) == len(cases)
    values = {r["case"]: float(np.asarray(
        __import__("nibabel").load(str(out / "out" / r["case"] / "out.nii.gz")).dataobj).mean())
        for r in result.rows if r["status"] == "succeeded"}
    report = {"statuses": {r["case"]: r["status"] for r in result.rows}, "killed": killed.get("node", "")[:12],
              "workers": sorted({e["worker"].split(":")[0] for e in events if e["kind"] == "succeeded" and e["worker"]}),
              "values": values, "alive_nodes_after": report_nodes, "identical_to_clean_run": same,
              "clean_statuses": {r["case"]: r["status"] for r in clean.rows}}
    ray.shutdown()
    cluster.shutdown()
    return report


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(Path(sys.argv[1]))))
