"""Content digests: one small function per artifact type, one place that composes them.

Digests make provenance checkable (the same inputs, tool version and params must give the
same output digest) and let a rerun after a worker crash be compared with a clean run.
"""
from __future__ import annotations

import hashlib
import json
from functools import singledispatch
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts.artifacts import Cine, Classification, Findings, Image, KSpace, Mask, Report, Table, Transform, kind_of
from ..io import artifact_to_dict, to_jsonable

_CHUNK = 1 << 20


def _h(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p)
    return h.hexdigest()


def _array_bytes(a: Any) -> bytes:
    arr = np.ascontiguousarray(np.asarray(a))
    return f"{arr.dtype.str}{arr.shape}".encode() + arr.tobytes()


def canonical_json(obj: Any) -> bytes:
    """Stable JSON bytes (sorted keys, numpy made plain) for hashing."""
    return json.dumps(to_jsonable(obj), sort_keys=True, separators=(",", ":"), default=str).encode()


@singledispatch
def artifact_digest(obj: Any) -> str:
    """sha256 of an artifact's content (arrays, geometry, labels); scalars hash their JSON."""
    return _h(b"value:", canonical_json(obj))


@artifact_digest.register(Image)
@artifact_digest.register(Cine)
@artifact_digest.register(Mask)
def _volume_digest(obj: Image | Cine | Mask) -> str:
    labels = canonical_json(getattr(obj, "labels", {}))
    return _h(kind_of(obj).value.encode(), _array_bytes(obj.data), _array_bytes(obj.affine), labels)


@artifact_digest.register
def _(obj: KSpace) -> str:
    return _h(b"kspace", _array_bytes(obj.data), _array_bytes(obj.mask), _array_bytes(obj.affine))


@artifact_digest.register
def _(obj: Transform) -> str:
    fixed = _array_bytes(obj.fixed_affine) if obj.fixed_affine is not None else b"-"
    return _h(b"transform", obj.type.encode(), _array_bytes(obj.matrix), fixed)


def _json_artifact_digest(obj: Any) -> str:
    d = artifact_to_dict(obj)
    d.pop("meta", None)  # meta holds timings/sources, not content
    return _h(canonical_json(d))


for _cls in (Table, Classification, Findings, Report):
    artifact_digest.register(_cls, _json_artifact_digest)


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, or of every file under a folder (names and bytes, sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(_CHUNK), b""):
                h.update(chunk)
    return h.hexdigest()


def params_digest(*objs: Any) -> str:
    """Short digest of JSON-able arguments (trace ``args_digest``)."""
    return _h(*(canonical_json(o) for o in objs))[:16]


__all__ = ["artifact_digest", "canonical_json", "file_digest", "params_digest"]
