"""Method cards (which method made a number), segmentation self-consistency scores, and the
report header that names them."""
from __future__ import annotations

import hashlib
import re
import shutil

import numpy as np
import pytest

from bcer.datasets.brain import make_brain
from bcer.datasets.cardiac import make_cardiac
from bcer.tools.methods import MethodCard, default_card, network_card, stamp_lineage
from bcer.tools.registry import call_tool
from bcer.tools.report.header import DISCLAIMER, METADATA_OPEN, strip_metadata
from bcer.tools.seg.bundle import SHIPPED_DIR
from bcer.tools.seg.confidence import THRESHOLDS, dice_by_label


def test_network_card_names_the_weights_and_their_training_data(tmp_path) -> None:
    shipped = SHIPPED_DIR / "cardiac_unet2d"
    card = network_card(shipped)
    weights = hashlib.sha256((shipped / "models" / "model.pt").read_bytes()).hexdigest()
    assert card.kind == "network" and card.weights_sha256 == weights and card.name == "cardiac_unet2d"
    assert card.default and card.validated_on_real is False and "synthetic phantoms only" in card.trained_on
    gen = card.training["generator_sha256"]
    assert card.training["generator"] == "bcer.datasets.cardiac.make_cardiac" and all(len(v) == 64 for v in gen.values())
    assert card.needs_disclaimer() and "weights sha256 " + weights[:12] in card.line()
    # a copy is still the default network (same weights); other weights are the user's model
    copy = tmp_path / "mine"
    shutil.copytree(shipped, copy)
    assert network_card(copy).default
    (copy / "models" / "model.pt").write_bytes(b"other weights")
    (copy / "configs" / "metadata.json").write_text('{"name": "validated_net", "version": "2.0"}')
    other = network_card(copy)
    assert not other.default and other.validated_on_real is None and not other.needs_disclaimer()
    assert other.weights_sha256 == hashlib.sha256(b"other weights").hexdigest()


def test_an_ensemble_card_digest_names_every_members_weights(tmp_path) -> None:
    import json

    root = tmp_path / "ens"
    (root / "models").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "configs" / "metadata.json").write_text(json.dumps({"name": "ens", "bcer": {"members": ["m1.pt"]}}))
    (root / "models" / "model.pt").write_bytes(b"first")
    (root / "models" / "m1.pt").write_bytes(b"second")
    digest = lambda b: hashlib.sha256(b).hexdigest()  # noqa: E731
    card = network_card(root)
    assert card.weights_sha256 == digest(f"{digest(b'first')} {digest(b'second')}".encode())
    (root / "models" / "m1.pt").write_bytes(b"retrained second")  # a member alone changes: the digest does
    assert network_card(root).weights_sha256 not in (card.weights_sha256, digest(b"first"))


def test_brain_self_consistency_is_the_rerun_dice() -> None:
    ph = make_brain("b", 5, size="small")
    ins = {k.lower(): ph.sequences[k] for k in ("T1", "T1c", "T2", "FLAIR")}
    from bcer.tools.seg.brain_tumor import BrainTumorParams, _classical

    base = call_tool("seg.brain_tumor", ins)["labels"]
    again, _ = _classical(ph.sequences["T1"], ph.sequences["T1c"], ph.sequences["T2"], ph.sequences["FLAIR"],
                          BrainTumorParams(smooth_sigma=0.9))  # the default 0.6 x 1.5
    conf = base.meta["confidence"]
    want = dice_by_label(np.asarray(base.data), again, {"WT": (1, 2, 4), "TC": (1, 4), "ET": (4,)})
    assert conf["parts"] == pytest.approx(want, abs=1e-4) and conf["score"] == pytest.approx(min(want.values()), abs=1e-4)
    assert conf["threshold"] == THRESHOLDS["seg.brain_tumor"] and conf["low_confidence"] == (conf["score"] < conf["threshold"])
    assert base.meta["method_card"]["kind"] == "classical" and base.meta["flags"]["low_confidence"]["flagged"] is conf["low_confidence"]


def test_a_prostate_bundle_states_its_own_flag_threshold(tmp_path) -> None:
    """The shipped prostate ensemble is judged by the threshold its metadata states; a copy that
    states another is judged by that one, on the same flip agreement score; a copy that states
    none falls back to the code's threshold."""
    import json

    from bcer.datasets.prostate import make_prostate

    ph = make_prostate("p", 3, size="small")
    stated = json.loads((SHIPPED_DIR / "prostate_unet3d" / "configs" / "metadata.json").read_text())
    shipped = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]})["gland"].meta["confidence"]
    assert shipped["threshold"] == stated["bcer"]["low_confidence_threshold"] and shipped["score"] is not None
    own = tmp_path / "retrained"
    shutil.copytree(SHIPPED_DIR / "prostate_unet3d", own)
    meta = json.loads((own / "configs" / "metadata.json").read_text())
    cut = round(shipped["score"] + 0.01, 4)  # just above this case's score: flagged by its own cut
    meta["bcer"]["low_confidence_threshold"] = cut
    (own / "configs" / "metadata.json").write_text(json.dumps(meta))
    conf = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"bundle_dir": str(own)})["gland"].meta["confidence"]
    assert conf["score"] == shipped["score"] and conf["method"] == shipped["method"]
    assert conf["threshold"] == cut and conf["low_confidence"] is True
    del meta["bcer"]["low_confidence_threshold"]
    (own / "configs" / "metadata.json").write_text(json.dumps(meta))
    conf = call_tool("seg.prostate", {"t2w": ph.sequences["T2w"]}, {"bundle_dir": str(own)})["gland"].meta["confidence"]
    assert conf["threshold"] == THRESHOLDS["seg.prostate"]


def test_cardiac_classical_alone_has_nothing_to_agree_with() -> None:
    ph = make_cardiac("c", 3, size="small", group="NOR")
    m = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, {"method": "classical"})["labels"]
    conf = m.meta["confidence"]
    assert conf["score"] is None and conf["low_confidence"] and "classical method" in conf["reason"]
    assert MethodCard(**m.meta["method_card"]).needs_disclaimer()


def test_dice_by_label() -> None:
    a, b = np.array([0, 1, 1, 2, 2, 2]), np.array([0, 1, 2, 2, 2, 0])
    d = dice_by_label(a, b, {"one": (1,), "two": (2,), "any": (1, 2)})
    assert d == pytest.approx({"one": 2 / 3, "two": 4 / 6, "any": 8 / 9})


def _chain(bundle_card: MethodCard) -> tuple[dict, object]:
    """A cardiac chain whose outputs carry lineage as the engine stamps it."""
    ph = make_cardiac("r", 12, size="small", group="DCM")
    cine, labels = ph.sequences["CINE"], ph.labels["seg"]
    labels.meta["method_card"] = bundle_card.model_dump()
    stamp_lineage({"labels": labels}, {"cine": cine}, "seg", "seg.cardiac", "2.8", bundle_card.model_dump(),
                  {"cine": "series CINE"}, case="case042")
    out = {}
    for node, tool, ins, reads in (("ed_es", "cardiac.ed_es", {"labels": labels, "cine": cine},
                                    {"labels": "node seg", "cine": "series CINE"}),
                                   ("function", "quant.cardiac_function", {"labels": labels}, {"labels": "node seg"})):
        if tool == "quant.cardiac_function":
            ins["phases"] = out["ed_es"]
            reads["phases"] = "node ed_es"
        res = call_tool(tool, ins)
        art = next(iter(res.values()))
        art.meta["origin"] = {"node": node, "field": next(iter(res)), "tool": tool}
        stamp_lineage(res, ins, node, tool, "x", default_card(tool, "x").model_dump(), reads, case="case042")
        out[node] = art
    rep = call_tool("report.structured", {"measurements": out["function"]})["report"]
    return rep.structured, rep


def test_report_header_names_case_series_methods_and_the_research_use_line() -> None:
    s, rep = _chain(network_card(SHIPPED_DIR / "cardiac_unet2d"))
    text = rep.text
    head = text[text.index(METADATA_OPEN): text.index("## Findings")]
    assert text.index("## About this report") < text.index("## Findings") < text.index("## Evidence")
    assert "Case: `case042`" in head and "Input series: `CINE`" in head and DISCLAIMER in head
    assert "`seg` (`seg.cardiac 2.8`)" in head and "weights sha256 " in head and "reads cine from series `CINE`" in head
    assert re.search(r"bcer `\d+\.\d+\.\d+`, report made `\d{4}-\d\d-\d\d \d\d:\d\d UTC`", head)
    assert s["header"]["case"] == "case042" and s["header"]["disclaimer"] == DISCLAIMER
    assert s["metadata_keys"] == ["header", "evidence_table"] and len(s["evidence_table"]) == len(
        {e["id"] for e in rep.evidence})
    assert "About this report" not in strip_metadata(text) and "## Findings" in strip_metadata(text)
    # a validated model of the user's: no research-use line
    mine = MethodCard(name="site_net", version="1", kind="network", validated_on_real=True, weights_sha256="ab" * 32)
    s2, rep2 = _chain(mine)
    assert s2["header"]["disclaimer"] is None and DISCLAIMER not in rep2.text


def test_flags_reach_the_report_header_and_the_case_page() -> None:
    from bcer.contracts.artifacts import Table
    from bcer.pages.case import _methods
    from bcer.pages.html import markdown
    from bcer.tools.report.header import header_lines, header_of

    seg = MethodCard(name="cardiac_unet2d", version="0.3.0", kind="network", default=True, validated_on_real=False)
    flags = {"near_tie": {"flagged": True, "detail": "ES frame 7 vs runner-up 8"},
             "low_confidence": {"flagged": False, "detail": "self-consistency 0.9 >= threshold 0.67", "score": 0.9}}
    t = Table([{"x": 1.0}], meta={"lineage": {"case": "c9", "nodes": {
        "seg": {"tool": "seg.cardiac", "version": "2.8", "method": seg.model_dump(), "reads": {"cine": "series CINE"},
                "flags": flags}}}})
    lines = "\n".join(header_lines(header_of([t])))
    assert "- Confidence at node `seg`: self-consistency 0.9 >= threshold 0.67" in lines  # a score is always shown
    assert "- Flag: near tie at node `seg`: ES frame 7 vs runner-up 8" in lines and "Flag: low confidence" not in lines
    prov = {"deliverables": {"labels": {"chain": [{"node": "seg", "tool": "seg.cardiac", "version": "2.8",
                                                   "method": seg.model_dump(), "flags": flags}]}}}
    page = _methods(prov)
    assert DISCLAIMER in page and '<span class="bad">near tie</span>' in page and "not low confidence" in page
    html = markdown("A 5 mL[^1] volume.\n" + METADATA_OPEN + "\n[^1]: `seg.labels.volume_ml`\n", lambda n: f"#node-{n}")
    assert '<a class="ev" href="#fn-1">1</a>' in html and 'id="fn-1"' in html and 'href="#node-seg"' in html
    assert "bcer:metadata" not in html
