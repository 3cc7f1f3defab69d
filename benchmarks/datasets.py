"""Dataset generation benchmark: time to synthesise and write a phantom cohort per domain.

    python benchmarks/datasets.py [--domains brain cardiac prostate] [--sizes small full]
                                  [--n 20] [--out benchmarks/results/datasets.json]

For each domain and size, ``bcer.datasets.synth.synth_cohort`` writes ``n`` cases in the
domain's default layout (brain: BraTS 2018, cardiac: ACDC, prostate: BIDS) into a temporary
folder; we report wall-clock seconds for the whole cohort (generation + NIfTI writing +
reading back), seconds per case, bytes written, the grid of the first case (shape, spacing)
and a truth check (brain: label volumes recomputed from the written masks vs the stated
ones). The one-time anatomy load (MNI152 templates for the brain) is timed separately so
per-case numbers are steady-state. Domains whose generator is missing are reported as such.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.contracts.case import SequenceRef  # noqa: E402
from bcer.contracts.errors import ToolError  # noqa: E402
from bcer.datasets.generators import get_generator  # noqa: E402
from bcer.datasets.synth import DEFAULT_LAYOUT, inspect_dataset, synth_cohort  # noqa: E402
from bcer.io import load_sequence  # noqa: E402

log = logging.getLogger("benchmarks.datasets")


def _du(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def _warm(domain: str) -> float:
    """Time the one-time setup of a generator (brain: reading and block-averaging MNI152)."""
    t0 = time.perf_counter()
    if domain == "brain":
        from bcer.datasets.brain import _mni_tissues

        _mni_tissues(1)
        _mni_tissues(2)
    get_generator(domain)
    return time.perf_counter() - t0


def _brain_truth_error(cases: list) -> float:
    """Largest relative difference between stated and recomputed label volumes (written masks)."""
    worst = 0.0
    for case in cases:
        seg = load_sequence(SequenceRef.model_validate(case.ground_truth["labels"]["seg"]))
        for lab, stated in case.ground_truth["values"]["volumes_ml"].items():
            if stated > 0:
                worst = max(worst, abs(seg.volume_ml(int(lab)) - stated) / stated)
    return worst


def run_one(domain: str, size: str, n: int, seed: int) -> dict[str, Any]:
    row: dict[str, Any] = {"domain": domain, "size": size, "n": n, "layout": DEFAULT_LAYOUT[domain]}
    try:
        row["setup_s"] = round(_warm(domain), 3)
    except ToolError as e:
        row["status"] = f"skipped: {e.message}"
        return row
    tmp = Path(tempfile.mkdtemp(prefix=f"bcer_bench_{domain}_{size}_"))
    try:
        t0 = time.perf_counter()
        cases = synth_cohort(domain, n, tmp, seed=seed, size=size)
        row["cohort_s"] = round(time.perf_counter() - t0, 3)
        row["per_case_s"] = round(row["cohort_s"] / n, 3)
        row["bytes"] = _du(tmp)
        t1 = time.perf_counter()
        first = inspect_dataset(tmp)[0]
        row["inspect_s"] = round(time.perf_counter() - t1, 3)
        row["grid"] = {k: {"shape": v["shape"], "spacing": v["spacing"], "orientation": v["orientation"]}
                       for k, v in first["sequences"].items()}
        if domain == "brain":
            row["max_volume_rel_error"] = _brain_truth_error(cases)
        row["status"] = "ok"
    except ToolError as e:
        row["status"] = f"failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("%s", row)
    return row


def _save(path: Path, row: dict[str, Any], args: argparse.Namespace) -> None:
    """Merge ``row`` into the results file, replacing an earlier row of the same domain+size."""
    doc = json.loads(path.read_text()) if path.exists() else {}
    rows = [r for r in doc.get("results", []) if (r["domain"], r["size"]) != (row["domain"], row["size"])]
    row = {**row, "seed": args.seed, "machine": {
        "platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
        "omp_threads": os.environ.get("OMP_NUM_THREADS"), "load_avg_1m": round(os.getloadavg()[0], 2)}}
    rows.append(row)
    rows.sort(key=lambda r: (r["domain"], r["size"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "datasets", "results": rows}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", nargs="+", default=["brain", "cardiac", "prostate"])
    ap.add_argument("--sizes", nargs="+", default=["small", "full"], choices=["small", "full"])
    ap.add_argument("--size", choices=["small", "full"], help="shorthand for --sizes SIZE")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "datasets.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sizes = [args.size] if args.size else args.sizes
    path = Path(args.out)
    rows = []
    for d in args.domains:
        for s in sizes:
            rows.append(run_one(d, s, args.n, args.seed))
            _save(path, rows[-1], args)  # after each row: a long run that is cut keeps its results
    log.info("wrote %s", path)
    return 0 if all(r.get("status") == "ok" or str(r.get("status", "")).startswith("skipped")
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
