"""``recon.zero_filled``: inverse FFT per coil and root-sum-of-squares combination."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...contracts.artifacts import Cine, Image, KSpace
from .._gpu import array_module
from ..registry import tool
from ._coils import analyse_mask, as_slices, check_kspace, run_batched, to_artifact
from ._fft import ifft2c, rss

_RESOURCES = {"num_cpus": 1, "memory_mb": 2048}


def zero_filled_core(batch: Any, mask2d: np.ndarray, xp: Any) -> Any:
    """(N, C, X, Y) k-space -> (N, X, Y) RSS magnitude; unsampled points are zeroed first
    so stray values outside the mask never leak into the image."""
    return rss(ifft2c(batch * xp.asarray(mask2d, dtype=xp.complex64), xp), xp)


def _zero_filled(kspace: KSpace, cine: bool, tool_name: str, device: str) -> Image | Cine:
    data = check_kspace(kspace, cine, tool_name)
    sampling = analyse_mask(kspace.mask, data.shape[1:3])
    xp = array_module(device)
    images, _ = run_batched(as_slices(data), xp,
                            lambda b: (zero_filled_core(b, sampling.mask2d, xp), {}))
    meta = {"method": "zero_filled", "coil_combine": "rss", "n_coils": int(data.shape[0]),
            "acceleration": float(sampling.mask2d.size / max(int(sampling.mask2d.sum()), 1)),
            "device": device}
    return to_artifact(images, kspace, data.shape, cine, meta)


@tool("recon.zero_filled", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="image", gpu_frameworks=("cupy",))
def zero_filled(kspace: KSpace, device: str = "cpu") -> Image:
    """Zero-filled reconstruction of (C, X, Y, Z) k-space: centred inverse FFT per coil,
    root-sum-of-squares coil combine. Exact for fully sampled data; aliased when undersampled.

    Args:
        kspace: multi-coil k-space (C, X, Y, Z) with its sampling mask.
        device: "cpu" or "cuda" (cupy path).

    Returns:
        Magnitude Image (X, Y, Z) on the recon matrix (``kspace.recon_affine``).
    """
    return _zero_filled(kspace, False, "recon.zero_filled", device)


@tool("recon.zero_filled_cine", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="cine", gpu_frameworks=("cupy",))
def zero_filled_cine(kspace: KSpace, device: str = "cpu") -> Cine:
    """Zero-filled reconstruction of cine k-space (C, X, Y, Z, T) into a magnitude Cine
    (X, Y, Z, T), frame by frame (same core as ``recon.zero_filled``)."""
    return _zero_filled(kspace, True, "recon.zero_filled_cine", device)
