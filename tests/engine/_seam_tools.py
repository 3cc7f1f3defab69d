"""Toy tools for the merge-seam tests (registered on import, in the driver and in Ray workers)."""
from __future__ import annotations

import signal
import time

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bcer.contracts import Image, Report
from bcer.tools.registry import tool


class Hog(BaseModel):
    model_config = ConfigDict(extra="forbid")
    add: float = Field(0.0, ge=-100, le=100)
    sleep_s: float = Field(1.0, ge=0, le=10)


@tool("xseam.hog", resources={"num_cpus": 1, "memory_mb": 64}, milestone="hogged")
def hog(img: Image, params: Hog) -> Image:
    """Holds a whole CPU, deaf to the worker's alarm (like a long C call), then adds a constant."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(params.sleep_s)
    return Image(np.asarray(img.data) + params.add, img.affine)


@tool("xseam.note", resources={"num_cpus": 0.25, "memory_mb": 64}, milestone="noted")
def note(img: Image) -> Report:
    """A one-line report of the image mean."""
    mean = float(np.mean(img.data))
    return Report(f"mean intensity {mean:.1f}", {"mean": mean}, [{"value": mean}])
