"""``recon.sense``: CG-SENSE (Pruessmann et al., MRM 2001) with coil maps estimated from
the calibration block.

Per slice, the image ``x`` solves ``(E^H E + lam I) x = E^H y`` with ``E = M F S`` (coil
maps S, centred orthonormal FFT F, sampling mask M) by conjugate gradients. All slices of a
batch iterate together: every CG scalar is a vector over slices, so there is no loop over
slices or voxels, only over iterations. Maps are normalised to unit root-sum-of-squares, so
the magnitude of ``x`` is on the scale of the RSS image of fully sampled data.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...contracts.artifacts import Cine, Image, KSpace
from ...contracts.errors import ErrorCode, ToolError
from .._gpu import array_module
from ..registry import tool
from ._coils import Sampling, analyse_mask, as_slices, check_kspace, run_batched, to_artifact
from ._fft import fft2c, ifft2c
from ._maps import ESTIMATORS

_RESOURCES = {"num_cpus": 1, "memory_mb": 4096}


class SenseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    iterations: int = Field(30, ge=1, le=200, description="maximum conjugate-gradient iterations")
    lam: float = Field(1e-3, ge=0.0, le=1.0, description="Tikhonov (L2) weight; the normal "
                       "operator has eigenvalues <= 1 because the maps have unit RSS")
    tol: float = Field(1e-4, ge=0.0, le=0.1, description="stop when every slice's residual norm "
                       "fell below tol x its initial norm")
    maps: Literal["smooth", "lowres", "espirit"] = Field(
        "smooth", description="coil-map estimator: 'smooth' (low-resolution ACS maps refitted by a "
        "weighted Legendre polynomial, robust when the object is cut by the FOV), 'lowres' "
        "(windowed ACS images / RSS) or 'espirit' (sigpy EspiritCalib, CPU)")
    map_threshold: float = Field(0.05, ge=0.0, le=0.5, description="relative low-resolution RSS "
                                 "(smooth/lowres) or eigenvalue (espirit) threshold: background")
    map_degree: int = Field(4, ge=1, le=12, description="total polynomial degree of 'smooth' maps")


def normal_op(x: Any, maps: Any, mask2d: Any, lam: float, xp: Any) -> Any:
    """(E^H E + lam I) x for a batch x (N, X, Y)."""
    coil_k = fft2c(maps * x[:, None], xp) * mask2d
    return xp.sum(maps.conj() * ifft2c(coil_k, xp), axis=1) + lam * x


def _dot(a: Any, b: Any, xp: Any) -> Any:
    """Per-slice real inner product Re<a, b> over (X, Y), shape (N, 1, 1)."""
    return xp.real(xp.sum(a.conj() * b, axis=(1, 2)))[:, None, None]


def cg_sense(kspace: Any, maps: Any, mask2d: Any, params: SenseParams, xp: Any) -> tuple[Any, dict]:
    """Batched CG on the SENSE normal equations; returns ((N, X, Y) complex image, stats)."""
    b = xp.sum(maps.conj() * ifft2c(kspace * mask2d, xp), axis=1)
    x = xp.zeros_like(b)
    r, p = b.copy(), b.copy()
    rs = rs0 = _dot(r, r, xp)
    stop = (params.tol ** 2) * rs0
    it, rs_new = 0, rs0
    for it in range(1, params.iterations + 1):
        ap = normal_op(p, maps, mask2d, params.lam, xp)
        denom = _dot(p, ap, xp)
        alpha = xp.where(denom > 0, rs / xp.where(denom > 0, denom, 1), 0)
        x = x + alpha * p
        r = r - alpha * ap
        rs_new = _dot(r, r, xp)
        if bool(xp.all(rs_new <= stop)):
            break
        p = r + xp.where(rs > 0, rs_new / xp.where(rs > 0, rs, 1), 0) * p
        rs = rs_new
    rel = xp.sqrt(xp.where(rs0 > 0, rs_new / xp.where(rs0 > 0, rs0, 1), 0))
    return x, {"iterations": it, "max_rel_residual": float(xp.max(rel))}


def sense_core(batch: Any, sampling: Sampling, params: SenseParams, xp: Any) -> tuple[Any, dict]:
    """(N, C, X, Y) undersampled k-space -> ((N, X, Y) magnitude, stats)."""
    mask2d = xp.asarray(sampling.mask2d, dtype=xp.complex64)
    maps = ESTIMATORS[params.maps](batch * mask2d, sampling, xp, params.map_threshold, params.map_degree)
    x, stats = cg_sense(batch, maps, mask2d, params, xp)
    return xp.abs(x), stats


def _check_calibration(sampling: Sampling, tool_name: str) -> None:
    if sampling.n_acs < 8:
        raise ToolError(ErrorCode.value_range, f"{tool_name} needs a fully sampled central "
                        f"calibration block of >= 8 lines to estimate coil maps; found {sampling.n_acs}",
                        hint="acquire autocalibration lines or use recon.zero_filled", arg="kspace.mask")


def _sense(kspace: KSpace, params: SenseParams, cine: bool, tool_name: str, device: str) -> Image | Cine:
    data = check_kspace(kspace, cine, tool_name)
    sampling = analyse_mask(kspace.mask, data.shape[1:3])
    _check_calibration(sampling, tool_name)
    xp = array_module(device)
    images, stats = run_batched(as_slices(data), xp, lambda b: sense_core(b, sampling, params, xp))
    meta = {"method": "cg_sense", "maps": params.maps, "acceleration": round(float(
                sampling.mask2d.size / max(int(sampling.mask2d.sum()), 1)), 3),
            "acs_lines": sampling.n_acs, "lam": params.lam, "n_coils": int(data.shape[0]),
            "iterations": max(s["iterations"] for s in stats),
            "max_rel_residual": max(s["max_rel_residual"] for s in stats), "device": device}
    return to_artifact(images, kspace, data.shape, cine, meta)


@tool("recon.sense", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="image", gpu_frameworks=("cupy",))
def sense(kspace: KSpace, params: SenseParams, device: str = "cpu") -> Image:
    """CG-SENSE reconstruction of undersampled (C, X, Y, Z) Cartesian k-space, coil maps
    estimated from the central calibration block (smooth refit of low-resolution maps by
    default, or raw low-resolution maps, or ESPIRiT). Any Cartesian mask with such a block
    works (regular or random lines).

    Args:
        kspace: multi-coil k-space (C, X, Y, Z) with a central fully sampled block.
        params: CG iterations, Tikhonov weight, tolerance, map estimator.
        device: "cpu" or "cuda" (cupy path).

    Returns:
        Magnitude Image (X, Y, Z) on the recon matrix (``kspace.recon_affine``).
    """
    return _sense(kspace, params, False, "recon.sense", device)


@tool("recon.sense_cine", version="1.1", milestone="reconstruction", resources=_RESOURCES,
      gpu="optional", output="cine", gpu_frameworks=("cupy",))
def sense_cine(kspace: KSpace, params: SenseParams, device: str = "cpu") -> Cine:
    """CG-SENSE reconstruction of cine k-space (C, X, Y, Z, T) into a magnitude Cine, maps
    estimated per slice and frame (same core as ``recon.sense``)."""
    return _sense(kspace, params, True, "recon.sense_cine", device)
