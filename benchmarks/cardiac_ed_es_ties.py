"""How separable are ED/ES one-frame ties? cardiac.ed_es's phase curve vs the truth, randomised family.

Issue 10's ED/ES misses are one-frame ties: the truth's ED (ES) is the frame of largest
(smallest) *label count* of the phantom's labels, and the runner-up frame is within 0.5 % of
EDV. This measures, per case, cardiac.ed_es's partial-volume blood curve
(:func:`bcer.tools.cardiac.blood_volume_curve`) with the region taken from the truth labels
(no segmentation: it isolates the phase curve from segmentation errors, and is cheap), and
scores rules for picking ED/ES from it: the raw arg-max/arg-min (cardiac.ed_es 1.2-1.4), the
curves weighted to each phase's cavity border (``border``, cardiac.ed_es 1.5),
periodic low-pass (Fourier, K harmonics), a 3-tap smoother, and a curve variant that counts the
voxels that are LV in every frame (eroded 1 or 2 voxels in-plane) as blood, removing their
noise from the sum (``interior1``/``interior2``), and the sum over the motion band only
(``motion1``, :func:`motion_curve`: with the truth's labels it knows exactly which voxels
change, so judge it with ``--labels seg``). It also reports, for every
miss, how far apart the two frames are in the truth and in the curve, and the curve's
residual against the truth count (after a linear fit), i.e. the measurement's noise floor.

Randomised family only (the tuning family); never run on held-out, with one exception that
picks no rule: ``--family heldout --noise-floor`` (truth labels only) measures how far apart
the held-out cines' truth frames are against the noise of a curve read on the truth labels,
i.e. what any image-based picker is up against there; its rule scores are not to be tuned on.

    .venv/bin/python benchmarks/cardiac_ed_es_ties.py --seed0 2000 --cases 60
    .venv/bin/python benchmarks/cardiac_ed_es_ties.py --seed0 6000 --cases 60 --labels seg [--stress dense_noisy] \
        --out benchmarks/results/cardiac_ed_es_ties_seg6000[_dense].json   (the motion-band curve)
    .venv/bin/python benchmarks/cardiac_ed_es_ties.py --seed0 6000 --cases 60 --noise-floor [--stress dense_noisy] \
        --out benchmarks/results/cardiac_ed_es_noise_floor6000[_dense].json   (truth labels, with and without noise)
    .venv/bin/python benchmarks/cardiac_ed_es_ties.py --seed0 1000 --cases 60 --labels seg \
        --out benchmarks/results/cardiac_ed_es_ties_seg.json   (and --noise 0 on the truth labels)
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from scipy import ndimage

from bcer.datasets.cardiac import family_ranges, make_cardiac
from bcer.metrics import frame_match
from bcer.tools.cardiac import LV, blood_fractions, blood_volume_curve, curve_noise_sd, phase_curves, phase_margins

GROUPS = ["NOR", "DCM", "HCM", "MINF", "RV"]
RESULTS = Path(__file__).parent / "results"


def fourier(v: np.ndarray, k: int) -> np.ndarray:
    """The periodic curve low-passed to its first ``k`` harmonics."""
    f = np.fft.rfft(v)
    f[k + 1:] = 0
    return np.fft.irfft(f, v.size)


RULES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "raw": lambda v: v,
    **{f"fourier{k}": (lambda k: lambda v: fourier(v, k))(k) for k in (2, 3, 4, 5)},
    "smooth3": lambda v: 0.25 * np.roll(v, 1) + 0.5 * v + 0.25 * np.roll(v, -1),
}


def interior_curve(cine, lab: np.ndarray, erode: int) -> np.ndarray:
    """``blood_volume_curve`` with every voxel that is LV in all frames (eroded ``erode`` voxels
    in-plane) counted as exactly one voxel of blood."""
    lv = lab == LV
    always = ndimage.binary_erosion(lv.all(axis=3), structure=np.ones((3, 3, 1), bool), iterations=erode)
    pv = blood_volume_curve(cine, lab)
    frac = np.clip(blood_fractions(cine, lab)[0], 0.0, 1.0)[always]  # (n_always, T)
    return pv + (1.0 - frac).sum(axis=0) * cine.voxel_volume_ml


def posterior_fraction(y: np.ndarray, s: float, mixed: float) -> np.ndarray:
    """E[f | y] for y = f + N(0, s^2), f = 0 or 1 with probability (1 - mixed) / 2 each, else
    uniform on [0, 1]: a soft voxel classification that pulls pure voxels' noise to 0 or 1 and
    keeps partial voxels' fractions (clipping removes only one side of the noise)."""
    from scipy.stats import norm

    s = max(s, 1e-6)
    l0, l1 = norm.pdf(y / s) / s, norm.pdf((y - 1.0) / s) / s
    a, b = -y / s, (1.0 - y) / s
    lu = np.clip(norm.cdf(b) - norm.cdf(a), 1e-300, None)
    mu = np.clip(y + s * (norm.pdf(a) - norm.pdf(b)) / lu, 0.0, 1.0)
    pure = (1.0 - mixed) / 2.0
    return (pure * l1 + mixed * lu * mu) / (pure * (l0 + l1) + mixed * lu)


def motion_curve(cine, lab: np.ndarray, dilate: int = 1) -> np.ndarray:
    """The blood curve summed over the motion band only: voxels that are LV in some frames but
    not all, dilated ``dilate`` voxels in-plane, minus the RV. Static voxels (always blood,
    always wall) add noise and no phase information; the band keeps the voxels that change."""
    lv = lab == LV
    cross = np.zeros((3, 3, 1), bool)
    cross[:, 1], cross[1, :] = True, True
    band = ndimage.binary_dilation(lv.any(axis=3) & ~lv.all(axis=3), structure=cross, iterations=dilate)
    band &= ~(lab == 1).any(axis=3)
    frac = np.clip(blood_fractions(cine, lab)[0], 0.0, 1.0)
    return (frac * band[..., None]).sum(axis=(0, 1, 2)) * cine.voxel_volume_ml


# a stress condition of the randomised family (``--stress``): dense frames, top-of-range noise,
# through-plane partial volume on every cine (the edge of the randomised ranges and beyond)
STRESS = {"dense_noisy": {"frames": {"small": (20, 30), "full": (16, 30)}, "noise": (0.05, 0.07),
                          "slice_profile": 1.0}}


def variant_curves(cine, lab: np.ndarray) -> dict[str, list[float]]:
    """The gated, PCA and linear variants of the blood curve (see the module docstring)."""
    f, region = blood_fractions(cine, lab)
    clipped = np.clip(f, 0.0, 1.0) * region[..., None]
    per_slice = clipped.sum(axis=(0, 1))  # (Z, T)
    m = clipped[region]  # (V, T)
    mu = m.mean(axis=1, keepdims=True)
    u, s, vt = np.linalg.svd(m - mu, full_matrices=False)
    fr = f[region]
    s_noise = float(np.median(np.abs(np.diff(fr, axis=1)))) / (0.6745 * np.sqrt(2.0))
    soft = {f"soft{int(100 * c)}": posterior_fraction(fr, s_noise, c).sum(0) for c in (0.1, 0.3, 0.6)}
    curves = {**soft, "gated": (per_slice * (lab == LV).any(axis=(0, 1))).sum(0),
              "pca4": (mu + (u[:, :4] * s[:4]) @ vt[:4]).sum(0), "linear": f[region].sum(0)}
    return {f"pv_{k}": [float(x) for x in v] for k, v in curves.items()}


def case_labels(ph, labels: str, cache: Path | None, key: str) -> np.ndarray:
    """The truth labels, or ``seg.cardiac``'s (cached per seed in ``cache``: the network is the slow part)."""
    if labels == "truth":
        return np.asarray(ph.labels["seg"].data)
    from bcer.tools.registry import call_tool

    path = None if cache is None else cache / f"seg_{key}.npy"
    if path is not None and path.exists():
        return np.load(path)
    lab = np.asarray(call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, {"method": "auto"})["labels"].data)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, lab)
    return lab


def case_curves(seed: int, i: int, borderline_every: int, labels: str = "truth", noise: float | None = None,
                cache: Path | None = None, stress: str | None = None, family: str = "randomised") -> dict:
    border = bool(borderline_every) and i % borderline_every == borderline_every - 1
    with family_ranges(family, **STRESS.get(stress or "", {})):
        ph = make_cardiac(f"{'ti' if family == 'randomised' else family[:2]}{i:03d}", seed, "small",
                          group=GROUPS[i % 5], family=family, borderline=border, noise=noise)
    lab = case_labels(ph, labels, cache, f"{seed}_{noise}" + (f"_{stress}" if stress else ""))
    pv = blood_volume_curve(ph.sequences["CINE"], lab)
    extra = {f"pv_interior{k}": [float(x) for x in interior_curve(ph.sequences["CINE"], lab, k)] for k in (1, 2)}
    extra.update(variant_curves(ph.sequences["CINE"], lab))
    extra["pv_motion1"] = [float(x) for x in motion_curve(ph.sequences["CINE"], lab, 1)]
    extra["noise_sd_est"] = curve_noise_sd(ph.sequences["CINE"], lab)
    pc = phase_curves(blood_fractions(ph.sequences["CINE"], lab), ph.sequences["CINE"].voxel_volume_ml)
    extra.update(border_ed=[float(x) for x in pc.ed], border_es=[float(x) for x in pc.es],
                 border_sd=[pc.sd_ed, pc.sd_es])
    return {"seed": seed, "pv": [float(x) for x in pv], **extra, "lv": ph.truth["lv_volume_curve_ml"],
            "ed": ph.truth["ed_frame"], "es": ph.truth["es_frame"],
            "slice_profile": bool(ph.truth["acquisition"]["slice_profile"])}


def score(cases: list[dict]) -> dict:
    """Per rule: ED/ES exact (index equal to the truth's), the misses, and exact-or-tied (a miss
    whose frames have the truth frames' exact voxel counts counts: ``bcer.metrics.frame_match``)."""
    curves = {name: (lambda rule: lambda c: rule(np.asarray(c["pv"])))(rule) for name, rule in RULES.items()}
    for key in ("pv_interior1", "pv_interior2", "pv_gated", "pv_pca4", "pv_linear", "pv_soft10", "pv_soft30",
                "pv_soft60", "pv_motion1"):
        if key in cases[0]:
            curves[key.removeprefix("pv_")] = (lambda key: lambda c: np.asarray(c[key]))(key)
    pickers = {name: (lambda f: lambda c: (int(np.argmax(f(c))), int(np.argmin(f(c)))))(f)
               for name, f in curves.items()}
    if "border_ed" in cases[0]:  # cardiac.ed_es 1.5: ED on the ED-border curve, ES on the ES-border curve
        pickers["border"] = lambda c: (int(np.argmax(c["border_ed"])), int(np.argmin(c["border_es"])))
    out = {}
    for name, pick in pickers.items():
        misses, tied = [], 0
        for c in cases:
            ed, es = pick(c)
            if (ed, es) != (c["ed"], c["es"]):
                misses.append(c["seed"])
                tied += frame_match(ed, c["ed"], c["lv"]) and frame_match(es, c["es"], c["lv"])
        out[name] = {"ed_es_exact": round(1 - len(misses) / len(cases), 4),
                     "ed_es_exact_or_tied": round(1 - (len(misses) - tied) / len(cases), 4), "misses": misses}
    return out


def miss_detail(c: dict) -> dict:
    """Truth and curve gaps (% of EDV) between the truth's frame and the raw curve's pick."""
    pv, lv = np.asarray(c["pv"]), np.asarray(c["lv"])
    ed, es = int(np.argmax(pv)), int(np.argmin(pv))
    edv, pv_edv = lv[c["ed"]], pv[c["ed"]]
    return {"seed": c["seed"], "truth": [c["ed"], c["es"]], "picked": [ed, es], "slice_profile": c["slice_profile"],
            "truth_gap_pct_edv": [round(100 * (lv[c["ed"]] - lv[ed]) / edv, 3), round(100 * (lv[es] - lv[c["es"]]) / edv, 3)],
            "curve_gap_pct": [round(100 * (pv[ed] - pv[c["ed"]]) / pv_edv, 3), round(100 * (pv[c["es"]] - pv[es]) / pv_edv, 3)]}


def residual_pct(c: dict) -> float:
    """SD of the truth count minus a linear fit of the curve, in % of EDV."""
    pv, lv = np.asarray(c["pv"]), np.asarray(c["lv"])
    a = np.c_[pv, np.ones_like(pv)]
    r = lv - a @ np.linalg.lstsq(a, lv, rcond=None)[0]
    return float(100 * r.std() / lv.max())


def calibration(cases: list[dict], border: bool = False) -> dict:
    """``cardiac.ed_es``'s ``ed_es_confidence`` (:func:`bcer.tools.cardiac.phase_margins` on the raw
    curve, 1.4; on the two border curves with ``border``, 1.5) against whether that pick is exact:
    mean confidence vs the exact rate, and per confidence bin; ``ambiguous`` is confidence < 0.8,
    as the tool flags it."""
    conf, ok = [], []
    for c in cases:
        if border:
            if not all(c.get("border_sd") or [None]):
                continue
            ed_c, es_c = np.asarray(c["border_ed"]), np.asarray(c["border_es"])
            conf.append(phase_margins(ed_c, c["border_sd"][0], es_c, c["border_sd"][1])["ed_es_confidence"])
            ok.append(float((int(np.argmax(ed_c)), int(np.argmin(es_c))) == (c["ed"], c["es"])))
            continue
        if not c.get("noise_sd_est"):
            continue
        pv = np.asarray(c["pv"])
        conf.append(phase_margins(pv, c["noise_sd_est"])["ed_es_confidence"])
        ok.append(float((int(np.argmax(pv)), int(np.argmin(pv))) == (c["ed"], c["es"])))
    conf_a, ok_a = np.asarray(conf), np.asarray(ok)
    bins = {}
    for lo, hi in ((0.0, 0.5), (0.5, 0.8), (0.8, 0.95), (0.95, 1.01)):
        m = (conf_a >= lo) & (conf_a < hi)
        bins[f"{lo:g}-{min(hi, 1):g}"] = {"cases": int(m.sum()), "exact": round(float(ok_a[m].mean()), 3) if m.any() else None}
    amb = conf_a < 0.8
    return {"cases": len(conf), "mean_confidence": round(float(conf_a.mean()), 3), "exact": round(float(ok_a.mean()), 3),
            "bins": bins, "ambiguous": int(amb.sum()),
            "exact_when_ambiguous": round(float(ok_a[amb].mean()), 3) if amb.any() else None,
            "exact_when_not": round(float(ok_a[~amb].mean()), 3) if (~amb).any() else None}


def noise_floor(noisy: list[dict], clean: list[dict]) -> dict:
    """The raw curve's noise against the gaps it must resolve, per case: the SD over frames of
    (noisy curve − the same cine's noise-free curve), and the truth's gap between its largest
    and second-largest (smallest and second-smallest) frames, all in % of the true EDV."""
    sd, gap_ed, gap_es, below, per_case = [], [], [], 0, []
    for n, c in zip(noisy, clean):
        lv = np.asarray(c["lv"])
        edv, srt = lv.max(), np.sort(lv)
        d = np.asarray(n["pv"]) - np.asarray(c["pv"])
        s = 100 * float(d.std()) / edv
        ge, gs = 100 * (srt[-1] - srt[-2]) / edv, 100 * (srt[1] - srt[0]) / edv
        sd.append(s), gap_ed.append(ge), gap_es.append(gs)
        below += int(min(ge, gs) < s)
        per_case.append({"seed": n["seed"], "noise_sd_pct_edv": round(s, 3), "gap_ed_pct_edv": round(ge, 3),
                         "gap_es_pct_edv": round(gs, 3)})

    def q(v: list[float]) -> dict:
        return {"median": round(float(np.median(v)), 3), "p10": round(float(np.percentile(v, 10)), 3),
                "p90": round(float(np.percentile(v, 90)), 3)}
    return {"curve_noise_sd_pct_edv": q(sd), "truth_gap_ed_pct_edv": q(gap_ed), "truth_gap_es_pct_edv": q(gap_es),
            "cases_with_a_gap_below_the_noise": below, "of": len(noisy),
            "noise_free_rules": score(clean), "per_case": per_case}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed0", type=int, default=2000)
    ap.add_argument("--cases", type=int, default=60)
    ap.add_argument("--borderline-every", type=int, default=3)
    ap.add_argument("--labels", default="truth", choices=["truth", "seg"], help="region from the truth or seg.cardiac")
    ap.add_argument("--noise", type=float, default=None, help="render with this noise (0: none) instead of the family's")
    ap.add_argument("--stress", default=None, choices=sorted(STRESS), help="pin a stress condition (STRESS)")
    ap.add_argument("--noise-floor", action="store_true",
                    help="also render every cine without noise and compare (noise_floor); not with --noise")
    ap.add_argument("--cache", type=Path, default=Path("/tmp/bcer_ties_seg"), help="seg.cardiac labels per case")
    ap.add_argument("--out", type=Path, default=RESULTS / "cardiac_ed_es_ties_randomised.json")
    ap.add_argument("--family", default="randomised", choices=["randomised", "heldout"],
                    help="heldout: only with --noise-floor on the truth labels (a measurement of the data)")
    args = ap.parse_args()
    if args.family != "randomised" and not (args.noise_floor and args.labels == "truth" and args.stress is None):
        ap.error("--family heldout measures the noise floor on the truth labels only (--noise-floor, no --stress)")
    t0 = time.time()
    cases = [case_curves(args.seed0 + i, i, args.borderline_every, args.labels, args.noise, args.cache, args.stress,
                         args.family) for i in range(args.cases)]
    scores = score(cases)
    res = [residual_pct(c) for c in cases]
    report = {"config": {k: str(v) for k, v in vars(args).items()}, "family": args.family,
              "rules": scores, "calibration": calibration(cases), "calibration_border": calibration(cases, True),
              "raw_misses": [miss_detail(c) for c in cases if c["seed"] in scores["raw"]["misses"]],
              "curve_residual_pct_edv": {"median": round(float(np.median(res)), 3), "max": round(float(np.max(res)), 3)},
              "wall_s": round(time.time() - t0, 1), "load_avg": os.getloadavg(), "cases": cases}
    if args.noise_floor:
        clean = [case_curves(args.seed0 + i, i, args.borderline_every, args.labels, 0.0, args.cache, args.stress,
                             args.family) for i in range(args.cases)]
        report["noise_floor"] = noise_floor(cases, clean)
    print(json.dumps({k: v for k, v in report.items() if k != "cases"}, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
