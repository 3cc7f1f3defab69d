"""Deterministic report prose: one template per plan slot, every number through ``num`` (value,
unit and evidence link), every side, zone and category word from the Evidence.

A *plan* is the ordered list of slots a report realises; the default plan per domain is
below, and an exemplar from the memory carries the plan it was written with, so the
template drafter can realise a verified exemplar's structure on new evidence.
"""
from __future__ import annotations

from typing import Callable

from pydantic import BaseModel, ConfigDict, Field

from .evidence import PHASE_AMBIGUITY, Evidence, Fact
from .lexicon import ZONE_WORDS

_UNITS = {"mL/m2": "mL/m²", "g/m2": "g/m²", "m2": "m²", "1e-6 mm2/s": "µm²/s", "mm2/s": "mm²/s"}
_SUPER = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


class Box(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lesion: str
    box_voxel: list[list[int]] = Field(description="[[i0, j0, k0], [i1, j1, k1]], min inclusive, max exclusive")


class Draft(BaseModel):
    """A report draft: Findings and Impression sentences plus lesion boxes (text and boxes)."""

    model_config = ConfigDict(extra="forbid")
    findings: list[str] = Field(default_factory=list)
    impression: list[str] = Field(default_factory=list)
    boxes: list[Box] = Field(default_factory=list)
    plan: list[str] = Field(default_factory=list)
    source: str = "template"

    def sentences(self) -> list[tuple[str, int, str]]:
        return [("findings", i, s) for i, s in enumerate(self.findings)] + \
               [("impression", i, s) for i, s in enumerate(self.impression)]


def unit_text(u: str) -> str:
    """Units without ASCII digits (so every ASCII digit outside code spans is a number)."""
    return _UNITS.get(u, u.translate(_SUPER))


def value_text(f: Fact, decimals: int = 1) -> str:
    if f.integer:
        return str(int(round(f.value)))
    d = max(decimals, 2) if abs(f.value) < 1 or f.unit == "m2" else decimals
    text = f"{round(f.value, d) + 0.0:.{d}f}"
    return f"{0.0:.{d}f}" if float(text) == 0 else text


def num(f: Fact | None, decimals: int = 1, unit: str | None = None) -> str:
    """``17.5 mL `[node.field.key]` ``: the only way a template writes a number."""
    if f is None:
        return ""
    u = unit_text(f.unit if unit is None else unit)
    u = f" {u}" if u and u not in ("frame", "frames", "segments") else ""
    return f"{value_text(f, decimals)}{u} `[{f.id}]`"


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# ---- brain -------------------------------------------------------------------------------------
def _crosses(ev: Evidence) -> bool:
    """Tissue on both sides of the midline in one piece (not separate foci, one on each side)."""
    return ev.laterality == "bilateral" and (not ev.foci() or any(e.side == "bilateral" for e in ev.foci()))


def _brain_overview(ev: Evidence, d: int) -> list[str]:
    side = ev.side
    out = [f"There is a {side}-hemispheric intra-axial tumour." if side else "There is an intra-axial tumour."]
    right, left = ev.fact("tumour", "right_share_pct"), ev.fact("tumour", "left_share_pct")
    if ev.laterality == "bilateral" and right and left:
        out.append(f"It crosses the midline: {num(right, d)} of it lies right and {num(left, d)} left of the midline."
                   if _crosses(ev) else f"Its foci lie on both sides of the midline: {num(right, d)} of the tumour "
                                        f"right and {num(left, d)} left of it.")
    foci = ev.foci()
    if foci:
        out.append(f"It is multifocal, with {num(ev.fact('tumour', 'n_foci'), d, unit='')} separate foci.")
        out += [f"Focus `{e.id}` is {f'{e.side}-hemispheric' if e.side in ('left', 'right') else 'across the midline'}"
                f", {num(ev.fact(e.id, 'volume_ml'), d)} in volume and {num(ev.fact(e.id, 'max_diameter_mm'), d)} in "
                f"largest diameter." for e in foci]
    return out


def _brain_part(roi: str, present: str, absent: str) -> Callable[[Evidence, int], list[str]]:
    def slot(ev: Evidence, d: int) -> list[str]:
        vol, diam = ev.fact(roi, "volume_ml"), ev.fact(roi, "max_diameter_mm")
        if vol is None or vol.value <= 0:
            return [absent]
        return [present.format(vol=num(vol, d), diam=num(diam, d))]
    return slot


def _brain_impression(ev: Evidence, d: int) -> list[str]:
    side = ev.side
    where = (f"{_cap(side)}-hemispheric glioma" if side else "Intra-axial glioma crossing the midline" if _crosses(ev)
             else "Bilateral intra-axial glioma" if ev.laterality == "bilateral" else "Intra-axial glioma")
    where = f"Multifocal {where[0].lower()}{where[1:]}" if ev.foci() else where
    grade = {"HGG": "a high-grade glioma (`HGG`)", "LGG": "a low-grade glioma (`LGG`)"}.get(ev.label, f"`{ev.label}`")
    out = [f"{where} with features of {grade}."]
    rule = next((r for r in ev.rules if "enhancing volume" in str(r.get("rule"))), None)
    if rule is not None and rule.get("value_id") and rule.get("threshold_id"):
        v, t = ev.facts[rule["value_id"]], ev.facts[rule["threshold_id"]]
        out.append(f"The enhancing component of {num(v, d, 'mL')} is at or above the {num(t, d, 'mL')} threshold."
                   if rule.get("passed") else f"There is no enhancing component above the {num(t, d, 'mL')} threshold.")
    return out


# ---- cardiac -----------------------------------------------------------------------------------
def _cf(ev: Evidence, name: str) -> Fact | None:
    return next((f for f in ev.facts.values() if f.name == name and f.entity in ("lv", "rv", "myo", "heart")), None)


def _cardiac_lv(ev: Evidence, d: int) -> list[str]:
    edvi = _cf(ev, "lv_edvi_ml_m2")
    return [f"The left ventricle measures {num(_cf(ev, 'lv_edv_ml'), d)} at end-diastole"
            + (f" ({num(edvi, d)} indexed)" if edvi else "")
            + f" and {num(_cf(ev, 'lv_esv_ml'), d)} at end-systole, with an ejection fraction of "
              f"{num(_cf(ev, 'lv_ef_pct'), d)}."]


def _cardiac_phases(ev: Evidence, d: int) -> list[str]:
    """The frames used, and, where cardiac.ed_es flags them as within its noise, the frames it
    cannot tell them from and the EF range over those: how far the EF rests on that choice."""
    ed, es = _cf(ev, "ed_frame"), _cf(ev, "es_frame")
    if ed is None or es is None:
        return []
    out = [f"End-diastole is frame {num(ed, d)} and end-systole frame {num(es, d)} of the cine."]
    c = ev.concepts.get(PHASE_AMBIGUITY)
    conf, lo, hi = _cf(ev, "ed_es_confidence"), _cf(ev, "lv_ef_min_pct"), _cf(ev, "lv_ef_max_pct")
    alts = [(word, f) for word, f in (("end-diastole", _cf(ev, "ed_alternative")),
                                      ("end-systole", _cf(ev, "es_alternative"))) if f is not None]
    if c is None or not c.present or None in (conf, lo, hi) or not alts:
        return out
    which = " or ".join(f"{word} from frame {num(f, d)}" for word, f in alts)
    out.append(f"The phase curve does not clearly separate {which} (phase confidence {num(conf, 2)}); with "
               f"{'that frame' if len(alts) == 1 else 'those frames'} the left ventricular ejection fraction "
               f"would lie between {num(lo, d)} and {num(hi, d)}.")
    return out


def _cardiac_mass(ev: Evidence, d: int) -> list[str]:
    mass, idx, wall = _cf(ev, "myo_mass_g"), _cf(ev, "lv_mass_index_g_m2"), _cf(ev, "max_wall_thickness_mm")
    if mass is None:
        return []
    s = f"Left ventricular myocardial mass is {num(mass, d)}" + (f" ({num(idx, d)} indexed)" if idx else "")
    return [s + (f", with a maximal wall thickness of {num(wall, d)}." if wall else ".")]


def _cardiac_rv(ev: Evidence, d: int) -> list[str]:
    edvi = _cf(ev, "rv_edvi_ml_m2")
    return [f"The right ventricle measures {num(_cf(ev, 'rv_edv_ml'), d)} at end-diastole"
            + (f" ({num(edvi, d)} indexed)" if edvi else "")
            + f", with an ejection fraction of {num(_cf(ev, 'rv_ef_pct'), d)}."]


def _cardiac_regional(ev: Evidence, d: int) -> list[str]:
    n, total = _cf(ev, "n_abnormal_segments"), _cf(ev, "n_segments")
    if n is None:
        return []
    of = f" of {num(total, d)} segments" if total else " segments"
    c = ev.concepts.get("regional wall motion abnormality")
    if c is not None and c.present:
        return [f"There is regional wall motion abnormality in {num(n, d)}{of}."]
    return [f"There is no regional wall motion abnormality ({num(n, d)}{of} with abnormal thickening)."]


def _cardiac_morphology(ev: Evidence, d: int) -> list[str]:
    out = []
    for key, chamber in (("LV dilatation", "left"), ("RV dilatation", "right")):
        c = ev.concepts.get(key)
        if c is not None:
            out.append(f"The {chamber} ventricle is {'dilated' if c.present else 'not dilated'}.")
    c = ev.concepts.get("LV hypertrophy")
    if c is not None:
        out.append("There is left ventricular hypertrophy." if c.present else "There is no left ventricular hypertrophy.")
    return out


def _cardiac_function(ev: Evidence, d: int) -> list[str]:
    out = []
    for key, chamber in (("reduced LV ejection fraction", "left"), ("reduced RV ejection fraction", "right")):
        c = ev.concepts.get(key)
        if c is not None:
            out.append(f"There is {'reduced' if c.present else 'preserved'} {chamber} ventricular systolic function.")
    return out


_ACDC_TEXT = {"NOR": "Normal cardiac study (ACDC group `NOR`).",
              "DCM": "Findings consistent with dilated cardiomyopathy (`DCM`).",
              "HCM": "Findings consistent with hypertrophic cardiomyopathy (`HCM`).",
              "MINF": "Findings consistent with previous myocardial infarction (`MINF`).",
              "RV": "Findings consistent with an abnormal right ventricle (`RV`)."}


def _cardiac_impression(ev: Evidence, d: int) -> list[str]:
    out = [_ACDC_TEXT.get(ev.label, f"ACDC group `{ev.label}`.")]
    ef = _cf(ev, "lv_ef_pct")
    if ef is not None:
        out.append(f"Left ventricular ejection fraction {num(ef, d)}.")
    return out


# ---- prostate ----------------------------------------------------------------------------------
def _zone(code: str) -> str:
    return ZONE_WORDS.get(code, code or "gland")


def _prostate_gland(ev: Evidence, d: int) -> list[str]:
    f = ev.fact("gland", "volume_ml")
    return [f"The prostate gland measures {num(f, d)} in volume."] if f else []


def _prostate_lesions(ev: Evidence, d: int) -> list[str]:
    lesions = ev.lesions()
    if not lesions:
        return ["No suspicious focal lesion is seen."]
    out = []
    for e in lesions:
        f = lambda n: ev.fact(e.id, n)  # noqa: E731
        s = (f"In the {e.side} {_zone(e.zone)} there is a focal lesion (`{e.id}`) of {num(f('size_mm'), d)} in "
             f"largest diameter and {num(f('volume_ml'), d)} in volume, on slices {num(f('slice_first'), d)} to "
             f"{num(f('slice_last'), d)}, with an ADC of {num(f('adc'), d)}")
        t2 = f("t2_ratio")
        out.append(s + (f" and a `T2w` signal ratio of {num(t2, d)}." if t2 else "."))
    return out


def _prostate_impression(ev: Evidence, d: int) -> list[str]:
    lesions = ev.lesions()
    out = [f"`{e.id}` ({e.side} {_zone(e.zone)}) is assigned PI-RADS category {num(ev.fact(e.id, 'category'), d)}."
           for e in lesions if ev.fact(e.id, "category")]
    label = f"`{ev.label}`" if ev.label else "not assessed"
    out.append(f"Overall assessment: {label}." if lesions else f"Overall assessment: {label}, no suspicious lesion.")
    return out


# ---- general -----------------------------------------------------------------------------------
def _general(ev: Evidence, d: int) -> list[str]:
    return [f"{f.name.replace('_', ' ').capitalize()}: {num(f, d)}." for f in ev.facts.values()
            if f.role in ("measure", "count") and f.required]


def _general_impression(ev: Evidence, d: int) -> list[str]:
    return [f"Conclusion: `{ev.label}`."] if ev.label else []


SLOTS: dict[str, Callable[[Evidence, int], list[str]]] = {
    "brain.overview": _brain_overview,
    "brain.enhancing": _brain_part("enhancing", "The enhancing component measures {vol} in volume and {diam} in "
                                   "largest diameter.", "No enhancing component is seen."),
    "brain.necrosis": _brain_part("necrotic_core", "A necrotic core of {vol} is present, {diam} in largest diameter.",
                                  "There is no necrotic core."),
    "brain.oedema": _brain_part("oedema", "Surrounding oedema measures {vol}, extending up to {diam}.",
                                "There is no surrounding oedema."),
    "brain.impression": _brain_impression,
    "cardiac.lv": _cardiac_lv, "cardiac.phases": _cardiac_phases, "cardiac.mass": _cardiac_mass,
    "cardiac.rv": _cardiac_rv,
    "cardiac.regional": _cardiac_regional, "cardiac.morphology": _cardiac_morphology,
    "cardiac.function": _cardiac_function, "cardiac.impression": _cardiac_impression,
    "prostate.gland": _prostate_gland, "prostate.lesions": _prostate_lesions,
    "prostate.impression": _prostate_impression,
    "general.facts": _general, "general.impression": _general_impression,
}
_PLANS = {"brain": ["brain.overview", "brain.enhancing", "brain.necrosis", "brain.oedema", "brain.impression"],
          "cardiac": ["cardiac.lv", "cardiac.phases", "cardiac.mass", "cardiac.rv", "cardiac.regional",
                      "cardiac.morphology", "cardiac.function", "cardiac.impression"],
          "prostate": ["prostate.gland", "prostate.lesions", "prostate.impression"],
          "general": ["general.facts", "general.impression"]}


def is_impression(slot: str) -> bool:
    return slot.endswith("impression")


def default_plan(ev: Evidence) -> list[str]:
    return list(_PLANS.get(ev.domain, _PLANS["general"]))


def slot_sentences(ev: Evidence, slot: str, decimals: int = 1) -> list[str]:
    fn = SLOTS.get(slot)
    return [s for s in fn(ev, decimals) if s] if fn else []


def evidence_boxes(ev: Evidence) -> list[Box]:
    return [Box(lesion=e.id, box_voxel=e.box_voxel) for e in ev.lesions() if e.box_voxel]


def realise(ev: Evidence, plan: list[str] | None = None, decimals: int = 1, source: str = "template") -> Draft:
    """The draft a plan gives on this evidence. Slots of another domain are skipped, and every
    slot of this domain's default plan that the plan lacks is appended (nothing is dropped)."""
    plan = [s for s in (plan or []) if s in SLOTS and s.split(".")[0] == ev.domain.split(".")[0]] or default_plan(ev)
    plan += [s for s in default_plan(ev) if s not in plan]
    draft = Draft(plan=plan, boxes=evidence_boxes(ev), source=source)
    for slot in plan:
        (draft.impression if is_impression(slot) else draft.findings).extend(slot_sentences(ev, slot, decimals))
    return draft


__all__ = ["Box", "Draft", "SLOTS", "default_plan", "evidence_boxes", "is_impression", "num", "realise",
           "slot_sentences", "unit_text", "value_text"]
