"""Issue 11's five-step pipeline, written as five user tools, in every runner side by side.

Per case: load -> N4 -> CurvatureFlow -> resample 2 mm -> two measurement branches (foreground
volume, intensity statistics), both written as table deliverables (JSON + CSV, the same
writer everywhere), on ``--cases`` synthetic biased, noisy ellipsoid volumes.

Arms (each cold arm in a fresh interpreter, so imports and workers really are cold):

- ``sequential``: one process, a plain loop; its step times give the floor
  (sum of step times / CPUs).
- ``processes``: the same loop in ``--cpus`` processes side by side (no Ray, cases dealt
  round-robin, timed after every process has imported): what the floor can really be here.
- ``ray_cold``: hand-written Ray tasks (one per step, chained by ObjectRefs), ``ray.init`` included.
- ``bcer_cold``: ``bcer.Study`` with a plan sketch; it starts its local cluster itself.
- ``warm``: one long-lived local cluster: the hand-written Ray tasks and bcer each run once to
  warm up, then are timed (``ray_warm``, ``bcer_warm``); then bcer with a node cache: a full
  run filling it, and a rerun with one changed downstream param (the intensity percentile),
  whose executed nodes are counted from events.

    python benchmarks/pipeline.py --cases 16 --shape 128,128,80

Writes ``benchmarks/results/pipeline.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)  # Ray workers start here: benchmarks._pipeline_tools imports by name
os.environ.setdefault("OMP_NUM_THREADS", "1")
RESULT = ROOT / "benchmarks" / "results" / "pipeline.json"
STEPS = ("load", "n4", "smooth", "resample", "volume", "intensity")


def sketch(percentile: float = 95.0):
    from bcer.contracts import PlanSketch

    return PlanSketch(goal="n4, smooth, resample, measure", steps=[
        {"id": "n4", "tool": "pipe.n4", "args": {"img": "@seq.T1"}},
        {"id": "smooth", "tool": "pipe.smooth", "args": {"img": "@node.n4.image"}},
        {"id": "resample", "tool": "pipe.resample", "args": {"img": "@node.smooth.image"}},
        {"id": "volume", "tool": "pipe.volume", "args": {"img": "@node.resample.image"}},
        {"id": "intensity", "tool": "pipe.intensity", "args": {"img": "@node.resample.image",
                                                               "percentile": percentile}}])


def make_cases(root: Path, n: int, shape: tuple[int, int, int]) -> None:
    from bcer.contracts import Image
    from bcer.io import write_nifti

    rng = np.random.default_rng(11)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, k) for k in shape], indexing="ij")
    for i in range(n):
        r = 0.7 + 0.1 * rng.random(3)
        brain = ((x / r[0]) ** 2 + (y / r[1]) ** 2 + (z / r[2]) ** 2 < 1).astype(np.float32)
        bias = np.exp(0.3 * rng.normal() * x + 0.3 * rng.normal() * y)
        data = (100 * brain + 20) * bias + rng.normal(0, 5, shape)
        write_nifti(Image(data.astype(np.float32), np.eye(4)), root / f"p{i:03d}" / "t1.nii.gz")


def load_cases(root: Path):
    from bcer.contracts import Case, SequenceRef

    return [Case(id=d.name, root=str(d), sequences={"T1": SequenceRef(path=str(d / "t1.nii.gz"))})
            for d in sorted(root.iterdir())]


# ---- arms (each returns a dict) ------------------------------------------------------------------
def arm_sequential(data: Path, out: Path, part: tuple[int, int] = (0, 1)) -> dict:
    """The plain loop (over every ``part[1]``-th case from ``part[0]``)."""
    from benchmarks import _pipeline_tools as t
    from bcer.engine.outputs import write_artifact
    from bcer.io import load_sequence

    steps = dict.fromkeys(STEPS, 0.0)
    t0 = time.perf_counter()
    for case in load_cases(data)[part[0]::part[1]]:
        s = time.perf_counter()
        img = load_sequence(case.sequences["T1"])
        steps["load"] += time.perf_counter() - s
        for name, fn in (("n4", lambda i: t.n4_step(i, t.N4Params())),
                         ("smooth", lambda i: t.smooth_step(i, t.FlowParams())),
                         ("resample", lambda i: t.resample_step(i, t.SpacingParams()))):
            s = time.perf_counter()
            img = fn(img)
            steps[name] += time.perf_counter() - s
        s = time.perf_counter()
        write_artifact(t.volume_step(img), out / case.id / "volume.json")
        steps["volume"] += time.perf_counter() - s
        s = time.perf_counter()
        write_artifact(t.intensity_step(img, t.IntensityParams()), out / case.id / "intensity.json")
        steps["intensity"] += time.perf_counter() - s
    return {"wall_s": time.perf_counter() - t0, "step_s": steps}


def _loop_part(data: Path, out: Path, part: tuple[int, int], barrier: Any, results: Any) -> None:
    import benchmarks._pipeline_tools  # noqa: F401  imports before the barrier: only the work is timed
    import bcer.engine.outputs  # noqa: F401

    barrier.wait()
    t0 = time.time()
    r = arm_sequential(data, out, part)
    results.put({"t0": t0, "t1": time.time(), "step_s": r["step_s"]})


def arm_processes(data: Path, out: Path, cpus: int) -> dict:
    """The plain loop in ``cpus`` processes side by side (cases dealt round-robin), no Ray: what
    this machine really gives ``cpus`` CPU-bound processes. Its per-step times show how much
    each step slows down when ``cpus`` of them run at once (shared cores, memory bandwidth)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(cpus), ctx.Queue()
    procs = [ctx.Process(target=_loop_part, args=(data, out, (k, cpus), barrier, results)) for k in range(cpus)]
    for p in procs:
        p.start()
    parts = [results.get() for _ in procs]
    for p in procs:
        p.join()
    steps = {k: sum(p["step_s"][k] for p in parts) for k in STEPS}
    return {"wall_s": max(p["t1"] for p in parts) - min(p["t0"] for p in parts), "step_s": steps,
            "busiest_s": max(p["t1"] - p["t0"] for p in parts)}


def _ray_tasks():
    import ray

    from benchmarks import _pipeline_tools as t
    from bcer.engine.outputs import write_artifact
    from bcer.io import load_sequence

    @ray.remote(num_cpus=1)
    def load(ref):
        return load_sequence(ref)

    @ray.remote(num_cpus=1)
    def n4(img):
        return t.n4_step(img, t.N4Params())

    @ray.remote(num_cpus=1)
    def smooth(img):
        return t.smooth_step(img, t.FlowParams())

    @ray.remote(num_cpus=1)
    def resample(img):
        return t.resample_step(img, t.SpacingParams())

    @ray.remote(num_cpus=1)
    def volume(img, path):
        write_artifact(t.volume_step(img), path)
        return True

    @ray.remote(num_cpus=1)
    def intensity(img, path):
        write_artifact(t.intensity_step(img, t.IntensityParams()), path)
        return True

    return load, n4, smooth, resample, volume, intensity


def run_ray(data: Path, out: Path) -> float:
    import ray

    load, n4, smooth, resample, volume, intensity = _ray_tasks()
    t0 = time.perf_counter()
    done = []
    for case in load_cases(data):
        img = resample.remote(smooth.remote(n4.remote(load.remote(case.sequences["T1"]))))
        done += [volume.remote(img, str(out / case.id / "volume.json")),
                 intensity.remote(img, str(out / case.id / "intensity.json"))]
    ray.get(done)
    return time.perf_counter() - t0


def run_bcer(data: Path, out: Path, address: str | None = None, cache: Path | None = None,
             percentile: float = 95.0) -> dict:
    import bcer

    __import__("benchmarks._pipeline_tools")
    t0 = time.perf_counter()
    result = bcer.Study(load_cases(data), plan=sketch(percentile), out=out, address=address, cache=cache).run()
    wall = time.perf_counter() - t0
    s = result.summary()
    if s["succeeded"] != s["cases"]:
        raise RuntimeError(f"bcer: {s}: {[r for r in result.rows if r['status'] != 'succeeded'][:1]}")
    ev = [e for e in result.events.to_pylist() if e["run"] == result.run_id]
    hits = {(e["case"], e["node"]) for e in ev if e["kind"] == "cache_hit"}
    executed = sum(e["kind"] == "succeeded" and (e["case"], e["node"]) not in hits for e in ev)
    return {"wall_s": wall, "executed_nodes": executed, "cache_hits": len(hits),
            "executed_by_node": sorted({e["node"] for e in ev if e["kind"] == "succeeded"
                                        and (e["case"], e["node"]) not in hits})}


def arm_ray_cold(data: Path, out: Path, cpus: int) -> dict:
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
    run_ray(data, out)
    wall = time.perf_counter() - t0
    ray.shutdown()
    return {"wall_s": wall}


def arm_bcer_cold(data: Path, out: Path, cpus: int) -> dict:
    from bcer.engine.cluster import ensure_ray

    t0 = time.perf_counter()
    ensure_ray(None, num_cpus=cpus)  # what Study does without an address, with the CPU count pinned
    r = run_bcer(data, out)
    r["wall_s"] = time.perf_counter() - t0
    return r


def arm_warm(data: Path, out: Path, cpus: int) -> dict:
    import ray

    ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
    run_ray(data, out / "ray_warmup")
    run_bcer(data, out / "bcer_warmup")
    res = {"ray_warm_s": run_ray(data, out / "ray"), "bcer_warm": run_bcer(data, out / "bcer")}
    res["ray_warm_s_2"] = run_ray(data, out / "ray2")  # bracket bcer: load drift shows as a spread
    cache = out / "cache"
    res["cache_first"] = run_bcer(data, out / "c1", cache=cache)
    res["cache_changed_param"] = run_bcer(data, out / "c2", cache=cache, percentile=90.0)
    ray.shutdown()
    return res


def _run_arm(arm: str, data: Path, out: Path, cpus: int) -> dict:
    """One arm in a fresh interpreter (cold means cold)."""
    res = out / f"{arm}.json"
    cmd = [sys.executable, __file__, "--arm", arm, "--data", str(data), "--work", str(out), "--cpus", str(cpus),
           "--arm-result", str(res)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(res.read_text())


def _same_outputs(a: Path, b: Path) -> bool:
    for f in sorted(a.rglob("*.json")):
        rel = f.relative_to(a)
        if rel.name not in ("volume.json", "intensity.json"):
            continue
        x, y = json.loads(f.read_text()), json.loads((b / rel).read_text())
        if x.get("rows") != y.get("rows"):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=16)
    ap.add_argument("--shape", default="128,128,80")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--result", type=Path, default=RESULT)
    ap.add_argument("--arm", default=None)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--arm-result", type=Path)
    args = ap.parse_args()
    if args.arm:  # a child process running one arm
        fn = {"sequential": lambda: arm_sequential(args.data, args.work / "seq"),
              "processes": lambda: arm_processes(args.data, args.work / "procs", args.cpus),
              "ray_cold": lambda: arm_ray_cold(args.data, args.work / "ray_cold", args.cpus),
              "bcer_cold": lambda: arm_bcer_cold(args.data, args.work / "bcer_cold", args.cpus),
              "warm": lambda: arm_warm(args.data, args.work / "warm", args.cpus)}[args.arm]
        args.arm_result.write_text(json.dumps(fn()))
        return
    work = Path(tempfile.mkdtemp(prefix="bcer_pipeline_"))
    make_cases(work / "data", args.cases, tuple(int(x) for x in args.shape.split(",")))
    runs = []
    load = [os.getloadavg()]
    for rep in range(args.repeats):
        out = work / f"rep{rep}"
        out.mkdir()
        r = {arm: _run_arm(arm, work / "data", out, args.cpus) for arm in ("sequential", "processes", "ray_cold", "bcer_cold",
                                                                   "warm")}
        r["identical_outputs"] = all(_same_outputs(out / "seq", out / d) for d in
                                     ("procs", "ray_cold", "bcer_cold", "warm/ray", "warm/bcer",
                                                              "warm/c1"))
        runs.append(r)
        load.append(os.getloadavg())
    summary = []
    for r in runs:
        floor = sum(r["sequential"]["step_s"].values()) / args.cpus
        warm_b, warm_r = r["warm"]["bcer_warm"]["wall_s"], min(r["warm"]["ray_warm_s"], r["warm"]["ray_warm_s_2"])
        first, changed = r["warm"]["cache_first"], r["warm"]["cache_changed_param"]
        summary.append({
            "sequential_s": round(r["sequential"]["wall_s"], 2), "floor_s": round(floor, 2),
            "ray_cold_s": round(r["ray_cold"]["wall_s"], 2), "bcer_cold_s": round(r["bcer_cold"]["wall_s"], 2),
            "bcer_cold_over_ray_cold": round(r["bcer_cold"]["wall_s"] / r["ray_cold"]["wall_s"], 3),
            "ray_warm_s": [round(r["warm"]["ray_warm_s"], 2), round(r["warm"]["ray_warm_s_2"], 2)],
            "bcer_warm_s": round(warm_b, 2), "bcer_warm_over_floor": round(warm_b / floor, 3),
            # the floor assumes the steps run as fast side by side as alone: the plain loop in
            # cpus processes (no Ray) measures what this machine really gives
            "processes_s": round(r["processes"]["wall_s"], 2),
            "processes_over_floor": round(r["processes"]["wall_s"] / floor, 3),
            "step_slowdown_side_by_side": round(sum(r["processes"]["step_s"].values())
                                                / sum(r["sequential"]["step_s"].values()), 3),
            "bcer_warm_over_processes": round(warm_b / r["processes"]["wall_s"], 3),
            "ray_warm_over_processes": round(warm_r / r["processes"]["wall_s"], 3),
            "bcer_warm_over_ray_warm": round(warm_b / warm_r, 3),
            "cache_first_s": round(first["wall_s"], 2), "cache_rerun_s": round(changed["wall_s"], 2),
            "cache_speedup": round(first["wall_s"] / changed["wall_s"], 2),
            "cache_rerun_executed_nodes": changed["executed_nodes"],
            "cache_rerun_executed_which": changed["executed_by_node"], "cache_rerun_hits": changed["cache_hits"],
            "identical_outputs": r["identical_outputs"]})
    report = {"benchmark": "pipeline", "cases": args.cases, "shape": args.shape, "cpus": args.cpus,
              "repeats": args.repeats, "runs": runs, "summary": summary, "load_average": load,
              "python": platform.python_version(), "cpu_count": os.cpu_count(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "uptime": os.popen("uptime").read().strip(),
              "command": "python benchmarks/pipeline.py " + " ".join(sys.argv[1:]),
              "goals": {"bcer_cold_over_ray_cold": "<= 1.05", "bcer_warm_over_floor": "<= 1.15",
                        "cache_speedup": ">= 5 with only the changed node executed"}}
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(report, indent=2))
    print(json.dumps(summary, indent=1), "\nload", load)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
