"""A toy tool that hangs on its first call (registered on import, in the driver and in Ray
workers): the engine's timeout handling is tested without the ablation's worker hook."""
from __future__ import annotations

import os
import time

import numpy as np
from pydantic import BaseModel, ConfigDict

from bcer.contracts import Image
from bcer.tools.registry import tool


class HangOnce(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flag: str  # a file made on the first call; its absence means "hang"


@tool("xabl.hang_once", resources={"num_cpus": 0.25, "memory_mb": 64}, milestone="smoothing")
def hang_once(image: Image, params: HangOnce) -> Image:
    """Hang (sleep 60 s) on the first call, answer at once afterwards."""
    try:
        os.close(os.open(params.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        time.sleep(60)
    except FileExistsError:
        pass
    return Image(np.asarray(image.data) + 1.0, image.affine)
