"""Model-zoo bundles at their published settings: load once, run per call, and a brain cohort.

    python benchmarks/bundles.py [--cases 2] [--prostate] [--skip-cohort] [--out benchmarks/results/bundles.json]

Bundle folders are built by ``tests/tools/_zoo_bundles.py`` from the published
brats_mri_segmentation (SegResNet, 4.7 M parameters, roi 240x240x160, sigmoid TC/WT/ET) and
prostate_mri_anatomy (6-level UNet, Spacingd 0.5 mm, roi 96^3, argmax) configs with the
published network sizes and random weights (nothing downloaded), so the numbers are speed
and memory, never accuracy: random weights give nonsense labels.

1. ``seg.brain_tumor`` in this process on a small brain phantom: first call (loads the
   bundle), second call (cached network), and a call with ``roi_size=64``.
2. (``--prostate``) ``seg.prostate`` on a small prostate phantom at the published spacing and
   roi: 0.5 mm resampling gives ~9 M voxels and ~90 windows of 96^3 through a 6-level UNet,
   many CPU-minutes; opt-in.
3. ``bcer.Study(..., bundles={"seg.brain_tumor": DIR})``: a brain cohort of ``--cases``
   phantoms (BraTS layout) on a local Ray cluster, one case in flight (each case holds ~4 GB
   at the published roi); SR and per-node seconds from provenance.

Peak resident memory is this process's (``ru_maxrss``); Ray workers are not counted.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bcer.tools.registry import call_tool  # noqa: E402
from bcer.tools.seg import bundle as B  # noqa: E402
from tests.tools import _zoo_bundles as Z  # noqa: E402

log = logging.getLogger("benchmarks.bundles")
BRAIN_PORTS = (("t1", "T1"), ("t1c", "T1c"), ("t2", "T2"), ("flair", "FLAIR"))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _timed(fn) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, round(time.perf_counter() - t0, 2)


def _brain_calls(work: Path) -> dict[str, Any]:
    from bcer.datasets.brain import make_brain

    root = Z.write_bundle(work / "brats_mri_segmentation", Z.brats_inference(), Z.brats_metadata())
    ph = make_brain("bench", 0, size="small", grade="HGG")
    inputs = {p: ph.sequences[s] for p, s in BRAIN_PORTS}
    B.clear_cache()
    res: dict[str, Any] = {"image_shape": list(ph.sequences["T1"].shape)}
    for label, params in (("first_call_published_roi", {}), ("second_call_published_roi", {}),
                          ("roi_64", {"roi_size": 64})):
        out, secs = _timed(lambda: call_tool("seg.brain_tumor", inputs, {"bundle_dir": str(root), **params}))
        meta = out["labels"].meta
        res[label] = {"seconds": secs, "roi_size": meta["roi_size"], "bundle_cache": meta["bundle_cache"],
                      "labels_present": sorted(int(v) for v in np.unique(out["labels"].data)),
                      "peak_rss_mb": round(_rss_mb())}
    info = B.cache_info()
    res["cache"] = {"loads": info.misses, "hits": info.hits}
    res["channels"] = meta["channels"]
    res["label_map"] = meta["label_map"]
    return res


def _prostate_call(work: Path) -> dict[str, Any]:
    from bcer.datasets.prostate import make_prostate

    root = Z.write_bundle(work / "prostate_mri_anatomy", Z.prostate_inference(), Z.prostate_metadata())
    ph = make_prostate("bench", 0, size="small")
    out, secs = _timed(lambda: call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"bundle_dir": str(root)}))
    meta = out["zones"].meta
    return {"image_shape": list(ph.sequences["T2w"].shape), "spacing_mm": [round(s, 3) for s in ph.sequences["T2w"].spacing],
            "seconds": secs, "roi_size": meta["roi_size"], "label_map": meta["label_map"],
            "zones_present": sorted(int(v) for v in np.unique(out["zones"].data)), "peak_rss_mb": round(_rss_mb())}


def _cohort(work: Path, n: int) -> dict[str, Any]:
    import bcer
    from bcer.datasets.synth import synth_cohort

    synth_cohort("brain", n, work / "brats", seed=11)
    models = work / "models"
    Z.write_bundle(models / "brats_mri_segmentation", Z.brats_inference(), Z.brats_metadata())
    study = bcer.Study(work / "brats", task="segment_brain", out=work / "out", max_in_flight=1,
                       model_dirs=(str(models),), bundles={"seg.brain_tumor": "brats_mri_segmentation"})
    result, secs = _timed(study.run)
    rows = []
    for row in result.rows:
        prov = json.loads((work / "out" / row["case"] / "provenance.json").read_text()) \
            if (work / "out" / row["case"] / "provenance.json").exists() else {}
        chain = next(iter(prov.get("deliverables", {}).values()), {}).get("chain", [])
        seg = next((c for c in chain if c["tool"] == "seg.brain_tumor"), {})
        rows.append({"case": row["case"], "status": row["status"], "sr": row["sr"], "case_seconds": row["duration_s"],
                     "seg_node_seconds": seg.get("duration_s"), "bundle_dir": seg.get("params", {}).get("bundle_dir")})
    s = result.summary()
    return {"cases": n, "wall_s": secs, "sr": s["sr"], "tcr": s["tcr"], "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2)
    ap.add_argument("--prostate", action="store_true", help="also time the published prostate bundle (slow on CPU)")
    ap.add_argument("--skip-cohort", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bundles.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bcer_bundles_"))
    import torch

    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                          "torch_threads": torch.get_num_threads(),
                                          "command": " ".join(["python", *sys.argv]),
                                          "load_avg_start": os.getloadavg()},
                              "note": "random weights: speed and memory only; labels are not meaningful"}
    try:
        report["brats_in_process"] = _brain_calls(work)
        if args.prostate:
            report["prostate_in_process"] = _prostate_call(work)
        if not args.skip_cohort:
            report["brats_cohort"] = _cohort(work, args.cases)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["machine"]["load_avg_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
