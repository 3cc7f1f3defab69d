"""R4 report loop: each Reflector issue type on a crafted report (with its span and the true
value), repairs that fix text AND boxes, best of k, bounded passes, the LLM drafter on a fake
backend (valid, schema-invalid and fenced answers)."""
from __future__ import annotations

import json

import pytest

from bcer.agents.llm.base import LLMReply
from bcer.agents.r4 import (WEIGHTS, LLMDrafter, R4Config, R4Loop, count_by_type, penalty, reflect, repair,
                            route)
from bcer.bench.report_inputs import report_inputs
from bcer.metrics import box_iou
from bcer.tools.report import build_evidence, realise
from bcer.tools.report.prose import Box, Draft


@pytest.fixture(scope="module")
def cases():
    """Evidence + clean template draft of: a multifocal prostate case (lesions left PZ / right TZ
    or similar), a DCM cardiac case, an HGG brain case (all from the bench generators)."""
    out = {}
    for task, i in (("prostate_report", 1), ("cardiac_report", 1), ("brain_report", 0)):
        inputs, _ = report_inputs(task, i)
        ev = build_evidence(**inputs)
        out[task] = (ev, realise(ev))
    return out


def _edit(draft: Draft, section: str, idx: int, old: str, new: str) -> Draft:
    d = draft.model_copy(deep=True)
    sentences = getattr(d, section)
    assert old in sentences[idx], (old, sentences[idx])
    sentences[idx] = sentences[idx].replace(old, new, 1)
    return d


def _only(issues, type_):
    got = [i for i in issues if i.type == type_]
    assert got, f"no {type_} issue in {[(i.type, i.message) for i in issues]}"
    assert all(i.type == type_ for i in issues), [(i.type, i.message) for i in issues]
    return got


def test_clean_template_drafts_have_no_issue(cases):
    for ev, draft in cases.values():
        assert reflect(draft, ev) == []


def test_laterality_prostate_and_cardiac(cases):
    ev, draft = cases["prostate_report"]
    lesion = ev.lesions()[0]
    wrong = "left" if lesion.side == "right" else "right"
    idx = next(i for i, s in enumerate(draft.findings) if f"`{lesion.id}`" in s)
    bad = _edit(draft, "findings", idx, f"In the {lesion.side} ", f"In the {wrong} ")
    (issue,) = _only(reflect(bad, ev), "laterality")
    assert (issue.sentence, issue.entity, issue.found, issue.expected) == (idx, lesion.id, wrong, lesion.side)
    assert bad.findings[idx][issue.span[0]:issue.span[1]] == wrong
    ev, draft = cases["cardiac_report"]
    idx = next(i for i, s in enumerate(draft.findings) if s.startswith("The right ventricle measures"))
    bad = _edit(draft, "findings", idx, "The right ventricle", "The left ventricle")
    (issue,) = _only(reflect(bad, ev), "laterality")
    assert issue.expected == "right" and bad.findings[idx][slice(*issue.span)] == "left ventricle"
    fixed, _ = repair(bad, ev, [issue])
    assert fixed.findings == draft.findings


def test_negation_both_polarities(cases):
    ev, draft = cases["cardiac_report"]  # DCM: the LV is dilated, the RV is not
    idx = draft.findings.index("The left ventricle is dilated.")
    bad = _edit(draft, "findings", idx, "is dilated", "is not dilated")
    (issue,) = _only(reflect(bad, ev), "negation")
    assert issue.entity == "lv" and issue.expected is True and issue.found is False  # issues name evidence entities
    idx = draft.findings.index("The right ventricle is not dilated.")
    bad = _edit(draft, "findings", idx, "is not dilated", "is dilated")
    (issue,) = _only(reflect(bad, ev), "negation")
    assert issue.entity == "rv" and issue.expected is False
    ev, draft = cases["prostate_report"]
    idx = next(i for i, s in enumerate(draft.findings) if "there is a focal lesion" in s)
    bad = _edit(draft, "findings", idx, "there is a focal lesion", "there is no focal lesion")
    assert _only(reflect(bad, ev), "negation")[0].sentence == idx


def test_unsupported_claims(cases):
    ev, draft = cases["prostate_report"]
    for sentence, what in (("The seminal vesicles are unremarkable.", "no such finding"),
                           ("A further focal lesion (`lesion_9`) is seen in the apex.", "lesion_9"),
                           ("The gland also measures 51.0 mm in length.", "states nothing the evidence holds"),
                           ("Its capsule measures 2.0 mm `[detect.findings.capsule]`.", "does not exist")):
        bad = draft.model_copy(deep=True)
        bad.findings.insert(1, sentence)
        issues = _only(reflect(bad, ev), "unsupported")
        assert issues[0].sentence == 1 and what in issues[0].message + str(issues[0].found), issues
        fixed, _ = repair(bad, ev, issues)
        assert fixed.findings == draft.findings


def test_contradiction_number_and_category(cases):
    ev, draft = cases["brain_report"]
    f = ev.fact("enhancing", "volume_ml")
    idx = next(i for i, s in enumerate(draft.findings) if f.id in s)
    printed = draft.findings[idx].split(" mL `[" + f.id)[0].split()[-1]
    bad = _edit(draft, "findings", idx, f"{printed} mL `[{f.id}", f"{float(printed) * 1.4:.1f} mL `[{f.id}")
    (issue,) = _only(reflect(bad, ev), "contradiction")
    assert issue.evidence_ids == [f.id] and issue.expected == pytest.approx(f.value)
    bad = _edit(draft, "impression", 0, "high-grade glioma (`HGG`)", "low-grade glioma (`LGG`)")
    issues = _only(reflect(bad, ev), "contradiction")
    fixed, _ = repair(bad, ev, issues)
    assert fixed.impression == draft.impression
    ev, draft = cases["prostate_report"]
    idx = len(draft.impression) - 1
    label = ev.label.split()[-1]
    bad = _edit(draft, "impression", idx, f"`PI-RADS {label}`", f"`PI-RADS {int(label) - 1}`")
    (issue,) = _only(reflect(bad, ev), "contradiction")
    assert issue.expected == int(label)


def test_missing_fact_and_label(cases):
    ev, draft = cases["cardiac_report"]
    bad = draft.model_copy(deep=True)
    rv = next(s for s in bad.findings if s.startswith("The right ventricle measures"))
    bad.findings.remove(rv)
    (issue,) = _only(reflect(bad, ev), "missing")
    assert issue.entity == "rv" and issue.fix.sentences == [rv]
    fixed, _ = repair(bad, ev, [issue])
    assert reflect(fixed, ev) == [] and rv in fixed.findings
    bad = draft.model_copy(deep=True)
    bad.impression = bad.impression[1:]  # the ACDC group sentence
    (issue,) = _only(reflect(bad, ev), "missing")
    assert issue.entity == "label" and issue.expected == ev.label


def test_localization_zone_slices_and_box(cases):
    ev, draft = cases["prostate_report"]
    lesion = ev.lesions()[0]
    zones = {"PZ": "peripheral zone", "TZ": "transition zone"}
    other = "TZ" if lesion.zone == "PZ" else "PZ"
    idx = next(i for i, s in enumerate(draft.findings) if f"`{lesion.id}`" in s)
    bad = _edit(draft, "findings", idx, zones[lesion.zone], zones[other])
    (issue,) = _only(reflect(bad, ev), "localization")
    assert issue.found == other and issue.expected == lesion.zone
    k0 = lesion.box_voxel[0][2]
    bad = _edit(draft, "findings", idx, f"on slices {k0} `", f"on slices {k0 + 4} `")
    (issue,) = _only(reflect(bad, ev), "localization")
    assert issue.expected == k0 and issue.found == k0 + 4
    bad = draft.model_copy(deep=True)
    (i0, j0, k0), (i1, j1, k1) = lesion.box_voxel
    shifted = [[i0 + (i1 - i0), j0, k0], [i1 + (i1 - i0), j1, k1]]  # moved by its own width: IoU 0
    bad.boxes = [Box(lesion=b.lesion, box_voxel=shifted if b.lesion == lesion.id else b.box_voxel) for b in bad.boxes]
    (issue,) = _only(reflect(bad, ev), "localization")
    assert issue.section == "boxes" and box_iou(shifted, lesion.box_voxel) < 0.5
    fixed, applied = repair(bad, ev, [issue])
    assert applied and next(b.box_voxel for b in fixed.boxes if b.lesion == lesion.id) == lesion.box_voxel
    bad.boxes = [b for b in bad.boxes if b.lesion != lesion.id]  # a box left out is missing
    assert _only(reflect(bad, ev), "missing")[0].entity == lesion.id


def test_loop_repairs_text_and_boxes_within_two_passes_and_weights(cases):
    ev, draft = cases["prostate_report"]
    lesion = ev.lesions()[0]
    wrong = "left" if lesion.side == "right" else "right"
    idx = next(i for i, s in enumerate(draft.findings) if f"`{lesion.id}`" in s)
    bad = _edit(draft, "findings", idx, f"In the {lesion.side} ", f"In the {wrong} ")
    bad.findings.insert(0, "The seminal vesicles are unremarkable.")
    bad.boxes = [Box(lesion=b.lesion, box_voxel=[[0, 0, 0], [2, 2, 2]]) for b in bad.boxes]
    issues = reflect(bad, ev)
    assert penalty(issues) == sum(WEIGHTS[i.type] for i in issues) and WEIGHTS["missing"] == 3
    counts = count_by_type(issues)
    assert counts["laterality"] == 1 and counts["unsupported"] == 1 and counts["localization"] == len(ev.lesions())

    class Fixed:  # a drafter that returns the corrupted draft (so the loop must repair it)
        name = "fixed"

        def drafts(self, ev, route, exemplars, decimals=1):
            return [bad], []
    out = R4Loop(Fixed(), config=R4Config(max_passes=2)).run(ev, task="prostate_report")
    assert out.final_issues == [] and penalty(out.initial_issues) > 0 and out.repairs >= 3
    assert sorted(out.draft.findings) == sorted(draft.findings)
    assert all(box_iou(b.box_voxel, ev.entities[b.lesion].box_voxel) == 1.0 for b in out.draft.boxes)
    kinds = [e["kind"] for e in out.events]
    assert kinds[0] == "r4_route" and "r4_reflect" in kinds and kinds.count("r4_repair") <= 2


class FakeLLM:
    """An LLMBackend that returns scripted completions and records what it was asked."""

    name, model = "fake", "fake-1"

    def __init__(self, texts):
        self.texts, self.calls = texts, []

    def complete(self, messages, *, json_schema=None, n=1, temperature=0.0, max_tokens=1024, seed=None):
        self.calls.append({"messages": messages, "schema": json_schema, "n": n})
        return LLMReply(texts=self.texts[:n], backend="fake", model=self.model, prompt_digest="x")


def test_llm_drafter_best_of_k_and_invalid_answers(cases):
    ev, draft = cases["cardiac_report"]
    wrong = _edit(draft, "findings", draft.findings.index("The left ventricle is dilated."), "is dilated", "is not dilated")
    good = {"findings": draft.findings, "impression": draft.impression, "boxes": []}
    texts = ["not json at all", json.dumps({"findings": wrong.findings, "impression": wrong.impression}),
             "```json\n" + json.dumps(good) + "\n```"]
    llm = FakeLLM(texts)
    exemplar = {"score": 0.9, "record": {"id": "e1", "profile_text": "cardiac report; label DCM", "report_text": "x",
                                         "tags": {"draft": {"findings": ["F."], "impression": ["I."]}}}}
    out = R4Loop(LLMDrafter(llm), retrieve=lambda r, t, c: [exemplar]).run(ev, task="cardiac_report")
    call = llm.calls[0]
    assert call["n"] == 3 and call["schema"]["required"] == ["findings", "impression"]
    assert any(m["role"] == "assistant" and "F." in m["content"] for m in call["messages"])  # few-shot exemplar
    assert out.draft_penalties == [WEIGHTS["negation"], 0] and out.chosen == 1 and out.final_issues == []
    llm_event = next(e for e in out.events if e["kind"] == "llm_call")
    assert llm_event["data"]["invalid"] == 1 and llm_event["data"]["valid"] == 2
    out = R4Loop(LLMDrafter(FakeLLM(["{}", "nope", "[]"]))).run(ev, task="cardiac_report")
    assert out.draft.source == "template" and out.final_issues == []  # no valid draft: template fallback


def test_router_profiles(cases):
    ev, _ = cases["prostate_report"]
    r = route(ev, "prostate_report", history="PSA 9", has_llm=True)
    assert (r.specialisation, r.profile, r.mode, r.k) == ("prostate", "borderline", "llm", 3)  # case 1: two lesions, the first borderline
    assert r.scope == {"task": "prostate_report", "profile": "borderline"}
    inputs, _ = report_inputs("prostate_report", 2)  # the generator's no-lesion case
    ev0 = build_evidence(**inputs)
    assert route(ev0, "prostate_report").profile == "no_finding" and route(ev0, "prostate_report").k == 1
