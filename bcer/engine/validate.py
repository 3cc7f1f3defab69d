"""Contract validators over written deliverables, and the SR/TCR score of a case.

Each validator returns ``(ok, reason)``; a validator never raises on a bad file (a bad file
is a failed check with its reason), so a case's validation is always complete.
"""
from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..contracts.case import Case
from ..contracts.task import DeliverableSpec, TaskContract, Validator

log = logging.getLogger(__name__)
Check = tuple[bool, str]


def _nifti(path: Path):
    import nibabel as nib

    return nib.load(str(path))


def _exists(path: Path, v: Validator, case: Case) -> Check:
    if not path.is_file():
        return False, f"{path.name} not written"
    return (True, "exists") if path.stat().st_size > 0 else (False, f"{path.name} is empty")


def _nifti_nonempty(path: Path, v: Validator, case: Case) -> Check:
    img = _nifti(path)
    data = np.asarray(img.dataobj)
    if data.size == 0 or not np.any(data):
        return False, f"{path.name} has no non-zero voxels (shape {data.shape})"
    return True, f"{int(np.count_nonzero(data))} non-zero voxels"


def _sequence_affine(case: Case, name: str) -> np.ndarray:
    key = case.sequence_key(name)
    if key is None:
        raise KeyError(f"case has no sequence {name!r}; has {sorted(case.sequences)}")
    ref = case.sequences[key]
    if ref.format == "nifti":
        return np.asarray(_nifti(Path(ref.path)).affine)  # header only: no voxel data read
    from ..io import load_sequence

    art = load_sequence(ref)
    # k-space reconstructs to its recon grid (the header's recon matrix, centre-cropped)
    return np.asarray(getattr(art, "recon_affine", art.affine))


def _affine_matches_input(path: Path, v: Validator, case: Case) -> Check:
    names = [str(a) for a in v.arg] if isinstance(v.arg, list) else [str(v.arg)]
    name = next((n for n in names if case.sequence_key(n) is not None), names[0])
    want = _sequence_affine(case, name)
    got = np.asarray(_nifti(path).affine)
    if np.allclose(got, want, atol=1e-3):
        return True, f"affine matches {name}"
    return False, f"affine of {path.name} differs from {name}: max |diff| {np.abs(got - want).max():.4g} mm"


def _load_json(path: Path) -> Any:
    if path.suffix != ".json":
        path = path.with_name(path.name.split(".")[0] + ".json")
    return json.loads(path.read_text())


def _json_field(path: Path, v: Validator, case: Case) -> Check:
    node: Any = _load_json(path)
    for part in str(v.arg).split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, dict) and isinstance(node.get("structured"), dict) and part in node["structured"]:
            node = node["structured"][part]  # reports keep their fields under "structured"
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False, f"{path.name} has no field {v.arg!r}"
    if node is None:
        return False, f"field {v.arg!r} of {path.name} is null"
    return True, f"{v.arg} = {str(node)[:60]}"


def _table_rows(path: Path, v: Validator, case: Case) -> Check:
    need = int(v.arg or 1)
    if path.suffix == ".csv":
        with open(path, newline="") as fh:
            n = sum(1 for _ in csv.DictReader(fh))
    else:
        n = len(_load_json(path).get("rows", []))
    return (n >= need, f"{n} rows (need >= {need})")


def _report_nonempty(path: Path, v: Validator, case: Case) -> Check:
    text = path.read_text() if path.suffix != ".json" else str(_load_json(path).get("text", ""))
    words = len(text.split())
    return (words > 0, f"{words} words" if words else f"{path.name} has no text")


def _report_verified(path: Path, v: Validator, case: Case) -> Check:
    """The R4 critic's final verdict (``meta.r4.verdict``); a report nobody reviewed passes, said so."""
    r4 = (_load_json(path).get("meta") or {}).get("r4")
    if not isinstance(r4, dict):
        return True, "not reviewed by the R4 critic"
    n = int(r4.get("material_issues", 0))
    return (r4.get("verdict", "clean") == "clean" and n == 0,
            "R4 critic: clean" if n == 0 else f"R4 critic: {n} unresolved material issue(s)")


VALIDATORS: dict[str, Callable[[Path, Validator, Case], Check]] = {
    "exists": _exists, "nifti_nonempty": _nifti_nonempty, "affine_matches_input": _affine_matches_input,
    "json_field": _json_field, "table_rows": _table_rows, "report_nonempty": _report_nonempty,
    "report_verified": _report_verified,
}


def validate_deliverable(spec: DeliverableSpec, case_dir: str | Path, case: Case) -> Check:
    """Run every validator of one deliverable; the first failure is the reason."""
    path = Path(case_dir) / spec.file
    if not path.is_file():
        return False, f"{spec.file} not written"
    reasons = []
    for v in spec.validators:
        try:
            ok, why = VALIDATORS[v.type](path, v, case)
        except Exception as e:  # a corrupt file is a failed check, not a crash
            ok, why = False, f"{v.type} could not read {spec.file}: {type(e).__name__}: {e}"
        if not ok:
            return False, f"{v.type}: {why}"
        reasons.append(f"{v.type}: {why}")
    return True, "; ".join(reasons)


def validate_deliverables(contract: TaskContract, case_dir: str | Path, case: Case) -> dict[str, Check]:
    """``{deliverable name: (ok, reason)}`` for every deliverable of the contract."""
    return {d.name: validate_deliverable(d, case_dir, case) for d in contract.deliverables}


def score(contract: TaskContract, milestones_done: list[str], validations: dict[str, Check]) -> tuple[int, float]:
    """(SR, TCR) of one case.

    SR is 1 only when every required milestone completed and every deliverable exists and
    passes its validators; TCR is the fraction of milestones + deliverables that did.
    """
    done = set(milestones_done)
    hits = [m in done for m in contract.milestones]
    hits += [bool(validations.get(d.name, (False, ""))[0]) for d in contract.deliverables]
    if not hits:
        return 1, 1.0
    return int(all(hits)), sum(hits) / len(hits)


__all__ = ["VALIDATORS", "score", "validate_deliverable", "validate_deliverables"]
