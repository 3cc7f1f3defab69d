"""Checks of a rigid transform between two series of one session.

Both series of a same-session exam are already in the scanner's frame (their headers'
affines), so what a registration may correct is patient/organ motion between the series
plus the part of EPI distortion a rigid transform absorbs. Limits and sources:

- translation 12 mm at the centre of the fixed image: prostate displacement during a ~9 min
  cine MRI was 0.2 ± 2.9 mm AP, 0.0 ± 3.4 mm SI, 0.0 ± 1.5 mm LR with transient excursions
  up to 12 mm (Mah et al., Int J Radiat Oncol Biol Phys 2002;54:568-575); whole-gland DWI
  distortion against T2w was 1.9 ± 0.6 mm without, 4.4 ± 1.1 mm with visible distortion and
  8.1 ± 4.7 mm with hip prostheses (Gill et al., Sci Rep 2017;7:12727).
- rotation 10°: our choice (we found no published bound on inter-series rotation in one
  prostate exam; the studies above report displacements of a few mm, which a rotation of
  10° about a point 50 mm away already exceeds).
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .core import Inputs, Unavailable, Verdict, Volume, check


class RigidParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_rotation_deg: float = Field(10.0, gt=0, le=180)
    max_translation_mm: float = Field(12.0, gt=0)
    fixed: list[str] = Field(default_factory=lambda: ["T2w"],
                             description="the fixed sequence (its grid's centre is where displacement is measured)")
    orthonormal_tol: float = Field(1e-3, gt=0, description="|R^T R - I| above this is not a rigid rotation")


def _matrix(x: Inputs) -> np.ndarray:
    m = np.asarray(x.json().get("matrix"), dtype=np.float64)
    if m.shape != (4, 4) or not np.all(np.isfinite(m)):
        raise Unavailable(f"transform matrix has shape {m.shape} or non-finite entries; need a finite 4x4")
    return m


def _fixed_grid(x: Inputs, p: RigidParams) -> Volume:
    """The fixed image's grid: a deliverable on it (``uses: {grid: ...}``), else the fixed input."""
    return x.nifti("grid") if x.has("grid") else x.sequence(p.fixed)


@check("registration_rotation", RigidParams)
def registration_rotation(x: Inputs, p: RigidParams) -> Verdict:
    """A proper rotation (orthonormal, det +1: no scaling, shear or flip in a "rigid" transform)
    of at most 10° between two series of one session (see the module's sources)."""
    m = _matrix(x)
    r = m[:3, :3]
    err = float(np.abs(r.T @ r - np.eye(3)).max())
    if err > p.orthonormal_tol or np.linalg.det(r) <= 0:
        return Verdict(False, None, "orthonormal, det +1", f"not a rigid rotation: |RᵀR − I| = {err:.3g}, "
                       f"det {np.linalg.det(r):.3g}")
    angle = float(np.degrees(np.arccos(np.clip((np.trace(r) - 1) / 2, -1, 1))))
    ok = angle <= p.max_rotation_deg
    return Verdict(ok, angle, f"≤ {p.max_rotation_deg:g}°", f"rotation {angle:.2f}°"
                   + ("" if ok else " between two series of one session"))


@check("registration_translation", RigidParams)
def registration_translation(x: Inputs, p: RigidParams) -> Verdict:
    """The transform moves the centre of the fixed image by at most 12 mm (see the module's
    sources); measured at the centre because that is where a prostate exam puts the gland,
    and because a rotation about a far-away origin would inflate the raw translation column."""
    m, grid = _matrix(x), _fixed_grid(x, p)
    centre_ijk = (np.asarray(grid.data.shape[:3], np.float64) - 1) / 2
    c = grid.affine[:3, :3] @ centre_ijk + grid.affine[:3, 3]
    d = float(np.linalg.norm(m[:3, :3] @ c + m[:3, 3] - c))
    ok = d <= p.max_translation_mm
    return Verdict(ok, d, f"≤ {p.max_translation_mm:g} mm", f"displacement at the fixed image centre {d:.2f} mm"
                   + ("" if ok else " between two series of one session"))


__all__ = ["registration_rotation", "registration_translation"]
