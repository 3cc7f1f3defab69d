"""--bundle TOOL=DIR / --model-dir: checked before any case runs, bound into plans by the planner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.agents.planners.bundles import BundleBinder, bundle_read_roots, parse_bundle_args, resolve_bundles
from bcer.contracts import load_contract
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.engine.planning import StaticPlanner, plan_and_compile

from tests.tools import _zoo_bundles as Z


def _brain_case(tmp_path: Path):
    from bcer.datasets.synth import synth_cohort

    return synth_cohort("brain", 1, tmp_path / "data", seed=1)[0]


def _bundle(root: Path) -> Path:
    """A bundle folder as resolve_bundles sees it (configs and a model file; nothing is loaded here)."""
    (root / "configs").mkdir(parents=True)
    (root / "models").mkdir()
    (root / "configs" / "inference.json").write_text(json.dumps(Z.brats_inference()))
    (root / "configs" / "metadata.json").write_text(json.dumps(Z.brats_metadata()))
    (root / "models" / "model.pt").write_bytes(b"")
    return root


def test_parse_and_resolve(tmp_path: Path) -> None:
    models = tmp_path / "models"
    folder = _bundle(models / "brats_mri_segmentation")
    assert parse_bundle_args(["seg.brain_tumor=a/b"]) == {"seg.brain_tumor": "a/b"}
    for bad in (["seg.brain_tumor"], ["=x"], ["seg.x=a", "seg.x=b"]):
        with pytest.raises(ToolError) as e:
            parse_bundle_args(bad)
        assert e.value.code == ErrorCode.schema
    # a relative folder is looked up under the model dirs
    got = resolve_bundles({"seg.brain_tumor": "brats_mri_segmentation"}, [models])
    assert got == {"seg.brain_tumor": str(folder.resolve())}
    assert bundle_read_roots(got, [models]) == (str(models.resolve()), str(folder.resolve()))
    cases = [({"seg.brain_tumr": str(folder)}, ErrorCode.schema, "seg.brain_tumor"),    # typo: did you mean
             ({"denoise.nlm": str(folder)}, ErrorCode.schema, "takes no bundle"),
             ({"seg.brain_tumor": "nowhere"}, ErrorCode.input_missing, "nowhere")]
    for bundles, code, text in cases:
        with pytest.raises(ToolError) as e:
            resolve_bundles(bundles, [models])
        assert e.value.code == code and text in str(e.value)
    with pytest.raises(ToolError) as e:
        resolve_bundles({"seg.brain_tumor": str(folder)}, [tmp_path / "no_models"])
    assert e.value.code == ErrorCode.input_missing and e.value.context["arg"] == "model_dir"


def test_binder_fills_bundle_dir_of_planned_steps_only(tmp_path: Path) -> None:
    case = _brain_case(tmp_path)
    folder = str(_bundle(tmp_path / "b").resolve())
    contract = load_contract("segment_brain")
    planner = BundleBinder(OfflinePlanner(), {"seg.brain_tumor": folder})
    sketch, workflow, _ = plan_and_compile(planner, contract.goal, case, contract)
    seg = [n for n in workflow.nodes if n.tool == "seg.brain_tumor"]
    assert len(seg) == 1 and seg[0].params["bundle_dir"] == folder and planner.name == "offline"
    # a plan that sets its own bundle_dir keeps it
    static = sketch.model_copy(deep=True)
    next(s for s in static.steps if s.tool == "seg.brain_tumor").args["bundle_dir"] = "/elsewhere"
    again = BundleBinder(StaticPlanner(static), {"seg.brain_tumor": folder}).plan(contract.goal, case, contract)
    assert next(s for s in again.steps if s.tool == "seg.brain_tumor").args["bundle_dir"] == "/elsewhere"
