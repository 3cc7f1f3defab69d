"""Centred 2-D FFTs over (X, Y) and root-sum-of-squares coil combination.

The k-space convention is the one of ``bcer.datasets.kspace`` (and of sigpy and fastMRI):
``kspace = fftshift(fft2(ifftshift(image), norm="ortho"))`` over the in-plane axes, so
the DC sample sits at index ``n // 2`` and the transform is unitary. All routines take an
array module ``xp`` (numpy or cupy) and work on batches whose last two axes are (X, Y).
"""
from __future__ import annotations

from typing import Any

_AXES = (-2, -1)


def fft2c(image: Any, xp: Any) -> Any:
    """Image (..., X, Y) -> centred k-space (..., X, Y), orthonormal."""
    shifted = xp.fft.ifftshift(image, axes=_AXES)
    return xp.fft.fftshift(xp.fft.fft2(shifted, axes=_AXES, norm="ortho"), axes=_AXES)


def ifft2c(kspace: Any, xp: Any) -> Any:
    """Centred k-space (..., X, Y) -> image (..., X, Y); the exact inverse of ``fft2c``."""
    shifted = xp.fft.ifftshift(kspace, axes=_AXES)
    return xp.fft.fftshift(xp.fft.ifft2(shifted, axes=_AXES, norm="ortho"), axes=_AXES)


def rss(coil_images: Any, xp: Any, axis: int = 1) -> Any:
    """Root-sum-of-squares over the coil axis (magnitude, real float)."""
    return xp.sqrt(xp.sum(xp.abs(coil_images) ** 2, axis=axis))
