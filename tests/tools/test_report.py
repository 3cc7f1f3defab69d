"""report.structured: every number in the Markdown equals its evidence, and every evidence
entry resolves to the value in the node output it names (cardiac, prostate, brain chains)."""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

from bcer.contracts.artifacts import Classification, Findings, Report, Table, Transform
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.brain import make_brain
from bcer.datasets.cardiac import make_cardiac
from bcer.datasets.prostate import make_prostate
from bcer.tools.registry import call_tool
from bcer.tools.report.header import strip_metadata

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _run(node: str, tool: str, inputs: dict, params: dict | None = None) -> dict[str, Any]:
    """call_tool plus what the executor does: stamp each output with its origin."""
    out = call_tool(tool, inputs, params)
    for field, art in out.items():
        art.meta["origin"] = {"node": node, "field": field, "tool": tool}
    return out


def _resolve(art: Any, key: str) -> float:
    """The value an evidence key names inside an artifact."""
    if isinstance(art, Table) and key.startswith("meta."):  # meta["whole"] of quant.roi_features
        node: Any = art.meta
        for part in re.findall(r"\w+|\[\d+\]", key[5:]):
            node = node[int(part[1:-1])] if part.startswith("[") else node[part]
        return node
    if isinstance(art, Table):
        m = re.fullmatch(r"rows\[(\d+)\]\.(\w+)", key)
        return art.rows[int(m.group(1))][m.group(2)] if m else art.rows[0][key]
    if isinstance(art, Findings):
        fid, attr = key.split(".", 1)
        f = next(f for f in art.items if f.id == fid)
        if attr.startswith("box_voxel."):  # slice range of the lesion box (k axis)
            return f.box_voxel[0][2] if attr.endswith("k_first") else f.box_voxel[1][2] - 1
        return getattr(f, attr) if attr == "volume_ml" else f.attributes[attr]
    if isinstance(art, Classification):
        m = re.fullmatch(r"rule_trace\[(\d+)\]\.(\w+)", key)
        if m:
            return art.rule_trace[int(m.group(1))][m.group(2)]
        return art.scores[key.split(".", 1)[1]]
    raise AssertionError(f"cannot resolve {key} in {type(art).__name__}")


def footnote_ids(text: str) -> list[str]:
    """The evidence id behind each footnote marker of the prose, in order (definitions resolved)."""
    defs = dict(re.findall(r"^\[\^(\d+)\]: `(.+?)`$", text, re.M))
    body = re.sub(r"^\[\^\d+\]: .*$", "", text, flags=re.M)
    return [defs[n] for n in re.findall(r"\[\^(\d+)\]", body)]


def prose(report: Report) -> str:
    """The drafted sentences with their inline evidence links (the Markdown has footnotes)."""
    return "\n".join(report.structured["findings"] + report.structured["impression"])


def check_numbers(report: Report, sources: dict[tuple[str, str], Any]) -> None:
    prose = strip_metadata(report.text)  # the header and the evidence footnotes are metadata
    text = re.sub(r"`[^`]*`|\[\^\d+\]", "", prose)  # ids, names and labels live in code spans
    tokens = NUMBER.findall(text)
    assert len(tokens) == len(report.evidence) > 0
    assert not re.search(r"`\[[^^]", prose)  # no path after a number: footnotes
    ids = [i for i in footnote_ids(report.text) if not i.endswith(".box_voxel")]  # box links
    assert ids == [e["id"] for e in report.evidence]
    for token, ev in zip(tokens, report.evidence):
        assert float(token) == ev["value"], ev
        actual = float(_resolve(sources[(ev["node"], ev["field"])], ev["key"]))
        assert ev["raw"] == pytest.approx(actual, rel=1e-12, abs=1e-12), ev
        decimals = len(token.split(".")[1]) if "." in token else 0
        assert abs(float(token) - actual) <= 0.5 * 10 ** -decimals + 1e-9, ev  # rounding only
    json.dumps(report.structured)  # the structured part is JSON


def test_cardiac_report() -> None:
    ph = make_cardiac("r", 12, size="small", group="DCM")
    phases = _run("ed_es", "cardiac.ed_es", {"labels": ph.labels["seg"]})["phases"]
    fn = _run("function", "quant.cardiac_function", {"labels": ph.labels["seg"], "phases": phases},
              {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
    cls = _run("acdc", "classify.cardiac_acdc", {"function": fn})["classification"]
    rep = _run("report", "report.structured", {"measurements": fn, "classification": cls})["report"]
    check_numbers(rep, {("function", "function"): fn, ("acdc", "classification"): cls})
    assert rep.structured["domain"] == "cardiac" and "`DCM`" in rep.text
    ef = next(e for e in rep.evidence if e["key"] == "lv_ef_pct")
    assert ef["node"] == "function" and ef["unit"] == "%"
    assert ef["value"] == pytest.approx(ph.truth["lv_ef_pct"], abs=0.05)  # the truth, as printed
    assert "mL/m²" in rep.text and "mL/m2" not in rep.text


def test_prostate_report() -> None:
    ph = make_prostate("r", 13, size="small", n_lesions=2)
    det = _run("detect", "detect.prostate_lesions", {
        "adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": ph.labels["gland"],
        "zones": ph.labels["zones"], "t2w": ph.sequences["T2w"],
        "transform": Transform(np.array(ph.truth["misalignment"]["matrix"]))})["findings"]
    feats = _run("zones", "quant.roi_features", {"image": ph.sequences["T2w"], "mask": ph.labels["zones"]})["features"]
    cls = _run("pirads", "classify.pirads", {"findings": det})["classification"]
    rep = _run("report", "report.structured", {"features": feats, "findings": det, "classification": cls})["report"]
    check_numbers(rep, {("detect", "findings"): det, ("zones", "features"): feats,
                        ("pirads", "classification"): cls})
    assert rep.structured["domain"] == "prostate"
    assert len(rep.structured["lesions"]) == len(det.items) == 2
    zones = {"PZ": "peripheral zone", "TZ": "transition zone"}
    for f in det.items:
        side = {"R": "right", "L": "left"}[f.side]
        assert re.search(rf"In the {side} {zones[f.zone]} there is a focal lesion \(`{f.id}`\)", rep.text)
        assert {"lesion": f.id, "box_voxel": [list(b) for b in f.box_voxel]} in rep.structured["boxes"]
    assert f"Overall assessment: `PI-RADS {ph.truth['max_category']}`" in rep.text
    assert rep.text.index("## Findings") < rep.text.index("## Impression") < rep.text.index("## Measurements")


def test_brain_report_and_defaults() -> None:
    ph = make_brain("r", 14, size="small", grade="HGG")
    feats = call_tool("quant.roi_features", {"image": ph.sequences["T1c"], "mask": ph.labels["seg"]})["features"]
    cls = call_tool("classify.glioma_grade", {"features": feats})["classification"]
    # no origin stamped (direct calls): ids fall back to the port names
    rep = call_tool("report.structured", {"features": feats, "classification": cls}, {"decimals": 2})["report"]
    check_numbers(rep, {("features", "features"): feats, ("classification", "classification"): cls})
    assert rep.structured["domain"] == "brain" and "`HGG`" in rep.text
    vol = next(e for e in rep.evidence if e["key"].endswith("volume_ml") and e["key"].startswith("rows[2]"))
    assert vol["value"] == pytest.approx(ph.truth["enhancing_ml"], abs=0.005)
    side = {"L": "left", "R": "right"}[feats.rows[0]["side"]]
    assert f"There is a {side}-hemispheric intra-axial tumour." in rep.text
    assert "high-grade glioma (`HGG`)" in rep.text


def test_brain_table_bound_to_both_ports_is_printed_once() -> None:
    """The offline planner binds the one features table to measurements AND features; the report
    used to print the compartment block twice."""
    ph = make_brain("r", 15, size="small", grade="LGG")
    feats = _run("feat", "quant.roi_features", {"image": ph.sequences["T1c"], "mask": ph.labels["seg"]})["features"]
    cls = _run("grade", "classify.glioma_grade", {"features": feats})["classification"]
    rep = _run("report", "report.structured", {"measurements": feats, "features": feats, "classification": cls})["report"]
    check_numbers(rep, {("feat", "features"): feats, ("grade", "classification"): cls})
    for row in feats.rows:
        assert rep.text.count(f"### `{row['roi']}`") == 1
    assert "No enhancing component is seen." in rep.text and "(`LGG`)" in rep.text


def test_errors() -> None:
    with pytest.raises(ToolError) as e:
        call_tool("report.structured", {})
    assert e.value.code == ErrorCode.input_missing
    with pytest.raises(ToolError) as e:
        call_tool("report.structured", {"measurements": Table([{"x": 1.0}])}, {"decimals": 9})
    assert e.value.code == ErrorCode.value_range
    with pytest.raises(ToolError) as e:  # a findings artifact where a table is expected
        call_tool("report.structured", {"measurements": Findings([])})
    assert e.value.code == ErrorCode.schema


def _randomised_chain(seed: int, ed_frame: int | None = None):
    """cardiac.ed_es with the cine (so with margins) -> quant.cardiac_function -> report, on a
    randomised cine with its truth labels (seed 6031: ES within the noise of frame 11)."""
    from bcer.datasets.cardiac import family_ranges

    with family_ranges("randomised"):
        ph = make_cardiac("amb", seed, "small", group="NOR", family="randomised")
    params = {} if ed_frame is None else {"ed_frame": ed_frame}
    phases = _run("ed_es", "cardiac.ed_es", {"labels": ph.labels["seg"], "cine": ph.sequences["CINE"]},
                  params)["phases"]
    fn = _run("function", "quant.cardiac_function", {"labels": ph.labels["seg"], "phases": phases},
              {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
    cls = _run("acdc", "classify.cardiac_acdc", {"function": fn})["classification"]
    rep = _run("report", "report.structured", {"measurements": fn, "classification": cls})["report"]
    return ph, phases.rows[0], fn, cls, rep


def test_cardiac_report_states_phases_within_the_noise() -> None:
    from bcer.agents.r4 import reflect
    from bcer.tools.report import build_evidence, realise

    ph, phases, fn, cls, rep = _randomised_chain(6031)
    row = fn.rows[0]
    assert phases["ed_es_ambiguous"] and row["ed_es_ambiguous"] and row["ed_es_confidence"] == phases["ed_es_confidence"]
    assert "ed_alternative" not in row and row["es_alternative"] == phases["es_runner_up"] == 11  # only ES in doubt
    lv = np.asarray(ph.truth["lv_volume_curve_ml"])  # the truth labels' curve: the EF range is exact
    efs = [100 * (lv[row["ed_frame"]] - lv[es]) / lv[row["ed_frame"]] for es in (row["es_frame"], 11)]
    assert (row["lv_ef_min_pct"], row["lv_ef_max_pct"]) == pytest.approx((min(efs), max(efs)), rel=1e-9)
    assert row["lv_ef_min_pct"] <= row["lv_ef_pct"] <= row["lv_ef_max_pct"]
    assert "does not clearly separate end-systole from frame 11 `[function.function.es_alternative]`" in prose(rep)
    check_numbers(rep, {("function", "function"): fn, ("acdc", "classification"): cls})
    ev = build_evidence(measurements=fn, classification=cls)
    assert ev.concepts["ambiguous cardiac phase"].present
    assert reflect(realise(ev), ev) == []  # the R4 Reflector accepts the sentence
    # a draft without the doubt (an LLM's, an older exemplar's plan) misses required facts and
    # gets the template's sentence inserted
    from bcer.agents.r4 import repair

    draft = realise(ev)
    draft.findings = [s for s in draft.findings if "does not clearly separate" not in s]
    issues = [i for i in reflect(draft, ev) if i.type == "missing"]
    assert {"ed_es_confidence", "es_alternative", "lv_ef_min_pct", "lv_ef_max_pct"} == {k for i in issues for k in i.expected}
    fixed, _ = repair(draft, ev, issues)
    assert any("does not clearly separate end-systole" in s for s in fixed.findings)
    assert reflect(fixed, ev) == []


def test_cardiac_report_is_silent_on_clear_or_given_phases() -> None:
    _, phases, fn, _, rep = _randomised_chain(6000)  # margins of several noise SDs
    assert phases["ed_es_ambiguous"] is False and fn.rows[0]["ed_es_ambiguous"] is False
    assert not any(k in fn.rows[0] for k in ("lv_ef_min_pct", "ed_alternative", "es_alternative"))
    assert "End-diastole is frame 3 `[function.function.ed_frame]`" in prose(rep)
    assert "does not clearly separate" not in rep.text
    _, phases, fn, _, rep = _randomised_chain(6031, ed_frame=6)  # metadata frames: not the curve's choice
    assert phases["source"] == "metadata" and "ed_es_confidence" not in fn.rows[0]
    assert "does not clearly separate" not in rep.text
