"""Coil-sensitivity maps from the calibration (ACS) block, for SENSE.

- ``lowres``: Hann-windowed ACS -> low-resolution coil images / their root-sum-of-squares.
  Accurate where the object is smooth on the scale of the window, wrong within about one
  low-resolution pixel of the field-of-view border when the object is cut by it: there the
  periodic FFT wraps the opposite border (different coil weights) into the estimate.
- ``smooth`` (default): the ``lowres`` maps with that border band and the background
  excluded, fitted per coil and slice by weighted least squares on a 2-D Legendre basis of
  total degree ``degree``, which extrapolates the (physically smooth) sensitivities into the
  border band and background. One batched solve per slice, no loop over voxels.
- ``espirit``: sigpy's ``EspiritCalib`` per slice (CPU only).

Every estimator returns (N, C, X, Y) complex64 maps with unit root-sum-of-squares where
they are defined (zero elsewhere), so the SENSE image has the RSS image's scale.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numpy.polynomial import legendre

from .._gpu import to_numpy
from ._coils import Sampling
from ._fft import ifft2c, rss

# Border band excluded from the fit, in low-resolution pixels (Y / n_acs): the width over
# which the wrapped-around border contaminates the windowed low-resolution coil images.
_BAND_LOWRES_PX = 1.2


def _window(sampling: Sampling, x: int, y: int) -> tuple[np.ndarray, int]:
    """(X, Y) Hann window over the ACS rows and a matching central band of columns."""
    a, b = sampling.acs
    wx = min(x, max(sampling.n_acs, round(sampling.n_acs * x / y)))
    window = np.zeros((x, y), dtype=np.float32)
    x0 = (x - wx) // 2
    window[x0:x0 + wx, a:b] = np.outer(np.hanning(wx + 2)[1:-1], np.hanning(b - a + 2)[1:-1])
    return window, wx


def _lowres(batch: Any, sampling: Sampling, xp: Any) -> tuple[Any, Any, int]:
    """(unit-RSS low-resolution maps (N,C,X,Y), low-resolution RSS (N,X,Y), window width in X)."""
    window, wx = _window(sampling, batch.shape[2], batch.shape[3])
    coil = ifft2c(batch * xp.asarray(window), xp)
    norm = rss(coil, xp)
    safe = xp.where(norm > 0, norm, 1)
    return coil / safe[:, None], norm, wx


def _peak_mask(norm: Any, threshold: float, xp: Any) -> Any:
    n = norm.shape[0]
    peak = xp.max(norm.reshape(n, -1), axis=1).reshape(n, 1, 1)
    return norm > threshold * peak


def lowres_maps(batch: Any, sampling: Sampling, xp: Any, threshold: float, degree: int = 0) -> Any:
    """Unit-RSS low-resolution maps, zeroed where the low-resolution RSS is below
    ``threshold`` x its slice maximum (background)."""
    maps, norm, _ = _lowres(batch, sampling, xp)
    return xp.where(_peak_mask(norm, threshold, xp)[:, None], maps, 0).astype(xp.complex64)


def _legendre_basis(x: int, y: int, degree: int) -> np.ndarray:
    """(X*Y, K) products P_i(x) P_j(y), i + j <= degree, on [-1, 1]^2."""
    vx = legendre.legvander(np.linspace(-1, 1, x), degree)
    vy = legendre.legvander(np.linspace(-1, 1, y), degree)
    terms = [(i, j) for i in range(degree + 1) for j in range(degree + 1 - i)]
    return np.stack([np.outer(vx[:, i], vy[:, j]).ravel() for i, j in terms], axis=1)


def smooth_maps(batch: Any, sampling: Sampling, xp: Any, threshold: float, degree: int = 4) -> Any:
    """Low-resolution maps refitted by a weighted Legendre polynomial (see module docstring)."""
    n, c, x, y = batch.shape
    maps, norm, wx = _lowres(batch, sampling, xp)
    # The per-pixel common phase of the maps is arbitrary (it moves into the image); fix it
    # to a virtual coil (the coil weights at the brightest pixel) so the maps are smooth.
    brightest = xp.argmax(norm.reshape(n, -1), axis=1)
    ref = maps.reshape(n, c, -1)[xp.arange(n), :, brightest]  # (N, C)
    common = xp.einsum("nc,ncxy->nxy", ref.conj(), maps)
    maps = maps * xp.exp(-1j * xp.angle(common))[:, None]
    bx = max(1, round(_BAND_LOWRES_PX * x / wx))
    by = max(1, round(_BAND_LOWRES_PX * y / max(sampling.n_acs, 1)))
    inner = np.zeros((x, y), dtype=bool)
    inner[bx:x - bx, by:y - by] = True
    weight = (_peak_mask(norm, threshold, xp) & xp.asarray(inner)).reshape(n, -1).astype(xp.float64)
    phi = xp.asarray(_legendre_basis(x, y, degree))  # (P, K)
    weighted = phi.T[None] * weight[:, None, :]  # (N, K, P)
    normal = weighted @ phi  # (N, K, K)
    ridge = 1e-9 * xp.trace(normal, axis1=1, axis2=2)[:, None, None] / phi.shape[1] + 1e-12
    normal = (normal + ridge * xp.eye(phi.shape[1])[None]).astype(xp.complex128)
    # explicit dtypes: cupy's matmul/solve do not promote mixed real/complex operands everywhere
    samples = maps.reshape(n, c, -1).transpose(0, 2, 1).astype(xp.complex128)  # (N, P, C)
    rhs = weighted.astype(xp.complex128) @ samples
    coef = xp.linalg.solve(normal, rhs)  # (N, K, C)
    fitted = (phi.astype(xp.complex128) @ coef).transpose(0, 2, 1).reshape(n, c, x, y)
    total = rss(fitted, xp)
    return (fitted / xp.where(total > 0, total, 1)[:, None]).astype(xp.complex64)


def espirit_maps(batch: Any, sampling: Sampling, xp: Any, threshold: float, degree: int = 0) -> Any:
    """ESPIRiT maps per slice with sigpy's ``EspiritCalib`` (computed on the CPU)."""
    from sigpy.mri.app import EspiritCalib

    host = to_numpy(batch)
    maps = np.stack([EspiritCalib(s, calib_width=sampling.n_acs, thresh=threshold, crop=0.8,
                                  max_iter=30, show_pbar=False).run() for s in host])
    return xp.asarray(maps, dtype=xp.complex64)


ESTIMATORS = {"lowres": lowres_maps, "smooth": smooth_maps, "espirit": espirit_maps}
