"""CMRxRecon ``.mat`` files (MATLAB v7.3 = HDF5): k-space and sampling masks.

MATLAB v7.3 stores arrays column-major, so h5py sees the dimensions reversed:
- k-space variable (``kspace_full``, ``kspace_sub04`` ...), MATLAB (kx, ky, sc, sz, t) =
  (readout, phase encoding, coil, slice, frame), appears in HDF5 as (t, sz, sc, ky, kx) with
  a compound dtype ``{real, imag}`` (single precision). bcer's ``KSpace.data`` is
  (C, X, Y, Z, T), so ``data = h5.transpose(2, 4, 3, 1, 0)``; a 4-D variable (no time) maps
  to (C, X, Y, Z) the same way.
- mask variable (``mask04`` ...) in a separate ``*_mask.mat`` file (or the same file),
  MATLAB (kx, ky) logical = HDF5 (ky, kx) uint8 (or a (ky,) vector); a mask whose columns
  are all alike becomes bcer's (Y,) line mask, otherwise it stays (X, Y).
CMRxRecon files carry no geometry: real files get an axis-aligned 1 mm affine centred on 0
(``meta["geometry_known"] = False``). Files written by bcer add a ``bcer_affine`` variable
(4x4, stored transposed like any MATLAB matrix) so phantoms round-trip exactly.
The k-space itself is stored as given: bcer's centred FFT convention is CMRxRecon's too.
"""
from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..contracts.artifacts import Cine, Image, KSpace
from ..contracts.errors import ErrorCode, ToolError
from ._hdf5 import open_hdf5

if TYPE_CHECKING:
    import h5py

log = logging.getLogger(__name__)

_USERBLOCK = 512  # MATLAB v7.3 files start with a 512-byte text header before the HDF5 data
_KSPACE_RX = re.compile(r"^kspace(_full|_sub\d+)?$")
_MASK_RX = re.compile(r"^mask(\d+)?$")

__all__ = ["kspace_shape", "read_cmrx_kspace", "read_cmrx_mask", "write_cmrx_kspace", "write_cmrx_mask", "read_sequence",
           "rss_image", "kspace_variable"]


def _open(path: str | Path) -> "h5py.File":
    return open_hdf5(path, "a MATLAB v7.3 (HDF5) file", "save with -v7.3; older .mat versions are not HDF5")


def kspace_variable(f, path: Path, name: str | None = None) -> str:
    """The k-space variable of an open file (named, or the one matching ``kspace*``)."""
    if name is not None:
        if name not in f:
            raise ToolError(ErrorCode.schema, f"{path.name} has no variable {name!r}",
                            hint=f"variables: {sorted(f.keys())}", file=str(path))
        return name
    found = sorted(k for k in f.keys() if _KSPACE_RX.match(k))
    if not found:
        raise ToolError(ErrorCode.schema, f"{path.name} has no k-space variable (kspace_full, kspace_subNN)",
                        hint=f"variables: {sorted(f.keys())}", file=str(path))
    return found[0]


def _complex(ds, path: Path) -> np.ndarray:
    raw = ds[()]
    names = raw.dtype.names or ()
    if "real" in names and "imag" in names:
        return (raw["real"] + 1j * raw["imag"]).astype(np.complex64)
    if raw.dtype.kind == "c":
        return raw.astype(np.complex64)
    raise ToolError(ErrorCode.schema, f"{ds.name.lstrip('/')} in {path.name} is {raw.dtype}, not complex "
                    "{real, imag}", file=str(path))


def _bcer_affine(f, shape3: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    if "bcer_affine" in f:
        return np.asarray(f["bcer_affine"][()], dtype=np.float64).T, True
    a = np.eye(4)
    a[:3, 3] = -(np.asarray(shape3, dtype=np.float64) - 1) / 2.0
    return a, False


def kspace_shape(path: str | Path, variable: str | None = None) -> tuple[int, ...]:
    """bcer shape (C, X, Y, Z[, T]) of a k-space variable, from the HDF5 header only."""
    path = Path(path)
    with _open(path) as f:
        shape = f[kspace_variable(f, path, variable)].shape
    if len(shape) not in (4, 5):
        raise ToolError(ErrorCode.shape, f"k-space in {path.name} has shape {shape}; expected 4-D or 5-D",
                        file=str(path))
    order = (2, 4, 3, 1, 0) if len(shape) == 5 else (1, 3, 2, 0)
    return tuple(int(shape[i]) for i in order)


def read_cmrx_mask(path: str | Path, name: str | None = None) -> np.ndarray:
    """A sampling mask as bcer uses it: (Y,) bool, or (X, Y) when it varies along the readout."""
    path = Path(path)
    with _open(path) as f:
        names = [name] if name else sorted(k for k in f.keys() if _MASK_RX.match(k))
        if not names or names[0] not in f:
            raise ToolError(ErrorCode.schema, f"{path.name} has no mask variable",
                            hint=f"variables: {sorted(f.keys())}", file=str(path))
        m = np.asarray(f[names[0]][()]).astype(bool)
    if m.ndim == 1:
        return m
    if m.ndim != 2:
        raise ToolError(ErrorCode.shape, f"mask in {path.name} has shape {m.shape}; expected (ky, kx)",
                        file=str(path))
    m = m.T  # MATLAB (kx, ky) -> bcer (X, Y)
    return m[0].copy() if np.all(m == m[:1]) else m


def read_cmrx_kspace(path: str | Path, variable: str | None = None, mask_path: str | Path | None = None,
                     mask_variable: str | None = None) -> KSpace:
    """k-space (C, X, Y, Z[, T]) with its mask (from ``mask_path``, a mask variable in the same
    file, or the non-zero phase-encoding lines) and affine.

    Raises:
        ToolError: ``input_missing``, ``schema`` (not HDF5, no k-space variable, not complex),
            ``shape`` (not 4-/5-D, mask size), ``numeric`` (NaN/Inf).
    """
    path = Path(path)
    with _open(path) as f:
        var = kspace_variable(f, path, variable)
        raw = _complex(f[var], path)
        if raw.ndim not in (4, 5):
            raise ToolError(ErrorCode.shape, f"{var} in {path.name} has {raw.ndim} dimensions {raw.shape}; "
                            "expected (t, sz, sc, ky, kx) or (sz, sc, ky, kx)", file=str(path))
        order = (2, 4, 3, 1, 0) if raw.ndim == 5 else (1, 3, 2, 0)
        data = np.ascontiguousarray(raw.transpose(order))
        affine, known = _bcer_affine(f, data.shape[1:4])
        in_file_mask = any(_MASK_RX.match(k) for k in f.keys())
    if not np.all(np.isfinite(data)):
        raise ToolError(ErrorCode.numeric, f"{var} in {path.name} has NaN/Inf samples", file=str(path))
    if mask_path is not None or in_file_mask:
        mask = read_cmrx_mask(mask_path or path, mask_variable)
    else:
        mask = np.any(data != 0, axis=tuple(i for i in range(data.ndim) if i != 2))
    want = (data.shape[2],) if mask.ndim == 1 else data.shape[1:3]
    if mask.shape != want:
        raise ToolError(ErrorCode.shape, f"mask {mask.shape} does not match k-space {data.shape} of {path.name}",
                        hint="mask must be (Y,) or (X, Y) of the k-space plane", file=str(path))
    meta: dict[str, Any] = {"source": str(path), "variable": var, "geometry_known": known}
    m = re.search(r"sub(\d+)", var)
    if m:
        meta["R"] = int(m.group(1))
    return KSpace(data, mask, affine, meta)


def rss_image(kspace: KSpace) -> Image | Cine:
    """Root-sum-of-squares image of (fully sampled) k-space, bcer's centred orthonormal iFFT."""
    k = np.asarray(kspace.data)
    img = np.fft.fftshift(np.fft.ifftn(np.fft.ifftshift(k, axes=(1, 2)), axes=(1, 2), norm="ortho"), axes=(1, 2))
    rss = np.sqrt(np.sum(np.abs(img) ** 2, axis=0)).astype(np.float32)
    cls = Cine if rss.ndim == 4 else Image
    return cls(rss, np.asarray(kspace.affine).copy(), {"source": kspace.meta.get("source"), "method": "rss"})


def _matlab_header(path: Path) -> None:
    """Fill the v7.3 userblock with MATLAB's text header, so tools recognise the file."""
    text = (f"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: "
            f"{time.strftime('%a %b %d %H:%M:%S %Y')} HDF5 schema 1.00 .").encode()
    head = text.ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02" + b"IM"
    with path.open("r+b") as f:
        f.write(head.ljust(128, b"\x00"))


def _write_mat(path: Path, variables: dict[str, np.ndarray], classes: dict[str, str]) -> Path:
    import h5py

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with h5py.File(tmp, "w", userblock_size=_USERBLOCK) as f:
            for name, arr in variables.items():
                ds = f.create_dataset(name, data=arr)
                ds.attrs["MATLAB_class"] = np.bytes_(classes[name])
        _matlab_header(tmp)
        os.replace(tmp, path)  # readers never see half a file
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_cmrx_kspace(path: str | Path, kspace: KSpace, variable: str = "kspace_full") -> Path:
    """Write k-space as MATLAB v7.3 ``variable`` (compound real/imag single) plus ``bcer_affine``."""
    data = np.asarray(kspace.data)
    if data.ndim not in (4, 5):
        raise ToolError(ErrorCode.shape, f"k-space must be (C,X,Y,Z[,T]), got {data.shape}", file=str(path))
    order = (4, 3, 0, 2, 1) if data.ndim == 5 else (3, 0, 2, 1)
    h5 = np.ascontiguousarray(data.transpose(order))
    comp = np.empty(h5.shape, dtype=[("real", "<f4"), ("imag", "<f4")])
    comp["real"], comp["imag"] = h5.real, h5.imag
    affine = np.ascontiguousarray(np.asarray(kspace.affine, dtype=np.float64).T)
    return _write_mat(Path(path), {variable: comp, "bcer_affine": affine},
                      {variable: "single", "bcer_affine": "double"})


def write_cmrx_mask(path: str | Path, mask: np.ndarray, nx: int, variable: str = "mask") -> Path:
    """Write a (Y,) or (X, Y) mask as MATLAB (kx, ky) logical (HDF5 (ky, kx) uint8)."""
    m = np.asarray(mask, dtype=bool)
    full = np.broadcast_to(m[None, :], (nx, m.size)) if m.ndim == 1 else m
    return _write_mat(Path(path), {variable: np.ascontiguousarray(full.T).astype(np.uint8)},
                      {variable: "logical"})


def read_sequence(ref) -> KSpace | Image | Cine:
    """SequenceRef reader for ``cmrx_mat``: ``options`` may name ``variable``, ``mask_path``,
    ``mask_variable``; ``kind=image``/``cine`` returns the RSS image of the (full) k-space."""
    o = ref.options
    ks = read_cmrx_kspace(ref.path, o.get("variable"), o.get("mask_path"), o.get("mask_variable"))
    kind = ref.kind.value if hasattr(ref.kind, "value") else str(ref.kind)
    return rss_image(ks) if kind in ("image", "cine") else ks
