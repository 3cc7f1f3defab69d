"""Per-node engine overhead: bcer's executor vs hand-written Ray tasks doing the same work.

Both sides run the same DAGs over the same input: per case, one task loads the NIfTI input,
then no-op nodes pass a tiny image along (a 20-node chain, and a fan-out of 1 -> 19), and the
last node's output is written as NIfTI. bcer adds binding, sandbox checks, placement, per-field
ObjectRefs, digests, the trace (events.jsonl) and provenance; the difference per node is the
engine's overhead.

    python benchmarks/engine_overhead.py [--cases 8] [--nodes 20] [--repeats 3]

bcer runs every case from one driver event loop (``run_case_workflows``), the whole DAG of a
case submitted at once. Arms: ``bcer`` is what a user gets by default (each linear chain of CPU
nodes one task, ``engine.segments``; branches separate tasks), ``bcer_per_node`` keeps one Ray
task per node (the pure per-node overhead), ``bcer_fused`` runs each case's DAG as one task
(what the cohort runner does for wide cohorts), ``ray`` is the same DAG as plain Ray tasks.

Writes ``benchmarks/results/engine_overhead.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)  # Ray workers start here, so benchmarks._noop_tools imports by name

import ray  # noqa: E402

from bcer.contracts import Case, Deliverable, Image, Node, SequenceRef, Workflow  # noqa: E402
from bcer.contracts.spec import Resources  # noqa: E402
from bcer.engine.executor import RunContext, run_case_workflows  # noqa: E402
from bcer.io import load_sequence, write_nifti  # noqa: E402

__import__("benchmarks._noop_tools")  # registers bench.noop
RES = Resources(num_cpus=1, memory_mb=0)  # one worker per CPU: no worker start-up inside timings


def make_case(root: Path, i: int) -> Case:
    img = Image(np.full((4, 4, 4), float(i), np.float32), np.eye(4))
    path = write_nifti(img, root / f"case{i}" / "t1.nii.gz")
    return Case(id=f"case{i}", root=str(path.parent), sequences={"T1": SequenceRef(path=str(path))})


def workflow(case: Case, shape: str, n: int) -> Workflow:
    """``chain``: n0 -> n1 -> ... ; ``fanout``: n0 -> {n1..n(n-1)}; the last node is the deliverable."""
    nodes = [Node(id="n0", tool="bench.noop", inputs={"img": "@seq.T1"}, outputs=["image"], resources=RES)]
    edges = []
    for k in range(1, n):
        src = f"n{k - 1}" if shape == "chain" else "n0"
        nodes.append(Node(id=f"n{k}", tool="bench.noop", inputs={"img": f"@node.{src}.image"},
                          outputs=["image"], resources=RES))
        edges.append((src, f"n{k}"))
    last = Deliverable(name="out", node=f"n{n - 1}", field="image", file="out.nii.gz")
    return Workflow(case_id=case.id, nodes=nodes, edges=edges, deliverables=[last])


def run_bcer(cases: list[Case], shape: str, n: int, out: Path, fuse: bool = False, segments: bool = True) -> float:
    run_id = uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    outs = run_case_workflows([(workflow(c, shape, n), c, RunContext(run_id=run_id, output_dir=out / run_id / c.id))
                               for c in cases], fuse=fuse, segments=segments)
    wall = time.perf_counter() - t0
    bad = [o.error for o in outs if o.status != "succeeded"]
    if bad:
        raise RuntimeError(f"bcer run failed: {bad[0]}")
    return wall


@ray.remote(num_cpus=1)
def _load(ref: SequenceRef) -> Image:
    return load_sequence(ref)


@ray.remote(num_cpus=1)
def _noop(img: Image) -> Image:
    return img


def run_plain_ray(cases: list[Case], shape: str, n: int, out: Path) -> float:
    t0 = time.perf_counter()
    per_case: list[tuple[Case, list]] = []
    for c in cases:
        first = _noop.remote(_load.remote(c.sequences["T1"]))
        refs = [first]
        for _ in range(1, n):
            refs.append(_noop.remote(refs[-1] if shape == "chain" else first))
        per_case.append((c, refs))
    run_id = uuid.uuid4().hex[:8]
    for c, refs in per_case:  # every node must have finished (as bcer checks), then the output is written
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        write_nifti(ray.get(refs[-1]), out / run_id / c.id / "out.nii.gz")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine_overhead.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix="bcer_bench_ray_"))
    tmp = Path(tempfile.mkdtemp(prefix="bcer_bench_"))
    cases = [make_case(tmp / "in", i) for i in range(args.cases)]
    results: dict[str, dict] = {}
    for shape in ("chain", "fanout"):
        run_bcer(cases, shape, args.nodes, tmp / "warm")  # warm workers and imports on both sides
        run_bcer(cases, shape, args.nodes, tmp / "warm", segments=False)
        run_bcer(cases, shape, args.nodes, tmp / "warm", fuse=True)
        run_plain_ray(cases, shape, args.nodes, tmp / "warm")
        b, p, f, r = [], [], [], []
        cpu: dict[str, float] = dict.fromkeys(("bcer", "bcer_per_node", "bcer_fused", "ray"), 0.0)
        for _ in range(args.repeats):  # interleaved, so load drifts hit every arm alike
            for arm, walls, fn in (("bcer", b, lambda: run_bcer(cases, shape, args.nodes, tmp / "bcer")),
                                   ("bcer_per_node", p, lambda: run_bcer(cases, shape, args.nodes, tmp / "bcer",
                                                                         segments=False)),
                                   ("bcer_fused", f, lambda: run_bcer(cases, shape, args.nodes, tmp / "bcer",
                                                                      fuse=True)),
                                   ("ray", r, lambda: run_plain_ray(cases, shape, args.nodes, tmp / "ray"))):
                c0 = time.process_time()  # the driver's own CPU (Python + Ray's core worker threads)
                walls.append(fn())
                cpu[arm] += time.process_time() - c0
        nodes = args.cases * args.nodes
        bm, pm, fm, rm = (statistics.median(x) for x in (b, p, f, r))
        results[shape] = {"bcer_wall_s": b, "bcer_per_node_wall_s": p, "bcer_fused_wall_s": f, "ray_wall_s": r,
                          "bcer_median_s": round(bm, 4), "bcer_per_node_median_s": round(pm, 4),
                          "bcer_fused_median_s": round(fm, 4), "ray_median_s": round(rm, 4), "nodes": nodes,
                          "bcer_ms_per_node": round(1000 * bm / nodes, 3),
                          "bcer_per_node_ms_per_node": round(1000 * pm / nodes, 3),
                          "ray_ms_per_node": round(1000 * rm / nodes, 3),
                          "overhead_per_node_ms": round(1000 * (bm - rm) / nodes, 3),
                          "per_node_overhead_per_node_ms": round(1000 * (pm - rm) / nodes, 3),
                          "ratio": round(bm / rm, 3), "ratio_per_node": round(pm / rm, 3),
                          "ratio_fused": round(fm / rm, 3),
                          "driver_cpu_ms_per_node": {k: round(1000 * v / args.repeats / nodes, 3)
                                                     for k, v in cpu.items()}}
        print(f"{shape:7s} bcer {bm:.3f}s  per-node {pm:.3f}s  fused {fm:.3f}s  ray {rm:.3f}s  ratio {bm / rm:.2f} "
              f"(per-node {pm / rm:.2f}, fused {fm / rm:.2f})")
    report = {"benchmark": "engine_overhead", "cases": args.cases, "nodes_per_case": args.nodes,
              "repeats": args.repeats, "ray_num_cpus": args.num_cpus, "ray_version": ray.__version__,
              "python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": results,
              "ratio": {k: v["ratio"] for k, v in results.items()},
              "ratio_per_node": {k: v["ratio_per_node"] for k, v in results.items()},
              "ratio_fused": {k: v["ratio_fused"] for k, v in results.items()},
              "load_average_1min": round(os.getloadavg()[0], 2),
              "uptime": os.popen("uptime").read().strip(),
              "command": "python benchmarks/engine_overhead.py " + " ".join(sys.argv[1:]),
              "note": "bcer = run_case_workflows with the default policy (one driver event loop, whole-DAG "
                      "submission, each linear chain of CPU nodes one task, and nodes of a tool the driver has measured under "
                      "2 ms join their parent's: the chain is one segment; the fan-out is one segment once the "
                      "warm-up run has shown bench.noop tiny, before that 20 tasks); bcer_per_node: one task per node; bcer_fused: one task per case; "
                      "ray = the same DAG as plain ray.remote tasks; all load the input in a task and write "
                      "one NIfTI; arms interleaved per repeat."}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")
    ray.shutdown()


if __name__ == "__main__":
    main()
