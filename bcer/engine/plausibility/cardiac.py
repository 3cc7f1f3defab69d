"""Checks of cardiac function deliverables: physiological ranges, ED > ES, frames and
volumes that agree across the phases table, the function table and the label cine, and a
label cine that agrees with the cine it was drawn on."""
from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import ndimage

from .core import Inputs, Unavailable, Verdict, check, find_sequence, in_range, number


class RangeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    columns: list[str]
    min: float
    max: float
    unit: str


def _columns_in_range(x: Inputs, p: RangeParams, what: str) -> Verdict:
    row = x.row()
    present = [c for c in p.columns if row.get(c) is not None]
    if not present:
        raise Unavailable(f"table has none of {p.columns}")
    verdicts = [in_range(number(row[c], c), p.min, p.max, c, p.unit) for c in present]
    bad = [v for v in verdicts if not v.ok]
    worst = bad[0] if bad else max(verdicts, key=lambda v: abs(v.value - (p.min + p.max) / 2))
    msg = "; ".join(v.message for v in (bad or verdicts))
    return Verdict(not bad, worst.value, worst.limit, f"{what}: {msg}")


class EfParams(RangeParams):
    columns: list[str] = Field(default_factory=lambda: ["lv_ef_pct", "rv_ef_pct"])
    min: float = 5.0
    max: float = 90.0
    unit: str = "%"


@check("ef_range", EfParams)
def ef_range(x: Inputs, p: EfParams) -> Verdict:
    """LV and RV ejection fraction within 5–90 % (limits of issue 10): below 5 % a ventricle
    does not eject, above 90 % its end-systolic cavity has vanished; an EF outside 0–100 %
    cannot exist at all and means the ED and ES volumes are wrong."""
    return _columns_in_range(x, p, "ejection fraction")


class EdvParams(RangeParams):
    columns: list[str] = Field(default_factory=lambda: ["lv_edv_ml", "rv_edv_ml"])
    min: float = 20.0
    max: float = 600.0
    unit: str = "mL"


@check("edv_range", EdvParams)
def edv_range(x: Inputs, p: EdvParams) -> Verdict:
    """LV and RV end-diastolic volume within 20–600 mL. Adult CMR reference ranges (SSFP,
    Kawel-Boehm et al., JCMR 2015;17:29) put normal LV and RV EDV on the order of 100–250 mL,
    and severe dilated cardiomyopathy reaches a few hundred mL. The bounds are wide on purpose
    (our choice, not a published cut-off): they reject a cavity of a few voxels or a mask over
    the chest, not a disease."""
    return _columns_in_range(x, p, "end-diastolic volume")


_PAIRS = (("lv_edv_ml", "lv_esv_ml"), ("rv_edv_ml", "rv_esv_ml"))


@check("ed_greater_than_es")
def ed_greater_than_es(x: Inputs, p: Any) -> Verdict:
    """End-diastolic volume > end-systolic volume for each ventricle in the function table (and
    on the LV volume curve of the phases table when the contract gives it): ED is the fullest
    frame by definition, so ED <= ES means the frames are swapped or a volume is wrong.
    Value: the smallest EDV − ESV (mL)."""
    row = x.row()
    diffs: dict[str, float] = {}
    for ed, es in _PAIRS:
        if row.get(ed) is not None and row.get(es) is not None:
            diffs[ed.split("_")[0].upper()] = number(row[ed], ed) - number(row[es], es)
    if x.has("phases"):
        ph = x.row("phases")
        if ph.get("lv_volume_ed_ml") is not None and ph.get("lv_volume_es_ml") is not None:
            diffs["LV (phases)"] = (number(ph["lv_volume_ed_ml"], "lv_volume_ed_ml")
                                    - number(ph["lv_volume_es_ml"], "lv_volume_es_ml"))
    if not diffs:
        raise Unavailable("no ED/ES volume pair in the table")
    worst = min(diffs, key=diffs.get)
    bad = [k for k, v in diffs.items() if v <= 0]
    msg = ", ".join(f"{k} EDV − ESV = {v:.1f} mL" for k, v in diffs.items())
    return Verdict(not bad, diffs[worst], "> 0 mL", msg + (f": ED is not larger than ES for {bad}" if bad else ""))


def _frame(row: dict[str, Any], key: str) -> int:
    v = number(row.get(key), key)
    if v != int(v):
        raise Unavailable(f"{key} = {v} is not a frame index")
    return int(v)


@check("phases_consistent")
def phases_consistent(x: Inputs, p: Any) -> Verdict:
    """ED and ES are two different frames of the cine (0 ≤ frame < n_frames), the volume
    curves have one value per frame, and the function table measured the same two frames."""
    ph = x.row()
    ed, es = _frame(ph, "ed_frame"), _frame(ph, "es_frame")
    n = _frame(ph, "n_frames") if ph.get("n_frames") is not None else None
    problems = []
    if ed == es:
        problems.append(f"ED and ES are the same frame {ed}")
    if n is not None:
        problems += [f"{k} {v} outside 0..{n - 1}" for k, v in (("ED", ed), ("ES", es)) if not 0 <= v < n]
        problems += [f"{c} has {len(ph[c])} values for {n} frames" for c in ("lv_volume_curve_ml", "rv_volume_curve_ml")
                     if isinstance(ph.get(c), list) and len(ph[c]) != n]
    if x.has("function"):
        fn = x.row("function")
        for k, v in (("ed_frame", ed), ("es_frame", es)):
            if fn.get(k) is not None and _frame(fn, k) != v:
                problems.append(f"function table {k} {_frame(fn, k)} ≠ phases {k} {v}")
    limit = "ED ≠ ES, both in the cine, same frames in every table"
    if problems:
        return Verdict(False, float(es - ed), limit, "; ".join(problems))
    return Verdict(True, float(es - ed), limit, f"ED frame {ed}, ES frame {es}" + (f" of {n}" if n else ""))


class SegVolumeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lv_label: int = Field(3, description="LV cavity label of the cine label map (ACDC: 3)")
    rv_label: int = Field(1, description="RV cavity label (ACDC: 1)")
    rel_tol: float = Field(0.02, gt=0, description="relative difference allowed between table and mask")


@check("volumes_match_seg", SegVolumeParams)
def volumes_match_seg(x: Inputs, p: SegVolumeParams) -> Verdict:
    """The function table's ED/ES volumes are those of the delivered label cine at the
    table's frames (voxel count x voxel volume, within 2 %): every reported number must be
    traceable to the delivered mask. Value: the largest relative difference."""
    row, seg = x.row(), x.nifti("seg")
    data = np.asarray(seg.data)
    if data.ndim != 4:
        raise Unavailable(f"seg has shape {data.shape}; need a (X, Y, Z, T) label cine")
    ed, es = _frame(row, "ed_frame"), _frame(row, "es_frame")
    if not (0 <= ed < data.shape[3] and 0 <= es < data.shape[3]):
        return Verdict(False, None, "", f"frames ED {ed}/ES {es} are outside the cine's {data.shape[3]} frames")
    diffs: dict[str, tuple[float, float]] = {}
    for key, label, frame in (("lv_edv_ml", p.lv_label, ed), ("lv_esv_ml", p.lv_label, es),
                              ("rv_edv_ml", p.rv_label, ed), ("rv_esv_ml", p.rv_label, es)):
        if row.get(key) is not None:
            diffs[key] = (number(row[key], key), float(np.count_nonzero(data[..., frame] == label)) * seg.voxel_ml)
    if not diffs:
        raise Unavailable("function table has no ED/ES volumes")
    rel = {k: abs(t - m) / max(m, 1e-6) for k, (t, m) in diffs.items()}
    worst = max(rel, key=rel.get)
    ok = rel[worst] <= p.rel_tol
    t, m = diffs[worst]
    return Verdict(ok, rel[worst], f"≤ {100 * p.rel_tol:g} %",
                   f"{worst} {t:.1f} mL vs {m:.1f} mL in the label cine ({100 * rel[worst]:.2f} % apart)")


class EveryFrameParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    labels: dict[str, int] = Field(default_factory=lambda: {"LV": 3, "RV": 1}, description="cavities checked")
    min_fraction: float = Field(0.1, gt=0, lt=1, description="smallest frame / largest frame, per cavity")


@check("cavities_every_frame", EveryFrameParams)
def cavities_every_frame(x: Inputs, p: EveryFrameParams) -> Verdict:
    """Each ventricle of the label cine is present in every frame at no less than 10 % of its
    largest frame: a smaller frame would mean an ejection fraction above 90 % between those
    two frames (the ``ef_range`` bound), so the frame lost its cavity (a segmentation failure)
    even when the ED/ES frames, and with them the function table, avoid it. A study that
    reads the delivered labels frame by frame must not get an empty frame as a success.
    Value: the smallest fraction over cavities and frames."""
    seg = x.nifti()
    data = np.asarray(seg.data)
    if data.ndim != 4:
        return Verdict(None, None, "", f"not applicable: labels are {data.ndim}-D, not a (X, Y, Z, T) cine")
    worst, problems = 1.0, []
    for name, label in p.labels.items():
        counts = np.count_nonzero(data == label, axis=(0, 1, 2)).astype(float)
        if not counts.max() > 0:
            problems.append(f"no {name} in any frame")
            worst = 0.0
            continue
        frac = counts / counts.max()
        worst = min(worst, float(frac.min()))
        low = np.flatnonzero(frac < p.min_fraction)
        if low.size:
            problems.append(f"{name} in frame(s) {low.tolist()} is {100 * float(frac[low].min()):.0f} % of its "
                            f"largest frame ({int(np.argmax(counts))})")
    limit = f"every frame ≥ {100 * p.min_fraction:g} % of the largest, per cavity"
    msg = "; ".join(problems) if problems else f"smallest frame {100 * worst:.0f} % of the largest"
    return Verdict(not problems, worst, limit, msg)


class LabelsCineParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sequence: list[str] = Field(default_factory=lambda: ["CINE"], description="the cine the labels were drawn on")
    lv_label: int = Field(3, description="LV cavity label (ACDC: 3)")
    myo_label: int = Field(2, description="myocardium label (ACDC: 2)")
    min_contrast: float = Field(0.1, description="lowest (LV - MYO) / LV of the median intensities")
    max_bright_myo: float = Field(0.15, gt=0, le=1, description="largest share of MYO voxels as bright as blood")
    min_enclosed: float = Field(0.6, ge=0, le=1, description="lowest share of the LV's in-plane rim that is MYO")


def label_cine_agreement(image: np.ndarray, labels: np.ndarray, lv_label: int = 3, myo_label: int = 2
                         ) -> dict[str, float]:
    """How well a (X, Y, Z, T) label cine agrees with its bright-blood cine, as medians over
    the frames that have both an LV and a myocardium:

    * ``contrast``: (median LV intensity − median MYO intensity) / median LV intensity;
    * ``bright_myo``: share of MYO voxels brighter than the midpoint of the two medians (blood
      labelled myocardium: a cavity too small, with its blood given to the wall);
    * ``dark_lv``: share of LV voxels darker than that midpoint (reported, not judged: real
      cavities hold papillary muscles and trabeculae);
    * ``enclosed``: per slice with an LV, the share of the voxels just outside the LV (in-plane
      4-neighbours) that are MYO; median over slices (an LV drawn on another blood pool is
      not ringed by myocardium).

    NaN when no frame has both structures.
    """
    img, lab = np.asarray(image, np.float64), np.asarray(labels)
    cross = ndimage.generate_binary_structure(2, 1)
    per_frame = []
    for t in range(lab.shape[3]):
        im, lt = img[..., t], lab[..., t]
        lv, myo = lt == lv_label, lt == myo_label
        if not lv.any() or not myo.any():
            continue
        b, m = float(np.median(im[lv])), float(np.median(im[myo]))
        mid = 0.5 * (b + m)
        rims = []
        for k in range(lt.shape[2]):
            s = lv[..., k]
            if s.any():
                rim = ndimage.binary_dilation(s, cross) & ~s
                rims.append(float(np.mean(lt[..., k][rim] == myo_label)) if rim.any() else 0.0)
        per_frame.append(((b - m) / abs(b) if b else (-1.0 if m > 0 else 0.0), float(np.mean(im[myo] > mid)),
                          float(np.mean(im[lv] < mid)), float(np.median(rims))))
    if not per_frame:
        return dict.fromkeys(("contrast", "bright_myo", "dark_lv", "enclosed"), float("nan"))
    med = np.median(np.asarray(per_frame), axis=0)
    return dict(zip(("contrast", "bright_myo", "dark_lv", "enclosed"), (float(v) for v in med)))


def label_cine_problems(a: dict[str, float], p: LabelsCineParams) -> dict[str, str]:
    """The limits of ``p`` that the statistics ``a`` (:func:`label_cine_agreement`) break, by
    name (``contrast``, ``bright_myo``, ``enclosed``; ``no_lv_myo`` when nothing was measured),
    each with its message; empty when the labels agree with the cine."""
    if not np.isfinite(a["contrast"]):
        return {"no_lv_myo": "no frame has both an LV and a myocardium label"}
    out = {}
    if a["contrast"] < p.min_contrast:
        out["contrast"] = f"LV is not brighter than the myocardium (contrast {a['contrast']:.2f})"
    if a["bright_myo"] > p.max_bright_myo:
        out["bright_myo"] = f"{100 * a['bright_myo']:.0f} % of the myocardium is as bright as blood"
    if a["enclosed"] < p.min_enclosed:
        out["enclosed"] = f"only {100 * a['enclosed']:.0f} % of the LV's rim is myocardium"
    return out


@check("labels_match_cine", LabelsCineParams)
def labels_match_cine(x: Inputs, p: LabelsCineParams) -> Verdict:
    """The label cine agrees with the bright-blood cine it was drawn on
    (:func:`label_cine_agreement`): the LV brighter than the myocardium (contrast ≥ 0.1), at
    most 15 % of the MYO voxels as bright as blood, and the LV ringed by myocardium (median
    share of its in-plane rim ≥ 0.6). The volume checks cannot see a cavity drawn too small
    whose blood went to the wall, or an LV drawn on the RV: their volumes and EF can be
    physiological and self-consistent. Limits set on the randomised family (our choice, not
    published cut-offs): over 60 cines the segmentation gave at most 7 % bright MYO and a
    fully ringed LV, against ≥ 16 % for a cavity eroded by two voxels and ≤ 0.44 ringed
    for LV and RV swapped. Value: the bright-MYO share."""
    if find_sequence(x.case, p.sequence) is None:  # k-space input: the reconstructed cine is no deliverable
        return Verdict(None, None, "", f"not applicable: the case has none of {p.sequence} "
                       f"(has {sorted(x.case.sequences)})")
    seg, cine = x.nifti(), x.sequence(p.sequence)
    if seg.data.ndim != 4 or cine.data.ndim != 4:
        return Verdict(None, None, "", f"not applicable: labels {seg.data.ndim}-D, cine {cine.data.ndim}-D")
    if seg.data.shape != cine.data.shape or not np.allclose(seg.affine, cine.affine, atol=1e-2):
        return Verdict(False, None, "labels on the cine's grid",
                       f"labels {seg.data.shape} are not on the cine's grid {cine.data.shape}")
    a = label_cine_agreement(cine.data, seg.data, p.lv_label, p.myo_label)
    limit = (f"contrast ≥ {p.min_contrast:g}, bright MYO ≤ {100 * p.max_bright_myo:g} %, "
             f"LV rim MYO ≥ {100 * p.min_enclosed:g} %")
    problems = list(label_cine_problems(a, p).values())
    if not np.isfinite(a["contrast"]):
        return Verdict(False, None, limit, problems[0])
    stats = (f"contrast {a['contrast']:.2f}, bright MYO {100 * a['bright_myo']:.1f} %, "
             f"dark LV {100 * a['dark_lv']:.1f} %, LV rim MYO {100 * a['enclosed']:.0f} %")
    return Verdict(not problems, a["bright_myo"], limit, ("; ".join(problems) + f" ({stats})") if problems else stats)


__all__ = ["cavities_every_frame", "ed_greater_than_es", "edv_range", "ef_range", "label_cine_agreement",
           "label_cine_problems", "labels_match_cine", "phases_consistent", "volumes_match_seg"]
