"""fastMRI ``.h5`` files: multi-coil k-space to and from bcer's ``KSpace``.

File form (as in the public fastMRI release):
- ``kspace``: complex64 (slices, coils, kx, ky); kx is the readout, ky the phase encoding
  (the undersampled axis). bcer's ``KSpace.data`` is (C, X, Y, Z), so
  ``data = kspace.transpose(1, 2, 3, 0)``.
- ``reconstruction_rss``: float32 (slices, x, y) root-sum-of-squares image of the fully
  sampled data (training/validation files only); read as an ``Image`` (X, Y, Z).
- ``mask`` (optional, test files): (ky,) sampled lines; without it the mask is the set of
  ky lines that hold any non-zero sample.
- attributes ``acquisition``, ``max``, ``norm``, ``patient_id`` (``max``/``norm`` of
  ``reconstruction_rss``), and ``acceleration``/``num_low_frequency`` with a mask.
- ``ismrmrd_header``: XML whose ``encodedSpace``/``reconSpace`` give matrix size and field
  of view (mm); the voxel size is FOV / matrix (z: FOV z is the slice thickness). The
  encoded matrix usually carries 2x readout oversampling (e.g. 640 x 368 for a 320 x 320
  recon); ``reconstruction_rss`` is the RSS image centre-cropped to the recon matrix, and so
  is every bcer reconstruction: ``KSpace.meta["recon_matrix"]`` is read from ``reconSpace``
  (see ``KSpace.recon_crop``), ``meta["encoded_matrix"]`` is the k-space array's matrix.
fastMRI stores no patient orientation: real files get an axis-aligned affine centred on 0;
the reference image's affine is that grid's centre crop, so it lines up with the k-space.
Files written by bcer add attributes ``bcer_affine`` (4x4 of the k-space grid),
``bcer_ref_affine``, ``bcer_meta`` and ``bcer_truth`` (JSON) so phantoms round-trip exactly.
"""
from __future__ import annotations

import json
import logging
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..contracts.artifacts import Image, KSpace
from ..contracts.errors import ErrorCode, ToolError
from ._hdf5 import open_hdf5
from .serialize import to_jsonable

if TYPE_CHECKING:
    import h5py

log = logging.getLogger(__name__)

_NS = "http://www.ismrm.org/ISMRMRD"

__all__ = ["read_fastmri", "read_fastmri_reference", "write_fastmri", "fastmri_header", "read_sequence",
           "domain_of", "recon_matrix_from_header"]


def _open(path: str | Path) -> "h5py.File":
    return open_hdf5(path, "a readable HDF5 file", "fastMRI files are HDF5 (.h5)")


def _grid_from_xml(xml: str, space: str, path: Path) -> tuple[tuple[int, int], tuple[float, float, float]]:
    """(matrix x,y), (spacing x,y,z) from the ISMRMRD header's ``encodedSpace``/``reconSpace``."""
    try:
        root = ET.fromstring(xml)
        ns = {"m": _NS} if root.tag.startswith("{") else {}
        p = "m:" if ns else ""
        node = root.find(f"{p}encoding/{p}{space}", ns)
        mat = [int(node.find(f"{p}matrixSize/{p}{a}", ns).text) for a in "xy"]
        fov = [float(node.find(f"{p}fieldOfView_mm/{p}{a}", ns).text) for a in "xyz"]
    except (ET.ParseError, AttributeError, TypeError, ValueError) as e:
        raise ToolError(ErrorCode.schema, f"ismrmrd_header of {path.name} lacks {space} matrix/FOV: {e}",
                        file=str(path)) from e
    return (mat[0], mat[1]), (fov[0] / mat[0], fov[1] / mat[1], fov[2])


def _header_xml(f) -> str | None:
    if "ismrmrd_header" not in f:
        return None
    raw = f["ismrmrd_header"][()]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def recon_matrix_from_header(f, path: Path) -> tuple[int, int] | None:
    """The ISMRMRD ``reconSpace`` in-plane matrix, or None for a file without a header."""
    xml = _header_xml(f)
    return None if xml is None else _grid_from_xml(xml, "reconSpace", path)[0]


# fastMRI ``acquisition`` attribute -> body region (knee and brain releases)
_ACQUISITION_DOMAIN = {"CORPD_FBK": "knee", "CORPDFS_FBK": "knee", "AXFLAIR": "brain", "AXT1": "brain",
                       "AXT1PRE": "brain", "AXT1POST": "brain", "AXT2": "brain"}
_KEYWORDS = (("prostate", "prostate"), ("pelvi", "prostate"), ("knee", "knee"), ("cine", "cardiac"),
             ("cardiac", "cardiac"), ("heart", "cardiac"), ("brain", "brain"), ("head", "brain"))


def domain_of(acquisition: str | None, xml: str | None) -> str:
    """Body region of a raw-data file: words in the ISMRMRD protocol name first (the
    fastMRI prostate release also calls its T2 ``AXT2``), then the fastMRI acquisition
    code; ``unknown`` when neither says."""
    if xml:
        try:
            root = ET.fromstring(xml)
            names = [el.text or "" for el in root.iter() if el.tag.split("}")[-1] in
                     ("protocolName", "seriesDescription", "bodyPartExamined")]
        except ET.ParseError:
            names = []
        text = " ".join(names).lower()
        for word, domain in _KEYWORDS:
            if word in text:
                return domain
    return _ACQUISITION_DOMAIN.get(str(acquisition or "").upper(), "unknown")


def _centred_affine(sp: tuple[float, float, float], shape: tuple[int, int, int]) -> np.ndarray:
    a = np.diag([*sp, 1.0])
    a[:3, 3] = -np.asarray(sp) * (np.asarray(shape) - 1) / 2.0
    return a


def _affine(f, attr: str, space: str, shape: tuple[int, int, int], path: Path) -> np.ndarray:
    if attr in f.attrs:
        return np.asarray(f.attrs[attr], dtype=np.float64).reshape(4, 4)
    xml = _header_xml(f)
    if xml is not None:
        _, sp = _grid_from_xml(xml, space, path)
        return _centred_affine(sp, shape)
    return _centred_affine((1.0, 1.0, 1.0), shape)


def _mask(f, k: np.ndarray, path: Path) -> np.ndarray:
    ny = k.shape[-1]
    if "mask" in f:
        m = np.asarray(f["mask"][()]).astype(bool).reshape(-1)
        if m.size != ny:
            raise ToolError(ErrorCode.shape, f"mask of {path.name} has {m.size} lines, kspace has {ny}",
                            file=str(path))
        return m
    return np.any(k != 0, axis=(0, 1, 2))


def fastmri_header(path: str | Path) -> dict[str, Any]:
    """Shape of the image grid, spacing and attributes without loading the k-space."""
    path = Path(path)
    with _open(path) as f:
        if "kspace" not in f:
            raise ToolError(ErrorCode.schema, f"{path.name} has no 'kspace' dataset",
                            hint=f"datasets present: {sorted(f.keys())}", file=str(path))
        s, c, kx, ky = _kspace_shape(f["kspace"].shape, path)
        affine = _affine(f, "bcer_affine", "encodedSpace", (kx, ky, s), path)
        recon = recon_matrix_from_header(f, path) or (kx, ky)
        attrs = {k: to_jsonable(v) for k, v in f.attrs.items() if not k.startswith("bcer_")}
        return {"shape": (kx, ky, s), "n_coils": c, "affine": affine, "datasets": sorted(f.keys()),
                "encoded_matrix": [kx, ky], "recon_matrix": [int(recon[0]), int(recon[1])],
                "domain": domain_of(attrs.get("acquisition"), _header_xml(f)), "attrs": attrs}


def _kspace_shape(shape: tuple[int, ...], path: Path) -> tuple[int, int, int, int]:
    if len(shape) == 3:  # single-coil files: (slices, kx, ky)
        return shape[0], 1, shape[1], shape[2]
    if len(shape) != 4:
        raise ToolError(ErrorCode.shape, f"kspace of {path.name} has shape {shape}; expected "
                        "(slices, coils, kx, ky)", file=str(path))
    return tuple(int(n) for n in shape)  # type: ignore[return-value]


def read_fastmri(path: str | Path) -> KSpace:
    """The k-space of a fastMRI file as ``KSpace`` (C, X, Y, Z) with mask and affine.

    Raises:
        ToolError: ``input_missing``, ``schema`` (not HDF5, no ``kspace``, not complex, bad
            header), ``shape`` (wrong dimensions, mask length), ``numeric`` (NaN/Inf).
    """
    path = Path(path)
    with _open(path) as f:
        if "kspace" not in f:
            raise ToolError(ErrorCode.schema, f"{path.name} has no 'kspace' dataset",
                            hint=f"datasets present: {sorted(f.keys())}", file=str(path))
        raw = f["kspace"]
        _kspace_shape(raw.shape, path)
        if raw.dtype.kind != "c":
            raise ToolError(ErrorCode.schema, f"kspace of {path.name} is {raw.dtype}, not complex",
                            file=str(path))
        k = np.asarray(raw[()], dtype=np.complex64)
        if k.ndim == 3:
            k = k[:, None]
        if not np.all(np.isfinite(k)):
            raise ToolError(ErrorCode.numeric, f"kspace of {path.name} has NaN/Inf samples", file=str(path))
        mask = _mask(f, k, path)
        affine = _affine(f, "bcer_affine", "encodedSpace", (k.shape[2], k.shape[3], k.shape[0]), path)
        meta: dict[str, Any] = json.loads(f.attrs["bcer_meta"]) if "bcer_meta" in f.attrs else {}
        for key in ("acquisition", "patient_id", "acceleration", "num_low_frequency"):
            if key in f.attrs:
                meta.setdefault(key, to_jsonable(f.attrs[key]))
        recon = recon_matrix_from_header(f, path)
        if recon is not None:  # the header is the file's own statement of its recon matrix
            meta["recon_matrix"] = [int(recon[0]), int(recon[1])]
        meta["encoded_matrix"] = [int(k.shape[2]), int(k.shape[3])]
        meta["source"] = str(path)
    ks = KSpace(np.ascontiguousarray(k.transpose(1, 2, 3, 0)), mask, affine, meta)
    try:
        ks.recon_crop
    except ValueError as e:
        raise ToolError(ErrorCode.schema, f"ismrmrd_header of {path.name}: {e}", file=str(path)) from e
    return ks


def read_fastmri_reference(path: str | Path) -> Image:
    """``reconstruction_rss`` (slices, x, y) as an Image (X, Y, Z)."""
    path = Path(path)
    with _open(path) as f:
        if "reconstruction_rss" not in f:
            raise ToolError(ErrorCode.input_missing, f"{path.name} has no 'reconstruction_rss'",
                            hint="test-set files carry no reference image", file=str(path))
        rss = np.asarray(f["reconstruction_rss"][()], dtype=np.float32)
        if rss.ndim != 3:
            raise ToolError(ErrorCode.shape, f"reconstruction_rss of {path.name} has shape {rss.shape}",
                            file=str(path))
        if not np.all(np.isfinite(rss)):
            raise ToolError(ErrorCode.numeric, f"reconstruction_rss of {path.name} has NaN/Inf", file=str(path))
        data = np.ascontiguousarray(rss.transpose(1, 2, 0))
        if "bcer_ref_affine" in f.attrs:
            affine = np.asarray(f.attrs["bcer_ref_affine"], dtype=np.float64).reshape(4, 4)
        elif "kspace" in f:  # the centre crop of the k-space grid, as fastMRI cuts it
            s, _, kx, ky = _kspace_shape(f["kspace"].shape, path)
            grid = _affine(f, "bcer_affine", "encodedSpace", (kx, ky, s), path)
            probe = KSpace(np.empty((1, kx, ky, 0), np.complex64), np.ones(ky, bool), grid,
                           {"recon_matrix": list(data.shape[:2])})
            try:
                affine = probe.recon_affine
            except ValueError:
                affine = _affine(f, "bcer_ref_affine", "reconSpace", data.shape, path)
        else:
            affine = _affine(f, "bcer_ref_affine", "reconSpace", data.shape, path)
    return Image(data, affine, {"source": str(path), "dataset": "reconstruction_rss"})


def ismrmrd_xml(kshape: tuple[int, int, int], kspacing: tuple[float, float, float],
                rshape: tuple[int, int], rspacing: tuple[float, float, float], protocol: str = "") -> str:
    """A minimal ISMRMRD header: protocol name, encoded/recon matrix and FOV, phase-encoding limits."""
    def space(tag: str, m: tuple[int, int], sp: tuple[float, float, float]) -> str:
        return (f"<{tag}><matrixSize><x>{m[0]}</x><y>{m[1]}</y><z>1</z></matrixSize><fieldOfView_mm>"
                f"<x>{m[0] * sp[0]:.6f}</x><y>{m[1] * sp[1]:.6f}</y><z>{sp[2]:.6f}</z></fieldOfView_mm></{tag}>")
    ny = kshape[1]
    info = f"<measurementInformation><protocolName>{protocol}</protocolName></measurementInformation>" if protocol else ""
    return (f'<?xml version="1.0" encoding="utf-8"?>\n<ismrmrdHeader xmlns="{_NS}">{info}<encoding>'
            + space("encodedSpace", kshape[:2], kspacing) + space("reconSpace", rshape, rspacing)
            + f"<encodingLimits><kspace_encoding_step_1><minimum>0</minimum><maximum>{ny - 1}</maximum>"
              f"<center>{ny // 2}</center></kspace_encoding_step_1><slice><minimum>0</minimum>"
              f"<maximum>{kshape[2] - 1}</maximum></slice></encodingLimits>"
            + "<trajectory>cartesian</trajectory></encoding></ismrmrdHeader>")


def write_fastmri(path: str | Path, kspace: KSpace, reference: Image | None = None,
                  patient_id: str = "", acquisition: str = "", truth: dict[str, Any] | None = None,
                  protocol: str = "") -> Path:
    """Write a 3-D ``KSpace`` (C, X, Y, Z) (and its reference image) as a fastMRI file, atomically.

    The header's ``reconSpace`` is ``kspace.meta["recon_matrix"]`` (the encoded matrix when
    absent); the reference, written as ``reconstruction_rss``, must lie on that recon grid
    (``KSpace.recon_crop`` of the encoded one), as in fastMRI's training/validation files.

    Raises:
        ToolError: ``shape`` for cine k-space (fastMRI has no time axis; use the cmrx layout),
            a recon matrix that does not fit, or a reference off the recon grid.
    """
    path = Path(path)
    data = np.asarray(kspace.data)
    if data.ndim != 4:
        raise ToolError(ErrorCode.shape, f"fastMRI stores (C,X,Y,Z) k-space, got {data.shape}",
                        hint="write cine k-space with the cmrx layout", file=str(path))
    sp = tuple(float(v) for v in np.linalg.norm(kspace.affine[:3, :3], axis=0))
    tmp = path.with_name(f".{path.name}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _write_h5(tmp, path, data, sp, kspace, reference, patient_id, acquisition, truth, protocol)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)  # readers never see half a file
    return path


def _write_h5(tmp: Path, path: Path, data: np.ndarray, sp: tuple[float, ...], kspace: KSpace,
              reference: Image | None, patient_id: str, acquisition: str, truth: dict[str, Any] | None,
              protocol: str) -> None:
    import h5py

    _, nx, ny, nz = data.shape
    try:
        _, _, rx, ry = kspace.recon_crop
    except ValueError as e:
        raise ToolError(ErrorCode.shape, f"cannot write {path.name}: {e}", file=str(path)) from e
    mask = np.asarray(kspace.mask, dtype=bool)
    with h5py.File(tmp, "w") as f:
        f.create_dataset("kspace", data=np.ascontiguousarray(data.transpose(3, 0, 1, 2)).astype(np.complex64))
        rsp = sp
        if reference is not None:
            ref = np.asarray(reference.data, dtype=np.float32)
            if ref.shape != (rx, ry, nz):
                raise ToolError(ErrorCode.shape, f"reference {ref.shape} is not on the recon grid {(rx, ry, nz)} "
                                f"of the k-space (encoded {(nx, ny, nz)})", file=str(path))
            f.create_dataset("reconstruction_rss", data=np.ascontiguousarray(ref.transpose(2, 0, 1)))
            f.attrs["max"] = float(ref.max())
            f.attrs["norm"] = float(np.linalg.norm(ref))
            f.attrs["bcer_ref_affine"] = np.asarray(reference.affine, dtype=np.float64)
            rsp = tuple(float(v) for v in np.linalg.norm(reference.affine[:3, :3], axis=0))
        if not mask.all():
            f.create_dataset("mask", data=mask)
            f.attrs["acceleration"] = int(kspace.meta.get("R", round(kspace.acceleration)))
            f.attrs["num_low_frequency"] = int(kspace.meta.get("n_acs", 0))
        f.create_dataset("ismrmrd_header", data=ismrmrd_xml((nx, ny, nz), sp, (rx, ry), rsp, protocol))
        f.attrs["acquisition"] = acquisition or str(kspace.meta.get("acquisition", "UNKNOWN"))
        f.attrs["patient_id"] = patient_id
        f.attrs["bcer_affine"] = np.asarray(kspace.affine, dtype=np.float64)
        f.attrs["bcer_meta"] = json.dumps(to_jsonable({k: v for k, v in kspace.meta.items() if k != "source"}))
        if truth is not None:
            f.attrs["bcer_truth"] = json.dumps(to_jsonable(truth))


def read_truth_attrs(path: str | Path) -> dict[str, Any] | None:
    """The ``bcer_truth`` JSON attribute of a file written by bcer, or None."""
    with _open(path) as f:
        raw = f.attrs.get("bcer_truth")
    return json.loads(raw) if raw is not None else None


def read_sequence(ref) -> KSpace | Image:
    """SequenceRef reader: ``kind=kspace`` gives the k-space, ``kind=image`` the
    ``reconstruction_rss`` reference."""
    kind = ref.kind.value if hasattr(ref.kind, "value") else str(ref.kind)
    if kind == "image":
        return read_fastmri_reference(ref.path)
    return read_fastmri(ref.path)
