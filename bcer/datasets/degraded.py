"""Degraded inputs for the short tasks, each with its clean truth in ``Phantom.references``.

- Denoise: every image sequence of a clean phantom gets Rician noise of a known sigma.
- SuperRes: every image sequence becomes a thick-slice (through-plane averaged) volume;
  the reference is the original on the grid the low-res slabs were averaged from.

Any domain with a generator in ``bcer.datasets.generators.GENERATORS`` works.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np

from ..contracts.artifacts import Cine, Image
from ..contracts.errors import ErrorCode, ToolError
from ..metrics import nrmse, psnr  # re-exported: the phantom tests use them beside the cases
from .degrade import downsample_through_plane, rician_noise
from .generators import get_generator
from .phantom import Phantom, Size

log = logging.getLogger(__name__)

__all__ = ["make_denoise_case", "make_superres_case", "nrmse", "psnr", "signal_level"]


def signal_level(data: np.ndarray) -> float:
    """99th percentile of the voxels brighter than 10 % of the maximum (the tissue signal)."""
    d = np.asarray(data, dtype=np.float64)
    fg = d[d > 0.1 * d.max()] if d.max() > 0 else d.ravel()
    return float(np.percentile(fg, 99)) if fg.size else 0.0


def _clean_phantom(domain: str, case_id: str, seed: int, size: Size, **kw: Any) -> Phantom:
    gen = get_generator(domain)
    params = inspect.signature(gen).parameters
    if "noise" in params:
        kw.setdefault("noise", 0.0)  # the degradation here must be the only noise
    return gen(case_id, seed, size, **kw)


def _volumes(ph: Phantom, types: tuple[type, ...]) -> dict[str, Any]:
    vols = {n: a for n, a in ph.sequences.items() if isinstance(a, types)}
    if not vols:
        raise ToolError(ErrorCode.input_missing, f"{ph.domain} phantom {ph.case_id} has no "
                        f"{'/'.join(t.__name__ for t in types)} sequence to degrade", case=ph.case_id)
    return vols


def make_denoise_case(case_id: str, seed: int, size: Size = "small", domain: str = "brain",
                      sigma_frac: float = 0.05, **kw: Any) -> Phantom:
    """A noisy case for the Denoise task.

    Args:
        case_id, seed, size: as for the domain's generator.
        domain: brain | cardiac | prostate.
        sigma_frac: Rician sigma as a fraction of each sequence's tissue signal level.
        **kw: extra generator arguments.

    Returns:
        The phantom with noisy image/cine sequences; ``references[name]`` is the clean
        volume on the same grid; ``truth["denoise"]`` gives per-sequence ``sigma`` and the
        noisy input's ``nrmse``/``psnr`` against the reference (the baseline to beat).
    """
    if not 0 < sigma_frac < 1:
        raise ToolError(ErrorCode.value_range, f"sigma_frac must be in (0, 1), got {sigma_frac}",
                        arg="sigma_frac", case=case_id)
    ph = _clean_phantom(domain, case_id, seed, size, **kw)
    rng = np.random.default_rng([seed, 0xD0])
    info: dict[str, Any] = {"sigma_frac": float(sigma_frac), "sigma": {}, "nrmse": {}, "psnr": {}}
    for name, art in _volumes(ph, (Image, Cine)).items():
        clean = np.asarray(art.data, dtype=np.float32)
        sigma = sigma_frac * signal_level(clean)
        noisy = rician_noise(clean, sigma, rng)
        ph.references[name] = type(art)(clean, np.array(art.affine), dict(art.meta, clean=True))
        ph.sequences[name] = type(art)(noisy, np.array(art.affine), dict(art.meta, noise_sigma=sigma))
        info["sigma"][name] = float(sigma)
        info["nrmse"][name] = nrmse(noisy, clean)
        info["psnr"][name] = psnr(noisy, clean)
    ph.truth = {**ph.truth, "task": "denoise", "denoise": info}
    ph.metadata = {**ph.metadata, "degradation": "rician_noise"}
    return ph


def _trim(img: Image, n: int, axis: int) -> Image:
    idx = [slice(None)] * img.data.ndim
    idx[axis] = slice(0, n)
    return Image(np.asarray(img.data)[tuple(idx)], np.array(img.affine), dict(img.meta))


def make_superres_case(case_id: str, seed: int, size: Size = "small", domain: str = "brain",
                       factor: int = 4, axis: int = 2, **kw: Any) -> Phantom:
    """A thick-slice case for the SuperRes task.

    Each image sequence is cut to a whole number of ``factor``-slice slabs along ``axis``
    (the reference), then slab-averaged (the input). Label maps are dropped: they would lie
    on the reference grid, not on the inputs (``truth["superres"]["labels_dropped"]``).

    Returns:
        The phantom with low-res sequences (``factor`` times thicker along ``axis``);
        ``references[name]`` the high-res truth; ``metadata["target_spacing"]`` and
        ``metadata["target_shape"]`` per sequence; ``truth["superres"]`` with factor, axis,
        target affines and the low-res input's NRMSE after nearest upsampling.
    """
    if factor < 2:
        raise ToolError(ErrorCode.value_range, f"factor must be >= 2, got {factor}", arg="factor",
                        case=case_id)
    ph = _clean_phantom(domain, case_id, seed, size, **kw)
    info: dict[str, Any] = {"factor": int(factor), "axis": int(axis), "target_affine": {},
                            "input_nrmse": {}}
    target_spacing, target_shape = {}, {}
    for name, img in _volumes(ph, (Image,)).items():
        n = (img.shape[axis] // factor) * factor
        hi = _trim(img, n, axis)
        lo = downsample_through_plane(hi, factor, axis)
        ph.references[name], ph.sequences[name] = hi, lo
        target_spacing[name] = [float(s) for s in hi.spacing]
        target_shape[name] = list(hi.shape)
        info["target_affine"][name] = hi.affine.tolist()
        info["input_nrmse"][name] = nrmse(np.repeat(lo.data, factor, axis=axis), hi.data)
    # Label maps lie on the high-res grid, not on the inputs: a case whose labels disagree
    # with its sequences fails validate_case_shapes, so they are dropped (names recorded).
    info["labels_dropped"] = sorted(ph.labels)
    ph.labels = {}
    ph.metadata = {**ph.metadata, "degradation": "thick_slices", "target_spacing": target_spacing,
                   "target_shape": target_shape}
    ph.truth = {**ph.truth, "task": "superres", "superres": info}
    return ph
