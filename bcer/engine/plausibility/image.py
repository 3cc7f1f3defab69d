"""Checks of image deliverables: finite values, still the input's content, the header's recon matrix."""
from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .core import (Inputs, NoParams, Unavailable, Verdict, check, find_sequence, sample_nearest,
                   voxel_to_world)

_MAX_POINTS = 200_000  # enough voxels for a stable correlation; bounds the cost on full-size grids


@check("finite_image", NoParams)
def finite_image(x: Inputs, p: NoParams) -> Verdict:
    """Every voxel finite and the image not constant. Limit: 0 NaN/Inf voxels, std > 0
    (a constant volume carries no image, whatever its size)."""
    data = np.asarray(x.nifti().data)
    bad = float(np.size(data) - np.count_nonzero(np.isfinite(data)))
    if bad:
        return Verdict(False, bad, "0 non-finite voxels", f"{bad:.0f} NaN/Inf voxels")
    std = float(data.std(dtype=np.float64))
    if std == 0.0:
        return Verdict(False, 0.0, "std > 0", f"the image is constant ({float(data.flat[0]):.4g})")
    return Verdict(True, 0.0, "0 non-finite voxels, std > 0", f"finite, std {std:.4g}")


class SimilarParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequence: list[str] = Field(default_factory=lambda: ["T1", "T2w", "T2", "FLAIR", "T1c"],
                                description="the input sequence (first the case has)")
    min_corr: float = Field(0.5, ge=-1.0, le=1.0, description="lowest Pearson r with the input")


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


@check("similar_to_input", SimilarParams)
def similar_to_input(x: Inputs, p: SimilarParams) -> Verdict:
    """The output is still the input's content: Pearson r between the deliverable and the input
    sequence at the input's voxel centres (nearest voxel of the output) >= 0.5. A denoised or
    super-resolved volume of the same scan correlates far above that on any real noise level;
    an output of another sequence, another grid position or another case does not."""
    out, inp = x.nifti(), x.sequence(p.sequence)
    if out.data.ndim != 3 or inp.data.ndim != 3:
        return Verdict(None, None, f"r ≥ {p.min_corr:g}", f"not applicable: {out.data.ndim}-D output, "
                       f"{inp.data.ndim}-D input")
    n = int(np.prod(inp.data.shape))
    idx = np.arange(0, n, max(1, n // _MAX_POINTS))
    if out.data.shape == inp.data.shape and np.allclose(out.affine, inp.affine, atol=1e-3):
        a = np.asarray(out.data).reshape(-1)[idx].astype(np.float64)
        b = np.asarray(inp.data).reshape(-1)[idx].astype(np.float64)
    else:
        ijk = np.column_stack(np.unravel_index(idx, inp.data.shape))
        a = sample_nearest(out, voxel_to_world(inp.affine, ijk), fill=np.nan)
        b = np.asarray(inp.data, np.float64).reshape(-1)[idx]
        keep = np.isfinite(a)
        if keep.mean() < 0.5:
            return Verdict(False, float(keep.mean()), "overlap ≥ 50 %",
                           f"the output covers only {100 * keep.mean():.0f} % of the input's field of view")
        a, b = a[keep], b[keep]
    r = _pearson(a, b)
    ok = r >= p.min_corr
    return Verdict(ok, r, f"r ≥ {p.min_corr:g}", f"correlation with input {find_sequence(x.case, p.sequence)} "
                   f"r = {r:.3f}" + ("" if ok else ": the output is not this input's image"))


class ReconMatrixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field("recon_matrix", description="case metadata key of the header's recon matrix")


def recon_matrix_of(meta: Any) -> tuple[int, ...]:
    """(x, y[, z]) from ``[x, y(, z)]`` or ``{"x": .., "y": .., "z": ..}`` (ISMRMRD reconSpace)."""
    if isinstance(meta, dict):
        vals = [meta[k] for k in ("x", "y", "z") if k in meta]
    else:
        vals = list(meta)
    out = tuple(int(v) for v in vals)
    if len(out) < 2 or min(out) < 1:
        raise Unavailable(f"recon matrix {meta!r} is not (x, y[, z]) positive integers")
    return out


@check("recon_matrix", ReconMatrixParams)
def recon_matrix(x: Inputs, p: ReconMatrixParams) -> Verdict:
    """The reconstruction's in-plane matrix equals the header's recon matrix (ISMRMRD
    ``reconSpace/matrixSize``, which fastMRI's ``reconstruction_rss`` uses: readout
    oversampling removed, centre crop) when the case metadata has one. The axes may be
    in either order (the NIfTI writer may store x/y transposed; that is an orientation,
    not another matrix). Value: in-plane voxels relative to the header's matrix."""
    meta = x.case.metadata.get(p.key)
    if meta is None:
        return Verdict(None, None, "", f"not applicable: case metadata has no {p.key!r}")
    want = recon_matrix_of(meta)[:2]
    got = tuple(int(n) for n in x.nifti().data.shape[:2])
    limit = f"{want[0]}×{want[1]}"
    ok = got == want or got == want[::-1]
    ratio = (got[0] * got[1]) / (want[0] * want[1])  # value: in-plane voxels relative to the header's
    return Verdict(ok, ratio, limit, f"in-plane matrix {got[0]}×{got[1]}"
                   + ("" if ok else f", header recon matrix {limit} ({ratio:.2g}× its voxels)"))


__all__ = ["finite_image", "recon_matrix", "recon_matrix_of", "similar_to_input"]
