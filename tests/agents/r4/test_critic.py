"""The R4 critic on radiologists' wordings (issue 31): units with conversions, closed world,
consistency across sentences, grade/likelihood words, side abbreviations and comparisons,
compound negation, counts in words and ranges, omissions, metadata lines, the honest final
verdict (page, case row, the contract's validator) and the LLM's validated second opinion.
Evidence is built from small hand-written tool outputs, so every expected value is known."""
from __future__ import annotations

import json

import pytest

from bcer.agents.llm.base import LLMReply
from bcer.agents.r4 import LLMSecondOpinion, R4Config, R4Loop, reflect, repair
from bcer.agents.r4.reviewer import R4Reviewer
from bcer.contracts.artifacts import Classification, Finding, Findings, Report, Table
from bcer.engine.outputs import measurement_records
from bcer.engine.review import ReviewRequest
from bcer.tools.report import build_evidence
from bcer.tools.report.prose import Draft, evidence_boxes


def _o(art, node, fld):
    art.meta["origin"] = {"node": node, "field": fld}
    return art


@pytest.fixture(scope="module")
def brain():
    rows = [{"roi": "enhancing", "volume_ml": 42.46, "max_diameter_mm": 71.19, "side": "L"},
            {"roi": "necrotic_core", "volume_ml": 17.52, "max_diameter_mm": 41.55, "side": "L"},
            {"roi": "oedema", "volume_ml": 105.66, "max_diameter_mm": 103.85, "side": "L"}]
    t = _o(Table(rows, {"volume_ml": "mL", "max_diameter_mm": "mm"}, "roi_features"), "q", "features")
    c = _o(Classification("HGG", [{"rule": "enhancing volume >= min_enhancing_ml", "value": 42.46, "threshold": 0.5,
                                   "passed": True}]), "g", "classification")
    return build_evidence(measurements=t, classification=c, domain="brain")


@pytest.fixture(scope="module")
def prostate():
    t = _o(Table([{"roi": "gland", "volume_ml": 31.96, "max_diameter_mm": 45.0}], {"volume_ml": "mL", "max_diameter_mm": "mm"},
                 "roi_features"), "q", "features")
    f = _o(Findings([Finding("lesion_1", "lesion", ((46, 44, 13), (53, 50, 15)), ((0, 0, 0), (1, 1, 1)), volume_ml=0.29,
                             side="L", zone="PZ", attributes={"size_mm": 10.06, "adc": 659.2})]), "d", "findings")
    c = _o(Classification("PI-RADS 4", [], scores={"lesion_1": 4.0}), "p", "classification")
    return build_evidence(measurements=t, findings=f, classification=c, domain="prostate")


@pytest.fixture(scope="module")
def cardiac():
    row = {"lv_edv_ml": 250.0, "lv_esv_ml": 190.0, "lv_ef_pct": 24.0, "rv_edv_ml": 150.0, "rv_ef_pct": 55.0,
           "myo_mass_g": 140.0, "lv_edvi_ml_m2": 130.0, "n_segments": 16, "n_abnormal_segments": 4}
    units = {"lv_edv_ml": "mL", "lv_esv_ml": "mL", "lv_ef_pct": "%", "rv_edv_ml": "mL", "rv_ef_pct": "%",
             "myo_mass_g": "g", "lv_edvi_ml_m2": "mL/m2", "n_segments": "segments", "n_abnormal_segments": "segments"}
    t = _o(Table([row], units, "cardiac_function"), "f", "function")
    rules = [("LVEF < lvef_low", 24.0, 40.0, True), ("LVEDVi > lvedvi_high", 130.0, 100.0, True),
             ("abnormal segments >= min_abnormal_segments", 4, 2.0, True), ("RVEDVi > rvedvi_high", 75.0, 110.0, False)]
    c = _o(Classification("DCM", [{"rule": r, "value": v, "threshold": th, "passed": p} for r, v, th, p in rules]),
           "a", "classification")
    return build_evidence(measurements=t, classification=c, domain="cardiac")


BRAIN = ["Intra-axial mass in the left hemisphere.",
         "The contrast-enhancing portion measures 42.5 mL and spans 71 mm.",
         "Central necrosis of 17.5 cc (41.6 mm across).",
         "Perilesional vasogenic oedema of 105.7 mL extends over 10.4 cm."]
BRAIN_IMP = ["Left hemispheric glioma; appearances favour a high-grade glioma (WHO grade 3-4)."]
PROSTATE = ["The prostate gland volume is 32.0 mL.",
            "A lesion in the L PZ measures 10.1 mm (0.29 mL), with an ADC of 659 µm²/s, on images 13 to 14."]
PROSTATE_IMP = ["PI-RADS v2.1 category 4 for lesion 1 in the left peripheral zone.",
                "Overall PI-RADS 4: high likelihood of clinically significant cancer."]
CARDIAC = ["LV end-diastolic volume 250 mL (130 mL/m² indexed), end-systolic volume 190 ml, LVEF 24%.",
           "LV mass 140 g.", "RV end-diastolic volume 150 mL, RVEF 55%.", "Regional hypokinesis in four of 16 segments.",
           "The LV is dilated.", "The LV is larger than the RV."]
CARDIAC_IMP = ["Appearances are those of a dilated cardiomyopathy."]


def _d(findings, impression, ev=None):
    return Draft(findings=list(findings), impression=list(impression), source="test",
                 boxes=evidence_boxes(ev) if ev is not None else [])


def _material(issues):
    return [(i.type, i.entity) for i in issues if i.material]


def test_radiologist_wordings_are_read_without_false_alarm(brain, prostate, cardiac):
    """Free text with other units (cc, cm), side abbreviations, counts in words, a location
    without an id, PI-RADS v2.1 and WHO wording: nothing to flag, every required fact stated."""
    assert _material(reflect(_d(BRAIN, BRAIN_IMP), brain)) == []
    assert _material(reflect(_d(PROSTATE, PROSTATE_IMP, prostate), prostate)) == []
    assert _material(reflect(_d(CARDIAC, CARDIAC_IMP), cardiac)) == []
    ranged = _d([PROSTATE[0], PROSTATE[1].replace("10.1 mm", "10-11 mm")], PROSTATE_IMP, prostate)
    assert _material(reflect(ranged, prostate)) == []  # a range that holds the value
    header = _d(["Research use only; the default models were validated on synthetic data only."] + BRAIN, BRAIN_IMP)
    assert _material(reflect(header, brain)) == []  # metadata lines are not findings


def test_units_with_conversions_and_repair_of_number_and_unit(brain):
    wrong = _d([BRAIN[0], BRAIN[1].replace("71 mm", "71 cm")] + BRAIN[2:], BRAIN_IMP)  # x10 through the unit
    (issue,) = [i for i in reflect(wrong, brain) if i.material]
    assert (issue.type, issue.entity, issue.expected) == ("contradiction", "enhancing", pytest.approx(71.19))
    fixed, _ = repair(wrong, brain, [issue])
    assert "71.2 mm `[q.features.rows[0].max_diameter_mm]`" in fixed.findings[1] and "cm" not in fixed.findings[1]
    litres = _d([BRAIN[0], BRAIN[1].replace("42.5 mL", "42.5 L")] + BRAIN[2:], BRAIN_IMP)
    assert _material(reflect(litres, brain)) == [("contradiction", "enhancing")]
    linked = _d([BRAIN[0], "Enhancing tumour 7.1 cm `[q.features.rows[0].max_diameter_mm]` across, 42.5 mL."]
                + BRAIN[2:], BRAIN_IMP)
    assert _material(reflect(linked, brain)) == []  # the same length in another unit is right


def test_closed_world_removes_unsupported_findings(brain, prostate, cardiac):
    for ev, f, imp, claim in ((brain, BRAIN, BRAIN_IMP, "There is a small focus of intratumoral haemorrhage."),
                              (brain, BRAIN, BRAIN_IMP, "Mass effect on the left lateral ventricle."),
                              (prostate, PROSTATE, PROSTATE_IMP, "There is extracapsular extension at the base."),
                              (cardiac, CARDIAC, CARDIAC_IMP, "Subendocardial late gadolinium enhancement.")):
        bad = _d(f[:1] + [claim] + f[1:], imp, ev)
        issues = [i for i in reflect(bad, ev) if i.material]
        assert [(i.type, i.sentence) for i in issues] == [("unsupported", 1)]
        fixed, _ = repair(bad, ev, issues)
        assert fixed.findings == list(f)  # removed, never rewritten into agreement


def test_contradictions_across_sentences(brain, cardiac, prostate):
    bad = _d(BRAIN[:3] + ["There is no necrosis."] + BRAIN[3:], BRAIN_IMP)
    (issue,) = [i for i in reflect(bad, brain) if i.material]
    assert (issue.type, issue.entity, issue.sentence) == ("contradiction", "necrotic_core", 3)
    out = R4Loop(_Given(bad), config=R4Config(k=1)).run(brain, task="brain_report")
    assert "There is no necrosis." not in out.draft.findings and BRAIN[2] in out.draft.findings
    assert out.verdict == "clean"
    grade = _d(BRAIN, ["Left hemispheric glioma; appearances favour a low-grade glioma (WHO grade 2)."])
    assert sorted(_material(reflect(grade, brain))) == [("contradiction", "label")] * 2
    normal = _d(CARDIAC, ["Normal biventricular size and systolic function."])
    assert ("contradiction", "label") in _material(reflect(normal, cardiac))
    compare = _d(CARDIAC[:-1] + ["The LV is smaller than the RV."], CARDIAC_IMP)
    assert _material(reflect(compare, cardiac)) == [("contradiction", "lv")]
    side = _d(PROSTATE, [PROSTATE_IMP[0].replace("left", "right"), PROSTATE_IMP[1]], prostate)
    assert _material(reflect(side, prostate)) == [("laterality", "lesion_1")]
    likely = _d(PROSTATE, [PROSTATE_IMP[0], PROSTATE_IMP[1].replace("high", "intermediate")], prostate)
    assert _material(reflect(likely, prostate)) == [("contradiction", "label")]


def test_compound_negation_zone_synonym_count_words_and_omission(brain, prostate, cardiac):
    neg = _d([BRAIN[0], "The lesion is non-enhancing."] + BRAIN[2:], BRAIN_IMP)
    assert ("negation", "enhancing") in _material(reflect(neg, brain))
    zone = _d([PROSTATE[0], PROSTATE[1].replace("L PZ", "L transitional zone")], PROSTATE_IMP, prostate)
    assert _material(reflect(zone, prostate)) == [("localization", "lesion_1")]
    count = _d(CARDIAC[:3] + ["Regional hypokinesis in seven of 16 segments."] + CARDIAC[4:], CARDIAC_IMP)
    (issue,) = [i for i in reflect(count, cardiac) if i.material]
    assert (issue.type, issue.entity, issue.expected) == ("contradiction", "heart", 4.0)
    gone = _d(BRAIN[:3], BRAIN_IMP)  # the oedema sentence left out
    (issue,) = [i for i in reflect(gone, brain) if i.material]
    assert (issue.type, issue.entity) == ("missing", "oedema") and issue.fix.sentences


class _Given:
    name = "given"

    def __init__(self, draft):
        self.draft = draft

    def drafts(self, ev, route, exemplars, decimals=1):
        return [self.draft], []


def test_unresolved_report_is_never_called_clean(brain, tmp_path):
    """No repair pass allowed: the final fresh critique keeps the error, the page carries the
    warning, the case row the verdict, and the contract's validator fails the report."""
    from bcer.contracts.task import Validator
    from bcer.engine.outputs import write_artifact
    from bcer.engine.validate import VALIDATORS

    bad = _d([BRAIN[0], BRAIN[1].replace("42.5 mL", "52.5 mL")] + BRAIN[2:], BRAIN_IMP)
    out = R4Loop(_Given(bad), config=R4Config(k=1, max_passes=0)).run(brain, task="brain_report")
    assert out.verdict == "unresolved" and out.summary()["material_issues"] == 1
    seed = Report("x", {"findings": bad.findings, "impression": bad.impression})
    inputs = {"measurements": brain.tables[0][1]}
    req = ReviewRequest("c1", "brain_report", "r", "report", seed, inputs, {"domain": "brain"})
    reviewer = R4Reviewer(config=R4Config(k=1, max_passes=0))
    reviewer.drafter = _Given(bad)  # the template drafter would write a clean draft that wins best-of-k
    res = reviewer.review(req)
    assert res.report.text.startswith("> **Not verified: the R4 critic found 1 unresolved issue(s)")
    assert res.report.structured["critic"]["verdict"] == "unresolved"
    rows = {r["measure"]: r["raw"] for r in measurement_records("report", res.report)}
    assert rows == {"r4_verdict": "unresolved", "r4_material_issues": 1}
    files = write_artifact(res.report, tmp_path / "report.md")
    ok, why = VALIDATORS["report_verified"](files[0], Validator(type="report_verified"), None)
    assert not ok and "1 unresolved" in why
    clean = R4Reviewer(config=R4Config(k=1, max_passes=2)).review(req)
    files = write_artifact(clean.report, tmp_path / "clean.md")
    assert VALIDATORS["report_verified"](files[0], Validator(type="report_verified"), None)[0]
    assert clean.report.structured["critic"]["verdict"] == "clean" and not clean.report.text.startswith(">")


class _FakeLLM:
    def __init__(self, text):
        self.text, self.calls = text, 0

    def complete(self, messages, json_schema=None, n=1, temperature=0.0, max_tokens=0):
        self.calls += 1
        return LLMReply(texts=[self.text], backend="fake", model="fake", prompt_digest="x")


def test_second_opinion_is_validated_against_the_evidence(cardiac):
    odd = _d(CARDIAC + ["Biventricular ejection: LV 24, RV 55."], CARDIAC_IMP)
    rules = [i for i in reflect(odd, cardiac) if i.material]
    assert [(i.type, i.sentence) for i in rules] == [("unsupported", 6)] * 2  # two unit-less numbers
    lv, rv = "f.function.lv_ef_pct", "f.function.rv_ef_pct"
    good = json.dumps({"claims": [{"index": 0, "fact": lv, "value": 24}, {"index": 0, "fact": rv, "value": 55}]})
    issues, call = LLMSecondOpinion(_FakeLLM(good)).review(odd, cardiac, rules)
    assert issues == [] and call["cleared"] == 1
    off = _d(CARDIAC + ["Biventricular ejection: LV 35, RV 55."], CARDIAC_IMP)
    claim = json.dumps({"claims": [{"index": 0, "fact": lv, "value": 35}, {"index": 0, "fact": rv, "value": 55}]})
    (issue,) = LLMSecondOpinion(_FakeLLM(claim)).review(off, cardiac, [i for i in reflect(off, cardiac)])[0]
    assert (issue.type, issue.entity, issue.expected) == ("contradiction", "lv", 24.0)
    invented = json.dumps({"claims": [{"index": 0, "fact": lv, "value": 24}, {"index": 0, "fact": rv, "value": 61}]})
    assert LLMSecondOpinion(_FakeLLM(invented)).review(odd, cardiac, rules)[0] == rules  # 61 is not in the text
    assert LLMSecondOpinion(_FakeLLM("no json")).review(odd, cardiac, rules)[0] == rules
    loop = R4Loop(_Given(odd), config=R4Config(k=1), opinion=LLMSecondOpinion(_FakeLLM(good)))
    out = loop.run(cardiac, task="cardiac_report")
    assert out.verdict == "clean" and odd.findings[6] in out.draft.findings  # kept: the LLM's reading held


def test_location_without_id_names_the_lesion_there():
    t = _o(Table([{"roi": "gland", "volume_ml": 40.0}], {"volume_ml": "mL"}, "roi_features"), "q", "features")
    items = [Finding(f"lesion_{k}", "lesion", ((10 * k, 10, 5), (10 * k + 5, 15, 8)), ((0, 0, 0), (1, 1, 1)),
                     volume_ml=0.5, side=side, zone=zone, attributes={"size_mm": 9.0 + k, "adc": 700.0})
             for k, side, zone in ((1, "L", "PZ"), (2, "R", "TZ"))]
    c = _o(Classification("PI-RADS 4", [], scores={"lesion_1": 4.0, "lesion_2": 3.0}), "p", "classification")
    ev = build_evidence(measurements=t, findings=_o(Findings(items), "d", "findings"), classification=c)
    base = ["The prostate gland volume is 40.0 mL."] + [
        f"Lesion {k} in the {w} measures {9 + k}.0 mm (0.5 mL), ADC 700 µm²/s, on images 5 to 7." for k, w in
        ((1, "left PZ"), (2, "right TZ"))]
    imp = ["Lesion 1 (left PZ): PI-RADS 4.", "Lesion 2 (right TZ): PI-RADS 3.", "Overall PI-RADS 4."]
    assert _material(reflect(_d(base + ["The right transition zone lesion measures 11 mm."], imp, ev), ev)) == []
    wrong = _d(base + ["The right transition zone lesion measures 14 mm."], imp, ev)
    assert _material(reflect(wrong, ev)) == [("contradiction", "lesion_2")]  # the lesion at that location
    nowhere = _d(base + ["A further lesion in the right PZ is suspicious."], imp, ev)
    assert _material(reflect(nowhere, ev)) == [("localization", "")]


def test_a_value_that_is_another_facts_is_wrong_for_the_fact_named(cardiac):
    """The EDV written with the ESV's value: the words name the EDV, so it is a contradiction
    (not a correct ESV), and the repaired report no longer carries it."""
    bad = _d([CARDIAC[0].replace("volume 250 mL", "volume 190 mL")] + CARDIAC[1:], CARDIAC_IMP)
    (issue,) = [i for i in reflect(bad, cardiac) if i.material]
    assert (issue.type, issue.entity, issue.expected) == ("contradiction", "lv", 250.0)
    out = R4Loop(_Given(bad), config=R4Config(k=1)).run(cardiac, task="cardiac_report")
    assert out.verdict == "clean" and not any("volume 190 mL (130" in s for s in out.draft.findings)
    count = _d(CARDIAC[:3] + ["Four segments are hypokinetic."] + CARDIAC[4:], CARDIAC_IMP)
    assert _material(reflect(count, cardiac)) == []  # the quantity word after the number


def test_the_contract_lists_what_the_report_must_state():
    from bcer.agents.r4.reviewer import _contract_requires, require

    row = {"lv_edv_ml": 250.0, "lv_ef_pct": 24.0, "rv_edv_ml": 150.0, "rv_ef_pct": 55.0, "myo_mass_g": 140.0}
    units = {"lv_edv_ml": "mL", "lv_ef_pct": "%", "rv_edv_ml": "mL", "rv_ef_pct": "%", "myo_mass_g": "g"}
    t = _o(Table([row], units, "cardiac_function"), "f", "function")
    draft = _d(["LV end-diastolic volume 250 mL, LVEF 24%.", "LV mass 140 g."], ["ACDC group `DCM`."])
    ev = build_evidence(measurements=t, classification=_o(Classification("DCM"), "a", "classification"))
    require(ev, _contract_requires("cardiac_report"))
    (issue,) = [i for i in reflect(draft, ev) if i.material]
    assert (issue.type, issue.entity, sorted(issue.expected)) == ("missing", "rv", ["rv_edv_ml", "rv_ef_pct"])
    require(ev, ["lv_edv_ml", "lv_ef_pct", "myo_mass_g"])  # a contract that does not ask for the RV
    assert _material(reflect(draft, ev)) == []
