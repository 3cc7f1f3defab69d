"""Deliverables and audit files of one case, each written atomically (temp file + rename).

Writers by artifact kind: image/cine/mask -> NIfTI; table -> JSON + CSV (the CSV only with the
full audit); classification,
findings, transform, value -> JSON; report -> Markdown + JSON; kspace -> ``.npz``.
The file a contract names is the primary file; companions share its stem.
"""
from __future__ import annotations

import io
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import ArtifactKind, kind_of
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.tokens import Token
from ..contracts.workflow import Workflow
from ..io import (artifact_to_dict, atomic_write_bytes, json_bytes, to_jsonable, write_json, write_nifti,
                  write_table_csv)
from .digest import file_digest

log = logging.getLogger(__name__)
DONE_FILE = "_DONE"
_NIFTI_KINDS = (ArtifactKind.image, ArtifactKind.cine, ArtifactKind.mask)
_JSON_KINDS = (ArtifactKind.classification, ArtifactKind.findings, ArtifactKind.transform)
DEFAULT_SUFFIX: dict[ArtifactKind, str] = {
    ArtifactKind.image: ".nii.gz", ArtifactKind.cine: ".nii.gz", ArtifactKind.mask: ".nii.gz",
    ArtifactKind.table: ".json", ArtifactKind.classification: ".json", ArtifactKind.findings: ".json",
    ArtifactKind.transform: ".json", ArtifactKind.report: ".md", ArtifactKind.value: ".json",
    ArtifactKind.kspace: ".npz",
}


def _stem(path: Path) -> Path:
    name = path.name
    for suf in (".nii.gz", ".nii", ".json", ".csv", ".md", ".npz"):
        if name.endswith(suf):
            return path.with_name(name[: -len(suf)])
    return path


def default_file(name: str, kind: ArtifactKind) -> str:
    """File name for a deliverable without one in the contract (``<name><suffix>``)."""
    return name + DEFAULT_SUFFIX.get(kind, ".json")


def write_artifact(artifact: Any, path: str | Path, companions: bool = True) -> list[Path]:
    """Write ``artifact`` at ``path`` (and its companions); returns the files, primary first.

    ``companions=False`` (a lean cohort) leaves out a table's second form (its CSV beside the
    JSON, or the reverse): the cohort's ``measurements.parquet`` holds every cell of it.

    Raises:
        ToolError: ``schema`` when the artifact cannot be written in that form.
    """
    path, kind = Path(path), kind_of(artifact)
    stem = _stem(path)
    if kind in _NIFTI_KINDS:
        if not path.name.endswith((".nii", ".nii.gz")):
            path = stem.with_name(stem.name + ".nii.gz")
        return [write_nifti(artifact, path)]
    if kind == ArtifactKind.table:
        as_json, as_csv = stem.with_suffix(".json"), stem.with_suffix(".csv")
        first, second = (as_csv, as_json) if path.suffix == ".csv" else (as_json, as_csv)
        if companions or first == as_json:
            write_json(artifact_to_dict(artifact), as_json)
        if companions or first == as_csv:
            write_table_csv(artifact, as_csv)
        return [first, second] if companions else [first]
    if kind == ArtifactKind.report:
        as_md, as_json = stem.with_suffix(".md"), stem.with_suffix(".json")
        atomic_write_bytes(as_md, artifact.text.encode())
        write_json(artifact_to_dict(artifact), as_json)
        return [as_json, as_md] if path.suffix == ".json" else [as_md, as_json]
    if kind in _JSON_KINDS:
        return [write_json(artifact_to_dict(artifact), path)]
    if kind == ArtifactKind.kspace:
        buf = io.BytesIO()
        np.savez(buf, data=artifact.data, mask=artifact.mask, affine=artifact.affine)
        return [atomic_write_bytes(path, buf.getvalue())]
    try:
        return [write_json({"kind": "value", "value": artifact}, path)]
    except TypeError as e:
        raise ToolError(ErrorCode.schema, f"cannot write a {type(artifact).__name__} as a deliverable",
                        file=str(path)) from e


# columns that name a table's row, most specific first: a row is keyed by what it is (a tumour
# compartment, a chamber, a lesion), never by its position, which shifts when a row is absent
ROW_KEYS = ("roi", "chamber", "structure", "compartment", "region", "lesion", "name", "id", "label")


def _row_key(row: dict[str, Any]) -> tuple[str, str] | None:
    """``(key column, row name)`` of a table row, or None when no column names it."""
    for col in ROW_KEYS:
        v = row.get(col)
        if isinstance(v, str) and v.strip():
            return col, v.strip()
        if col == "label" and isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return col, f"label_{int(v)}"
    return None


def _record(deliverable: str, row: str | None, index: int | None, measure: str, value: Any,
            unit: str) -> dict[str, Any] | None:
    value = to_jsonable(value)
    base = {"deliverable": deliverable, "row": row, "row_index": index, "measure": measure, "unit": unit,
            "raw": value}  # ``raw``: the value as the wide row shows it (a bool stays a bool)
    if isinstance(value, (bool, int, float)):
        return dict(base, value=float(value), text=None)
    if isinstance(value, str):
        return dict(base, value=None, text=value)
    return None  # lists, dicts: in the deliverable file, not in a cell


def measurement_records(name: str, artifact: Any) -> list[dict[str, Any]]:
    """Every scalar of a deliverable in long form, one record per (row, measure):
    ``deliverable, row, row_index, measure, value, text, unit`` (``measurements.parquet``; the
    ``raw`` value is kept for the wide row and not written to that table).

    ``row`` is the row's name (its ``roi``/``chamber``/.../``label`` column; a finding's id), or
    None for a one-row table, a classification or a value; ``row_index`` is the position in the
    deliverable, kept for tables whose rows have no name. Numbers (and booleans, as 0/1) go to
    ``value``, words to ``text``.
    """
    kind, recs = kind_of(artifact), []
    if kind == ArtifactKind.classification:
        recs.append(_record(name, None, None, "label", artifact.label, ""))
        recs += [_record(name, None, None, f"score.{k}", float(v), "") for k, v in artifact.scores.items()]
    elif kind == ArtifactKind.table:
        many = len(artifact.rows) > 1
        for i, row in enumerate(artifact.rows):
            key = _row_key(row)
            label = key[1] if key else None
            for col, v in row.items():
                if key is not None and col == key[0]:
                    continue
                recs.append(_record(name, label, i if many or key else None, col, v, artifact.units.get(col, "")))
    elif kind == ArtifactKind.findings:
        recs.append(_record(name, None, None, "count", len(artifact.items), "findings"))
        for i, f in enumerate(artifact.items):
            recs.append(_record(name, f.id, i, "volume_ml", f.volume_ml, "mL"))
            recs += [_record(name, f.id, i, col, v, "") for col, v in
                     (("label", f.label), ("side", f.side), ("zone", f.zone)) if v]
            recs += [_record(name, f.id, i, k, v, "") for k, v in f.attributes.items()]
    elif kind == ArtifactKind.mask:
        conf = (getattr(artifact, "meta", None) or {}).get("confidence")
        if isinstance(conf, dict):  # the segmenter's self-consistency (tools/seg/confidence.py)
            recs += [_record(name, None, None, "confidence_score", conf.get("score"), ""),
                     _record(name, None, None, "confidence_threshold", conf.get("threshold"), ""),
                     _record(name, None, None, "low_confidence", bool(conf.get("low_confidence")), ""),
                     _record(name, None, None, "confidence_method", conf.get("method"), "")]
    elif kind == ArtifactKind.value and isinstance(artifact, (int, float, str, bool)):
        recs.append(_record(name, None, None, "value", artifact, ""))
    elif kind == ArtifactKind.report and isinstance(artifact.meta.get("r4"), dict):  # the critic's verdict
        r4 = artifact.meta["r4"]
        recs.append(_record(name, None, None, "r4_verdict", str(r4.get("verdict", "")), ""))
        recs.append(_record(name, None, None, "r4_material_issues", int(r4.get("material_issues", 0)), ""))
    return [r for r in recs if r is not None]


def wide_measurements(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The cohort row's ``measurements``: ``<deliverable>.<row>.<measure>`` for named rows,
    ``<deliverable>.<measure>`` for one-row tables, classifications and values. Rows of a
    multi-row table without a name column are only in the long form (a column keyed by position
    would mean another thing in each case)."""
    out: dict[str, Any] = {}
    for r in records:
        if r["row"] is None and r["row_index"] is not None:
            continue
        key = f"{r['deliverable']}.{r['row']}.{r['measure']}" if r["row"] is not None else \
            f"{r['deliverable']}.{r['measure']}" if r["measure"] != "value" else r["deliverable"]
        out[key] = r["raw"]
    return out


def case_records(written: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The long-form records of a case's written deliverables (as the workers made them)."""
    return [{k: v for k, v in r.items() if k != "raw"} for w in written.values() for r in w.get("records", ())]


def measurements_of(name: str, artifact: Any) -> dict[str, Any]:
    """Small scalars for the cohort row (see :func:`wide_measurements`), complete: nothing cut."""
    return wide_measurements(measurement_records(name, artifact))


def write_audit(obj: Any, path: str | Path) -> Path:
    """Write an audit record atomically (temp file + rename) into an existing folder (the
    case folder: no ``mkdir`` per file, a per-process temp name instead of ``mkstemp``)."""
    path = os.fspath(path)
    tmp = f"{os.path.dirname(path)}/.{os.path.basename(path)}.{os.getpid()}.{threading.get_ident()}.tmp"
    payload = json_bytes(obj)  # the one JSON encoder of bcer.io
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except FileNotFoundError:  # the folder does not exist yet: the slow, general path
        return atomic_write_bytes(path, payload)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(path)


def write_workflow(case_dir: str | Path, workflow: Workflow | dict[str, Any]) -> Path:
    data = workflow.model_dump(mode="json") if hasattr(workflow, "model_dump") else workflow
    return write_audit(data, Path(case_dir) / "workflow.json")


def write_plan(case_dir: str | Path, sketch: Any) -> Path:
    """``plan.json``: the sketch as the Brain emitted it (pydantic model or dict)."""
    data = sketch.model_dump(mode="json") if hasattr(sketch, "model_dump") else sketch
    return write_audit(data, Path(case_dir) / "plan.json")


def build_provenance(workflow: Workflow, records: dict[str, dict[str, Any]],
                     deliverables: dict[str, dict[str, Any]], inputs: dict[str, dict[str, Any]],
                     run_id: str, case_id: str | None = None) -> dict[str, Any]:
    """``provenance.json`` content: for each deliverable the chain of nodes that made it.

    Args:
        records: node id -> what ran (tool, version, params, inputs, device, output digests...).
        deliverables: name -> {node, field, files, artifact_digest, file_digests}; the worker
            that wrote a deliverable digests its files (``file_digests``), else they are read here.
        inputs: sequence name -> {path, format, sha256}.
        case_id: the case (default: the workflow's).
    """
    order = {n.id: i for i, n in enumerate(workflow.nodes)}
    ups: dict[str, set[str]] = {n.id: set(n.after) for n in workflow.nodes}
    for u, v in workflow.edges:
        ups.setdefault(v, set()).add(u)
    out: dict[str, Any] = {}
    for name, d in deliverables.items():
        chain = sorted(_ancestors(ups, d["node"]) | {d["node"]}, key=lambda n: order.get(n, 0))
        used_seqs = sorted({tok.name for n in chain for t in records.get(n, {}).get("inputs", {}).values()
                            if (tok := Token.try_parse(t)) is not None and tok.scope == "seq"})
        out[name] = {
            "node": d["node"], "field": d["field"], "artifact_digest": d.get("artifact_digest"),
            "files": d.get("file_digests") or {str(Path(f).name): file_digest(f) for f in d.get("files", [])
                                                if Path(f).exists()},
            "chain": [dict(records.get(n, {"node": n, "status": "not run"}), node=n) for n in chain],
            "inputs": {s: inputs.get(s) for s in used_seqs},
        }
    return {"run_id": run_id, "case": case_id or workflow.case_id, "task": workflow.task,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "deliverables": out}


def _ancestors(ups: dict[str, set[str]], node: str) -> set[str]:
    seen, todo = set(), [node]
    while todo:
        for u in ups.get(todo.pop(), ()):
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def write_provenance(case_dir: str | Path, provenance: dict[str, Any]) -> Path:
    return write_audit(provenance, Path(case_dir) / "provenance.json")


def write_done(case_dir: str | Path, info: dict[str, Any]) -> Path:
    """``_DONE`` marks a finished, validated case (resume skips it); written last."""
    return write_audit(info, Path(case_dir) / DONE_FILE)


__all__ = ["DONE_FILE", "ROW_KEYS", "build_provenance", "default_file", "measurement_records",
           "measurements_of", "wide_measurements", "write_artifact", "write_audit", "write_done", "write_plan",
           "write_provenance", "write_workflow"]
