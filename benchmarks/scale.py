"""Back-pressure and scale (issue 11 part 6, issue 13 resume).

``capped``: a 1,000-case cohort whose cases each put ~4 x 8 MB through the object store
(load -> scale -> scale -> stats, one Ray task per node), on a local cluster whose object
store is capped at 200 MB: it must finish, with the driver's RSS read as cases finish.

``resume``: a 10,000-case tiny cohort (load -> stats -> JSON) is SIGKILLed at half by the
test harness (the driver runs in a child process); the rerun on the same folder must skip
the finished half in under 5 % of the first run's time. The first run's time is measured
on its own, uninterrupted, on a fresh folder, beside it.

    python benchmarks/scale.py capped --cases 1000 --store-mb 200
    python benchmarks/scale.py resume --cases 10000

Writes ``benchmarks/results/scale_capped.json`` / ``scale_resume.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
RESULTS = ROOT / "benchmarks" / "results"


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cases(root: Path, n: int, shape: tuple[int, int, int]):
    """n case folders holding hard links to one input (so 1,000 cases cost one file's disk)."""
    from bcer.contracts import Case, Image, SequenceRef
    from bcer.io import write_nifti

    src = write_nifti(Image(np.linspace(0, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape), np.eye(4)),
                      root / "_src" / "t1.nii.gz")
    cases = []
    for i in range(n):
        d = root / f"c{i:06d}"
        d.mkdir(parents=True, exist_ok=True)
        if not (d / "t1.nii.gz").exists():
            os.link(src, d / "t1.nii.gz")
        cases.append(Case(id=d.name, root=str(d), sequences={"T1": SequenceRef(path=str(d / "t1.nii.gz"))}))
    return cases


def capped(args) -> dict:
    import ray

    import bcer
    from bcer.contracts import PlanSketch

    __import__("benchmarks._wide_tools")
    tmp = Path(tempfile.mkdtemp(prefix="bcer_capped_"))
    cases = _cases(tmp / "in", args.cases, (128, 128, 128))
    ray.init(address="local", num_cpus=args.cpus, object_store_memory=args.store_mb * 1024 * 1024,
             include_dashboard=False, log_to_driver=False, configure_logging=False,
             _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
    plan = PlanSketch(goal="scale twice, measure", steps=[
        {"id": "a", "tool": "wide.scale", "args": {"img": "@seq.T1"}},
        {"id": "b", "tool": "wide.scale", "args": {"img": "@node.a.image"}},
        {"id": "s", "tool": "wide.stats", "args": {"img": "@node.b.image"}}])
    marks, rss, n = {args.cases // 4 * k for k in (1, 2, 3, 4)}, {}, [0]

    def probe(row: dict) -> None:
        n[0] += 1
        if n[0] in marks:
            rss[n[0]] = round(_rss_mb(), 1)

    t0 = time.time()
    study = bcer.Study(cases, plan=plan, out=tmp / "out")
    cfg = study.config()
    cfg.fuse = "never"  # every intermediate goes through the object store: that is what is capped
    from bcer.api import make_repairer
    from bcer.engine.cohort import run_cohort

    cfg.repairer = make_repairer(cfg.run_id)
    result = run_cohort(cases, cfg, on_case_done=probe)
    wall = time.time() - t0
    s = result.summary()
    want = float(np.linspace(0, 1, 128 ** 3, dtype=np.float32).mean() * 2.25)
    means = [r["measurements"].get("s.mean") for r in result.rows]
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"benchmark": "scale_capped", "cases": args.cases, "object_store_mb": args.store_mb,
            "bytes_through_store_per_case_mb": 4 * 8, "succeeded": s["succeeded"], "wall_s": round(wall, 1),
            "cases_per_s": round(args.cases / wall, 1), "driver_rss_mb_at_cases": rss,
            "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "all_means_correct": all(m is not None and abs(m - want) < 1e-4 for m in means),
            "load_average": os.getloadavg(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _tiny_cohort(root: Path, out: Path, cases_n: int, address: str | None):
    import bcer
    from benchmarks.wide_cohort import CONTRACT, PLAN

    cases = _cases(root, cases_n, (8, 8, 8))
    return bcer.Study(cases, task=CONTRACT, plan=PLAN, out=out, address=address)


def child(args) -> None:
    """The first run, in its own process (the harness kills it)."""
    __import__("benchmarks._wide_tools")
    _tiny_cohort(args.data, args.out, args.cases, args.address).run()


def resume(args) -> dict:
    import ray

    __import__("benchmarks._wide_tools")
    tmp = Path(tempfile.mkdtemp(prefix="bcer_resume_"))
    _cases(tmp / "in", args.cases, (8, 8, 8))
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=tempfile.mkdtemp(prefix="bcer_ray_"))
    address = ray.get_runtime_context().gcs_address
    # the reference: a full, uninterrupted first run on a fresh folder (the case list is built
    # before the clock starts, in both runs: it is the dataset reader's cost, not the engine's)
    study = _tiny_cohort(tmp / "in", tmp / "full", args.cases, address)
    t0 = time.time()
    full = study.run()
    first_s = time.time() - t0
    assert full.summary()["succeeded"] == args.cases
    # the run that dies: a child driver on the same cluster, SIGKILLed once half the cases are done
    out = tmp / "out"
    cmd = [sys.executable, __file__, "child", "--cases", str(args.cases), "--data", str(tmp / "in"),
           "--out", str(out), "--address", address]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    t0 = time.time()
    while sum(1 for _ in out.glob("*/_DONE")) < args.cases // 2:
        if proc.poll() is not None:
            raise RuntimeError("the first run ended before half its cases were done")
        time.sleep(0.2)
    killed_s = time.time() - t0
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = sum(1 for _ in out.glob("*/_DONE"))
    # the rerun: how long until it has skipped every finished case (their rows reported), and in all
    seen: dict = {"resumed": 0, "t_skipped": None}
    study = _tiny_cohort(tmp / "in", out, args.cases, address)
    t0 = time.time()

    def probe(row: dict) -> None:
        if row.get("resumed"):
            seen["resumed"] += 1
            if seen["resumed"] == done_at_kill:
                seen["t_skipped"] = time.time() - t0

    result = study.run(on_case_done=probe)
    rerun_s = time.time() - t0
    s = result.summary()
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"benchmark": "scale_resume", "cases": args.cases, "first_run_s": round(first_s, 2),
            "killed_after_s": round(killed_s, 2), "done_at_kill": done_at_kill,
            "rerun_skip_s": round(seen["t_skipped"], 3), "rerun_total_s": round(rerun_s, 2),
            "skip_fraction_of_first_run": round(seen["t_skipped"] / first_s, 4),
            "rerun_total_over_first_run": round(rerun_s / first_s, 3),
            "resumed_rows": s["resumed"], "succeeded": s["succeeded"],
            "load_average": os.getloadavg(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "note": "skip = from the rerun's start until every finished case was skipped (its row read from "
                    "result.json and reported); the rerun then runs the other half. Same cluster throughout; "
                    "the killed driver joined it as `bcer cohort --address` would."}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["capped", "resume", "child"])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--store-mb", type=int, default=200)
    ap.add_argument("--data", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--address", default=None)
    ap.add_argument("--result", type=Path, default=None)
    args = ap.parse_args()
    if args.what == "child":
        child(args)
        return
    report = capped(args) if args.what == "capped" else resume(args)
    path = args.result or RESULTS / f"scale_{args.what}.json"
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
