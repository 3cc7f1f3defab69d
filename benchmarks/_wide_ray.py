"""The hand-written Ray arm of ``wide_cohort.py --whole-process``: what a researcher would write
without bcer (ray, nibabel, numpy, json; no bcer import), 16 cases in flight.

    python benchmarks/_wide_ray.py INPUTS OUT NUM_CPUS
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import ray


@ray.remote(num_cpus=1)
def load(path: str) -> np.ndarray:
    return np.asarray(nib.load(path).dataobj, dtype=np.float32)


@ray.remote(num_cpus=1)
def stats_and_write(data: np.ndarray, path: str) -> bool:
    d = np.asarray(data, dtype=np.float64)
    row = {"mean": float(d.mean()), "std": float(d.std()), "min": float(d.min()), "max": float(d.max()),
           "n": int(d.size)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"kind": "table", "rows": [row]}))
    return True


def main(inputs: Path, out: Path, num_cpus: int, in_flight: int = 16) -> None:
    ray.init(num_cpus=num_cpus, include_dashboard=False)
    pending: list = []
    for case in sorted(d for d in inputs.iterdir() if d.is_dir()):
        if len(pending) >= in_flight * 2:
            done, pending = ray.wait(pending, num_returns=len(pending) - in_flight)
            ray.get(done)
        img = load.remote(str(case / "t1.nii.gz"))
        pending.append(stats_and_write.remote(img, str(out / case.name / "stats.json")))
    ray.get(pending)
    ray.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
