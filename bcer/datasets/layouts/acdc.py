"""ACDC layout: ``patientNNN/Info.cfg``, ``patientNNN_4d.nii.gz``, ``patientNNN_frameNN[_gt].nii.gz``.

``Info.cfg`` holds ``ED``, ``ES`` (1-based frame numbers), ``Group`` (NOR, DCM, HCM, MINF, RV),
``Height`` (cm), ``NbFrame`` and ``Weight`` (kg), one ``Key: value`` per line. The ED and ES
frames are also stored as 3-D volumes with their manual labels (``_gt``: 1 RV, 2 MYO, 3 LV).
Reads the real training/testing folders (flat, or one level down as in ``training/``).

Case mapping: sequence ``CINE`` is the 4-D file; metadata ``height``/``weight`` (what a
clinician knows beforehand); ``ground_truth.values`` has ``group`` and 0-based
``ed_frame``/``es_frame`` (the diagnosis and the phase annotation are outputs of the
cardiac tasks, so they are truth, not metadata); ``ground_truth.labels`` has ``ed``/``es``
label volumes. Phantom cohorts also carry ``bcer_truth.json`` (all measured values) and the
full per-frame labels as ``patientNNN_4d_gt.nii.gz`` (label ``seg``).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable

from ...contracts.artifacts import Mask
from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...io.nifti import read_header
from ..phantom import Phantom
from ._common import (read_each, read_truth, ref_for,
                      validate_case_shapes, write_truth, write_volume)

log = logging.getLogger(__name__)

NAME = "acdc"
LABELS = {1: "RV", 2: "MYO", 3: "LV"}
REQUIRED_KEYS = ("ED", "ES", "Height", "NbFrame", "Weight")  # Group is absent from unlabeled sets
_CASE_RX = re.compile(r"patient\d{3,}")

__all__ = ["NAME", "detect", "write", "read", "read_info", "write_info", "case_dirs"]


def _is_case_dir(d: Path) -> bool:
    return d.is_dir() and bool(_CASE_RX.fullmatch(d.name)) and (
        (d / "Info.cfg").exists() or any(d.glob(f"{d.name}_4d.nii*")))


def case_dirs(root: Path) -> list[Path]:
    """patientNNN folders directly under ``root`` or one level down (training/, testing/)."""
    root = Path(root)
    found = [d for d in root.iterdir() if _is_case_dir(d)]
    if not found:
        found = [d for sub in root.iterdir() if sub.is_dir() for d in sub.iterdir() if _is_case_dir(d)]
    return sorted(found)


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and bool(case_dirs(root))


def read_info(path: Path) -> dict[str, Any]:
    """Parse ``Info.cfg`` into typed values (ints for frames, floats for height/weight).

    Raises:
        ToolError: ``input_missing`` (no file), ``schema`` naming the file and the key that is
            missing or malformed, ``value_range`` for ED/ES outside 1..NbFrame.
    """
    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"{path.parent.name} has no Info.cfg", file=str(path))
    raw: dict[str, str] = {}
    for line in path.read_text(errors="replace").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            raw[k.strip()] = v.strip()
    for key in REQUIRED_KEYS:
        if key not in raw:
            raise ToolError(ErrorCode.schema, f"{path.name} of {path.parent.name} has no {key!r}",
                            hint=f"Info.cfg needs {list(REQUIRED_KEYS)} (and Group)", file=str(path), key=key)
    info: dict[str, Any] = {}
    for key, cast in (("ED", int), ("ES", int), ("NbFrame", int), ("Height", float), ("Weight", float)):
        try:
            info[key] = cast(float(raw[key])) if cast is int else cast(raw[key])
        except ValueError as e:
            raise ToolError(ErrorCode.schema, f"{key} in {path.name} of {path.parent.name} is {raw[key]!r}, "
                            "not a number", file=str(path), key=key) from e
    for key in ("ED", "ES"):
        if not 1 <= info[key] <= info["NbFrame"]:
            raise ToolError(ErrorCode.value_range, f"{key}={info[key]} outside 1..NbFrame={info['NbFrame']} "
                            f"in {path.parent.name}", file=str(path), key=key)
    if raw.get("Group"):
        info["Group"] = raw["Group"]
    return info


def write_info(path: Path, ed: int, es: int, group: str | None, height: float, n_frames: int,
               weight: float) -> Path:
    """Write ``Info.cfg`` exactly as ACDC does (1-based ED/ES)."""
    lines = [f"ED: {ed}", f"ES: {es}"] + ([f"Group: {group}"] if group else []) + [
        f"Height: {height:.1f}", f"NbFrame: {n_frames}", f"Weight: {weight:.1f}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _frame_name(d: str, f: int, gt: bool = False) -> str:
    return f"{d}_frame{f:02d}{'_gt' if gt else ''}.nii.gz"


def _write_case(p: Phantom, d: Path) -> None:
    cine = p.sequences.get("CINE")
    seg = p.labels.get("seg")
    if cine is None or seg is None:
        raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} needs CINE and seg labels for ACDC",
                        case=p.case_id)
    name = d.name
    t = p.truth
    ed, es = int(t["ed_frame"]), int(t["es_frame"])
    write_volume(cine, d / f"{name}_4d.nii.gz")
    labels: dict[str, SequenceRef] = {"seg": write_volume(seg, d / f"{name}_4d_gt.nii.gz")}
    for key, f in (("ed", ed), ("es", es)):
        write_volume(cine.frame(f), d / _frame_name(name, f + 1))
        labels[key] = write_volume(_mask_frame(seg, f), d / _frame_name(name, f + 1, gt=True))
    write_info(d / "Info.cfg", ed + 1, es + 1, t.get("group"), float(p.metadata["height"]), cine.n_frames,
               float(p.metadata["weight"]))
    write_truth(d, p, labels, extra_values={"source_case_id": p.case_id})


def _mask_frame(seg: Mask, f: int) -> Mask:
    return Mask(seg.data[..., f], seg.affine, dict(seg.meta, frame=f), labels=dict(seg.labels))


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as ACDC patient folders under ``out``.

    Case ids of the form ``patientNNN`` are kept; others are numbered after the highest
    patient number already in ``out`` (the original id is kept in the truth sidecar as
    ``source_case_id``). Returns ``read``'s cases for exactly the written folders.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    taken = [int(d.name[7:]) for d in out.iterdir() if _CASE_RX.fullmatch(d.name)]
    nxt = max(taken, default=0) + 1
    names = []
    for p in phantoms:
        if _CASE_RX.fullmatch(p.case_id):
            name = p.case_id
        else:
            name, nxt = f"patient{nxt:03d}", nxt + 1
        _write_case(p, out / name)
        names.append(name)
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in names]


def _find(d: Path, stem: str) -> Path | None:
    for ext in (".nii.gz", ".nii"):
        if (d / f"{stem}{ext}").exists():
            return d / f"{stem}{ext}"
    return None


def _read_case(d: Path) -> Case:
    name = d.name
    info_path = d / "Info.cfg"
    info = read_info(info_path)
    sequences: dict[str, SequenceRef] = {}
    cine = _find(d, f"{name}_4d")
    if cine is not None:
        sequences["CINE"] = ref_for(cine.resolve(), kind="cine")
    values: dict[str, Any] = {"ed_frame": info["ED"] - 1, "es_frame": info["ES"] - 1, "n_frames": info["NbFrame"]}
    if "Group" in info:
        values["group"] = info["Group"]
    labels: dict[str, Any] = {}
    for key in ("ED", "ES"):
        gt = _find(d, f"{name}_frame{info[key]:02d}_gt")
        if gt is not None:
            labels[key.lower()] = ref_for(gt.resolve(), kind="mask", labels=LABELS).model_dump(mode="json")
    truth = read_truth(d)
    references: dict[str, Any] = {}
    if truth is not None:
        values = {**truth["values"], **values}
        labels = {**truth["labels"], **labels}
        references = truth["references"]
    metadata = {"height": info["Height"], "weight": info["Weight"]}
    gt_doc = {"values": values, "labels": labels, "references": references}
    case = Case(id=name, root=str(d.resolve()), domain="cardiac", sequences=sequences, metadata=metadata,
                ground_truth=gt_doc, layout=NAME)
    _check_frames(case, info, info_path)
    validate_case_shapes(case, ndim=None)
    return case


def _check_frames(case: Case, info: dict[str, Any], info_path: Path) -> None:
    """NbFrame must match the 4-D file's time axis (from its header)."""
    ref = case.sequences.get("CINE")
    if ref is None:
        return
    shape = read_header(ref.path)["shape"]
    if len(shape) != 4:
        raise ToolError(ErrorCode.shape, f"{Path(ref.path).name} has shape {shape}; expected (X,Y,Z,T)",
                        case=case.id, file=ref.path)
    if shape[3] != info["NbFrame"]:
        raise ToolError(ErrorCode.shape, f"{Path(ref.path).name} has {shape[3]} frames but Info.cfg says "
                        f"NbFrame={info['NbFrame']}", case=case.id, file=str(info_path))


def read(root: Path) -> list[Case]:
    """Every ACDC patient under ``root`` as a lazy ``Case`` (headers checked, arrays not loaded).

    Raises:
        ToolError: ``input_missing`` (no patients, or a patient without Info.cfg), ``schema``
            (missing/malformed Info.cfg key, unreadable header), ``shape`` (NbFrame differs from
            the 4-D file, files of one case on different grids).
    """
    root = Path(root)
    dirs = case_dirs(root) if root.is_dir() else []
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no ACDC patient folders under {root}",
                        hint="expected patientNNN/Info.cfg and patientNNN_4d.nii.gz", file=str(root))
    return read_each(dirs, _read_case, lambda d: d.name, lambda d: d, domain="cardiac", layout=NAME)
