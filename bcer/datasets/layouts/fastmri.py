"""fastMRI layout: one ``.h5`` file per case (e.g. ``multicoil_val/file1000001.h5``).

Each file holds ``kspace`` (slices, coils, kx, ky) and, in training/validation sets,
``reconstruction_rss`` (see ``bcer.io.fastmri``). A case has sequence ``KSPACE``;
``ground_truth.references["KSPACE"]`` is the ``reconstruction_rss`` image when present;
metadata has the file's ``acquisition`` and ``patient_id``, and the header's ``recon_matrix``
and ``encoded_matrix`` ([x, y]: ISMRMRD reconSpace / the k-space matrix); the case domain is
the phantom's, else read from the header (``bcer.io.fastmri.domain_of``: knee, brain,
prostate, cardiac, or ``unknown``). Phantom cohorts add a
``bcer_truth`` attribute (truth values + metadata) and, when the phantom has label maps,
``<stem>_<label>.nii.gz`` files beside the ``.h5`` (ignored by readers of real data).
fastMRI is 2-D multi-slice: cine k-space cannot be written here (use the ``cmrx`` layout).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...io.nifti import read_header
from ...io.fastmri import fastmri_header, read_truth_attrs, write_fastmri
from ..kspace import KSPACE_SOURCES
from ..phantom import Phantom
from ._common import read_each, ref_for, sanitize_case_id, write_volume

log = logging.getLogger(__name__)

NAME = "fastmri"

__all__ = ["NAME", "detect", "write", "read", "case_files"]


def case_files(root: Path) -> list[Path]:
    """``.h5`` files directly under ``root`` or one folder down (``multicoil_val/``), sorted."""
    root = Path(root)
    found = list(root.glob("*.h5")) + list(root.glob("*/*.h5"))
    return sorted(p for p in found if p.is_file() and not p.name.startswith("."))


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and bool(case_files(root))


def _write_case(p: Phantom, out: Path) -> str:
    ks = p.sequences.get("KSPACE")
    if ks is None:
        raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} has no KSPACE for fastMRI",
                        hint="make it with bcer.datasets.kspace.make_kspace_case", case=p.case_id)
    stem = sanitize_case_id(p.case_id)
    label_files = {}
    for name, mask in p.labels.items():
        write_volume(mask, out / f"{stem}_{name}.nii.gz")
        label_files[name] = {"path": f"{stem}_{name}.nii.gz",
                             "labels": {str(int(k)): v for k, v in mask.labels.items()}}
    doc = {"values": p.truth, "metadata": p.metadata, "domain": p.domain, "labels": label_files}
    _, _, acq, protocol = KSPACE_SOURCES.get(p.domain, ("", "", "UNKNOWN", ""))
    try:
        write_fastmri(out / f"{stem}.h5", ks, p.references.get("KSPACE"), patient_id=p.case_id,
                      acquisition=acq, truth=doc, protocol=protocol)
    except ToolError as e:
        raise e.with_context(case=p.case_id)
    return stem


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write k-space phantoms as fastMRI files under ``out``; returns their cases."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stems = [_write_case(p, out) for p in phantoms]
    by_id = {c.id: c for c in read(out)}
    return [by_id[s] for s in stems]


def _read_case(path: Path) -> Case:
    head = fastmri_header(path)  # schema error naming the file when there is no kspace
    doc = read_truth_attrs(path) or {}
    metadata: dict[str, Any] = {k: head["attrs"][k] for k in ("acquisition", "patient_id") if k in head["attrs"]}
    metadata.update(doc.get("metadata", {}))
    # the header, not a sidecar, says what the recon matrix is (readout oversampling removed)
    metadata.update(recon_matrix=head["recon_matrix"], encoded_matrix=head["encoded_matrix"])
    references = ({"KSPACE": SequenceRef(path=str(path.resolve()), format="fastmri_h5", kind="image")
                   .model_dump(mode="json")} if "reconstruction_rss" in head["datasets"] else {})
    labels = {}
    for name, lab in doc.get("labels", {}).items():
        p = path.parent / lab["path"]
        labels[name] = ref_for(p.resolve(), kind="mask",
                               labels={int(k): v for k, v in lab.get("labels", {}).items()}).model_dump(mode="json")
    gt = None
    if doc or references:
        gt = {"values": dict(doc.get("values", {})), "labels": labels, "references": references}
    seq = SequenceRef(path=str(path.resolve()), format="fastmri_h5", kind="kspace",
                      options={"shape": list(head["shape"]), "n_coils": head["n_coils"]})
    return Case(id=sanitize_case_id(path.stem), root=str(path.parent.resolve()),
                domain=doc.get("domain") or head["domain"], sequences={"KSPACE": seq}, metadata=metadata,
                ground_truth=gt, layout=NAME)


def _check_labels(case: Case) -> None:
    """Label maps lie on the recon grid (the encoded grid centre-cropped to the recon matrix)."""
    x, y, z = case.sequences["KSPACE"].options["shape"]
    rx, ry = case.metadata.get("recon_matrix", [x, y])
    shape = (min(rx, x) if y >= ry else y, min(ry, y), z)
    for name, r in (case.ground_truth or {}).get("labels", {}).items():
        got = read_header(r["path"])["shape"]
        if tuple(got[:3]) != shape:
            raise ToolError(ErrorCode.shape, f"label {name} of case {case.id} has grid {tuple(got[:3])}, "
                            f"k-space images are {shape} (recon matrix)", case=case.id, file=r["path"])


def _read_checked(path: Path) -> Case:
    case = _read_case(path)
    _check_labels(case)
    return case


def read(root: Path) -> list[Case]:
    """Every ``.h5`` under ``root`` as a lazy ``Case`` (attributes and shapes read, no k-space).

    Raises:
        ToolError: ``input_missing`` (no files), ``schema`` (not HDF5, no ``kspace``),
            ``shape`` (k-space not 3-/4-D, labels on another grid).
    """
    root = Path(root)
    files = case_files(root) if root.is_dir() else []
    if not files:
        raise ToolError(ErrorCode.input_missing, f"no fastMRI .h5 files under {root}", file=str(root))
    cases = read_each(files, _read_checked, lambda p: p.stem, lambda p: p.parent, layout=NAME)
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ToolError(ErrorCode.schema, f"case ids {dup} occur in more than one folder under {root}",
                        hint="read each split folder separately", file=str(root))
    return cases

