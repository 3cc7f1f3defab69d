"""``recon.grappa``: GRAPPA (Griswold et al., MRM 2002) from the autocalibration lines.

For uniform undersampling by R along Y, every missing line ``y0 + r`` (r = 1..R-1, y0 on
the sampling lattice) is a linear combination, over all coils, of a ``kernel_y`` x
``kernel_x`` block of acquired points at rows ``y0 + R*j`` and columns ``x + dx``. The
weights are fitted per slice on the fully sampled ACS block by Tikhonov-regularised least
squares, ``W = (S^H S + ridge I)^-1 S^H T`` with ``ridge = lam tr(S^H S)/K + noise_ridge M
sigma^2`` (M calibration rows, sigma^2 the k-space noise power), batched over slices (no loop
over voxels: source blocks are gathered by shifting whole arrays, one shift per kernel
offset). The filled k-space is combined by inverse FFT + root-sum-of-squares.
"""
from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ...contracts.artifacts import Cine, Image, KSpace
from ...contracts.errors import ErrorCode, ToolError
from .._gpu import array_module
from ..registry import tool
from ._coils import Sampling, analyse_mask, as_slices, check_kspace, run_batched, to_artifact
from ._fft import ifft2c, rss

_RESOURCES = {"num_cpus": 1, "memory_mb": 4096}


class GrappaParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kernel_y: int | None = Field(None, ge=2, le=6, description="acquired source lines per kernel "
                                 "(phase encoding); the ACS block must span R*(kernel_y-1)+1 lines. "
                                 "None: 3 when the ACS has >= 5R lines (enough calibration rows), else 2")
    kernel_x: Literal[3, 5, 7, 9] = Field(5, description="source columns per kernel (readout, odd)")
    lam: float = Field(3e-4, ge=0.0, le=1.0, description="Tikhonov weight relative to the mean "
                       "eigenvalue of the calibration normal matrix (dominated by the k-space centre, so "
                       "keep it small)")
    noise_ridge: float = Field(0.5, ge=0.0, le=100.0, description="extra ridge in units of the "
                               "noise power the calibration rows carry (estimated from the readout edges)")


def kernel_height(params: GrappaParams, sampling: Sampling) -> int:
    """``kernel_y``, or the automatic choice: a third source line only pays when the ACS
    leaves at least 3R calibration rows after the kernel span (else the fit overfits)."""
    if params.kernel_y is not None:
        return params.kernel_y
    return 3 if sampling.n_acs >= 5 * sampling.R else 2


def kernel_rows(kernel_y: int) -> np.ndarray:
    """Lattice offsets j of the source rows ``y0 + R*j``, centred around the gap they fill."""
    lo = -((kernel_y - 1) // 2)
    return np.arange(lo, lo + kernel_y)


def _gather(k: Any, rows: np.ndarray, row0: Any, cols: slice, hx: int, xp: Any) -> Any:
    """Stack source blocks: k (N, C, X', Y') -> (N, C*ky*kx, len(cols), len(row0)); ``row0``
    are the kernel anchor rows, ``cols`` the anchor columns (in padded coordinates)."""
    blocks = []
    for j in rows:
        r = k[..., row0 + j]  # (N, C, X', P): one gather per kernel row, not per voxel
        for dx in range(-hx, hx + 1):
            blocks.append(r[:, :, cols.start + dx:cols.stop + dx])
    n, c = k.shape[:2]
    stacked = xp.stack(blocks, axis=2)  # (N, C, ky*kx, Xs, P)
    return stacked.reshape(n, c * len(blocks), stacked.shape[-2], stacked.shape[-1])


def noise_power(batch: Any, sampling: Sampling, xp: Any) -> Any:
    """Per-slice noise power E|n|^2 of a k-space sample, (N,): robust (median) estimate from
    the acquired samples in the outer sixteenth of the readout on each side, where the
    signal has decayed; for complex Gaussian noise ``median(|n|^2) = ln 2 * E|n|^2``."""
    n, c, x, _ = batch.shape
    edge = max(1, x // 16)
    lines = xp.asarray(np.flatnonzero(sampling.lines))
    outer = xp.concatenate([batch[:, :, :edge], batch[:, :, x - edge:]], axis=2)[..., lines]
    return xp.median(xp.abs(outer.reshape(n, -1)) ** 2, axis=1) / np.log(2.0)


def calibrate(acs: Any, R: int, rows: np.ndarray, hx: int, lam: float, xp: Any,
              noise: Any = None, noise_ridge: float = 0.0) -> Any:
    """GRAPPA weights (N, K, C*(R-1)) from the ACS block (N, C, X, L), K = C*ky*kx.

    The ridge is ``lam * tr(S^H S) / K + noise_ridge * M * noise``: the second term is what
    noise of power ``noise`` (N,) in the M source rows adds to ``S^H S`` on average, so
    the fit does not trust directions that noise alone could explain."""
    n, c, x, L = acs.shape
    anchors = xp.asarray(np.arange(-R * int(rows[0]), L - R * int(rows[-1])))
    src = _gather(acs, R * rows, anchors, slice(hx, x - hx), hx, xp)  # (N, K, Xv, P)
    tgt = xp.stack([acs[:, :, hx:x - hx][..., anchors + r] for r in range(1, R)], axis=2)
    K = src.shape[1]
    S = src.reshape(n, K, -1).transpose(0, 2, 1).astype(xp.complex128)  # (N, M, K)
    T = tgt.reshape(n, c * (R - 1), -1).transpose(0, 2, 1).astype(xp.complex128)
    Sh = S.conj().transpose(0, 2, 1)
    AhA, AhB = Sh @ S, Sh @ T
    scale = xp.real(xp.trace(AhA, axis1=1, axis2=2)) / K
    ridge = lam * scale + 1e-12 * (scale == 0)
    if noise is not None:
        ridge = ridge + noise_ridge * S.shape[1] * noise
    reg = ridge[:, None, None] * xp.eye(K)[None]
    return xp.linalg.solve(AhA + reg, AhB).astype(xp.complex64)


def apply_kernel(k: Any, weights: Any, sampling: Sampling, rows: np.ndarray, hx: int, xp: Any) -> Any:
    """Fill the missing lattice gaps of k (N, C, X, Y); acquired samples are kept as they are."""
    n, c, x, y = k.shape
    R = sampling.R
    pad_y = R * int(max(-rows[0], rows[-1]) + 1)
    kp = xp.pad(k, ((0, 0), (0, 0), (hx, hx), (pad_y, pad_y)))
    first = sampling.offset - R * ((sampling.offset + R - 1) // R)  # lattice line in [-(R-1), 0]
    anchors = np.arange(first, y, R)
    src = _gather(kp, R * rows, xp.asarray(anchors + pad_y), slice(hx, hx + x), hx, xp)
    K, P = src.shape[1], anchors.size
    est = src.reshape(n, K, x * P).transpose(0, 2, 1) @ weights  # (N, X*P, C*(R-1))
    est = est.reshape(n, x, P, c, R - 1).transpose(0, 3, 1, 2, 4)  # (N, C, X, P, R-1)
    out = k.copy()
    for r in range(1, R):
        target = anchors + r
        ok = (target >= 0) & (target < y)
        ok &= ~sampling.lines[np.clip(target, 0, y - 1)]
        if ok.any():
            out[..., xp.asarray(target[ok])] = est[..., xp.asarray(np.flatnonzero(ok)), r - 1]
    return out


def grappa_core(batch: Any, sampling: Sampling, params: GrappaParams, xp: Any) -> tuple[Any, dict]:
    """(N, C, X, Y) undersampled k-space -> ((N, X, Y) RSS image, stats)."""
    batch = batch * xp.asarray(sampling.mask2d, dtype=xp.complex64)
    if sampling.R == 1:
        return rss(ifft2c(batch, xp), xp), {}
    rows, hx = kernel_rows(kernel_height(params, sampling)), params.kernel_x // 2
    a, b = sampling.acs
    noise = noise_power(batch, sampling, xp) if params.noise_ridge > 0 else None
    weights = calibrate(batch[..., a:b], sampling.R, rows, hx, params.lam, xp, noise, params.noise_ridge)
    filled = apply_kernel(batch, weights, sampling, rows, hx, xp)
    return rss(ifft2c(filled, xp), xp), {}


def _check_pattern(sampling: Sampling, params: GrappaParams, tool_name: str, x: int) -> None:
    if not sampling.uniform:
        raise ToolError(ErrorCode.value_range, f"{tool_name} needs uniform Cartesian undersampling "
                        f"along Y (every R-th line plus a central ACS block)",
                        hint="use recon.sense (any Cartesian mask) or recon.zero_filled", arg="kspace.mask")
    ky = kernel_height(params, sampling)
    need = sampling.R * (ky - 1) + 1
    if sampling.R > 1 and (sampling.n_acs < need or x < params.kernel_x + 2):
        raise ToolError(ErrorCode.value_range, f"{tool_name}: the ACS block has {sampling.n_acs} lines "
                        f"but kernel_y={ky} at R={sampling.R} needs {need}",
                        hint=f"lower kernel_y to {max(2, (sampling.n_acs - 1) // sampling.R + 1)}"
                        if sampling.n_acs >= sampling.R + 1 else "acquire more calibration lines",
                        arg="kernel_y")


def _grappa(kspace: KSpace, params: GrappaParams, cine: bool, tool_name: str, device: str) -> Image | Cine:
    data = check_kspace(kspace, cine, tool_name)
    sampling = analyse_mask(kspace.mask, data.shape[1:3])
    _check_pattern(sampling, params, tool_name, data.shape[1])
    xp = array_module(device)
    images, _ = run_batched(as_slices(data), xp, lambda b: grappa_core(b, sampling, params, xp))
    meta = {"method": "grappa", "coil_combine": "rss", "acceleration": sampling.R,
            "acs_lines": sampling.n_acs, "kernel": [kernel_height(params, sampling), params.kernel_x],
            "lam": params.lam, "noise_ridge": params.noise_ridge, "n_coils": int(data.shape[0]), "device": device}
    return to_artifact(images, kspace, data.shape, cine, meta)


@tool("recon.grappa", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="image", gpu_frameworks=("cupy",))
def grappa(kspace: KSpace, params: GrappaParams, device: str = "cpu") -> Image:
    """GRAPPA reconstruction of uniformly undersampled (C, X, Y, Z) k-space with a central
    ACS block: kernels calibrated per slice on the ACS lines fill the missing lines, then
    inverse FFT + root-sum-of-squares.

    Args:
        kspace: multi-coil k-space (C, X, Y, Z), mask (Y,) with every R-th line + ACS.
        params: kernel size and Tikhonov weight.
        device: "cpu" or "cuda" (cupy path).

    Returns:
        Magnitude Image (X, Y, Z) on the recon matrix (``kspace.recon_affine``).
    """
    return _grappa(kspace, params, False, "recon.grappa", device)


@tool("recon.grappa_cine", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="cine", gpu_frameworks=("cupy",))
def grappa_cine(kspace: KSpace, params: GrappaParams, device: str = "cpu") -> Cine:
    """GRAPPA reconstruction of cine k-space (C, X, Y, Z, T) into a magnitude Cine, kernels
    calibrated per slice and frame (same core as ``recon.grappa``)."""
    return _grappa(kspace, params, True, "recon.grappa_cine", device)
