"""CMRxRecon (2023) layout: MATLAB v7.3 cine k-space per patient and acceleration factor.

Real form (multi-coil cine; single-coil folders are not read)::

    <root>/MultiCoil/Cine/TrainingSet/FullSample/P001/cine_sax.mat         kspace_full
    <root>/MultiCoil/Cine/TrainingSet/AccFactor04/P001/cine_sax.mat        kspace_sub04
    <root>/MultiCoil/Cine/TrainingSet/AccFactor04/P001/cine_sax_mask.mat   mask04

One case per undersampled patient folder (id ``P001_acc04``); a patient with only a
``FullSample`` folder gives case ``P001`` with the full k-space. Sequence ``KSPACE`` is the
short-axis file (``cine_sax.mat``); when the patient's ``FullSample`` file exists,
``ground_truth.references["KSPACE"]`` is its RSS image (``cmrx_mat`` reader, kind cine).
Phantom cohorts are written into ``AccFactorNN/PNNN/`` with ``bcer_truth.json``, the clean
reference ``cine_sax_ref.nii.gz`` and label maps ``cine_sax_<name>.nii.gz`` beside the
``.mat`` files (names real readers ignore).
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...io.nifti import read_header
from ...io.cmrx import kspace_shape, write_cmrx_kspace, write_cmrx_mask
from ..phantom import Phantom
from ._common import read_each, read_truth, write_truth, write_volume

log = logging.getLogger(__name__)

NAME = "cmrx"
SUBDIR = Path("MultiCoil") / "Cine" / "TrainingSet"
SAX = "cine_sax.mat"
_PATIENT_RX = re.compile(r"P\d{3,}")
_ACC_RX = re.compile(r"AccFactor(\d+)")

__all__ = ["NAME", "detect", "write", "read", "patient_dirs"]


def _base(root: Path) -> Path:
    """The folder holding FullSample/AccFactorNN (root itself or root/MultiCoil/Cine/TrainingSet)."""
    root = Path(root)
    for cand in (root / SUBDIR, root / "MultiCoil" / "Cine" / "ValidationSet", root):
        if cand.is_dir() and any(_ACC_RX.fullmatch(d.name) or d.name == "FullSample"
                                 for d in cand.iterdir() if d.is_dir()):
            return cand
    return root


def patient_dirs(root: Path) -> list[tuple[Path, int | None]]:
    """(patient folder, acceleration or None for FullSample), sorted."""
    base = _base(root)
    found: list[tuple[Path, int | None]] = []
    if not base.is_dir():
        return found
    for acc_dir in sorted(d for d in base.iterdir() if d.is_dir()):
        m = _ACC_RX.fullmatch(acc_dir.name)
        if not m and acc_dir.name != "FullSample":
            continue
        acc = int(m.group(1)) if m else None
        found += [(p, acc) for p in sorted(acc_dir.iterdir()) if p.is_dir() and _PATIENT_RX.fullmatch(p.name)]
    return found


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and any((p / SAX).exists() for p, _ in patient_dirs(root))


def _write_case(p: Phantom, base: Path, name: str) -> None:
    ks = p.sequences.get("KSPACE")
    if ks is None:
        raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} has no KSPACE for CMRxRecon",
                        hint="make it with bcer.datasets.kspace.make_kspace_case", case=p.case_id)
    R = int(ks.meta.get("R", round(ks.acceleration)))
    d = base / f"AccFactor{R:02d}" / name
    write_cmrx_kspace(d / SAX, ks, f"kspace_sub{R:02d}")
    write_cmrx_mask(d / "cine_sax_mask.mat", ks.mask, ks.data.shape[1], f"mask{R:02d}")
    labels = {k: write_volume(m, d / f"cine_sax_{k}.nii.gz") for k, m in p.labels.items()}
    refs = {k: write_volume(img, d / "cine_sax_ref.nii.gz") for k, img in p.references.items() if k == "KSPACE"}
    write_truth(d, p, labels, refs, extra_values={"source_case_id": p.case_id})


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write k-space phantoms into ``out/MultiCoil/Cine/TrainingSet/AccFactorNN/PNNN``.

    Ids of the form ``PNNN`` are kept, others are numbered after the highest existing one.
    Returns ``read``'s cases for exactly the written folders.
    """
    base = Path(out) / SUBDIR
    base.mkdir(parents=True, exist_ok=True)
    taken = [int(p.name[1:]) for p, _ in patient_dirs(out)]
    nxt = max(taken, default=0) + 1
    written = []
    for p in phantoms:
        if _PATIENT_RX.fullmatch(p.case_id):
            name = p.case_id
        else:
            name, nxt = f"P{nxt:03d}", nxt + 1
        _write_case(p, base, name)
        R = int(p.sequences["KSPACE"].meta.get("R", round(p.sequences["KSPACE"].acceleration)))
        written.append(f"{name}_acc{R:02d}")
    by_id = {c.id: c for c in read(out)}
    return [by_id[w] for w in written]


def _read_case(d: Path, acc: int | None, full: dict[str, Path]) -> Case:
    sax = d / SAX
    if not sax.exists():
        raise ToolError(ErrorCode.input_missing, f"{d.name} has no {SAX}", file=str(sax))
    options: dict[str, Any] = {}
    if acc is not None:
        options["variable"] = f"kspace_sub{acc:02d}"
        mask = d / "cine_sax_mask.mat"
        if mask.exists():
            options.update(mask_path=str(mask.resolve()), mask_variable=f"mask{acc:02d}")
    else:
        options["variable"] = "kspace_full"
    seq = SequenceRef(path=str(sax.resolve()), format="cmrx_mat", kind="kspace", options=options)
    truth = read_truth(d)
    gt: dict[str, Any] | None = None
    metadata: dict[str, Any] = {}
    if truth is not None:
        metadata.update(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    if acc is not None and d.name in full:
        ref = SequenceRef(path=str(full[d.name].resolve()), format="cmrx_mat", kind="cine",
                          options={"variable": "kspace_full"})
        gt = gt or {"values": {}, "labels": {}, "references": {}}
        gt["references"].setdefault("KSPACE", ref.model_dump(mode="json"))
    if acc is not None:
        gt = gt or {"values": {}, "labels": {}, "references": {}}
        gt["values"].setdefault("acceleration", acc)
    cid = f"{d.name}_acc{acc:02d}" if acc is not None else d.name
    case = Case(id=cid, root=str(d.resolve()), domain=(truth or {}).get("domain") or "cardiac",
                sequences={"KSPACE": seq}, metadata=metadata, ground_truth=gt, layout=NAME)
    _check_grids(case)
    return case


def _check_grids(case: Case) -> None:
    """Label maps and NIfTI references must lie on the k-space's image grid (headers only)."""
    ref = case.sequences["KSPACE"]
    grid = kspace_shape(ref.path, ref.options.get("variable"))[1:4]
    gt = case.ground_truth or {}
    for name, r in [*gt.get("labels", {}).items(), *gt.get("references", {}).items()]:
        if r["format"] != "nifti":
            continue
        got = tuple(read_header(r["path"])["shape"][:3])
        if got != grid:
            raise ToolError(ErrorCode.shape, f"{name} of case {case.id} has grid {got}, the k-space images {grid}",
                            case=case.id, file=r["path"], other=ref.path)


def read(root: Path) -> list[Case]:
    """Every CMRxRecon patient/acceleration under ``root`` as a lazy ``Case``.

    Raises:
        ToolError: ``input_missing`` (no patient folders, or one without ``cine_sax.mat``),
            ``schema`` (malformed truth sidecar).
    """
    dirs = patient_dirs(Path(root)) if Path(root).is_dir() else []
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no CMRxRecon patient folders under {root}",
                        hint=f"expected {SUBDIR}/AccFactorNN/PNNN/{SAX}", file=str(root))
    full = {d.name: d / SAX for d, acc in dirs if acc is None and (d / SAX).exists()}
    undersampled = {d.name for d, acc in dirs if acc is not None}
    todo = [(d, acc) for d, acc in dirs if acc is not None or d.name not in undersampled]
    return read_each(todo, lambda x: _read_case(x[0], x[1], full), lambda x: x[0].name, lambda x: x[0],
                     domain="cardiac", layout=NAME)
