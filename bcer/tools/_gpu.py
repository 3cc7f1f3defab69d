"""Choosing the array backend for tools with a GPU path. cupy is optional (``bcer[gpu]``)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..contracts.errors import ErrorCode, ToolError
from ..optional import optional_import


def array_module(device: str) -> Any:
    """numpy for "cpu"; cupy for "cuda" (typed ``resource`` error if cupy is missing)."""
    if device == "cpu":
        return np
    cp, ok = optional_import("cupy", "gpu")
    if not ok:
        raise ToolError(ErrorCode.resource, "device 'cuda' asked but cupy is not installed",
                        hint="install bcer[gpu] or run on CPU", no_device=True)
    return cp


def torch_device(device: str) -> Any:
    import torch

    if device != "cpu" and not torch.cuda.is_available():
        # no_device: Ray gave a GPU this process cannot use (CPU-only torch, a simulated GPU);
        # the Reflector then runs the CPU path instead of treating it as out of memory
        raise ToolError(ErrorCode.resource, f"device {device!r} asked but torch sees no CUDA device",
                        hint="install a CUDA build of torch on the GPU nodes, or run on CPU", no_device=True)
    return torch.device("cuda" if device != "cpu" else "cpu")


def to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "get"):  # cupy
        return x.get()
    if hasattr(x, "detach"):  # torch
        return x.detach().cpu().numpy()
    return np.asarray(x)
