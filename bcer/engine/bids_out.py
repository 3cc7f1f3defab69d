"""The BIDS derivative dataset at ``OUT`` (BIDS 1.9, checked by the official validator in tests).

::

    OUT/dataset_description.json          DatasetType derivative, GeneratedBy, SourceDatasets, DatasetLinks
    OUT/participants.tsv
    OUT/sub-<label>[/ses-<label>]/anat/sub-<label>[_ses-<label>]_desc-<name>_dseg.nii.gz
                                            ..._desc-<name>_dseg.tsv   (index, name)
                                            ..._desc-<name>_dseg.json  (Sources, SpatialReference)
    OUT/phenotype/<name>.tsv + .json       tables, findings, classifications: one row per case/region
    OUT/.bidsignore                         bcer's own files (per-case folders, parquet tables, ...)

Labels come from the case id: ``sub-01_ses-02`` (a BIDS input) keeps subject 01 and session 02;
any other id becomes a subject label of its letters and digits (``brain-003`` -> ``brain003``).
``Sources`` and ``SpatialReference`` are BIDS URIs into the input dataset, linked as ``raw``.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..io import atomic_write_bytes, write_json
from ..io.bids_names import subject_label
from ..io.nifti import mask_label_names
from .derivatives import Finished, grid_input, label_mapping, nifti_bytes, remap

log = logging.getLogger(__name__)
BIDS_VERSION = "1.9.0"
_BIDS_ID = re.compile(r"^sub-([A-Za-z0-9]+)(?:_ses-([A-Za-z0-9]+))?$")
_BIDS_TOP = {"dataset_description.json", "participants.tsv", "participants.json", "README", "README.md",
             "CHANGES", "LICENSE", "phenotype", ".bidsignore", "sourcedata", "code", "derivatives"}
_DATATYPES = {"anat", "func", "dwi", "fmap", "perf"}

_README = """# bcer derivatives

Segmentations (`*_dseg.nii.gz` with their `dseg.tsv` label tables) and measurement tables
(`phenotype/*.tsv`) written by bcer. bcer's own per-case records (plan, workflow, provenance,
events) stay in the per-case folders listed in `.bidsignore`.
"""

__all__ = ["BIDS_VERSION", "entities", "write_tree"]


def entities(case_id: str) -> tuple[str, str | None]:
    """(subject, session) labels of a case id."""
    m = _BIDS_ID.match(case_id)
    return (m.group(1), m.group(2)) if m else (subject_label(case_id), None)


def _alnum(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", name) or "mask"


def _raw_root(finished: list[Finished]) -> Path | None:
    """The input dataset's root: the common folder of the case roots' parents, above any
    ``sub-``/``ses-`` folder."""
    roots = [str(Path(f.case.root).resolve().parent) for f in finished]
    if not roots:
        return None
    try:
        root = Path(os.path.commonpath(roots))
    except ValueError:
        return None
    while root.name.startswith(("sub-", "ses-")) and root.parent != root:
        root = root.parent
    return root


def _uri(path: str, raw: Path | None) -> str:
    p = Path(path).resolve()
    if raw is not None and p.is_relative_to(raw):
        return f"bids:raw:{p.relative_to(raw).as_posix()}"
    return p.as_uri()


def _spatial_ref(done: Finished, name: str, raw: Path | None) -> str | None:
    """URI of the input image the mask lies on (same shape and affine), else of its first input."""
    seq = grid_input(done, name) or next(iter(done.used.get(name) or done.inputs), None)
    path = done.inputs.get(seq or "", {}).get("path")
    return _uri(path, raw) if path else None


def _tsv(rows: list[dict[str, Any]], columns: list[str]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, columns, delimiter="\t", lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({c: ("n/a" if r.get(c) is None or r.get(c) == "" else _cell(r[c])) for c in columns})
    return buf.getvalue().encode()


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v).replace("\t", " ").replace("\n", " ")


def _write_masks(out: Path, done: Finished, sub: str, ses: str | None, raw: Path | None) -> list[Path]:
    folder = out / f"sub-{sub}" / (f"ses-{ses}" if ses else "") / "anat"
    prefix = f"sub-{sub}" + (f"_ses-{ses}" if ses else "")
    written = []
    for name, path in done.masks.items():
        stem = folder / f"{prefix}_desc-{_alnum(name)}_dseg"
        names = mask_label_names(path)
        mapping = label_mapping(names, done.case)  # the input dataset's label values, as in predictions/
        written.append(atomic_write_bytes(stem.with_suffix(".nii.gz"), nifti_bytes(remap(path, mapping))))
        rows = [{"index": 0, "name": "background"}] + [{"index": mapping.get(v, v), "name": n}
                                                       for v, n in sorted(names.items())]
        written.append(atomic_write_bytes(stem.with_suffix(".tsv"), _tsv(rows, ["index", "name"])))
        seqs = done.used.get(name) or list(done.inputs)
        sidecar = {"Description": f"bcer deliverable {name!r} of case {done.case.id}",
                   "Sources": [_uri(done.inputs[s]["path"], raw) for s in seqs if done.inputs.get(s, {}).get("path")]}
        ref = _spatial_ref(done, name, raw)
        if ref:
            sidecar["SpatialReference"] = ref
        written.append(write_json(sidecar, stem.with_suffix(".json")))
    return written


def _table_rows(name: str, doc: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Rows and units of a table, findings or classification document."""
    kind = doc.get("kind")
    if kind == "table":
        return [dict(r) for r in doc.get("rows", [])], dict(doc.get("units") or {})
    if kind == "findings":
        rows = []
        for it in doc.get("items", []):
            attrs = {k: v for k, v in (it.get("attributes") or {}).items() if isinstance(v, (int, float, str))}
            rows.append({"id": it.get("id"), "label": it.get("label"), "volume_ml": it.get("volume_ml"),
                         "side": it.get("side"), "zone": it.get("zone"), **attrs})
        return rows, {"volume_ml": "mL"}
    scores = {f"score_{k}": v for k, v in (doc.get("scores") or {}).items()}
    return [{"label": doc.get("label"), **scores}], {}


def _write_phenotype(out: Path, finished: list[Finished], labels: dict[str, tuple[str, str | None]]) -> list[Path]:
    tables: dict[str, tuple[list[dict[str, Any]], dict[str, str]]] = {}
    for done in finished:
        sub, ses = labels[done.case.id]
        for name, doc in done.docs.items():
            rows, units = _table_rows(name, doc)
            acc = tables.setdefault(_alnum(name), ([], {}))
            acc[0].extend({"participant_id": f"sub-{sub}", **({"session_id": f"ses-{ses}"} if ses else {}), **r}
                          for r in rows)
            acc[1].update(units)
    written = []
    for name, (rows, units) in sorted(tables.items()):
        cols = list(dict.fromkeys(c for r in rows for c in r))
        if not any("session_id" in r for r in rows):
            cols = [c for c in cols if c != "session_id"]
        written.append(atomic_write_bytes(out / "phenotype" / f"{name}.tsv", _tsv(rows, cols)))
        meta: dict[str, Any] = {"Description": f"bcer deliverable {name!r}, one row per case and region"}
        meta.update({c: {"Description": c.replace("_", " "), **({"Units": units[c]} if c in units else {})}
                     for c in cols if c != "participant_id"})
        written.append(write_json(meta, out / "phenotype" / f"{name}.json"))
    return written


def _participants(out: Path, subjects: list[str]) -> list[Path]:
    """``participants.tsv`` (+ .json), left out when a case folder is named ``sub-*`` without being a
    subject folder (``sub-01_ses-02``): the validator counts such folders as subjects even when
    ``.bidsignore`` lists them, so no participants table could match."""
    strays = [p.name for p in out.glob("sub-*") if p.is_dir() and p.name not in subjects]
    for name in ("participants.tsv", "participants.json"):
        (out / name).unlink(missing_ok=True)
    if strays:
        log.info("BIDS export: no participants.tsv beside the case folders %s", strays[:3])
        return []
    table = _tsv([{"participant_id": s} for s in subjects], ["participant_id"])
    return [atomic_write_bytes(out / "participants.tsv", table),
            write_json({"Description": "the subjects of this derivative dataset",
                        "participant_id": {"Description": "BIDS subject label of the case"}},
                       out / "participants.json")]


def _ignore_lines(out: Path, subjects: set[str]) -> list[str]:
    """``.bidsignore`` lines for everything under ``out`` that is bcer's, not BIDS."""
    lines = []
    for p in sorted(out.iterdir()):
        if p.name in _BIDS_TOP:
            continue
        if p.name not in subjects:
            lines.append(f"/{p.name}")
            continue
        for q in sorted(p.iterdir()):  # a case folder named like its subject (a BIDS input without sessions)
            if not (q.is_dir() and (q.name.startswith("ses-") or q.name in _DATATYPES)):
                lines.append(f"/{p.name}/{q.name}")
    # written after the cohort (HTML pages) or by other exports: ignored before they exist
    return sorted(set(lines) | {"/report", "/predictions", "/dicom", "/cohort.parquet", "/events.parquet",
                                "/measurements.parquet"})


def _description(out: Path, name: str, generated_by: dict[str, Any], raw: Path | None) -> Path:
    path = out / "dataset_description.json"
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        doc = {}
    doc.update({"Name": doc.get("Name", name), "BIDSVersion": BIDS_VERSION, "DatasetType": "derivative"})
    doc.setdefault("GeneratedBy", [generated_by or {"Name": "bcer"}])  # the cohort's own entry wins
    if raw is not None:
        doc["SourceDatasets"] = [{"URL": raw.as_uri()}]
        doc["DatasetLinks"] = {"raw": raw.as_uri()}
    return write_json(doc, path)


def write_tree(out: str | Path, finished: Iterable[Finished], *, name: str = "bcer derivatives",
               generated_by: dict[str, Any] | None = None) -> list[Path]:
    """Write the BIDS derivative dataset for ``finished`` under ``out``; returns its files."""
    out, finished = Path(out), list(finished)
    labels, seen = {}, {}
    for done in finished:
        key = entities(done.case.id)
        if key in seen:  # two case ids with the same letters and digits: the first keeps the label
            log.warning("BIDS export: case %s has the same labels %s as %s; it is left out",
                        done.case.id, key, seen[key])
            continue
        seen[key], labels[done.case.id] = done.case.id, key
    finished = [d for d in finished if d.case.id in labels]
    raw = _raw_root(finished)
    written = [_description(out, name, generated_by or {}, raw)]
    for done in finished:
        written += _write_masks(out, done, *labels[done.case.id], raw)
    written += _write_phenotype(out, finished, labels)
    subjects = sorted({f"sub-{s}" for s, _ in labels.values()})
    written += _participants(out, subjects)
    if not (out / "README.md").exists():
        written.append(atomic_write_bytes(out / "README.md", _README.encode()))
    written.append(atomic_write_bytes(out / ".bidsignore",
                                      ("\n".join(_ignore_lines(out, set(subjects))) + "\n").encode()))
    return written
