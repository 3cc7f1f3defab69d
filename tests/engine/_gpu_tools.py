"""GPU-tagged toy tools for the simulated-GPU placement tests (registered on import, in the driver
and in Ray workers). They do no GPU work (there is no device here): they hold the GPU share Ray
gives them for ``sleep_s`` so run intervals overlap measurably, and answer with the device
the engine chose."""
from __future__ import annotations

import os
import time

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bcer.contracts import Image
from bcer.tools.registry import tool


class Hold(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sleep_s: float = Field(0.4, ge=0, le=5)


def _hold(img: Image, params: Hold, device: str) -> Image:
    time.sleep(params.sleep_s)
    return Image(np.asarray(img.data) + 1.0, img.affine,
                 {"device": device, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})


@tool("xgpu.whole", resources={"num_cpus": 0.25, "memory_mb": 64}, gpu="optional", milestone="held",
      frameworks=())  # no GPU work: a worker need not import torch for it
def whole(img: Image, params: Hold, device: str = "cpu") -> Image:
    """Asks for a whole GPU (num_gpus 0 -> 1 on a GPU cluster)."""
    return _hold(img, params, device)


@tool("xgpu.quarter", resources={"num_cpus": 0.25, "num_gpus": 0.25, "memory_mb": 64}, gpu="optional",
      milestone="held", frameworks=())
def quarter(img: Image, params: Hold, device: str = "cpu") -> Image:
    """A small model: a quarter of a GPU, so four share one."""
    return _hold(img, params, device)
