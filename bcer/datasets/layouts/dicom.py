"""DICOM layout: one folder per case, one DICOM series per sequence.

Written form (what ``write`` produces, and what ``read`` accepts among other shapes)::

    <out>/<case>/AX_T2/IM_0001.dcm ...                 one MR series per sequence
    <out>/<case>/AX_DIFFUSION_ADC/IM_0001.dcm ...
    <out>/<case>/labels/<name>.nii.gz                  ground-truth label maps (phantoms only)
    <out>/<case>/references/<name>.nii.gz              clean reference images (phantoms only)
    <out>/<case>/bcer_truth.json                       truth sidecar (phantoms only)

Each series is written on its own grid, oblique or not, as its affine says; InstanceNumbers follow
the array's slice axis, so a grid whose slice axis runs against the in-plane cross product (a
left-handed grid) is a series numbered against the slice normal, and the reader keeps that
order (``bcer.io.dicom``): series of one case may be numbered in opposite directions.
A sequence whose ``meta["series_description"]`` is set is written under that description.

Reading identifies series by SeriesDescription, then ProtocolName, through the one alias
table ``bcer.contracts.sequences.canonical_sequence`` (AX_T2 -> T2w, AX_DIFFUSION_ADC -> ADC,
AX_DIFFUSION_CALC_BVAL -> DWI, ...), not by folder names: real exports nest series in any
folder structure (or mix them in one folder). Series the table does not know are kept under
their sanitised description. With ``seq`` (the CLI's ``--seq T2w='*t2*tra*'``) each named
sequence is the one series whose SeriesDescription (or ProtocolName) the glob matches,
case-insensitively; no match or several is an error listing the series the case has.
Every chosen series is checked from its headers (orientation, duplicated or missing slices)
when the case is read, so a broken series is named with its case before anything runs. Only headers are read; pixels load lazily through
``bcer.io.load_sequence`` (format ``dicom``, ``options.series_uid``).
"""
from __future__ import annotations

import fnmatch
import logging
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ...contracts.artifacts import Image, Mask
from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.sequences import canonical_sequence
from ...io.dicom import check_series, list_series, patient_metadata, sanitise_description, write_series
from ..phantom import Phantom
from ._common import read_each, read_truth, sanitize_case_id, write_truth, write_volume

log = logging.getLogger(__name__)

NAME = "dicom"
# canonical sequence -> SeriesDescription written for it (others keep their canonical name)
SERIES_DESCRIPTION = {"T2w": "AX_T2", "ADC": "AX_DIFFUSION_ADC", "DWI": "AX_DIFFUSION_CALC_BVAL"}
_MAX_PROBE = 64  # files looked at by ``detect`` before giving up

__all__ = ["NAME", "SERIES_DESCRIPTION", "detect", "write", "read", "series_name"]


def _has_dicom_magic(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            f.seek(128)
            return f.read(4) == b"DICM"
    except OSError:
        return False


def _holds_dicom(folder: Path) -> bool:
    files = (q for q in folder.rglob("*") if q.is_file() and not q.name.startswith("."))
    return any(_has_dicom_magic(p) for p in islice(files, _MAX_PROBE))


def _case_dirs(root: Path, limit: int | None = None) -> list[Path]:
    """Sub-folders holding DICOM files (only the first ``limit`` are probed), or ``[root]``
    when the files of a single case sit directly in ``root``."""
    subs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    found = [d for d in subs[:limit] if _holds_dicom(d)]
    if not found and any(_has_dicom_magic(p) for p in islice((q for q in root.iterdir() if q.is_file()),
                                                             _MAX_PROBE)):
        return [root]
    return found


def detect(root: Path) -> bool:
    """True when ``root`` holds case folders with DICOM Part-10 files (the 'DICM' marker);
    looks at a few folders and files only, so it stays fast on large datasets."""
    root = Path(root)
    return root.is_dir() and bool(_case_dirs(root, limit=8))


def _canonical_prefix(text: str) -> str | None:
    """Canonical name of ``text`` or of its longest ``_``-separated prefix: scanners append
    plane and options (``t2_tse_tra`` -> ``t2_tse`` -> T2w, ``AX_T2_FS`` -> ``AX_T2``); failing
    that, of its longest suffix (Siemens diffusion maps end in ``_ADC`` or ``_CALC_BVAL``)."""
    tokens = sanitise_description(text).split("_")
    for n in range(len(tokens), 0, -1):
        name = canonical_sequence("_".join(tokens[:n]))
        if name:
            return name
    for n in range(1, len(tokens)):  # then suffixes: ``ep2d_diff_b50_800_ADC`` -> ``ADC``
        name = canonical_sequence("_".join(tokens[n:]))
        if name:
            return name
    return None


def series_name(description: str, protocol: str = "") -> str:
    """Canonical sequence name of a series (from SeriesDescription, then ProtocolName), or
    its sanitised description when the alias table knows neither."""
    return (canonical_sequence(description) or canonical_sequence(protocol) or _canonical_prefix(description)
            or _canonical_prefix(protocol) or sanitise_description(description or protocol))


# ----------------------------------------------------------------------------- writing

def _patient_tags(metadata: dict[str, Any]) -> dict[str, Any]:
    tags: dict[str, Any] = {}
    if isinstance(metadata.get("age"), (int, float)):
        tags["PatientAge"] = f"{int(metadata['age']):03d}Y"
    if metadata.get("sex") in ("M", "F", "O"):
        tags["PatientSex"] = metadata["sex"]
    if isinstance(metadata.get("weight"), (int, float)):
        tags["PatientWeight"] = f"{float(metadata['weight']):.1f}"
    if isinstance(metadata.get("height"), (int, float)):  # DICOM stores metres; bcer uses cm
        tags["PatientSize"] = f"{float(metadata['height']) / 100.0:.3f}"
    return tags


def _write_case(p: Phantom, out: Path) -> Path:
    from pydicom.uid import generate_uid

    cid = sanitize_case_id(p.case_id)
    d = out / cid
    study_uid, tags = generate_uid(), _patient_tags(p.metadata)
    for number, (seq, art) in enumerate(p.sequences.items(), start=1):
        if not isinstance(art, Image) or np.ndim(art.data) != 3:
            raise ToolError(ErrorCode.schema, f"sequence {seq} of {p.case_id} is a {type(art).__name__}; "
                            "the DICOM layout stores 3-D images only",
                            hint="use the acdc/fastmri/cmrx layout for cine or k-space data", case=p.case_id)
        # a phantom may name its series as a scanner would (the reader maps names by the alias table)
        desc = str(art.meta.get("series_description") or SERIES_DESCRIPTION.get(seq, seq))
        extra = dict(tags)
        if "b_value" in art.meta:
            extra["DiffusionBValue"] = float(art.meta["b_value"])
        write_series(art, d / desc, desc, series_number=number, patient_id=cid,
                     study_uid=study_uid, extra=extra)
    labels = {n: write_volume(m, d / "labels" / f"{n}.nii.gz") for n, m in p.labels.items()}
    refs = {n: write_volume(img, d / "references" / f"{n}.nii.gz") for n, img in p.references.items()}
    write_truth(d, p, labels, refs)
    return d


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as DICOM case folders under ``out``; returns the read-back Cases of
    exactly the written ones, in order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    dirs = [_write_case(p, out) for p in phantoms]
    return read_each(dirs, _read_case, lambda d: d.name, lambda d: d, layout=NAME)


# ----------------------------------------------------------------------------- reading

def _guess_domain(names: Iterable[str]) -> str:
    names = set(names)
    if {"T2w", "ADC", "DWI"} & names:
        return "prostate"
    if {"T1", "T1c", "T2", "FLAIR"} & names:
        return "brain"
    return "unknown"


def _series_ref(s: dict[str, Any]) -> SequenceRef:
    return SequenceRef(path=str(Path(s["folder"]).resolve()), format="dicom", kind="image",
                       options={"series_uid": s["SeriesInstanceUID"], "series_description": s["SeriesDescription"],
                                "n_files": s["n_files"]})


def _by_alias(series: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every series under the name the alias table gives it (numbered when two share one)."""
    out: dict[str, dict[str, Any]] = {}
    for s in series:
        name = series_name(s["SeriesDescription"], s["ProtocolName"])
        if name in out:  # two series with one name: keep both, numbered
            name = f"{name}_{s['SeriesNumber'] or len(out) + 1}"
        out[name] = s
    return out


def _listing(series: list[dict[str, Any]]) -> str:
    return "; ".join(f"#{s['SeriesNumber']} {s['SeriesDescription'] or s['ProtocolName']!r} ({s['n_files']} files)"
                     for s in series) or "none"


def _matches(s: dict[str, Any], pattern: str) -> bool:
    pat = pattern.lower()
    return any(fnmatch.fnmatchcase(str(v).lower(), pat) for v in (s["SeriesDescription"], s["ProtocolName"]) if v)


def _by_pattern(cid: str, d: Path, series: list[dict[str, Any]], seq: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """The one series each ``seq`` pattern (a glob on SeriesDescription or ProtocolName,
    case-insensitive) matches.

    Raises:
        ToolError: ``input_missing`` when a pattern matches no series, ``schema`` when it
            matches several; both list the series the case has.
    """
    out = {}
    for name, pattern in seq.items():
        seq_name = canonical_sequence(name) or name
        hits = [s for s in series if _matches(s, pattern)]
        if len(hits) != 1:
            code = ErrorCode.input_missing if not hits else ErrorCode.schema
            what = "no series matches" if not hits else f"{len(hits)} series match"
            raise ToolError(code, f"case {cid}: {what} {seq_name}={pattern!r}; the case has: {_listing(series)}",
                            hint="--seq patterns are globs on SeriesDescription (or ProtocolName), case-insensitive; "
                            "make each match exactly one series", case=cid, file=str(d), arg="seq")
        out[seq_name] = hits[0]
    return out


def _read_case(d: Path, seq: Mapping[str, str] | None = None) -> Case:
    cid = sanitize_case_id(d.name)
    series = list_series(d)
    chosen = _by_pattern(cid, d, series, seq) if seq else _by_alias(series)
    for name, s in chosen.items():  # headers only: a missing or doubled slice is named now
        try:
            check_series(s)
        except ToolError as e:
            raise e.with_context(case=cid, sequence=name)
    sequences = {name: _series_ref(s) for name, s in chosen.items()}
    truth = read_truth(d)
    metadata = patient_metadata(series[0]["files"][0]) if series else {}
    gt = None
    domain = _guess_domain(sequences)
    if truth is not None:
        metadata.update(truth["metadata"])
        domain = truth.get("domain") or domain
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    return Case(id=cid, root=str(d.resolve()), domain=domain,
                sequences=sequences, metadata=metadata, ground_truth=gt, layout=NAME)


def read(root: Path, seq: Mapping[str, str] | None = None) -> list[Case]:
    """Every case under ``root`` as a lazy Case (headers only; no pixel data is loaded).

    Args:
        root: the dataset folder (one sub-folder per case) or one case folder.
        seq: sequence name -> SeriesDescription glob (``{"T2w": "*t2*tra*", "ADC": "*adc*"}``,
            the CLI's ``--seq``); without it every series is named through the alias table.

    Raises:
        ToolError: ``input_missing`` when ``root`` does not exist, holds no DICOM case, or a
            pattern matches no series of a case; ``schema`` for a damaged header or truth
            sidecar, a pattern matching several series, missing/duplicated slices or mixed
            geometry (each naming the case and the file).
    """
    root = Path(root)
    if not root.is_dir():
        raise ToolError(ErrorCode.input_missing, f"DICOM dataset folder not found: {root}", file=str(root))
    dirs = _case_dirs(root)
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no DICOM case folders under {root}", file=str(root),
                        hint="expected <root>/<case>/<series>/*.dcm")
    return read_each(dirs, lambda d: _read_case(d, seq), lambda d: d.name, lambda d: d, layout=NAME)


def load_label(case: Case, name: str) -> Mask:
    """Convenience: the ground-truth label map ``name`` of a case written by ``write``."""
    from ...io import load_sequence

    if not case.ground_truth or name not in case.ground_truth.get("labels", {}):
        raise ToolError(ErrorCode.input_missing, f"case {case.id} has no ground-truth label {name!r}",
                        case=case.id)
    return load_sequence(SequenceRef.model_validate(case.ground_truth["labels"][name]))
