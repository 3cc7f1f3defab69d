"""Is a deliverable of a faulty run the same as the clean run's? (wrong-deliverable detection)

A deliverable of a run with an injected fault is *wrong* when it passed its contract
validators but differs from the same arm's clean run of the same case. Comparison is in
world space and tolerant to what a correct recovery legitimately changes:

- NIfTI (images, masks, cines): put on the clean grid (nearest for integer data, linear
  otherwise) when the grids differ; masks must agree (mean Dice over labels >= ``MASK_DICE``),
  images within ``IMAGE_NRMSE`` of the clean range.
- JSON (tables, classifications, findings, the structured part of reports): same
  structure, equal strings and labels, numbers within ``REL_TOL``; transforms: rotation
  terms within ``ROTATION_TOL`` and translation within ``TRANSLATION_MM``; fields that only
  say *where* something came from (``meta``, ``evidence``, rendered ``text``, voxel indices
  and input affines, which depend on the input grid) are not compared.

A differing deliverable is not *wrong* when its lineage shows the planner chose other
parameters and nothing else (:func:`plan_only_difference`): an LLM may revise a plan after a
fault and set, say, another filter strength. "Wrong" means computed from a corrupted binding,
so such a run counts apart (``plan_differs``) and only when the same tools were fed the same
input data. Lineage is ``provenance.json`` (engine) or ``lineage.json`` (the ReAct arms).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ..contracts import Case, TaskContract

MASK_DICE = 0.90
IMAGE_NRMSE = 0.05
REL_TOL = 0.05
ABS_TOL = 1e-6
ROTATION_TOL = 0.01
TRANSLATION_MM = 0.5
_IGNORED = {"meta", "evidence", "text", "origin", "method"}
_REF = re.compile(r"`\[[^\]]*\]`|\[[A-Za-z_][\w.\[\]*()]*\]")
_NUM = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _ignored(key: str) -> bool:
    return key in _IGNORED or "voxel" in key or key.endswith("_affine")


def _json_of(path: Path) -> Any:
    if path.suffix != ".json":
        path = path.with_name(path.name.split(".")[0] + ".json")
    data = json.loads(path.read_text())
    if isinstance(data, dict) and data.get("kind") == "report" and "structured" in data:
        return data["structured"]
    return data


def _close(a: float, b: float) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= max(ABS_TOL, REL_TOL * max(abs(a), abs(b)))


def _text_same(a: str, b: str) -> tuple[bool, str]:
    a, b = _REF.sub("", a), _REF.sub("", b)
    if _NUM.sub("#", a) != _NUM.sub("#", b):
        return False, f"text differs: {a[:60]!r} vs {b[:60]!r}"
    for x, y in zip(_NUM.findall(a), _NUM.findall(b)):
        if not _close(float(x), float(y)):
            return False, f"number {x} vs {y} in {a[:60]!r}"
    return True, ""


def _same_transform(a: dict[str, Any], b: dict[str, Any]) -> tuple[bool, str]:
    """Rigid/affine matrices: direction cosines within ``ROTATION_TOL`` (about half a degree)
    and translations within ``TRANSLATION_MM`` (element-wise relative tolerance would fail on
    near-zero rotation terms that differ by a hundredth of a degree)."""
    ma, mb = np.asarray(a.get("matrix"), dtype=float), np.asarray(b.get("matrix"), dtype=float)
    if ma.shape != mb.shape or ma.shape != (4, 4):
        return False, f"matrix shapes {ma.shape} vs {mb.shape}"
    rot = float(np.abs(ma[:3, :3] - mb[:3, :3]).max())
    shift = float(np.linalg.norm(ma[:3, 3] - mb[:3, 3]))
    ok = rot <= ROTATION_TOL and shift <= TRANSLATION_MM
    return ok, f"transform differs: rotation terms by {rot:.4f}, translation by {shift:.2f} mm"


def same_json(a: Any, b: Any, where: str = "") -> tuple[bool, str]:
    """(equal within tolerance, first difference)."""
    if isinstance(a, dict) and isinstance(b, dict) and a.get("kind") == b.get("kind") == "transform":
        return _same_transform(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        ka = {k for k in a if not _ignored(k)}
        kb = {k for k in b if not _ignored(k)}
        if ka != kb:
            return False, f"{where or 'root'}: keys {sorted(ka ^ kb)[:4]} differ"
        for k in sorted(ka):
            ok, why = same_json(a[k], b[k], f"{where}.{k}")
            if not ok:
                return ok, why
        return True, ""
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False, f"{where}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b)):
            ok, why = same_json(x, y, f"{where}[{i}]")
            if not ok:
                return ok, why
        return True, ""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return (a == b), f"{where}: {a!r} vs {b!r}"
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return _close(float(a), float(b)), f"{where}: {a} vs {b}"
    if isinstance(a, str) and isinstance(b, str):
        ok, why = _text_same(a, b)
        return ok, f"{where}: {why}"
    return (a == b), f"{where}: {a!r} vs {b!r}"


def _on_grid(data: np.ndarray, affine: np.ndarray, grid_affine: np.ndarray, grid_shape: tuple[int, ...],
             nearest: bool) -> np.ndarray:
    from ..tools.resample import resample_onto

    how = "nearest" if nearest else "linear"
    if data.ndim == 3:
        return resample_onto(data.astype(np.float32), affine, grid_affine, grid_shape[:3], how)
    frames = [resample_onto(data[..., t].astype(np.float32), affine, grid_affine, grid_shape[:3], how)
              for t in range(data.shape[-1])]
    return np.stack(frames, axis=-1)


def same_nifti(a_path: Path, b_path: Path) -> tuple[bool, str]:
    """``a`` (a faulty run's) against ``b`` (the clean run's), in world space."""
    import nibabel as nib

    a_img, b_img = nib.load(str(a_path)), nib.load(str(b_path))
    a, b = np.asarray(a_img.dataobj), np.asarray(b_img.dataobj)
    integer = np.issubdtype(b.dtype, np.integer) or np.issubdtype(b.dtype, np.bool_)
    if a.ndim != b.ndim or (a.ndim == 4 and a.shape[-1] != b.shape[-1]):
        return False, f"shape {a.shape} vs {b.shape}"
    if a.shape != b.shape or not np.allclose(a_img.affine, b_img.affine, atol=1e-3):
        a = _on_grid(a, np.asarray(a_img.affine), np.asarray(b_img.affine), b.shape, integer)
    if integer:
        labels = [v for v in np.union1d(np.unique(a), np.unique(b)) if v != 0]
        if not labels:
            return True, ""
        dices = []
        for v in labels:
            x, y = np.rint(a) == v, b == v
            dices.append(2 * np.count_nonzero(x & y) / max(1, np.count_nonzero(x) + np.count_nonzero(y)))
        mean = float(np.mean(dices))
        return mean >= MASK_DICE, f"mean Dice {mean:.3f} vs the clean run"
    b = b.astype(np.float64)
    span = float(np.percentile(b, 99.5) - np.percentile(b, 0.5)) or float(np.abs(b).max()) or 1.0
    nrmse = float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)) / span)
    return nrmse <= IMAGE_NRMSE, f"NRMSE {nrmse:.3f} vs the clean run"


def same_file(a_path: Path, b_path: Path) -> tuple[bool, str]:
    if not b_path.exists():
        return False, f"the clean run has no {b_path.name}"
    try:
        if a_path.name.endswith((".nii", ".nii.gz")):
            return same_nifti(a_path, b_path)
        return same_json(_json_of(a_path), _json_of(b_path))
    except Exception as e:  # an unreadable file is not the clean one
        return False, f"cannot compare {a_path.name}: {type(e).__name__}: {e}"


def wrong_deliverables(contract: TaskContract, case: Case, run_dir: str | Path, clean_dir: str | Path,
                       clean_case: Case | None = None) -> dict[str, str]:
    """``{deliverable: why}`` of deliverables present in ``run_dir`` that pass their validators
    (checked against ``case``, the run's possibly corrupted copy) but differ from ``clean_dir``'s
    (checked against ``clean_case``). A deliverable the clean run did not validate is skipped
    (nothing to compare against)."""
    from ..engine.validate import validate_deliverable

    run_dir, clean_dir = Path(run_dir), Path(clean_dir)
    wrong: dict[str, str] = {}
    for d in contract.deliverables:
        mine = run_dir / d.file
        if not mine.exists() or not validate_deliverable(d, run_dir, case)[0]:
            continue
        if not validate_deliverable(d, clean_dir, clean_case or case)[0]:
            continue
        ok, why = same_file(mine, clean_dir / d.file)
        if not ok:
            wrong[d.name] = why
    return wrong


def lineage(run_dir: str | Path, name: str) -> list[dict[str, Any]] | None:
    """The tool calls behind deliverable ``name`` (each with ``tool``, ``params``,
    ``input_digests``, ``output_digests``), or None when the run recorded none."""
    for file in ("provenance.json", "lineage.json"):
        path = Path(run_dir) / file
        if path.exists():
            entry = (json.loads(path.read_text()).get("deliverables") or {}).get(name)
            return entry.get("chain") if entry else None
    return None


def _leaf_inputs(chain: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(tool, port, digest) of every input no call of the chain made: the data it started from."""
    made = {d for c in chain for d in (c.get("output_digests") or {}).values()}
    return sorted((c["tool"], port, d) for c in chain for port, d in (c.get("input_digests") or {}).items()
                  if d not in made)


def plan_only_difference(mine: list[dict[str, Any]] | None, clean: list[dict[str, Any]] | None) -> str | None:
    """Why a deliverable that differs from the clean run's is the plan's choice and not a
    corrupted binding: the same tools, fed the same input data (digests of every input no call
    in the chain made), with other parameters. None when the lineages do not show that (missing,
    other tools, other data, or the same params, so the difference has another cause)."""
    if not mine or not clean or sorted(c["tool"] for c in mine) != sorted(c["tool"] for c in clean):
        return None
    if _leaf_inputs(mine) != _leaf_inputs(clean):
        return None
    by_tool = {c["tool"]: c for c in clean}
    diffs = [f"{c['tool']}.{k}: {v!r} vs {by_tool[c['tool']]['params'].get(k)!r}" for c in mine
             for k, v in sorted((c.get("params") or {}).items()) if by_tool[c["tool"]]["params"].get(k) != v]
    return f"same tools and input data, other params ({'; '.join(diffs[:4])})" if diffs else None


def present_deliverables(contract: TaskContract, run_dir: str | Path) -> list[str]:
    """Deliverables whose file exists in the case folder (what a consumer would pick up)."""
    return [d.name for d in contract.deliverables if (Path(run_dir) / d.file).exists()]


__all__ = ["lineage", "plan_only_difference", "present_deliverables", "same_file", "same_json", "same_nifti",
           "wrong_deliverables"]
