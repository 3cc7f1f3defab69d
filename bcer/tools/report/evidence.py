"""What a report may say: the facts, entities and concepts that its input artifacts establish.

Every fact carries its evidence id ``<node>.<field>.<key>`` (the node output it came from,
``meta["origin"]`` stamped by the executor, else the port name) and the key inside that
artifact; every entity (tumour compartment, cardiac chamber, lesion) carries its side,
zone and boxes; every concept (enhancement, dilatation, a suspicious lesion...) says
whether the evidence shows it present. The drafters write from this, the R4 Reflector
checks a draft against it, the Repairer fixes from it.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from ...contracts.artifacts import Classification, Findings, Table

_SIDE = {"L": "left", "R": "right", "left": "left", "right": "right"}
ACDC_LABELS = ("NOR", "DCM", "HCM", "MINF", "RV")
BORDERLINE_REL = 0.10  # a rule value within 10 % of its threshold is borderline


@dataclass
class Fact:
    """One number a report may state."""

    id: str
    key: str
    name: str
    entity: str
    value: float
    unit: str
    node: str
    field: str
    side: str = ""
    role: str = "measure"  # measure | slice | rule_value | rule_threshold | score | count
    required: bool = False
    integer: bool = False


@dataclass
class Entity:
    id: str
    kind: str  # compartment | chamber | lesion | gland | tumour
    label: str
    side: str = ""
    zone: str = ""
    box_voxel: list[list[int]] | None = None
    box_world: list[list[float]] | None = None
    category: int | None = None


@dataclass
class Concept:
    """A finding that is either present or absent (checked for negation errors)."""

    key: str
    present: bool
    evidence: list[str] = field(default_factory=list)


@dataclass
class Evidence:
    domain: str
    facts: dict[str, Fact] = field(default_factory=dict)
    entities: dict[str, Entity] = field(default_factory=dict)
    concepts: dict[str, Concept] = field(default_factory=dict)
    label: str = ""
    label_id: str = ""
    rules: list[dict[str, Any]] = field(default_factory=list)
    tables: list[tuple[str, Table, dict[str, str]]] = field(default_factory=list)
    sources: list[Any] = field(default_factory=list)  # the input artifacts (their lineage opens the report)

    # ---- lookups ---------------------------------------------------------------------------
    def fact(self, entity: str, name: str) -> Fact | None:
        return next((f for f in self.facts.values() if f.entity == entity and f.name == name), None)

    def lesions(self) -> list[Entity]:
        return [e for e in self.entities.values() if e.kind == "lesion"]

    def foci(self) -> list[Entity]:
        """The separate foci of a multifocal brain tumour (none for a single one)."""
        return [e for e in self.entities.values() if e.kind == "focus"]

    def required_ids(self) -> list[str]:
        return [f.id for f in self.facts.values() if f.required]

    @property
    def laterality(self) -> str:
        """left | right | bilateral | "" of the whole tumour (its union of compartments when the
        table says, else the compartments' one side), for brain reports."""
        t = self.entities.get("tumour")
        if t is not None and t.kind == "tumour":
            return t.side
        sides = {e.side for e in self.entities.values() if e.kind == "compartment" and e.side}
        return sides.pop() if len(sides) == 1 else ("bilateral" if sides else "")

    @property
    def side(self) -> str:
        """The side of the (single, one-sided) tumour, for brain reports."""
        lat = self.laterality
        return lat if lat in ("left", "right") else ""

    # ---- profile (Router, Retriever, memory) -----------------------------------------------
    def profile(self) -> str:
        """no_finding | single | multifocal | borderline (a deciding value near its threshold)."""
        for r in self.rules:
            v, t = r.get("value"), r.get("threshold")
            if _num(v) and _num(t) and float(t) != 0 and abs(float(v) - float(t)) <= BORDERLINE_REL * abs(float(t)):
                return "borderline"
        if self.domain == "prostate":
            n = len(self.lesions())
            return "no_finding" if n == 0 else ("single" if n == 1 else "multifocal")
        if self.domain == "cardiac":
            return "no_finding" if self.label == "NOR" else "single"
        if self.domain == "brain":
            if self.foci():
                return "multifocal"
            return "single" if any(e.kind == "compartment" for e in self.entities.values()) else "no_finding"
        return "single"

    def profile_text(self, history: str = "") -> str:
        """The evidence as one line of words: what the memory embeds and retrieves by."""
        parts = [f"{self.domain} report", f"label {self.label}" if self.label else "", self.profile()]
        for e in self.entities.values():
            if e.kind in ("lesion", "compartment"):
                size = self.fact(e.id, "size_mm") or self.fact(e.id, "max_diameter_mm")
                bits = [e.label, e.side, e.zone, f"category {e.category}" if e.category else "",
                        f"{size.value:.0f} mm" if size else ""]
                parts.append(" ".join(b for b in bits if b))
        parts += [f"{c.key} {'present' if c.present else 'absent'}" for c in self.concepts.values()]
        if history:
            parts.append(f"history {history}")
        return "; ".join(p for p in parts if p)

    def digest(self) -> str:
        blob = json.dumps({"facts": {k: round(f.value, 6) for k, f in sorted(self.facts.items())},
                           "label": self.label, "entities": sorted(self.entities)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def origin_of(artifact: Any, port: str) -> dict[str, str]:
    o = dict(getattr(artifact, "meta", {}).get("origin") or {})
    return {"node": str(o.get("node", port)), "field": str(o.get("field", port))}


def _add(ev: Evidence, origin: dict[str, str], key: str, name: str, entity: str, value: Any, unit: str,
         **kw: Any) -> Fact | None:
    if not _num(value):
        return None
    f = Fact(id=f"{origin['node']}.{origin['field']}.{key}", key=key, name=name, entity=entity,
             value=float(value), unit=unit, node=origin["node"], field=origin["field"],
             integer=isinstance(value, int) or kw.pop("integer", False), **kw)
    ev.facts[f.id] = f
    return f


# ---- per domain ------------------------------------------------------------------------------
_BRAIN_REQUIRED = {"volume_ml", "max_diameter_mm"}
_CARDIAC_SIDE = {"lv": "left", "rv": "right", "myo": "left"}
_CARDIAC_REQUIRED = {"lv_edv_ml", "lv_esv_ml", "lv_ef_pct", "rv_edv_ml", "rv_ef_pct", "myo_mass_g",
                     "lv_edvi_ml_m2", "n_abnormal_segments"}
_PROSTATE_REQUIRED = {"size_mm", "adc", "volume_ml"}
PHASE_AMBIGUITY = "ambiguous cardiac phase"  # ED/ES within the phase curve's noise of the runner-up frames
_PHASE_DOUBT = {"ed_es_confidence", "ed_alternative", "es_alternative", "lv_ef_min_pct", "lv_ef_max_pct"}


def _brain(ev: Evidence, table: Table, origin: dict[str, str]) -> None:
    for i, row in enumerate(table.rows):
        roi = str(row.get("roi", f"row{i}"))
        side = _SIDE.get(str(row.get("side", "")), "")
        ev.entities[roi] = Entity(roi, "compartment", roi.replace("_", " "), side=side)
        for col, v in row.items():
            key = col if len(table.rows) == 1 else f"rows[{i}].{col}"
            _add(ev, origin, key, col, roi, v, table.units.get(col, ""), side=side,
                 required=col in _BRAIN_REQUIRED)
    _whole(ev, table, origin)
    vols = {e: (ev.fact(e, "volume_ml").value if ev.fact(e, "volume_ml") else 0.0)
            for e in ("enhancing", "necrotic_core", "oedema")}
    for concept, roi in (("enhancement", "enhancing"), ("necrosis", "necrotic_core"), ("oedema", "oedema")):
        f = ev.fact(roi, "volume_ml")
        ev.concepts[concept] = Concept(concept, vols[roi] > 0.0, [f.id] if f else [])


def _side_of(v: Any) -> str:
    return "bilateral" if str(v) == "bilateral" else _SIDE.get(str(v), "")


def _whole(ev: Evidence, table: Table, origin: dict[str, str]) -> None:
    """The tumour as a whole (``meta["whole"]`` of quant.roi_features): its side, the share on
    each side of the midline, its foci (each a ``focus`` entity when it is multifocal)."""
    whole = table.meta.get("whole") or {}
    if not whole:
        return
    ev.entities["tumour"] = Entity("tumour", "tumour", "tumour", side=_side_of(whole.get("side", "")))
    for key in ("right_share_pct", "left_share_pct"):
        _add(ev, origin, f"meta.whole.{key}", key, "tumour", whole.get(key), "%")
    n = _add(ev, origin, "meta.whole.n_foci", "n_foci", "tumour", whole.get("n_foci"), "", role="count")
    multifocal = bool(whole.get("multifocal"))
    ev.concepts["multifocal"] = Concept("multifocal", multifocal, [n.id] if n else [])
    if not multifocal:
        return
    for k, f in enumerate(whole.get("foci") or [], start=1):
        fid = f"focus_{f.get('focus', k)}"
        ev.entities[fid] = Entity(fid, "focus", fid.replace("_", " "), side=_side_of(f.get("side", "")))
        for col, unit in (("volume_ml", "mL"), ("max_diameter_mm", "mm")):
            _add(ev, origin, f"meta.whole.foci[{k - 1}].{col}", col, fid, f.get(col), unit, side=ev.entities[fid].side)


def _cardiac(ev: Evidence, table: Table, origin: dict[str, str]) -> None:
    row = table.rows[0] if table.rows else {}
    for col, v in row.items():
        entity = col.split("_", 1)[0] if col.split("_", 1)[0] in _CARDIAC_SIDE else "heart"
        _add(ev, origin, col if len(table.rows) == 1 else f"rows[0].{col}", col, entity, v, table.units.get(col, ""),
             side=_CARDIAC_SIDE.get(entity, ""), required=col in _CARDIAC_REQUIRED,
             role="count" if col.startswith("n_") else "measure")
    for e, label in (("lv", "left ventricle"), ("rv", "right ventricle"), ("myo", "myocardium")):
        ev.entities.setdefault(e, Entity(e, "chamber", label, side=_CARDIAC_SIDE[e]))
    if isinstance(row.get("ed_es_ambiguous"), bool):  # cardiac.ed_es's own verdict on its frames
        conf = ev.fact("heart", "ed_es_confidence")
        ev.concepts[PHASE_AMBIGUITY] = Concept(PHASE_AMBIGUITY, row["ed_es_ambiguous"], [conf.id] if conf else [])
        if row["ed_es_ambiguous"]:  # then the report must state the doubt (R4 inserts it when a draft omits it)
            for f in ev.facts.values():
                if f.node == origin["node"] and f.field == origin["field"] and f.name in _PHASE_DOUBT:
                    f.required = True


def _prostate_findings(ev: Evidence, findings: Findings, origin: dict[str, str]) -> None:
    for f in findings.items:
        ev.entities[f.id] = Entity(f.id, "lesion", f.id, side=_SIDE.get(f.side, f.side), zone=f.zone,
                                   box_voxel=[list(map(int, b)) for b in f.box_voxel],
                                   box_world=[list(map(float, b)) for b in f.box_world])
        side = ev.entities[f.id].side
        _add(ev, origin, f"{f.id}.volume_ml", "volume_ml", f.id, f.volume_ml, "mL", side=side, required=True)
        for attr, unit in (("size_mm", "mm"), ("adc", "1e-6 mm2/s"), ("t2_ratio", "")):
            _add(ev, origin, f"{f.id}.{attr}", attr, f.id, f.attributes.get(attr), unit, side=side,
                 required=attr in _PROSTATE_REQUIRED)
        (k0, k1) = int(f.box_voxel[0][2]), int(f.box_voxel[1][2]) - 1
        _add(ev, origin, f"{f.id}.box_voxel.k_first", "slice_first", f.id, k0, "", side=side, role="slice",
             required=True)
        _add(ev, origin, f"{f.id}.box_voxel.k_last", "slice_last", f.id, k1, "", side=side, role="slice",
             required=True)
    ev.concepts["suspicious lesion"] = Concept("suspicious lesion", bool(findings.items),
                                               [f"{origin['node']}.{origin['field']}.items"])


def _classification(ev: Evidence, c: Classification, origin: dict[str, str]) -> None:
    ev.label, ev.label_id = c.label, f"{origin['node']}.{origin['field']}.label"
    for lesion_id, score in c.scores.items():
        if lesion_id in ev.entities and _num(score):
            ev.entities[lesion_id].category = int(score)
            _add(ev, origin, f"scores.{lesion_id}", "category", lesion_id, int(score), "", role="score",
                 side=ev.entities[lesion_id].side, required=True)
    for i, r in enumerate(c.rule_trace):
        rule = dict(r, index=i)
        for part in ("value", "threshold"):
            f = _add(ev, origin, f"rule_trace[{i}].{part}", f"rule_{part}", "rules", r.get(part), "",
                     role=f"rule_{part}")
            rule[f"{part}_id"] = f.id if f else None
        ev.rules.append(rule)
    if ev.domain == "cardiac":
        _cardiac_concepts(ev)


_ACDC_CONCEPT = {"LVEF < lvef_low": "reduced LV ejection fraction", "LVEDVi > lvedvi_high": "LV dilatation",
                 "max wall >= wall_hcm": "LV hypertrophy", "LV mass index >= mass_index_hcm": "LV hypertrophy",
                 "abnormal segments >= min_abnormal_segments": "regional wall motion abnormality",
                 "RVEDVi > rvedvi_high": "RV dilatation", "RVEF < rvef_low": "reduced RV ejection fraction"}


def _cardiac_concepts(ev: Evidence) -> None:
    for r in ev.rules:
        concept = _ACDC_CONCEPT.get(str(r.get("rule", "")))
        if concept is None:
            continue
        c = ev.concepts.setdefault(concept, Concept(concept, False))
        c.present = c.present or bool(r.get("passed"))
        c.evidence += [x for x in (r.get("value_id"),) if x]


def _cells(ev: Evidence, table: Table, origin: dict[str, str]) -> None:
    for i, row in enumerate(table.rows):
        entity = str(row.get("roi", table.name))
        for col, v in row.items():
            key = col if len(table.rows) == 1 else f"rows[{i}].{col}"
            if f"{origin['node']}.{origin['field']}.{key}" not in ev.facts:
                _add(ev, origin, key, col, entity, v, table.units.get(col, ""))


def _domain(tables: list[Table], c: Classification | None, findings: Findings | None, hint: str) -> str:
    if hint not in ("", "auto"):
        return hint
    if c is not None:
        if c.label in ACDC_LABELS:
            return "cardiac"
        if c.label in ("HGG", "LGG"):
            return "brain"
        if c.label.startswith("PI-RADS"):
            return "prostate"
    if any(t.name in ("cardiac_function", "phases") for t in tables):
        return "cardiac"
    return "prostate" if findings is not None else "general"


def distinct_tables(pairs: list[tuple[str, Table | None]]) -> list[tuple[str, Table]]:
    """The tables given, each once: a planner may bind one table to two ports (the brain report
    printed its compartment block twice because of that)."""
    seen, out = set(), []
    for port, t in pairs:
        if t is None:
            continue
        o = origin_of(t, port)
        key = (o["node"], o["field"]) if "origin" in t.meta else id(t)
        if key in seen or id(t) in seen:
            continue
        seen.update({key, id(t)})
        out.append((port, t))
    return out


def build_evidence(measurements: Table | None = None, features: Table | None = None,
                   classification: Classification | None = None, findings: Findings | None = None,
                   domain: str = "auto") -> Evidence:
    """The Evidence of a report's inputs (the same inputs ``report.structured`` takes)."""
    tables = distinct_tables([("measurements", measurements), ("features", features)])
    dom = _domain([t for _, t in tables], classification, findings, domain)
    ev = Evidence(dom, sources=[a for a in (measurements, features, classification, findings) if a is not None])
    for port, t in tables:
        origin = origin_of(t, port)
        ev.tables.append((port, t, origin))
        if dom == "brain":
            _brain(ev, t, origin)
        elif dom == "cardiac" and t.name != "phases" and any("ef_pct" in k for k in (t.rows[0] if t.rows else {})):
            _cardiac(ev, t, origin)
        elif dom == "prostate" and "gland" not in ev.entities and t.rows:
            ev.entities["gland"] = Entity("gland", "gland", "prostate gland")
            row = t.rows[0]
            _add(ev, origin, "volume_ml" if len(t.rows) == 1 else "rows[0].volume_ml", "volume_ml", "gland",
                 row.get("volume_ml"), t.units.get("volume_ml", "mL"), required=True)
            _add(ev, origin, "max_diameter_mm" if len(t.rows) == 1 else "rows[0].max_diameter_mm",
                 "max_diameter_mm", "gland", row.get("max_diameter_mm"), "mm")
    for port, t, origin in ev.tables:  # every other numeric cell (the measurements appendix cites them)
        _cells(ev, t, origin)
    if findings is not None:
        _prostate_findings(ev, findings, origin_of(findings, "findings"))
    if classification is not None:
        _classification(ev, classification, origin_of(classification, "classification"))
    return ev


__all__ = ["ACDC_LABELS", "PHASE_AMBIGUITY", "Concept", "Entity", "Evidence", "Fact", "build_evidence",
           "distinct_tables", "origin_of"]
