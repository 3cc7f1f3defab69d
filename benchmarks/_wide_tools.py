"""User tools of the wide-cohort and scale benchmarks (importable by module name in Ray workers)."""
from __future__ import annotations

import numpy as np

from bcer.contracts import Image, Table
from bcer.tools.registry import tool


@tool("wide.stats", resources={"num_cpus": 1, "memory_mb": 0}, milestone="measured")
def stats(img: Image) -> Table:
    """Intensity statistics of one image (mean, std, min, max, voxels)."""
    d = np.asarray(img.data, dtype=np.float64)
    return Table([{"mean": float(d.mean()), "std": float(d.std()), "min": float(d.min()),
                   "max": float(d.max()), "n": int(d.size)}])


def stats_row(data: np.ndarray) -> dict:
    """The same numbers, for the hand-written Ray baseline."""
    d = np.asarray(data, dtype=np.float64)
    return {"mean": float(d.mean()), "std": float(d.std()), "min": float(d.min()), "max": float(d.max()),
            "n": int(d.size)}


@tool("wide.scale", resources={"num_cpus": 1, "memory_mb": 0}, milestone="scaled")
def scale(img: Image) -> Image:
    """Multiplies an image by 1.5 (a new array: what a real filter would hand on)."""
    return Image(np.asarray(img.data, dtype=np.float32) * 1.5, img.affine)
