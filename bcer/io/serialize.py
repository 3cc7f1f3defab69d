"""Non-volume artifacts to and from JSON (tables, classifications, findings, reports, transforms)."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import (Classification, Finding, Findings, Report, Table,
                                   Transform)
from ..contracts.errors import ErrorCode, ToolError
from .nifti import atomic_write_bytes


def to_jsonable(obj: Any) -> Any:
    """numpy scalars/arrays and tuples become plain JSON types (recursively)."""
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def artifact_to_dict(a: Any) -> dict[str, Any]:
    if isinstance(a, Table):
        return {"kind": "table", "name": a.name, "units": a.units, "rows": a.rows, "meta": a.meta}
    if isinstance(a, Classification):
        return {"kind": "classification", "label": a.label, "rule_trace": a.rule_trace,
                "evidence": a.evidence, "scores": a.scores, "meta": a.meta}
    if isinstance(a, Findings):
        return {"kind": "findings", "items": [asdict(f) for f in a.items],
                "affine": a.affine, "meta": a.meta}
    if isinstance(a, Report):
        return {"kind": "report", "text": a.text, "structured": a.structured,
                "evidence": a.evidence, "meta": a.meta}
    if isinstance(a, Transform):
        return {"kind": "transform", "type": a.type, "matrix": a.matrix,
                "fixed_affine": a.fixed_affine, "meta": a.meta}
    raise TypeError(f"no JSON form for {type(a).__name__}")


def artifact_from_dict(d: dict[str, Any]) -> Any:
    kind = d.get("kind")
    if kind == "table":
        return Table(d["rows"], d.get("units", {}), d.get("name", "measurements"), d.get("meta", {}))
    if kind == "classification":
        return Classification(d["label"], d.get("rule_trace", []), d.get("evidence", {}),
                              d.get("scores", {}), d.get("meta", {}))
    if kind == "findings":
        items = [Finding(**{**f, "box_voxel": tuple(map(tuple, f["box_voxel"])),
                            "box_world": tuple(map(tuple, f["box_world"]))}) for f in d["items"]]
        aff = np.asarray(d["affine"]) if d.get("affine") is not None else None
        return Findings(items, aff, d.get("meta", {}))
    if kind == "report":
        return Report(d["text"], d.get("structured", {}), d.get("evidence", []), d.get("meta", {}))
    if kind == "transform":
        fa = np.asarray(d["fixed_affine"]) if d.get("fixed_affine") is not None else None
        return Transform(np.asarray(d["matrix"]), d.get("type", "rigid"), fa, d.get("meta", {}))
    raise ToolError(ErrorCode.schema, f"unknown artifact kind in JSON: {kind!r}",
                    hint="'kind' is one of 'table', 'classification', 'findings', 'report', 'transform'")


def json_bytes(obj: Any) -> bytes:
    """Indented JSON of ``obj``: pydantic-core's encoder (the standard library's indenting
    encoder is pure Python: a fifth of a tiny case's worker time), numpy values through
    :func:`to_jsonable` as they are met, and NaN or infinity as ``null`` so the file is JSON."""
    import pydantic_core

    return pydantic_core.to_json(obj, indent=2, fallback=to_jsonable, inf_nan_mode="null")


def write_json(obj: Any, path: str | Path) -> Path:
    return atomic_write_bytes(path, json_bytes(obj))


def write_table_csv(t: Table, path: str | Path) -> Path:
    import csv
    import io

    cols: list[str] = []
    for r in t.rows:
        cols += [c for c in r if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in t.rows:
        w.writerow({k: to_jsonable(v) for k, v in r.items()})
    return atomic_write_bytes(path, buf.getvalue().encode())
