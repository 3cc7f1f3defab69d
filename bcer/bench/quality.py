"""Quality of a case's deliverables against its phantom ground truth.

Reported beside SR/TCR, never folded into them. Each metric reads the written deliverable
files (what a user gets), the case's ground truth (``Case.ground_truth``: ``values``,
``labels`` and ``references`` as SequenceRef dicts) and, where it needs to know which input
sequence a deliverable came from, the case's ``workflow.json``. A metric whose truth is
absent (a real dataset, a case without lesions) is None, not a failure.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import metrics
from ..contracts import Case, SequenceRef, TaskContract
from ..metrics import box_iou
from ..contracts.sequences import canonical_sequence
from ..contracts.tokens import Token

log = logging.getLogger(__name__)
Metric = Callable[[Case, Path, TaskContract], "float | None"]
METRICS: dict[str, Metric] = {}


def metric(name: str) -> Callable[[Metric], Metric]:
    def deco(fn: Metric) -> Metric:
        METRICS[name] = fn
        return fn
    return deco


# ---- shared readers ---------------------------------------------------------------------
def _deliverable_path(case_dir: Path, contract: TaskContract, name: str) -> Path:
    return case_dir / next(d.file for d in contract.deliverables if d.name == name)


def _nifti(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import nibabel as nib

    img = nib.load(str(path))
    return np.asarray(img.dataobj), np.asarray(img.affine)


def _truth_ref(case: Case, part: str, name: str) -> Any:
    from ..io import load_sequence

    refs = (case.ground_truth or {}).get(part, {})
    canon = canonical_sequence(name)  # label names ("gland", "lesions") are no sequences: exact match only
    key = next((k for k in refs if k == name or (canon is not None and canonical_sequence(k) == canon)), None)
    return None if key is None else load_sequence(SequenceRef.model_validate(refs[key]))


def _values(case: Case) -> dict[str, Any]:
    return dict((case.ground_truth or {}).get("values", {}))


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def source_sequence(case_dir: Path, deliverable: str) -> str | None:
    """The case sequence a deliverable was computed from (first ``@seq`` up its chain)."""
    wf = _json(case_dir / "workflow.json")
    nodes = {n["id"]: n for n in wf["nodes"]}
    d = next((d for d in wf["deliverables"] if d["name"] == deliverable), None)
    todo = [d["node"]] if d else []
    while todo:
        node = nodes[todo.pop(0)]
        for value in node["inputs"].values():
            tok = Token.try_parse(value)
            if tok is not None and tok.scope == "seq":
                return tok.name
            if tok is not None and tok.scope == "node":
                todo.append(tok.name)
    return None


def scored_dice(a: np.ndarray, b: np.ndarray) -> float | None:
    """``bcer.metrics.dice``, or None when both masks are empty: the bench scores only
    what the truth has (a case without that compartment is not a perfect score)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    return None if not (a.any() or b.any()) else metrics.dice(a, b)


# ---- image restoration ------------------------------------------------------------------
def _restored(case: Case, case_dir: Path, contract: TaskContract, name: str):
    seq = source_sequence(case_dir, name)
    ref = _truth_ref(case, "references", seq) if seq else None
    if ref is None:
        return None
    data, _ = _nifti(_deliverable_path(case_dir, contract, name))
    return seq, data.astype(np.float64), np.asarray(ref.data, np.float64)


@metric("psnr_gain_db")
def psnr_gain_db(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """dB of PSNR the denoised volume gains over the noisy input (same reference)."""
    from ..metrics import psnr
    from ..io import load_sequence

    got = _restored(case, case_dir, contract, contract.deliverables[0].name)
    if got is None:
        return None
    seq, out, ref = got
    noisy = np.asarray(load_sequence(case.sequences[seq]).data, np.float64)
    return psnr(out, ref) - psnr(noisy, ref)


def _on_reference_grid(case: Case, case_dir: Path, contract: TaskContract, name: str):
    """(output, low-res input, reference) on the reference grid, the output resampled linearly."""
    from ..io import load_sequence
    from ..tools.resample import resample_onto

    seq = source_sequence(case_dir, name)
    ref = _truth_ref(case, "references", seq) if seq else None
    if ref is None:
        return None
    data, aff = _nifti(_deliverable_path(case_dir, contract, name))
    out = resample_onto(data.astype(np.float32), aff, ref.affine, ref.shape[:3], "linear", default=0.0)
    low = load_sequence(case.sequences[seq])
    return np.asarray(out, np.float64), low, np.asarray(ref.data, np.float64)


@metric("psnr_gain_vs_nearest_db")
def psnr_gain_vs_nearest_db(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """dB of PSNR the super-resolved volume gains over nearest-neighbour upsampling."""
    from ..metrics import psnr
    from ..tools.resample import resample_onto

    got = _on_reference_grid(case, case_dir, contract, contract.deliverables[0].name)
    if got is None:
        return None
    out, low, ref = got
    near = resample_onto(np.asarray(low.data, np.float32), low.affine, np.asarray(
        _truth_ref(case, "references", source_sequence(case_dir, contract.deliverables[0].name)).affine),
        ref.shape[:3], "nearest", default=0.0)
    return psnr(out, ref) - psnr(np.asarray(near, np.float64), ref)


@metric("nrmse")
def nrmse_metric(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """NRMSE of the first deliverable against the clean reference of its source sequence
    (recon: least-squares gain-corrected magnitudes inside the object, as the recon tools)."""
    from ..metrics import nrmse
    from ..metrics import nrmse_scaled as recon_nrmse

    name = contract.deliverables[0].name
    if contract.milestones == ["super_resolution"]:
        got = _on_reference_grid(case, case_dir, contract, name)
        return None if got is None else nrmse(got[0], got[2])
    got = _restored(case, case_dir, contract, name)
    if got is None:
        return None
    _, out, ref = got
    if "reconstruction" in contract.milestones:
        return recon_nrmse(out.reshape(ref.shape), ref)
    return nrmse(out, ref)


@metric("nrmse_ratio_vs_zero_filled")
def nrmse_ratio_vs_zero_filled(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Recon NRMSE over the zero-filled baseline's NRMSE (the tools issue wants <= 0.5)."""
    from ..io import load_sequence
    from ..metrics import nrmse_scaled as recon_nrmse
    from ..tools.registry import call_tool

    got = _restored(case, case_dir, contract, contract.deliverables[0].name)
    if got is None:
        return None
    seq, out, ref = got
    zf = call_tool("recon.zero_filled", {"kspace": load_sequence(case.sequences[seq])})["image"]
    base = recon_nrmse(np.asarray(zf.data).reshape(ref.shape), ref)
    return recon_nrmse(out.reshape(ref.shape), ref) / base if base > 0 else None


# ---- registration -----------------------------------------------------------------------
@metric("registration_error_mm")
def registration_error_mm(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Mean distance (mm) between true and estimated fixed->moving maps over the organ mask."""
    truth = _values(case).get("misalignment") or {}
    organ = _truth_ref(case, "labels", "gland")
    name = next((d.name for d in contract.deliverables if d.kind.value == "transform"), None)
    if not truth.get("matrix") or organ is None or name is None:
        return None
    est = np.asarray(_json(_deliverable_path(case_dir, contract, name))["matrix"], np.float64)
    ijk = np.argwhere(np.asarray(organ.data) > 0)
    pts = np.c_[ijk, np.ones(len(ijk))] @ np.asarray(organ.affine).T
    err = pts @ (est - np.asarray(truth["matrix"], np.float64)).T
    return float(np.linalg.norm(err[:, :3], axis=1).mean())


# ---- segmentation -----------------------------------------------------------------------
_BRATS = {"wt": (1, 2, 4), "tc": (1, 4), "et": (4,)}


def _seg_pair(case: Case, case_dir: Path, contract: TaskContract, truth_name: str):
    name = next((d.name for d in contract.deliverables if d.kind.value == "mask"), None)
    truth = _truth_ref(case, "labels", truth_name)
    if name is None or truth is None:
        return None
    data, _ = _nifti(_deliverable_path(case_dir, contract, name))
    return np.asarray(data), np.asarray(truth.data)


def _truth_region(case: Case, region: str) -> tuple[int, ...]:
    """Truth values of a BraTS region from the truth's label names (BraTS 2023+ puts ET at 3,
    2018-2021 at 4); bcer's own values when the truth names none. Predictions use bcer's."""
    from ..datasets.layouts.brats2023 import region_values

    ref = ((case.ground_truth or {}).get("labels") or {}).get("seg") or {}
    named = {int(k): v for k, v in (ref.get("options") or {}).get("labels", {}).items()}
    return region_values(named, region) or _BRATS[region]


def _brats_dice(region: str) -> Metric:
    def fn(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
        pair = _seg_pair(case, case_dir, contract, "seg")
        if pair is None:
            return None
        got, want = pair
        return scored_dice(np.isin(got, _BRATS[region]), np.isin(want, _truth_region(case, region)))
    fn.__doc__ = f"Dice of the BraTS {region.upper()} region against the truth label map."
    return fn


for _r in _BRATS:
    metric(f"dice_{_r}")(_brats_dice(_r))


def _cardiac_dice(label: int) -> Metric:
    def fn(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
        pair = _seg_pair(case, case_dir, contract, "seg")
        if pair is None:
            return None
        got, want = pair
        if got.shape != want.shape:  # truth at ED/ES only: compare those frames
            vals = _values(case)
            frames = [int(vals["ed_frame"]), int(vals["es_frame"])]
            got = got[..., frames] if got.ndim == 4 else got
            want = want[..., frames] if want.ndim == 4 else want
        return scored_dice(got == label, want == label) if got.shape == want.shape else None
    fn.__doc__ = f"Dice of ACDC label {label} over every frame with truth."
    return fn


for _n, _l in (("rv", 1), ("myo", 2), ("lv", 3)):
    metric(f"dice_{_n}")(_cardiac_dice(_l))


@metric("gland_dice")
def gland_dice(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    pair = _seg_pair(case, case_dir, contract, "gland")
    return None if pair is None else scored_dice(pair[0] > 0, pair[1] > 0)


# ---- measurements and classes -----------------------------------------------------------
def _table_value(path: Path, column: str) -> float | None:
    for row in _json(path).get("rows", []):
        if row.get(column) is not None:
            return float(row[column])
    return None


@metric("ef_error_pts")
def ef_error_pts(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """|LV EF measured - true| in percentage points."""
    truth = _values(case).get("lv_ef_pct")
    name = next((d.name for d in contract.deliverables if d.milestone == "quantification"), None)
    if truth is None or name is None:
        return None
    got = _table_value(_deliverable_path(case_dir, contract, name), "lv_ef_pct")
    return None if got is None else abs(got - float(truth))


@metric("ed_es_exact")
def ed_es_exact(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """1 when the delivered ED and ES frames both equal the truth's (frames of largest and
    smallest true LV volume), else 0 (mean = the fraction of cases exactly right)."""
    vals = _values(case)
    name = next((d.name for d in contract.deliverables if d.milestone == "phase_detection"), None)
    if name is None or vals.get("ed_frame") is None or vals.get("es_frame") is None:
        return None
    ed = _table_value(_deliverable_path(case_dir, contract, name), "ed_frame")
    es = _table_value(_deliverable_path(case_dir, contract, name), "es_frame")
    if ed is None or es is None:
        return None
    return float(int(ed) == int(vals["ed_frame"]) and int(es) == int(vals["es_frame"]))


def _class_accuracy(truth_key: str) -> Metric:
    def fn(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
        truth = _values(case).get(truth_key)
        name = next((d.name for d in contract.deliverables if d.kind.value == "classification"), None)
        if truth is None or name is None:
            return None
        label = str(_json(_deliverable_path(case_dir, contract, name)).get("label", ""))
        if truth_key == "max_category":  # "PI-RADS 4" vs 4; no lesion: PI-RADS 1-2 or a "no lesion" label
            num = re.findall(r"\d+", label)
            got = int(num[-1]) if num else 1
            return float(got == int(truth) or (int(truth) <= 2 and got <= 2))
        return float(label.strip().upper() == str(truth).strip().upper())
    fn.__doc__ = f"1 when the delivered class equals the truth {truth_key!r}, else 0 (mean = accuracy)."
    return fn


metric("grade_accuracy")(_class_accuracy("grade"))
metric("group_accuracy")(_class_accuracy("group"))
metric("pirads_accuracy")(_class_accuracy("max_category"))


def _lesion_matches(case: Case, case_dir: Path, contract: TaskContract) -> list[tuple[float, bool]] | None:
    """Per true lesion: (best box IoU over findings, side of that finding right)."""
    lesions = _values(case).get("lesions")
    name = next((d.name for d in contract.deliverables if d.kind.value == "findings"), None)
    if not lesions or name is None:
        return None
    items = _json(_deliverable_path(case_dir, contract, name)).get("items", [])
    out = []
    for les in lesions:
        scored = [(box_iou(les["box_voxel"], f["box_voxel"]), f) for f in items]
        iou, best = max(scored, key=lambda x: x[0], default=(0.0, None))
        out.append((iou, best is not None and iou > 0 and str(best.get("side", ""))[:1] == str(les["side"])[:1]))
    return out


@metric("lesion_box_iou")
def lesion_box_iou(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Mean over true lesions of the best 3-D box IoU of a finding (None: no true lesion)."""
    m = _lesion_matches(case, case_dir, contract)
    return None if m is None else float(np.mean([iou for iou, _ in m]))


@metric("lesion_side_accuracy")
def lesion_side_accuracy(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Fraction of true lesions whose best-matching finding is on the right side."""
    m = _lesion_matches(case, case_dir, contract)
    return None if m is None else float(np.mean([ok for _, ok in m]))


@metric("lesion_sensitivity")
def lesion_sensitivity(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Fraction of true lesions that some finding overlaps (box IoU >= 0.1, the rule that makes
    a finding a true rather than a false positive); None for a case without true lesions."""
    m = _lesion_matches(case, case_dir, contract)
    return None if m is None else float(np.mean([iou >= 0.1 for iou, _ in m]))


@metric("lesion_false_positives")
def lesion_false_positives(case: Case, case_dir: Path, contract: TaskContract) -> float | None:
    """Findings that overlap no true lesion (box IoU < 0.1); counted on lesion-free cases too."""
    values = _values(case)
    name = next((d.name for d in contract.deliverables if d.kind.value == "findings"), None)
    if "lesions" not in values or name is None:
        return None
    items = _json(_deliverable_path(case_dir, contract, name)).get("items", [])
    truth = [les["box_voxel"] for les in values["lesions"]]
    return float(sum(all(box_iou(t, f["box_voxel"]) < 0.1 for t in truth) for f in items))


def case_quality(case: Case, case_dir: str | Path, contract: TaskContract) -> dict[str, float | None]:
    """Every quality metric of the contract for one case; a metric that cannot be computed
    (no truth, deliverable missing or unreadable) is None and logged, never raised."""
    out: dict[str, float | None] = {}
    for q in contract.quality:
        fn = METRICS.get(q.metric)
        if fn is None:
            log.warning("task %s: no quality metric %r", contract.id, q.metric)
            out[q.metric] = None
            continue
        try:
            v = fn(case, Path(case_dir), contract)
            out[q.metric] = None if v is None or not np.isfinite(v) else round(float(v), 4)
        except Exception as e:  # a missing/corrupt deliverable: SR already says so
            log.info("case %s: %s not computed: %s: %s", case.id, q.metric, type(e).__name__, e)
            out[q.metric] = None
    return out


def summarise(contract: TaskContract, per_case: list[dict[str, float | None]]) -> dict[str, dict[str, Any]]:
    """Mean of each metric over the cases that have it, and whether its threshold is met."""
    out = {}
    for q in contract.quality:
        vals = [c[q.metric] for c in per_case if c.get(q.metric) is not None]
        mean = float(np.mean(vals)) if vals else None
        met = None
        if mean is not None and q.threshold is not None:
            met = bool(mean >= q.threshold) if q.higher_is_better else bool(mean <= q.threshold)
        out[q.metric] = {"mean": None if mean is None else round(mean, 4), "n": len(vals),
                         "threshold": q.threshold, "higher_is_better": q.higher_is_better, "met": met}
    return out


__all__ = ["METRICS", "box_iou", "case_quality", "dice", "source_sequence", "summarise"]
