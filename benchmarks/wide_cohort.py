"""Issue 13: many tiny cases. bcer's per-case cost against hand-written Ray, side by side.

Each case is an 8x8x8 NIfTI; the plan is one tool (load -> intensity statistics -> one JSON
deliverable). The hand-written Ray baseline runs a load task and a stats task per case and
writes the same JSON; bcer runs ``Study`` with a contract (the deliverable validated, trace,
provenance, result.json, _DONE, cohort tables). Both run on the same local Ray cluster, one
after the other, repeated; the driver's peak RSS is read after each bcer run.

    python benchmarks/wide_cohort.py --cases 500 --repeats 2
    python benchmarks/wide_cohort.py --cases 10000 --repeats 1 --rss-at 1000,5000,10000
    python benchmarks/wide_cohort.py --whole-process --cases 2000 --repeats 3

``--whole-process`` times what a user pays for the whole job, each way in a fresh Python process
(imports, cluster start, run, shutdown), the arms interleaved; it also counts the files each
bcer case writes of its own (its folder) and what the cohort writes once.

Writes ``benchmarks/results/wide_cohort[_N].json`` (``wide_cohort_process.json`` for
``--whole-process``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)  # Ray workers start here, so benchmarks._wide_tools imports by name

import ray  # noqa: E402

import bcer  # noqa: E402
from bcer.contracts import (Case, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract,  # noqa: E402
                            Validator)
from bcer.io import load_sequence, write_json, write_nifti  # noqa: E402

__import__("benchmarks._wide_tools")
from benchmarks._wide_tools import stats_row  # noqa: E402

CONTRACT = TaskContract(id="wide_stats", domain="any", goal="intensity statistics", inputs=["T1"],
                        milestones=["measured"],
                        deliverables=[DeliverableSpec(name="stats", kind="table", milestone="measured",
                                                      file="stats.json",
                                                      validators=[Validator(type="table_rows", arg=1)])])
PLAN = PlanSketch(goal="intensity statistics", steps=[{"id": "stats", "tool": "wide.stats",
                                                       "args": {"img": "@seq.T1"}}])


def make_cases(root: Path, n: int) -> list[Case]:
    rng = np.random.default_rng(0)
    cases = []
    for i in range(n):
        d = root / f"c{i:06d}"
        p = write_nifti(Image(rng.normal(100, 10, (8, 8, 8)).astype(np.float32), np.eye(4)), d / "t1.nii.gz")
        cases.append(Case(id=f"c{i:06d}", root=str(d), sequences={"T1": SequenceRef(path=str(p))}))
    return cases


@ray.remote(num_cpus=1)
def _load(ref: SequenceRef) -> Image:
    return load_sequence(ref)


@ray.remote(num_cpus=1)
def _stats_and_write(img: Image, path: str) -> bool:
    write_json({"kind": "table", "rows": [stats_row(img.data)]}, path)
    return True


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


CPU: dict[str, list[float]] = {}


def run_ray(cases: list[Case], out: Path, in_flight: int, probe: "RssProbe | None" = None) -> float:
    """Hand-written Ray with the same back-pressure bound (cases in flight)."""
    c0 = _cpu()
    t0 = time.perf_counter()
    pending: list = []
    finished = 0
    for c in cases:
        if len(pending) >= in_flight * 2:
            done, pending = ray.wait(pending, num_returns=len(pending) - in_flight)
            ray.get(done)
            for _ in done:
                finished += 1
                if probe:
                    probe({})
        img = _load.remote(c.sequences["T1"])
        pending.append(_stats_and_write.remote(img, str(out / c.id / "stats.json")))
    ray.get(pending)
    for _ in pending if probe else ():
        probe({})
    CPU.setdefault("ray", []).append(_cpu() - c0)
    return time.perf_counter() - t0


class RssProbe:
    """The driver's RSS whenever ``n`` finished cases reach the given marks."""

    def __init__(self, marks: list[int]):
        self.marks, self.seen, self.n = sorted(marks), {}, 0

    def __call__(self, row: dict) -> None:
        self.n += 1
        if self.n in self.marks:
            self.seen[self.n] = _rss_mb()


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_bcer(cases: list[Case], out: Path, in_flight: int | None, probe: RssProbe | None = None,
             label: str = "bcer", fuse: str = "auto") -> tuple[float, dict]:
    from bcer.api import make_repairer
    from bcer.engine.cohort import run_cohort

    cfg = bcer.Study(cases, task=CONTRACT, plan=PLAN, out=out, max_in_flight=in_flight).config()
    cfg.fuse, cfg.repairer = fuse, make_repairer(cfg.run_id)
    c0 = _cpu()
    t0 = time.perf_counter()
    result = run_cohort(cases, cfg, on_case_done=probe)
    wall = time.perf_counter() - t0
    CPU.setdefault(label, []).append(_cpu() - c0)
    s = result.summary()
    if s["succeeded"] != len(cases):
        bad = next(r for r in result.rows if r["status"] != "succeeded")
        raise RuntimeError(f"bcer: {s}; first failure {bad}")
    return wall, s


def cases_in(root: Path) -> list[Case]:
    """The cases ``make_cases`` wrote under ``root`` (a child process rebuilds the list)."""
    return [Case(id=d.name, root=str(d), sequences={"T1": SequenceRef(path=str(d / "t1.nii.gz"))})
            for d in sorted(root.iterdir()) if d.is_dir()]


def child(inputs: Path, out: Path, num_cpus: int) -> None:
    """The bcer arm as a user runs it (the Ray arm is ``_wide_ray.py``, which imports no bcer)."""
    cases = cases_in(inputs)
    res = bcer.Study(cases, task=CONTRACT, plan=PLAN, out=out).run()
    if res.summary()["succeeded"] != len(cases):
        raise SystemExit(f"bcer: {res.summary()}")


def _files(root: Path) -> tuple[int, int]:
    files = [f for f in root.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def whole_process(args: argparse.Namespace) -> None:
    """Each arm in its own fresh process, interleaved, ``repeats`` times; wall from outside."""
    import subprocess

    tmp = Path(tempfile.mkdtemp(prefix="bcer_wide_proc_"))
    make_cases(tmp / "in", args.cases)
    walls: dict[str, list[float]] = {"ray": [], "bcer": []}
    files: dict = {}
    for rep in range(args.repeats):
        for arm in ("ray", "bcer"):
            out = tmp / "out" / f"{arm}_{rep}"
            cmd = ([sys.executable, str(Path(__file__).with_name("_wide_ray.py")), str(tmp / "in"), str(out),
                    str(args.num_cpus)] if arm == "ray" else
                   [sys.executable, __file__, "--child", "--inputs", str(tmp / "in"), "--out-dir", str(out),
                    "--num-cpus", str(args.num_cpus)])
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            walls[arm].append(time.perf_counter() - t0)
            if arm == "bcer":
                per_case = [_files(d) for d in out.iterdir() if d.is_dir() and d.name.startswith("c0")]
                own = _files(out)
                files = {"per_case_files_median": statistics.median(n for n, _ in per_case),
                         "per_case_bytes_median": statistics.median(b for _, b in per_case),
                         "per_case_file_names": sorted(str(f.relative_to(out / "c000000"))
                                                       for f in (out / "c000000").rglob("*") if f.is_file()),
                         "cohort_level_files": sorted(str(f.relative_to(out)) for f in out.iterdir()
                                                      if f.is_file()),
                         "all_files": own[0], "all_bytes": own[1]}
            shutil.rmtree(out, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in walls.items()}
    report = {"benchmark": "wide_cohort_process", "cases": args.cases, "repeats": args.repeats,
              "ray_num_cpus": args.num_cpus,
              "wall_s": {k: [round(x, 2) for x in v] for k, v in walls.items()},
              "median_s": {k: round(v, 2) for k, v in med.items()},
              "bcer_fraction_of_ray_throughput": round(med["ray"] / med["bcer"], 3),
              "bcer_fraction_per_repeat": [round(r / b, 3) for r, b in zip(walls["ray"], walls["bcer"])],
              "target": ">= 0.8 of hand-written Ray's throughput, whole process each way",
              "bcer_files": files, "cpu_count": os.cpu_count(), "ray_version": ray.__version__,
              "python": platform.python_version(), "load_average_after": os.getloadavg(),
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "note": "8x8x8 NIfTI per case, one tool; each arm a fresh `python` process (imports, cluster start, "
                      "run, shutdown) timed from outside, arms interleaved; ray = load task + stats task writing "
                      "the JSON, 16 cases in flight; bcer = Study with the default options (lean case folders: "
                      "deliverable, provenance.json, _DONE; --audit writes the full per-case audit)."}
    out = args.result or ROOT / "benchmarks" / "results" / "wide_cohort_process.json"
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--in-flight", default="16,auto", help="bcer max_in_flight values (auto = default)")
    ap.add_argument("--fuse", default="auto", help="bcer fusion settings to run, e.g. auto,never")
    ap.add_argument("--rss-at", default="", help="finished-case counts at which to read the driver RSS")
    ap.add_argument("--result", type=Path, default=None)
    ap.add_argument("--whole-process", action="store_true", help="time each arm as a fresh process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.inputs, args.out_dir, args.num_cpus)
    if args.whole_process:
        return whole_process(args)
    tmp = Path(tempfile.mkdtemp(prefix="bcer_wide_"))
    t0 = time.time()
    cases = make_cases(tmp / "in", args.cases)
    synth_s = time.time() - t0
    from bcer.engine.cluster import ensure_ray

    ensure_ray(num_cpus=args.num_cpus)  # the local cluster bcer starts (both arms run on it)
    warm = cases[: min(64, len(cases))]
    run_ray(warm, tmp / "warm_ray", 16)  # workers and imports warm on both sides
    run_bcer(warm, tmp / "warm_bcer", 16, label="warm")
    load = {"before": os.getloadavg()}
    marks = [int(x) for x in args.rss_at.split(",") if x]
    results: dict = {"ray": []}
    arms = [(mif, fuse) for mif in args.in_flight.split(",") for fuse in args.fuse.split(",")]
    label = {a: f"bcer_{a[0]}" + ("" if a[1] == "auto" else f"_fuse_{a[1]}") for a in arms}
    for a in arms:
        results[label[a]] = []
    rss: dict = {}
    for rep in range(args.repeats):
        shutil.rmtree(tmp / "out", ignore_errors=True)
        probe = RssProbe(marks) if marks else None
        results["ray"].append(run_ray(cases, tmp / "out" / "ray", 16, probe))
        if probe:  # the hand-written driver's own growth, for comparison
            rss[f"ray_rep{rep}"] = probe.seen
        for mif, fuse in arms:
            probe = RssProbe(marks) if marks else None
            name = label[(mif, fuse)]
            wall, _ = run_bcer(cases, tmp / "out" / f"{name}_{rep}", None if mif == "auto" else int(mif), probe,
                               label=name, fuse=fuse)
            results[name].append(wall)
            if probe:
                rss[f"{name}_rep{rep}"] = probe.seen
    load["after"] = os.getloadavg()
    ray_med = statistics.median(results["ray"])
    summary = {k: {"wall_s": [round(x, 3) for x in v], "median_s": round(statistics.median(v), 3),
                   "driver_cpu_ms_per_case": round(1000 * statistics.median(CPU[k][-len(v):]) / args.cases, 3),
                   "cases_per_s": round(args.cases / statistics.median(v), 1),
                   "fraction_of_ray_throughput": round(ray_med / statistics.median(v), 3)}
               for k, v in results.items()}
    report = {"benchmark": "wide_cohort", "cases": args.cases, "repeats": args.repeats, "ray_num_cpus": args.num_cpus,
              "synth_s": round(synth_s, 2), "results": summary, "driver_rss_mb_at_cases": rss,
              "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "load_average": load, "cpu_count": os.cpu_count(), "ray_version": ray.__version__,
              # Ray keeps one metric series per task name: readable per-case names cost driver
              # memory unless metrics collection is off (RAY_enable_metrics_collection=0)
              "ray_enable_metrics_collection": os.environ.get("RAY_enable_metrics_collection", "1"),
              "python": platform.python_version(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "note": "same cluster, runs interleaved; ray = load task + stats task writing the JSON, "
                      "16 cases in flight; bcer = Study with a contract (validation, trace, provenance, "
                      "result.json, _DONE, cohort.parquet/events.parquet)."}
    out = args.result or ROOT / "benchmarks" / "results" / (
        "wide_cohort.json" if args.cases <= 1000 else f"wide_cohort_{args.cases}.json")
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["results"], indent=1), "\nrss", rss, "\nload", load)
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
