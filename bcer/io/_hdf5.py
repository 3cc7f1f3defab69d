"""Opening HDF5 containers (fastMRI .h5, MATLAB v7.3 .mat) with typed errors naming the file."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..contracts.errors import ErrorCode, ToolError

if TYPE_CHECKING:
    import h5py


def open_hdf5(path: str | Path, what: str, hint: str) -> "h5py.File":
    """Open ``path`` read-only; a missing file is ``input_missing``, a non-HDF5 one ``schema``."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"file not found: {path}", file=str(path))
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise ToolError(ErrorCode.schema, f"{path.name} is not {what}: {e}", hint=hint, file=str(path)) from e
