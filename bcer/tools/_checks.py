"""Input checks shared by tools: each failure is a typed ToolError naming the input."""
from __future__ import annotations

import numpy as np

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.geometry import same_grid


def require_ndim(artifact, ndim: int, name: str) -> None:
    shape = tuple(np.shape(artifact.data))
    if len(shape) != ndim:
        what = {3: "a 3-D volume", 4: "a 3-D+time cine"}.get(ndim, f"{ndim}-D data")
        raise ToolError(ErrorCode.shape, f"input {name!r} has shape {shape}; expected {what}", arg=name)


def require_finite(artifact, name: str) -> None:
    data = np.asarray(artifact.data)
    if np.iscomplexobj(data) or np.issubdtype(data.dtype, np.floating):
        if not np.all(np.isfinite(data)):
            bad = int(data.size - np.count_nonzero(np.isfinite(data)))
            raise ToolError(ErrorCode.numeric, f"input {name!r} has {bad} NaN/Inf values", arg=name)


def require_nonempty(mask, name: str, label: int | None = None) -> None:
    data = np.asarray(mask.data)
    n = np.count_nonzero(data == label) if label is not None else np.count_nonzero(data)
    if n == 0:
        what = f"label {label}" if label is not None else "any foreground"
        raise ToolError(ErrorCode.value_range, f"mask {name!r} has no voxels of {what}", arg=name)


def require_same_grid(a, b, name_a: str, name_b: str, atol: float = 1e-3) -> None:
    if not same_grid(a.affine, np.shape(a.data), b.affine, np.shape(b.data), atol):
        raise ToolError(ErrorCode.shape, f"inputs {name_a!r} {np.shape(a.data)[:3]} and {name_b!r} "
                        f"{np.shape(b.data)[:3]} are not on the same voxel grid",
                        hint="resample one onto the other (register.apply or resample.to_grid)",
                        arg=name_b, reference=name_a)


def require_volume(artifact, name: str, ndim: int = 3) -> np.ndarray:
    """The common preamble: right number of dimensions and finite values."""
    require_ndim(artifact, ndim, name)
    require_finite(artifact, name)
    return np.asarray(artifact.data)
