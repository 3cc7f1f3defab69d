"""An adversarial corpus for the R4 report critic, written apart from ``benchmarks/r4_errors.py``.

Nothing here comes from ``bcer.bench.report_errors`` or from the report lexicon: the
evidence is synthesised directly as the report tool's input artifacts (tables, a
classification, findings) from a seed, the reports are written with this file's own
radiologist-style templates (free text, numbers mostly without evidence links, mixed units,
abbreviations), and the errors are of other kinds:

- ``unit_scale``: a length or volume whose digits are right but whose unit is a factor of ten
  (or a thousand) off (``71.2 mm`` written ``71.2 cm``);
- ``value_shift``: a number changed by 25-60 %, or a count written in words changed;
- ``fabricated``: a finding the evidence does not hold (haemorrhage, cyst, extracapsular
  extension, midline shift, pericardial effusion, late enhancement...);
- ``compound_negation``: a present finding denied inside a compound word (``non-enhancing``,
  ``necrosis-free``, ``non-dilated``) or an absent one asserted;
- ``absent_with_volume``: a sentence denying a component whose volume another sentence states;
- ``grade_word``: the grade or group word against the classification (``low-grade``, ``WHO
  grade 2``, ``intermediate likelihood`` for PI-RADS 4, ``normal biventricular function`` for DCM);
- ``impression_side``: the impression names the other side (often as an abbreviation);
- ``zone_swap``: a lesion's zone given as another zone or its synonym;
- ``omission``: every sentence about one required compartment, chamber or lesion left out;
- ``side_comparison`` (cardiac): a comparison between the ventricles the volumes contradict.

Each corrupted report carries one error with the type and entity a critic should name, the
sentence it sits in, and a ground truth of its own (text that must be gone, facts that must be
stated) to judge a repair without asking the critic. A harmless paraphrase pass (other units
with the right value, ranges that hold the value, counts in words, side and zone
abbreviations, a location without an id) makes reports that must NOT be flagged.

Splits: seeds 0-99 are the development split (the critic was tuned on these, base wording
only); seeds 100-299 and the paraphrase pass are held out and reported once.

    python benchmarks/r4_adversarial.py --split heldout --out benchmarks/results/r4_adversarial.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.contracts.artifacts import Classification, Finding, Findings, Table  # noqa: E402
from bcer.tools.report.evidence import Evidence, build_evidence  # noqa: E402
from bcer.tools.report.prose import Box, Draft  # noqa: E402

DOMAINS = ("brain", "prostate", "cardiac")
KINDS = ("unit_scale", "value_shift", "fabricated", "compound_negation", "absent_with_volume", "grade_word",
         "impression_side", "zone_swap", "omission", "side_comparison")
# the issue type a critic should raise for each kind
KIND_TYPE = {"unit_scale": "contradiction", "value_shift": "contradiction", "fabricated": "unsupported",
             "compound_negation": "negation", "absent_with_volume": "contradiction", "grade_word": "contradiction",
             "impression_side": "laterality", "zone_swap": "localization", "omission": "missing",
             "side_comparison": "contradiction"}
SPLITS = {"dev": range(0, 100), "heldout": range(100, 300)}
_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


# ---- evidence, synthesised as the report tool's inputs ---------------------------------------
def _origin(art: Any, node: str, fld: str) -> Any:
    art.meta["origin"] = {"node": node, "field": fld}
    return art


def _brain_inputs(rng: np.random.Generator) -> dict[str, Any]:
    side = "L" if rng.random() < 0.5 else "R"
    rows = []
    enh = rng.random() < 0.75
    parts = {"enhancing": enh, "necrotic_core": enh and rng.random() < 0.7, "oedema": rng.random() < 0.85}
    for roi, present in parts.items():
        if not present:
            continue
        vol = float(rng.uniform(2, 60) if roi != "oedema" else rng.uniform(20, 140))
        rows.append({"roi": roi, "volume_ml": vol, "max_diameter_mm": float((vol * 1500) ** (1 / 3) * rng.uniform(0.9, 1.3)),
                     "mean": float(rng.uniform(100, 600)), "side": side})
    if not rows:
        rows.append({"roi": "oedema", "volume_ml": 35.0, "max_diameter_mm": 48.0, "mean": 300.0, "side": side})
        parts["oedema"] = True
    t = _origin(Table(rows, {"volume_ml": "mL", "max_diameter_mm": "mm", "mean": "a.u."}, "roi_features"),
                "roi_stats", "features")
    e_ml = next((r["volume_ml"] for r in rows if r["roi"] == "enhancing"), 0.0)
    whole = sum(r["volume_ml"] for r in rows)
    hgg = e_ml >= 0.5 and e_ml / whole >= 0.02
    cls = _origin(Classification("HGG" if hgg else "LGG", [
        {"rule": "enhancing volume >= min_enhancing_ml", "value": e_ml, "threshold": 0.5, "passed": e_ml >= 0.5}],
        scores={"enhancing_ml": e_ml, "whole_tumour_ml": whole}), "grade", "classification")
    return {"measurements": t, "classification": cls}


_PZ_TZ = ("PZ", "TZ")


def _prostate_inputs(rng: np.random.Generator) -> dict[str, Any]:
    gland = {"roi": "gland", "volume_ml": float(rng.uniform(18, 90)), "max_diameter_mm": float(rng.uniform(38, 62))}
    t = _origin(Table([gland], {"volume_ml": "mL", "max_diameter_mm": "mm"}, "roi_features"), "gland_stats", "features")
    n = int(rng.choice([0, 1, 1, 2, 2, 3]))
    items, scores, trace = [], {}, []
    for j in range(n):
        size = float(rng.uniform(5, 24))
        k0 = int(rng.integers(3, 18))
        i0, j0 = int(rng.integers(20, 60)), int(rng.integers(20, 60))
        w = max(2, int(size / 1.5))
        side, zone = ("L", "R")[int(rng.integers(0, 2))], _PZ_TZ[int(rng.integers(0, 2))]
        adc = float(rng.uniform(520, 1300))
        lid = f"lesion_{j + 1}"
        items.append(Finding(lid, "lesion", ((i0, j0, k0), (i0 + w, j0 + w, k0 + int(rng.integers(2, 5)))),
                             ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)), volume_ml=float(size ** 3 / 2000 * rng.uniform(0.6, 1)),
                             side=side, zone=zone, attributes={"size_mm": size, "adc": adc}))
        cat = 5 if size >= 15 and adc < 850 else (4 if adc < 850 else int(rng.choice([2, 3])))
        scores[lid] = float(cat)
        trace.append({"rule": f"{lid}: ADC < adc_marked", "value": adc, "threshold": 850.0, "passed": adc < 850})
    label = f"PI-RADS {int(max(scores.values())) if scores else 1}"
    f = _origin(Findings(items), "lesions", "findings")
    cls = _origin(Classification(label, trace, scores=scores), "pirads", "classification")
    return {"measurements": t, "findings": f, "classification": cls}


def _cardiac_inputs(rng: np.random.Generator) -> dict[str, Any]:
    label = ("NOR", "DCM", "HCM", "MINF", "RV")[int(rng.integers(0, 5))]
    bsa = float(rng.uniform(1.6, 2.2))
    lv_edvi = {"DCM": rng.uniform(115, 170), "MINF": rng.uniform(90, 130)}.get(label, rng.uniform(60, 95))
    lv_ef = {"DCM": rng.uniform(12, 35), "MINF": rng.uniform(25, 39), "HCM": rng.uniform(60, 75)}.get(label, rng.uniform(56, 68))
    rv_edvi = rng.uniform(115, 160) if label == "RV" else rng.uniform(60, 100)
    rv_ef = rng.uniform(20, 38) if label == "RV" else rng.uniform(45, 65)
    mass_i = rng.uniform(115, 150) if label == "HCM" else rng.uniform(50, 95)
    wall = rng.uniform(16, 22) if label == "HCM" else rng.uniform(7, 11)
    n_abn = int(rng.integers(3, 9)) if label == "MINF" else 0
    lv_edv, rv_edv = lv_edvi * bsa, rv_edvi * bsa
    row = {"ed_frame": 0, "es_frame": int(rng.integers(8, 12)), "lv_edv_ml": lv_edv, "lv_esv_ml": lv_edv * (1 - lv_ef / 100),
           "lv_ef_pct": lv_ef, "rv_edv_ml": rv_edv, "rv_esv_ml": rv_edv * (1 - rv_ef / 100), "rv_ef_pct": rv_ef,
           "myo_mass_g": mass_i * bsa, "max_wall_thickness_mm": wall, "bsa_m2": bsa, "lv_edvi_ml_m2": lv_edvi,
           "rv_edvi_ml_m2": rv_edvi, "lv_mass_index_g_m2": mass_i, "n_segments": 16, "n_abnormal_segments": n_abn}
    row = {k: (v if isinstance(v, int) else float(v)) for k, v in row.items()}
    units = {"lv_edv_ml": "mL", "lv_esv_ml": "mL", "lv_ef_pct": "%", "rv_edv_ml": "mL", "rv_esv_ml": "mL",
             "rv_ef_pct": "%", "myo_mass_g": "g", "max_wall_thickness_mm": "mm", "bsa_m2": "m2",
             "lv_edvi_ml_m2": "mL/m2", "rv_edvi_ml_m2": "mL/m2", "lv_mass_index_g_m2": "g/m2", "n_segments": "segments",
             "n_abnormal_segments": "segments", "ed_frame": "frame", "es_frame": "frame"}
    t = _origin(Table([row], units, "cardiac_function"), "lv_rv_function", "function")
    rules = [("LVEF < lvef_low", lv_ef, 40.0, lv_ef < 40), ("LVEDVi > lvedvi_high", lv_edvi, 100.0, lv_edvi > 100),
             ("LV mass index >= mass_index_hcm", mass_i, 110.0, mass_i >= 110),
             ("abnormal segments >= min_abnormal_segments", n_abn, 2.0, n_abn >= 2),
             ("RVEDVi > rvedvi_high", rv_edvi, 110.0, rv_edvi > 110), ("RVEF < rvef_low", rv_ef, 40.0, rv_ef < 40)]
    trace = [{"rule": r, "value": float(v), "threshold": th, "passed": bool(p)} for r, v, th, p in rules]
    cls = _origin(Classification(label, trace), "acdc_group", "classification")
    return {"measurements": t, "classification": cls}


def make_evidence(domain: str, seed: int) -> Evidence:
    rng = np.random.default_rng([seed, DOMAINS.index(domain), 31])
    inputs = {"brain": _brain_inputs, "prostate": _prostate_inputs, "cardiac": _cardiac_inputs}[domain](rng)
    return build_evidence(**inputs, domain=domain)


# ---- the writer: one sentence group per entity, wording drawn from this file's own templates ----
@dataclass
class Sent:
    text: str
    section: str  # findings | impression
    entity: str   # the evidence entity the sentence is about ("" for the overview)
    tag: str      # what it states: size, absent, grade, side, zone, ...


class Writer:
    """Writes numbers as a radiologist would: rounded, in the evidence's unit or a common other one."""

    def __init__(self, ev: Evidence, rng: np.random.Generator, linked: bool):
        self.ev, self.rng, self.linked = ev, rng, linked

    def pick(self, options: list[str]) -> str:
        return options[int(self.rng.integers(0, len(options)))]

    def fact(self, entity: str, name: str):
        return self.ev.fact(entity, name)

    def val(self, entity: str, name: str, unit: str | None = None) -> str:
        f = self.fact(entity, name)
        v, u = f.value, unit or f.unit
        if u == "cm" and f.unit == "mm":
            v = v / 10
        text = {"mL": self.pick(["{:.1f} mL", "{:.1f} ml", "{:.1f} cc", "{:.1f} cm³"]), "mm": "{:.0f} mm" if v >= 20 else "{:.1f} mm",
                "cm": "{:.1f} cm", "%": self.pick(["{:.0f}%", "{:.0f} %"]), "g": "{:.0f} g",
                "mL/m2": self.pick(["{:.0f} mL/m²", "{:.0f} ml/m2"]), "g/m2": "{:.0f} g/m²",
                "1e-6 mm2/s": self.pick(["{:.0f} µm²/s", "{:.0f} x 10⁻⁶ mm²/s"]),
                "segments": "{:.0f}", "frame": "{:.0f}"}.get(u, "{:.0f}" if f.role == "slice" else "{:.1f}").format(v)
        return text + (f" `[{f.id}]`" if self.linked else "")


_SIDE_WORD = {"left": ["left", "left-sided"], "right": ["right", "right-sided"]}
_ZONE_WORD = {"PZ": ["peripheral zone", "PZ"], "TZ": ["transition zone", "TZ"]}
_PIRADS_WORD = {1: "very low", 2: "low", 3: "intermediate", 4: "high", 5: "very high"}


def _brain(w: Writer) -> list[Sent]:
    ev, side = w.ev, w.ev.side
    out = [Sent(w.pick([f"An intra-axial mass is centred in the {side} cerebral hemisphere.",
                        f"There is a heterogeneous {side}-sided intra-axial mass lesion.",
                        f"Intra-axial tumour in the {side} hemisphere."]), "findings", "", "side")]
    if ev.fact("enhancing", "volume_ml"):
        out.append(Sent(w.pick([
            f"The contrast-enhancing portion measures {w.val('enhancing', 'volume_ml')} and spans {w.val('enhancing', 'max_diameter_mm')}.",
            f"Enhancing tumour: {w.val('enhancing', 'volume_ml')}, maximal extent {w.val('enhancing', 'max_diameter_mm')}.",
            f"There is solid enhancing tissue of {w.val('enhancing', 'volume_ml')}, {w.val('enhancing', 'max_diameter_mm')} across."]),
            "findings", "enhancing", "size"))
    else:
        out.append(Sent(w.pick(["No contrast enhancement is demonstrated.", "There is no enhancing tissue."]),
                        "findings", "enhancing", "absent"))
    if ev.fact("necrotic_core", "volume_ml"):
        out.append(Sent(w.pick([
            f"Central necrosis of {w.val('necrotic_core', 'volume_ml')} ({w.val('necrotic_core', 'max_diameter_mm')} across).",
            f"A necrotic centre measuring {w.val('necrotic_core', 'max_diameter_mm')} ({w.val('necrotic_core', 'volume_ml')}) is noted."]),
            "findings", "necrotic_core", "size"))
    else:
        out.append(Sent(w.pick(["No necrotic component.", "There is no central necrosis."]), "findings",
                        "necrotic_core", "absent"))
    if ev.fact("oedema", "volume_ml"):
        out.append(Sent(w.pick([
            f"Perilesional vasogenic oedema of {w.val('oedema', 'volume_ml')} extends over {w.val('oedema', 'max_diameter_mm', 'cm')}.",
            f"Surrounding FLAIR hyperintensity (oedema) measures {w.val('oedema', 'volume_ml')}, up to {w.val('oedema', 'max_diameter_mm')}."]),
            "findings", "oedema", "size"))
    else:
        out.append(Sent(w.pick(["No perilesional oedema.", "There is no surrounding oedema."]), "findings", "oedema",
                        "absent"))
    grade = {"HGG": ["a high-grade glioma (WHO grade 3-4)", "a high grade glioma"],
             "LGG": ["a low-grade glioma (WHO grade 2)", "a low grade glioma"]}[ev.label]
    out.append(Sent(w.pick([f"{side.capitalize()} hemispheric glioma; appearances favour {w.pick(grade)}.",
                            f"Appearances are in keeping with {w.pick(grade)} in the {side} hemisphere."]),
                    "impression", "label", "grade"))
    return out


def _prostate(w: Writer) -> list[Sent]:
    ev = w.ev
    out = [Sent(w.pick([f"The prostate gland volume is {w.val('gland', 'volume_ml')}.",
                        f"Estimated prostate volume {w.val('gland', 'volume_ml')}."]), "findings", "gland", "size")]
    lesions = ev.lesions()
    if not lesions:
        out.append(Sent(w.pick(["No focal abnormality suspicious for clinically significant cancer.",
                                "No suspicious focal lesion in either zone."]), "findings", "", "absent"))
        out.append(Sent(w.pick(["Overall PI-RADS 1: very low likelihood of clinically significant cancer.",
                                "No suspicious lesion; overall assessment PI-RADS 1."]), "impression", "label", "grade"))
        return out
    for e in lesions:
        n = e.id.split("_")[1]
        name = w.pick([f"Lesion {n}", f"Lesion #{n}"]) if len(lesions) > 1 or w.rng.random() < 0.5 else "A lesion"
        side, zone = w.pick(_SIDE_WORD[e.side]), w.pick(_ZONE_WORD[e.zone])
        k0, k1 = w.val(e.id, "slice_first"), w.val(e.id, "slice_last")
        out.append(Sent(w.pick([
            f"{name} in the {side} {zone} measures {w.val(e.id, 'size_mm')} ({w.val(e.id, 'volume_ml')}), "
            f"with an ADC of {w.val(e.id, 'adc')}, on images {k0} to {k1}.",
            f"{name}: {w.val(e.id, 'size_mm')} T2-hypointense focus in the {side} {zone}, volume "
            f"{w.val(e.id, 'volume_ml')}, ADC {w.val(e.id, 'adc')}, slices {k0}-{k1}."]), "findings", e.id, "size"))
    for e in lesions:
        n = e.id.split("_")[1]
        cat = int(ev.fact(e.id, "category").value)
        out.append(Sent(w.pick([f"Lesion {n} ({e.side} {e.zone}): PI-RADS {cat}.",
                                f"PI-RADS v2.1 category {cat} for lesion {n} in the {e.side} {_ZONE_WORD[e.zone][0]}."]),
                        "impression", e.id, "zone"))
    top = int(ev.label.split()[-1])
    out.append(Sent(w.pick([f"Overall PI-RADS {top}: {_PIRADS_WORD[top]} likelihood of clinically significant cancer.",
                            f"Overall assessment PI-RADS {top} ({_PIRADS_WORD[top]} likelihood)."]),
                    "impression", "label", "grade"))
    return out


_ACDC_WORDS = {"NOR": ["Normal biventricular size and systolic function.", "Normal cardiac MRI."],
               "DCM": ["Appearances are those of a dilated cardiomyopathy.", "Dilated cardiomyopathy phenotype."],
               "HCM": ["Appearances are consistent with hypertrophic cardiomyopathy.", "Hypertrophic cardiomyopathy phenotype."],
               "MINF": ["Regional dysfunction in keeping with a previous myocardial infarction.",
                        "Appearances of a prior myocardial infarction."],
               "RV": ["Isolated right ventricular abnormality (dilated, impaired RV).",
                      "Abnormal right ventricle, dilated with impaired function."]}


def _cardiac(w: Writer) -> list[Sent]:
    ev = w.ev
    c = {k: x.present for k, x in ev.concepts.items()}
    out = [Sent(w.pick([
        f"LV end-diastolic volume {w.val('lv', 'lv_edv_ml')} ({w.val('lv', 'lv_edvi_ml_m2')} indexed), end-systolic "
        f"volume {w.val('lv', 'lv_esv_ml')}, LVEF {w.val('lv', 'lv_ef_pct')}.",
        f"The left ventricular EDV is {w.val('lv', 'lv_edv_ml')} (indexed {w.val('lv', 'lv_edvi_ml_m2')}) and ESV "
        f"{w.val('lv', 'lv_esv_ml')}; ejection fraction {w.val('lv', 'lv_ef_pct')}."]), "findings", "lv", "size"),
        Sent(w.pick([f"LV mass {w.val('myo', 'myo_mass_g')} ({w.val('lv', 'lv_mass_index_g_m2')}).",
                     f"Myocardial mass is {w.val('myo', 'myo_mass_g')}."]), "findings", "myo", "size"),
        Sent(w.pick([f"RV end-diastolic volume {w.val('rv', 'rv_edv_ml')}, RVEF {w.val('rv', 'rv_ef_pct')}.",
                     f"The right ventricle has an EDV of {w.val('rv', 'rv_edv_ml')} and an ejection fraction of "
                     f"{w.val('rv', 'rv_ef_pct')}."]), "findings", "rv", "size")]
    n = int(ev.fact("heart", "n_abnormal_segments").value)
    nw = _WORDS[n] if n < len(_WORDS) else str(n)
    if n:
        out.append(Sent(w.pick([f"Regional hypokinesis in {nw} of 16 segments.",
                                f"{nw.capitalize()} segments are hypokinetic."]), "findings", "heart", "count"))
    else:
        out.append(Sent(w.pick(["No regional wall motion abnormality (0 of 16 segments).",
                                "Regional wall motion is normal (no abnormal segment)."]), "findings", "heart", "count"))
    out.append(Sent(w.pick(["The LV is dilated." if c["LV dilatation"] else "The LV is normal in size.",
                            "Dilated left ventricle." if c["LV dilatation"] else "Normal left ventricular size."]),
                    "findings", "lv", "dilated"))
    out.append(Sent("Concentric LV hypertrophy." if c["LV hypertrophy"] else "No left ventricular hypertrophy.",
                    "findings", "lv", "hypertrophy"))
    bigger = "RV" if ev.fact("rv", "rv_edv_ml").value > ev.fact("lv", "lv_edv_ml").value else "LV"
    if abs(ev.fact("rv", "rv_edv_ml").value - ev.fact("lv", "lv_edv_ml").value) > 15:
        out.append(Sent(f"The {bigger} is larger than the {'LV' if bigger == 'RV' else 'RV'}.", "findings",
                        bigger.lower(), "comparison"))
    out.append(Sent(w.pick(_ACDC_WORDS[ev.label]), "impression", "label", "grade"))
    return out


def write_report(ev: Evidence, seed: int) -> tuple[Draft, list[Sent]]:
    rng = np.random.default_rng([seed, DOMAINS.index(ev.domain), 7])
    w = Writer(ev, rng, linked=rng.random() < 0.25)
    sents = {"brain": _brain, "prostate": _prostate, "cardiac": _cardiac}[ev.domain](w)
    return _draft(ev, sents), sents


def _draft(ev: Evidence, sents: list[Sent]) -> Draft:
    return Draft(findings=[s.text for s in sents if s.section == "findings"],
                 impression=[s.text for s in sents if s.section == "impression"],
                 boxes=[Box(lesion=e.id, box_voxel=e.box_voxel) for e in ev.lesions() if e.box_voxel], source="adversarial")


# ---- errors ----------------------------------------------------------------------------------
@dataclass
class Case:
    kind: str
    type: str
    entity: str
    section: str
    sentence: int
    draft: Draft
    gone: list[str] = field(default_factory=list)   # text that must not be in a repaired report
    need: list[str] = field(default_factory=list)   # fact ids whose value a repaired report must state
    detail: str = ""

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("draft")
        return d


def _locate(sents: list[Sent], i: int) -> tuple[str, int]:
    sec = sents[i].section
    return sec, sum(1 for s in sents[:i] if s.section == sec)


def _with(sents: list[Sent], i: int, text: str) -> list[Sent]:
    out = list(sents)
    out[i] = Sent(text, sents[i].section, sents[i].entity, sents[i].tag)
    return out


_NUM_UNIT = re.compile(r"(\d+(?:\.\d+)?) ?(mm|cm|mL|ml|cc|cm³)(?![\w²])")
_FABRICATED = {
    "brain": ["There is a small focus of intratumoral haemorrhage.", "Midline shift of 6 mm to the contralateral side.",
              "Mass effect with effacement of the adjacent lateral ventricle.", "A 7 mm cyst is seen within the lesion.",
              "Leptomeningeal enhancement is present."],
    "prostate": ["There is extracapsular extension at the base.", "The right seminal vesicle is invaded.",
                 "A 9 mm simple cyst lies in the transition zone.", "Enlarged obturator lymph nodes are seen.",
                 "Focal capsular bulge suggests extraprostatic extension."],
    "cardiac": ["There is a small pericardial effusion.", "Subendocardial late gadolinium enhancement in the LAD territory.",
                "The left atrium is dilated.", "Moderate mitral regurgitation is present.",
                "An apical LV thrombus is seen."],
}


def _unit_scale(ev, sents, rng) -> list[Case]:
    out = []
    for i, s in enumerate(sents):
        if s.tag != "size" or s.section != "findings":
            continue
        for m in _NUM_UNIT.finditer(s.text):
            u = m.group(2)
            wrong = {"mm": "cm", "cm": "mm", "mL": "L", "ml": "L", "cc": "L", "cm³": "mm³"}[u]
            t = s.text[:m.start(2)] + wrong + s.text[m.end(2):]
            sec, idx = _locate(sents, i)
            out.append(Case("unit_scale", KIND_TYPE["unit_scale"], s.entity, sec, idx, _draft(ev, _with(sents, i, t)),
                            gone=[m.group(1) + " " + wrong], detail=f"{m.group(0)} -> {m.group(1)} {wrong}"))
            break
    return out[:2]


def _value_shift(ev, sents, rng) -> list[Case]:
    out = []
    for i, s in enumerate(sents):
        if s.tag not in ("size", "count") or s.section != "findings":
            continue
        for w in _WORDS[1:]:
            if re.search(rf"\b{w}\b", s.text, re.I) and s.tag == "count":
                new = _WORDS[min(len(_WORDS) - 1, _WORDS.index(w) + int(rng.integers(2, 4)))]
                t = re.sub(rf"\b{w}\b", new, s.text, count=1)
                t = re.sub(rf"\b{w.capitalize()}\b", new.capitalize(), t, count=1)
                sec, idx = _locate(sents, i)
                out.append(Case("value_shift", "contradiction", s.entity, sec, idx, _draft(ev, _with(sents, i, t)),
                                gone=[t], detail=f"{w} -> {new}"))
                break
        nums = [m for m in re.finditer(r"(?<![\w.⁻])(\d+(?:\.\d+)?)(?=\s*(?:mm|cm|mL|ml|cc|cm³|%|g\b|µm|x 10))", s.text)]
        if not nums:
            continue
        m = nums[int(rng.integers(0, len(nums)))]
        factor = rng.uniform(1.25, 1.6) if rng.random() < 0.5 else rng.uniform(0.4, 0.75)
        dec = len(m.group(1).split(".")[1]) if "." in m.group(1) else 0
        new = f"{float(m.group(1)) * factor:.{dec}f}"
        if float(new) == float(m.group(1)):
            continue
        t = s.text[:m.start(1)] + new + s.text[m.end(1):]
        sec, idx = _locate(sents, i)
        out.append(Case("value_shift", "contradiction", s.entity, sec, idx, _draft(ev, _with(sents, i, t)),
                        gone=[t], detail=f"{m.group(1)} -> {new}"))
    idx = rng.permutation(len(out))[:2]
    return [out[int(j)] for j in idx]


def _fabricated(ev, sents, rng) -> list[Case]:
    out = []
    for text in rng.permutation(_FABRICATED[ev.domain])[:2]:
        pos = int(rng.integers(1, sum(s.section == "findings" for s in sents) + 1))
        new = list(sents)
        new.insert(pos, Sent(str(text), "findings", "", "fabricated"))
        out.append(Case("fabricated", "unsupported", "", "findings", pos, _draft(ev, new), gone=[str(text)]))
    return out


_NEGATE = {  # (entity, tag) -> (pattern, replacement) writing a present finding as absent, or the reverse
    ("enhancing", "size"): ["The lesion is non-enhancing.", "There is no enhancing component."],
    ("necrotic_core", "size"): ["The tumour is necrosis-free.", "No necrotic component is seen."],
    ("oedema", "size"): ["There is no perilesional oedema.", "Oedema-free surrounding parenchyma."],
    ("enhancing", "absent"): ["There is avid contrast enhancement of the lesion."],
    ("necrotic_core", "absent"): ["There is central necrosis."],
    ("oedema", "absent"): ["There is extensive perilesional oedema."],
}


def _compound_negation(ev, sents, rng) -> list[Case]:
    out = []
    for i, s in enumerate(sents):
        opts = _NEGATE.get((s.entity, s.tag))
        if ev.domain == "cardiac" and s.tag == "dilated":
            dil = ev.concepts["LV dilatation"].present
            opts = ["The LV is non-dilated."] if dil else ["The LV is moderately dilated."]
        if ev.domain == "cardiac" and s.tag == "hypertrophy":
            opts = ["The LV wall is non-hypertrophied."] if ev.concepts["LV hypertrophy"].present else [
                "There is asymmetric septal hypertrophy."]
        if ev.domain == "prostate" and s.tag == "absent":
            opts = ["A suspicious focal lesion is seen in the left peripheral zone."]
        if not opts or (s.tag == "size" and ev.domain == "brain" and False):
            continue
        text = str(opts[int(rng.integers(0, len(opts)))])
        sec, idx = _locate(sents, i)
        # the size sentence replaced: its facts go with it, so the repair must also state them again
        need = [f.id for f in ev.facts.values() if f.entity == s.entity and f.required] if s.tag == "size" else []
        out.append(Case("compound_negation", "negation", s.entity if ev.domain != "cardiac" else "lv", sec, idx,
                        _draft(ev, _with(sents, i, text)), gone=[text], need=need))
    return [out[int(j)] for j in rng.permutation(len(out))[:2]]


def _absent_with_volume(ev, sents, rng) -> list[Case]:
    out = []
    words = {"enhancing": "No enhancement is seen.", "necrotic_core": "There is no necrosis.",
             "oedema": "No oedema.", "lv": "The left ventricle is unremarkable and not enlarged."}
    for i, s in enumerate(sents):
        if s.tag != "size" or s.entity not in words or s.section != "findings":
            continue
        if s.entity == "lv" and not ev.concepts["LV dilatation"].present:
            continue
        new = list(sents)
        new.insert(i + 1, Sent(words[s.entity], "findings", s.entity, "absent"))
        sec, idx = _locate(new, i + 1)
        out.append(Case("absent_with_volume", "contradiction", s.entity, sec, idx, _draft(ev, new),
                        gone=[words[s.entity]]))
    return [out[int(j)] for j in rng.permutation(len(out))[:1]]


def _grade_word(ev, sents, rng) -> list[Case]:
    i = next(j for j, s in enumerate(sents) if s.tag == "grade")
    s = sents[i]
    if ev.domain == "brain":
        if ev.label == "HGG":
            t = re.sub(r"high[- ]grade glioma( \(WHO grade 3-4\))?", "low-grade glioma (WHO grade 2)", s.text)
        else:
            t = re.sub(r"low[- ]grade glioma( \(WHO grade 2\))?", "high-grade glioma (WHO grade 4)", s.text)
    elif ev.domain == "prostate":
        top = int(ev.label.split()[-1])
        other = top - 1 if top > 2 else top + 2
        t = s.text.replace(_PIRADS_WORD[top], _PIRADS_WORD[other])
        if t == s.text:
            return []
    else:
        other = "NOR" if ev.label != "NOR" else "DCM"
        t = _ACDC_WORDS[other][int(rng.integers(0, 2))]
    sec, idx = _locate(sents, i)
    return [Case("grade_word", "contradiction", "label", sec, idx, _draft(ev, _with(sents, i, t)), gone=[t])]


def _impression_side(ev, sents, rng) -> list[Case]:
    out = []
    if ev.domain == "cardiac":  # a cardiac impression names the group, not a side
        return out
    for i, s in enumerate(sents):
        if s.section != "impression":
            continue
        m = re.search(r"\b(left|right|Left|Right|L|R)\b", s.text)
        if not m:
            continue
        w = m.group(1)
        other = {"left": "right", "right": "left", "Left": "Right", "Right": "Left", "L": "R", "R": "L"}[w]
        if ev.domain == "brain" and rng.random() < 0.5:
            other = "R" if w.lower() == "left" else ("L" if w.lower() == "right" else other)
        t = s.text[:m.start()] + other + s.text[m.end():]
        sec, idx = _locate(sents, i)
        entity = "tumour" if ev.domain == "brain" else s.entity
        out.append(Case("impression_side", "laterality", entity, sec, idx, _draft(ev, _with(sents, i, t)), gone=[t]))
    return out[:1]


def _zone_swap(ev, sents, rng) -> list[Case]:
    out = []
    swap = {"peripheral zone": "transitional zone", "transition zone": "peripheral gland", "PZ": "TZ", "TZ": "PZ"}
    for i, s in enumerate(sents):
        if not s.entity.startswith("lesion_"):
            continue
        m = re.search(r"peripheral zone|transition zone|\bPZ\b|\bTZ\b", s.text)
        if not m:
            continue
        t = s.text[:m.start()] + swap[m.group(0)] + s.text[m.end():]
        sec, idx = _locate(sents, i)
        out.append(Case("zone_swap", "localization", s.entity, sec, idx, _draft(ev, _with(sents, i, t)), gone=[t]))
    return [out[int(j)] for j in rng.permutation(len(out))[:2]]


def _omission(ev, sents, rng) -> list[Case]:
    out = []
    for entity in sorted({s.entity for s in sents if s.tag == "size"}):
        keep = [s for s in sents if s.entity != entity or s.tag not in ("size", "zone")]
        need = [f.id for f in ev.facts.values() if f.entity == entity and f.required]
        if need:
            out.append(Case("omission", "missing", entity, "findings", -1, _draft(ev, keep), need=need))
    return [out[int(j)] for j in rng.permutation(len(out))[:2]]


def _side_comparison(ev, sents, rng) -> list[Case]:
    for i, s in enumerate(sents):
        if s.tag == "comparison":
            t = s.text.replace("larger than", "smaller than")
            sec, idx = _locate(sents, i)
            return [Case("side_comparison", "contradiction", s.entity, sec, idx, _draft(ev, _with(sents, i, t)), gone=[t])]
    return []


_MAKERS = {"unit_scale": _unit_scale, "value_shift": _value_shift, "fabricated": _fabricated,
           "compound_negation": _compound_negation, "absent_with_volume": _absent_with_volume,
           "grade_word": _grade_word, "impression_side": _impression_side, "zone_swap": _zone_swap,
           "omission": _omission, "side_comparison": _side_comparison}


def corrupt(ev: Evidence, sents: list[Sent], seed: int) -> list[Case]:
    rng = np.random.default_rng([seed, DOMAINS.index(ev.domain), 13])
    out = []
    for kind in KINDS:
        out += _MAKERS[kind](ev, sents, rng)
    return out


# ---- harmless paraphrases (must not be flagged) ------------------------------------------------
def _to_cm(m: re.Match) -> str:
    return f"{float(m.group(1)) / 10:.1f} cm" if float(m.group(1)) >= 20 else m.group(0)


def _as_range(m: re.Match) -> str:
    v = float(m.group(1))
    return f"{int(np.floor(v))}-{int(np.floor(v)) + 1} {m.group(2)}" if v >= 10 else m.group(0)


_HARMLESS = [
    (re.compile(r"(\d+) mm(?![\w²])"), _to_cm),
    (re.compile(r"(\d+\.\d) (mL|ml|cc)\b"), lambda m: f"{m.group(1)} cm³"),
    (re.compile(r"(\d+\.\d) (mm)(?![\w²])"), _as_range),
    (re.compile(r"\bin the (left|right)(?:-sided)? (peripheral zone|transition zone)"),
     lambda m: f"in the {m.group(1)[0].upper()} {'PZ' if m.group(2).startswith('p') else 'TZ'}"),
    (re.compile(r"\bLV\b(?! mass)"), lambda m: "left ventricle"),
    (re.compile(r"\(0 of 16 segments\)"), lambda m: "(none of sixteen segments)"),
    (re.compile(r"\bin the (left|right) cerebral hemisphere"), lambda m: f"in the {m.group(1)} hemisphere"),
    (re.compile(r"^A lesion in the"), lambda m: "In the"),
]


def paraphrase(draft: Draft, seed: int) -> Draft:
    """The same report in other harmless words (every fact, side and zone kept)."""
    rng = np.random.default_rng([seed, 99])
    new = draft.model_copy(deep=True)
    for section in ("findings", "impression"):
        out = []
        for s in getattr(new, section):
            if "`[" not in s:  # linked numbers are left as the drafter wrote them
                for pat, rep in _HARMLESS:
                    if rng.random() < 0.7:
                        s = pat.sub(rep, s)
            out.append(s)
        setattr(new, section, out)
    return new


# ---- scoring ---------------------------------------------------------------------------------
def hit(issue: Any, case: Case) -> bool:
    """A critic issue names this error: the right type, and the right entity (a fabricated
    sentence has none: then the right sentence)."""
    if not issue.material or issue.type != case.type:
        return False
    if case.entity:
        return issue.entity == case.entity
    return issue.section == case.section and issue.sentence == case.sentence


def _text(d: Draft) -> str:
    return "\n".join(d.findings + d.impression)


def truly_fixed(final: Draft, case: Case, ev: Evidence) -> bool:
    """Ground truth of a repair, not asking the critic: the wrong text is gone and every fact
    the error had removed is stated again (by its evidence link or its value)."""
    text = _text(final)
    if any(g in text for g in case.gone):
        return False
    for fid in case.need:
        f = ev.facts[fid]
        if f"[{fid}]" not in text and f"{f.value:.1f}" not in text and f"{f.value:.0f} " not in text:
            return False
    return True


class _Given:
    name = "given"

    def __init__(self, draft: Draft):
        self.draft = draft

    def drafts(self, ev, route, exemplars, decimals=1):
        return [self.draft], []


def evaluate(seeds: range, wording: str) -> dict[str, Any]:
    from bcer.agents.r4 import R4Config, R4Loop, reflect

    kinds = {k: {"n": 0, "hit": 0, "repaired": 0, "false_clean": 0} for k in KINDS}
    doms = {d: {"n": 0, "hit": 0, "repaired": 0, "clean_reports": 0, "clean_flagged": 0} for d in DOMAINS}
    per = {d: {k: {"n": 0, "hit": 0} for k in KINDS} for d in DOMAINS}
    misses, alarms, costs = [], [], []
    for seed in seeds:
        for dom in DOMAINS:
            ev = make_evidence(dom, seed)
            clean, sents = write_report(ev, seed)
            if wording == "paraphrased":
                clean = paraphrase(clean, seed)
            t0 = time.perf_counter()
            issues = reflect(clean, ev)
            costs.append(time.perf_counter() - t0)
            doms[dom]["clean_reports"] += 1
            bad = [i for i in issues if i.material]
            doms[dom]["clean_flagged"] += bool(bad)
            if bad and len(alarms) < 40:
                alarms.append({"seed": seed, "domain": dom, "issues": [(i.type, i.entity, i.message) for i in bad],
                               "report": _text(clean)})
            if wording == "paraphrased":
                continue  # the paraphrase pass measures false alarms only
            for case in corrupt(ev, sents, seed):
                t0 = time.perf_counter()
                issues = reflect(case.draft, ev)
                costs.append(time.perf_counter() - t0)
                found = any(hit(i, case) for i in issues)
                out = R4Loop(_Given(case.draft), config=R4Config(k=1, max_passes=2)).run(ev, task=dom)
                declared_clean = not any(i.material for i in out.final_issues)
                fixed = truly_fixed(out.draft, case, ev)
                k, dd = kinds[case.kind], doms[dom]
                for row in (k, dd, per[dom][case.kind]):
                    row["n"] += 1
                    row["hit"] += found
                k["repaired"] += declared_clean and fixed
                dd["repaired"] += declared_clean and fixed
                k["false_clean"] += declared_clean and not fixed
                if (not found or not (declared_clean and fixed)) and len(misses) < 60:
                    misses.append({"seed": seed, "domain": dom, **case.row(), "found": found,
                                   "declared_clean": declared_clean, "fixed": fixed,
                                   "issues": [(i.type, i.entity, i.section, i.sentence) for i in issues][:8],
                                   "final": _text(out.draft) if not fixed else ""})
    return {"kinds": _rates(kinds), "domains": _rates(doms), "per_domain_kind": {d: _rates(v) for d, v in per.items()},
            "cost_ms_per_draft": round(1e3 * float(np.mean(costs)), 3) if costs else None,
            "misses": misses, "false_alarms": alarms}


def _rates(rows: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    out = {}
    for k, r in rows.items():
        o = dict(r)
        if r.get("n"):
            o["recall"] = round(r["hit"] / r["n"], 4)
            if "repaired" in r:
                o["repair_success"] = round(r["repaired"] / r["n"], 4)
        if r.get("clean_reports"):
            o["false_alarm_rate"] = round(r["clean_flagged"] / r["clean_reports"], 4)
        out[k] = o
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", choices=sorted(SPLITS), default="dev")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    t0 = time.time()
    res = {"split": args.split, "seeds": [SPLITS[args.split].start, SPLITS[args.split].stop - 1],
           "base": evaluate(SPLITS[args.split], "base"), "paraphrased": evaluate(SPLITS[args.split], "paraphrased")}
    res["config"] = {"note": "synthetic evidence and reports written by this generator (not patient data, not our "
                             "phantoms' reports); one error per corrupted report; repair = R4 loop, <= 2 passes, "
                             "template tier", "wall_s": round(time.time() - t0, 1), "machine": platform.machine(),
                     "cpus": os.cpu_count(), "python": platform.python_version()}
    for w in ("base", "paraphrased"):
        r = res[w]
        print(w, "cost ms", r["cost_ms_per_draft"])
        for k, v in r["kinds"].items():
            if v.get("n"):
                print(f"  {k:20s} n={v['n']:4d} recall={v['recall']} repair={v['repair_success']} false_clean={v['false_clean']}")
        for d, v in r["domains"].items():
            print(f"  {d:10s} n={v['n']} recall={v.get('recall')} repair={v.get('repair_success')} "
                  f"false_alarm={v.get('false_alarm_rate')}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
