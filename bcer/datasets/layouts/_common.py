"""Helpers shared by layout writers and readers: case ids, the truth sidecar, header checks.

The truth sidecar ``bcer_truth.json`` sits in each case folder written by a phantom writer.
Real datasets lack it; readers use it when present. Its form (paths relative to the case
folder, so a dataset can be moved)::

    {"case_id": "...", "domain": "brain", "metadata": {...},
     "values": {...JSON truth...},
     "labels": {"seg": {"path": "x_seg.nii.gz", "format": "nifti", "kind": "mask",
                        "options": {"labels": {"1": "necrotic", ...}}}},
     "references": {"T1": {"path": "...", "format": "nifti", "kind": "image", "options": {}}}}

``read_truth`` turns it into ``Case.ground_truth``: ``{"values", "labels", "references"}``
with every ref a ``SequenceRef`` dict holding an absolute path.
"""
from __future__ import annotations

import contextlib
import contextvars

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...io import sequence_header, to_jsonable, write_json, write_nifti

log = logging.getLogger(__name__)

TRUTH_FILE = "bcer_truth.json"

__all__ = ["TRUTH_FILE", "sanitize_case_id", "write_truth", "read_truth", "ref_for",
           "write_volume", "validate_case_shapes", "list_case_dirs"]


def sanitize_case_id(raw: str) -> str:
    """A case id valid for ``Case.id`` (``[A-Za-z0-9][A-Za-z0-9_.-]*``) and for file names.

    Runs of other characters become one ``_``; a leading non-alphanumeric is dropped.
    """
    s = re.sub(r"[^A-Za-z0-9_.\-]+", "_", str(raw).strip())
    s = re.sub(r"^[^A-Za-z0-9]+", "", s)
    if not s:
        raise ToolError(ErrorCode.schema, f"case id {raw!r} has no usable characters",
                        hint="use letters, digits, '_', '-' or '.'", arg="case_id")
    return s


def ref_for(path: str | Path, artifact: Any = None, kind: str | None = None,
            fmt: str = "nifti", **options: Any) -> SequenceRef:
    """A SequenceRef for a written file; masks carry their label names in ``options.labels``."""
    k = kind or getattr(getattr(artifact, "kind", None), "value", None) or "image"
    labels = getattr(artifact, "labels", None)
    if labels:
        options = {**options, "labels": {str(int(v)): str(n) for v, n in labels.items()}}
    return SequenceRef(path=str(path), format=fmt, kind=k, options=to_jsonable(options))


def write_volume(artifact: Any, path: Path) -> SequenceRef:
    """Write an Image/Cine/Mask as NIfTI and return the absolute SequenceRef for it."""
    p = write_nifti(artifact, path)
    return ref_for(p.resolve(), artifact)


def _relative(ref: SequenceRef, case_dir: Path) -> dict[str, Any]:
    d = ref.model_dump(mode="json")
    p = Path(d["path"])
    d["path"] = str(p.resolve().relative_to(case_dir.resolve())) if p.is_absolute() else str(p)
    return d


def write_truth(case_dir: Path, phantom: Any, labels: Mapping[str, SequenceRef],
                references: Mapping[str, SequenceRef] | None = None,
                extra_values: Mapping[str, Any] | None = None) -> Path:
    """Write ``bcer_truth.json`` for one phantom case (refs stored relative to ``case_dir``)."""
    case_dir = Path(case_dir)
    doc = {
        "case_id": phantom.case_id,
        "domain": phantom.domain,
        "metadata": to_jsonable(phantom.metadata),
        "values": to_jsonable({**phantom.truth, **dict(extra_values or {})}),
        "labels": {k: _relative(r, case_dir) for k, r in labels.items()},
        "references": {k: _relative(r, case_dir) for k, r in (references or {}).items()},
    }
    return write_json(doc, case_dir / TRUTH_FILE)


def read_truth(case_dir: Path) -> dict[str, Any] | None:
    """The sidecar of ``case_dir`` as ``{"values", "labels", "references", "metadata",
    "domain"}`` with absolute-path SequenceRef dicts, or None when there is no sidecar.

    Raises:
        ToolError: ``schema`` when the sidecar is not valid JSON of the expected form.
    """
    path = Path(case_dir) / TRUTH_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
        out = {"values": dict(doc.get("values", {})), "metadata": dict(doc.get("metadata", {})),
               "domain": doc.get("domain")}
        for part in ("labels", "references"):
            out[part] = {}
            for name, r in dict(doc.get(part, {})).items():
                ref = SequenceRef.model_validate(r)
                p = Path(ref.path)
                ref.path = str(p if p.is_absolute() else (Path(case_dir) / p).resolve())
                out[part][name] = ref.model_dump(mode="json")
    except (ValueError, TypeError, AttributeError) as e:
        raise ToolError(ErrorCode.schema, f"malformed truth sidecar {path.name}: {e}",
                        hint=f"delete or rewrite {TRUTH_FILE}", file=str(path)) from e
    return out


def validate_case_shapes(case: Case, names: Iterable[str] | None = None,
                         include_labels: bool = True, ndim: int | None = 3) -> tuple[int, ...]:
    """Check from headers that sequences of one case share one voxel grid shape.

    Args:
        case: the case to check.
        names: sequences that must agree (default: all of them). Prostate T2w and ADC live
            on different grids by design: pass only the ones that must match.
        include_labels: also check the ground-truth label maps against them.
        ndim: required number of dimensions of every checked file (None: any of 3/4).

    Returns:
        The shared spatial shape (X, Y, Z).

    Raises:
        ToolError: ``shape`` naming the case and the file that disagrees (or is not 3-D);
            ``schema``/``input_missing`` from unreadable headers.
    """
    chosen = list(case.sequences) if names is None else [n for n in names if n in case.sequences]
    refs = [(n, case.sequences[n]) for n in chosen]
    if include_labels and case.ground_truth:
        refs += [(f"label:{n}", SequenceRef.model_validate(r))
                 for n, r in case.ground_truth.get("labels", {}).items()]
    first: tuple[str, str, tuple[int, ...]] | None = None
    for name, ref in refs:
        shape = sequence_header(ref)["shape"]
        want = ndim if ref.kind.value != "cine" else 4
        if (want is not None and len(shape) != want) or len(shape) < 3:
            raise ToolError(ErrorCode.shape, f"{name} of case {case.id} has shape {shape}; "
                            f"expected {want or 3}-D", case=case.id, file=ref.path)
        if first is None:
            first = (name, ref.path, tuple(shape[:3]))
        elif tuple(shape[:3]) != first[2]:
            raise ToolError(ErrorCode.shape, f"{name} of case {case.id} has grid {tuple(shape[:3])} "
                            f"but {first[0]} has {first[2]}",
                            hint="sequences of one case must share a voxel grid; resample first",
                            case=case.id, file=ref.path, other=first[1])
    return first[2] if first else ()


def list_case_dirs(root: Path, pattern: str) -> list[Path]:
    """Sorted sub-folders of ``root`` whose names match ``pattern`` (a full regex)."""
    rx = re.compile(pattern)
    return sorted(p for p in Path(root).iterdir() if p.is_dir() and rx.fullmatch(p.name))


_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("bcer_strict_read", default=True)


@contextlib.contextmanager
def lenient_read():
    """Within this block, a layout's ``read`` keeps a case that fails its checks as a Case
    carrying ``issues`` (so one corrupt case becomes a failed row, not a failed cohort)."""
    token = _STRICT.set(False)
    try:
        yield
    finally:
        _STRICT.reset(token)


def read_each(items, read_one, case_id, root_of, *, domain: str = "unknown", layout: str | None = None) -> list[Case]:
    """``[read_one(item) for item in items]``, strict by default; under ``lenient_read()`` a
    ToolError becomes a placeholder Case with the error in ``issues``."""
    cases = []
    for item in items:
        try:
            cases.append(read_one(item))
        except ToolError as e:
            if _STRICT.get():
                raise
            cid = sanitize_case_id(str(case_id(item)))
            log.warning("case %s cannot be read: %s", cid, e)
            cases.append(Case(id=cid, root=str(Path(root_of(item)).resolve()), domain=domain, layout=layout,
                              issues=[e.with_context(case=cid).to_dict()]))
    return cases
