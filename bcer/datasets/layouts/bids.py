"""BIDS layout: ``sub-<label>[/ses-<label>]/{anat,dwi}/sub-<label>_<entities>_<suffix>.nii.gz``
plus ``participants.tsv`` and ``dataset_description.json``.

Sequence names map to BIDS suffixes both ways:

=========  =================================  =========================================
canonical  file (``sub-XX_`` prefix omitted)  note
=========  =================================  =========================================
T1         ``anat/T1w``
T1c        ``anat/ce-gd_T1w``                 any ``ce-`` entity on T1w reads as T1c
T2 / T2w   ``anat/T2w``                        T2 for the brain domain, T2w otherwise
FLAIR      ``anat/FLAIR``
PD         ``anat/PDw``
CINE       ``anat/acq-sax_cine``              4-D (X, Y, Z, T)
ADC        ``dwi/ADC``                        a parametric map, not raw diffusion
DWI        ``dwi/acq-highb_dwi``              one high-b volume; ``.bval`` next to it
=========  =================================  =========================================

Phantom cohorts also get a ``bcer_truth.json`` per subject, with label maps and clean
references under ``sub-XX/truth/``; real datasets are read from their files alone (label maps
found as ``derivatives/*/sub-XX/anat/*_dseg.nii.gz`` when present).
"""
from __future__ import annotations

import csv
import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ...contracts.case import Case
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.sequences import canonical_sequence
from ...io import atomic_write_bytes, write_json
from ...io.bids_names import subject_label
from ..phantom import Phantom
from ._common import (read_each, read_truth, ref_for, sanitize_case_id,
                      validate_case_shapes, write_truth, write_volume)

log = logging.getLogger(__name__)

NAME = "bids"
BIDS_VERSION = "1.8.0"
# canonical -> (datatype folder, entities+suffix after "sub-XX_")
SUFFIX = {
    "T1": ("anat", "T1w"), "T1c": ("anat", "ce-gd_T1w"), "T2": ("anat", "T2w"),
    "T2w": ("anat", "T2w"), "FLAIR": ("anat", "FLAIR"), "PD": ("anat", "PDw"),
    "CINE": ("anat", "acq-sax_cine"), "ADC": ("dwi", "ADC"), "DWI": ("dwi", "acq-highb_dwi"),
}
_NIFTI = re.compile(r"^(?P<stem>sub-[A-Za-z0-9]+.*)\.nii(\.gz)?$")

__all__ = ["NAME", "detect", "write", "read", "subject_label", "parse_name"]


def parse_name(filename: str) -> tuple[dict[str, str], str] | None:
    """Entities and suffix of a BIDS NIfTI file name, or None when it is not one."""
    m = _NIFTI.match(filename)
    if not m:
        return None
    parts = m.group("stem").split("_")
    entities = dict(p.split("-", 1) for p in parts[:-1] if "-" in p)
    return entities, parts[-1]


def _canonical(entities: dict[str, str], suffix: str, domain: str) -> str | None:
    s = suffix.lower()
    if s == "t1w":
        return "T1c" if "ce" in entities else "T1"
    if s == "t2w":
        return "T2" if domain == "brain" else "T2w"
    if s == "dwi":
        return "ADC" if entities.get("acq", "").lower() == "adc" else "DWI"
    return canonical_sequence(suffix) or canonical_sequence(entities.get("acq", ""))


def detect(root: Path) -> bool:
    root = Path(root)
    if not root.is_dir():
        return False
    subs = [p for p in root.glob("sub-*") if p.is_dir()]
    return bool(subs) and ((root / "participants.tsv").exists()
                           or (root / "dataset_description.json").exists()
                           or any((s / "anat").is_dir() or any(s.glob("ses-*/anat")) for s in subs))


def _write_subject(p: Phantom, out: Path) -> dict[str, Any]:
    label = subject_label(p.case_id)
    sub = f"sub-{label}"
    d = out / sub
    written = {}
    for seq, art in p.sequences.items():
        if seq not in SUFFIX:
            log.warning("BIDS writer skips sequence %s of %s (no BIDS suffix for it)", seq, p.case_id)
            continue
        folder, suffix = SUFFIX[seq]
        written[seq] = d / folder / f"{sub}_{suffix}.nii.gz"
        write_volume(art, written[seq])
        if seq == "DWI":
            bval = art.meta.get("b_value", p.metadata.get("b_value", p.truth.get("b_value")))
            if bval is not None:
                atomic_write_bytes(d / folder / f"{sub}_{suffix}.bval", f"{float(bval):g}\n".encode())
    labels = {n: write_volume(m, d / "truth" / f"{sub}_desc-{_alnum(n)}_dseg.nii.gz")
              for n, m in p.labels.items()}
    refs = {}
    for seq, img in p.references.items():
        if seq in written and np.array_equal(np.asarray(img.data), np.asarray(p.sequences[seq].data)):
            refs[seq] = ref_for(written[seq].resolve(), img)
        else:
            refs[seq] = write_volume(img, d / "truth" / f"{sub}_desc-clean{_alnum(seq)}_ref.nii.gz")
    write_truth(d, p, labels, refs)
    return {"participant_id": sub, **{k: v for k, v in p.metadata.items() if _scalar(v)}}


def _alnum(name: str) -> str:
    """BIDS entity values are alphanumeric: ``lesions_adc`` -> ``lesionsadc``."""
    return re.sub(r"[^A-Za-z0-9]", "", str(name)) or "x"


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool, np.generic))


def _tsv_value(v: Any) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "n/a"
    # tabs and newlines would break the TSV row
    return re.sub(r"[\t\r\n]+", " ", str(v.item() if isinstance(v, np.generic) else v))


def _write_participants(rows: list[dict[str, Any]], out: Path) -> None:
    path = out / "participants.tsv"
    old = _participants(out) if path.exists() else {}
    merged = {**old, **{r["participant_id"]: r for r in rows}}
    cols = ["participant_id"]
    for r in merged.values():
        cols += [c for c in r if c not in cols]
    lines = ["\t".join(cols)]
    lines += ["\t".join(_tsv_value(r.get(c)) for c in cols) for _, r in sorted(merged.items())]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode())


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as a BIDS dataset under ``out``; returns ``read(out)``'s cases for the
    written subjects."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, domains = [], set()
    for p in phantoms:  # one phantom in memory at a time
        rows.append(_write_subject(p, out))
        domains.add(p.domain)
    _write_participants(rows, out)
    desc = out / "dataset_description.json"
    if desc.exists():
        domains |= set(json.loads(desc.read_text()).get("bcer_domains") or [])
    write_json({"Name": "bcer synthetic phantoms", "BIDSVersion": BIDS_VERSION, "DatasetType": "raw",
                "GeneratedBy": [{"Name": "bcer", "Description": "synthetic MRI phantoms"}],
                "bcer_domains": sorted(domains)}, desc)
    by_id = {c.id: c for c in read(out)}
    return [by_id[r["participant_id"]] for r in rows]


def _coerce(v: str) -> Any:
    if v in ("n/a", ""):
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


def _participants(root: Path) -> dict[str, dict[str, Any]]:
    path = Path(root) / "participants.tsv"
    if not path.exists():
        return {}
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        return {r["participant_id"]: {k: _coerce(v) for k, v in r.items() if k is not None}
                for r in rows}
    except (KeyError, csv.Error) as e:
        raise ToolError(ErrorCode.schema, f"participants.tsv is malformed: {e}",
                        hint="it needs a participant_id column", file=str(path)) from e


def _guess_domain(root: Path, names: set[str]) -> str:
    desc = root / "dataset_description.json"
    if desc.exists():
        try:
            doms = json.loads(desc.read_text()).get("bcer_domains") or []
            if len(doms) == 1:
                return str(doms[0])
        except ValueError:
            log.warning("unreadable %s; guessing the domain from file names", desc)
    if names & {"FLAIR", "T1c"}:
        return "brain"
    if names & {"ADC", "DWI"}:
        return "prostate"
    if "CINE" in names:
        return "cardiac"
    return "unknown"


def _sessions(root: Path) -> list[tuple[str, Path]]:
    out = []
    for s in sorted(p for p in Path(root).glob("sub-*") if p.is_dir()):
        sess = sorted(p for p in s.glob("ses-*") if p.is_dir())
        out += [(f"{s.name}_{x.name}", x) for x in sess] if sess else [(s.name, s)]
    return out


def _derivative_labels(root: Path, case_id: str) -> dict[str, Any]:
    sub = case_id.split("_")[0]
    labels = {}
    for p in sorted(root.glob(f"derivatives/*/{sub}/**/*_dseg.nii*")):
        parsed = parse_name(p.name)
        name = parsed[0].get("desc", "seg") if parsed else "seg"
        labels[name] = ref_for(p.resolve(), kind="mask").model_dump(mode="json")
    return labels


def _read_subject(root: Path, case_id: str, d: Path, participants: dict[str, dict[str, Any]]) -> Case:
    found = []
    for folder in ("anat", "dwi"):
        for p in sorted((d / folder).glob("sub-*.nii*")):
            parsed = parse_name(p.name)
            if parsed:
                found.append((p, *parsed))
    truth = read_truth(d)
    domain = (truth or {}).get("domain") or _guess_domain(
        root, {_canonical(e, s, "brain") or "" for _, e, s in found})
    sequences = {}
    for p, entities, suffix in found:
        name = _canonical(entities, suffix, domain)
        if name is None or name in sequences:
            log.warning("BIDS reader skips %s (unknown or duplicate sequence)", p)
            continue
        sequences[name] = ref_for(p.resolve(), kind="cine" if name == "CINE" else "image")
    # "n/a" means unknown: leave the key out rather than bind None to @case.<key>
    metadata = {k: v for k, v in participants.get(case_id.split("_")[0], {}).items()
                if k != "participant_id" and v is not None}
    gt = None
    if truth is not None:
        metadata.update({k: v for k, v in truth["metadata"].items() if k not in metadata})
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    elif labels := _derivative_labels(root, case_id):
        gt = {"values": {}, "labels": labels, "references": {}}
    case = Case(id=sanitize_case_id(case_id), root=str(d.resolve()), domain=domain,
                sequences=sequences, metadata=metadata, ground_truth=gt, layout=NAME)
    grid_bound = None if domain != "prostate" else [n for n in ("ADC", "DWI") if n in sequences]
    validate_case_shapes(case, names=grid_bound, include_labels=domain != "prostate", ndim=None)
    return case


def read(root: Path) -> list[Case]:
    """Every subject (or subject+session) of a BIDS dataset as a lazy ``Case``.

    Raises:
        ToolError: ``input_missing`` (no subjects), ``schema`` (unreadable header, tsv or
            sidecar), ``shape`` (files of one case on different grids).
    """
    root = Path(root)
    sessions = _sessions(root) if root.is_dir() else []
    if not sessions:
        raise ToolError(ErrorCode.input_missing, f"no BIDS subjects (sub-*) under {root}",
                        hint="expected sub-XX/anat/sub-XX_T1w.nii.gz", file=str(root))
    participants = _participants(root)
    return read_each(sessions, lambda x: _read_subject(root, x[0], x[1], participants), lambda x: x[0],
                     lambda x: x[1], layout=NAME)
