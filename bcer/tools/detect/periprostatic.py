"""Step 5 of ``detect.prostate_lesions``: what is periprostatic tissue, not a lesion, whatever
the gland mask says (fat without DWI signal; the capsule as a one-voxel sheet along the
mask's edge), and the high-b image's b-value that sets how much DWI a low-ADC lesion shows.

Its own module so the detector's steps stay short; it reads the maps step 1 made (each
voxel's normal ADC ``ref`` and normal-tissue DWI ``dnorm``) as plain arrays."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy import ndimage

from ...contracts.artifacts import Image
from ..quant import max_diameter_mm

if TYPE_CHECKING:
    from .params import LesionParams


def not_a_lesion(comp: np.ndarray, a: np.ndarray, d: np.ndarray, ref: np.ndarray, dnorm: np.ndarray,
                 depth: np.ndarray, spacing: tuple[float, ...], affine: np.ndarray, p: LesionParams,
                 b_value: float | None = None) -> str:
    """Why a lesion's ADC-grid outline is periprostatic tissue, not a lesion (step 5); "" when
    it is a lesion. ``ref``/``dnorm``: each voxel's normal ADC and normal-tissue DWI;
    ``depth``: each voxel's distance (mm) inside the gland (share >= 0.5). Thresholds set with
    a mask-edge measurement (in git history) on the randomised family only (segmented mask, one
    voxel larger, one smaller)."""
    adc, r = float(np.median(a[comp])), float(np.median(ref[comp]))
    adc_ratio = adc / max(r, 1e-6)
    dwi_ratio = float(np.median(d[comp]) / max(float(np.median(dnorm[comp])), 1e-6))
    if dwi_ratio >= p.edge_dwi_ratio:
        return ""
    if adc_ratio < p.blackout_adc_ratio:
        # ADC in 1e-6 mm2/s: a lesion of its zone's b=0 signal is exp(b x drop) x brighter
        need = p.edge_dwi_ratio
        if b_value:
            need = min(need, p.blackout_s0_ratio * float(np.exp(b_value * (r - adc) * 1e-6)))
        if dwi_ratio < need:
            return (f"ADC {adc_ratio:.2f}x its reference without DWI signal ({dwi_ratio:.2f}x its zone, "
                    f"{need:.2f}x asked)")
    # one voxel wide in-plane in every slice: no voxel has all four in-plane neighbours inside
    if ndimage.binary_erosion(comp, ndimage.generate_binary_structure(2, 1)[..., None]).any():
        return ""
    voxel = max(spacing[:2])
    length = max_diameter_mm(np.argwhere(comp), affine)
    if length < p.linear_length_vox * voxel or float(depth[comp].max()) > p.linear_depth_vox * voxel + 1e-6:
        return ""
    return f"linear ({length:.1f} mm long, one voxel wide) along the gland's edge with DWI {dwi_ratio:.2f}x its zone"


def b_value(dwi: Image) -> float | None:
    """The high-b image's b-value (s/mm2) from its metadata (DICOM DiffusionBValue, a NIfTI
    .bval), None when not given or not one positive number."""
    try:
        b = float(dwi.meta.get("b_value") or 0.0)
    except (TypeError, ValueError):
        return None
    return b if np.isfinite(b) and b > 0 else None
