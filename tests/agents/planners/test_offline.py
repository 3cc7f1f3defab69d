"""The offline planner: plans every task from several phrasings, compiles, refuses what the
case cannot support, revises compile errors, and plans with a newly registered tool."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest

from bcer.agents.planners.offline import OfflinePlanner, goal_domain, goal_milestones
from bcer.contracts import (ArtifactKind, Case, DeliverableSpec, ErrorCode, Mask, Table, TaskContract,
                            ToolError, load_contract)
from bcer.contracts.case import SequenceRef
from bcer.engine.compiler import CompileError, compile_plan
from bcer.engine.planning import plan_and_compile


def _case(cid: str, domain: str, seqs: dict[str, str], **metadata) -> Case:
    # planning and compiling read names, kinds and metadata only: no file is opened
    return Case(id=cid, root="/nonexistent", domain=domain, metadata=metadata,
                sequences={k: SequenceRef(path=f"/nonexistent/{k}.nii.gz", kind=kind) for k, kind in seqs.items()})


BRAIN = _case("b1", "brain", {"T1": "image", "T1c": "image", "T2": "image", "FLAIR": "image"}, age=50)
PROSTATE = _case("p1", "prostate", {"T2w": "image", "ADC": "image", "DWI": "image"}, psa_ng_ml=7.0)
CARDIAC = _case("c1", "cardiac", {"CINE": "cine"}, height=172.0, weight=70.0)
CARDIAC_K = _case("c2", "cardiac", {"KSPACE": "kspace"}, height=180.0, weight=80.0)
KSPACE_3D = _case("k1", "cardiac", {"KSPACE": "kspace"})
SUPERRES = _case("s1", "brain", {"T1": "image", "T1c": "image", "T2": "image", "FLAIR": "image"},
                 target_spacing={"T1": [1.0, 1.0, 1.25], "T2": [2.0, 2.0, 2.0]})

# task -> (case, three phrasings, milestones each phrasing must reach)
PHRASINGS = {
    "denoise": (BRAIN, ["denoise this scan", "remove the noise from the volume", "reduce the Rician noise"],
                {"denoising"}),
    "superres": (SUPERRES, ["super-resolve to the target spacing", "upsample the thick slices",
                            "increase the through-plane resolution"], {"super_resolution"}),
    "register_prostate": (PROSTATE, ["register the ADC to the T2w", "align the diffusion with T2w",
                                     "co-register the ADC map onto the T2-weighted image"], {"registration"}),
    "segment_brain": (BRAIN, ["segment the tumour", "delineate the glioma", "give me the tumour label map"],
                      {"segmentation"}),
    "recon_cardiac": (KSPACE_3D, ["reconstruct the k-space", "recon this undersampled acquisition",
                                  "turn the raw data into an image"], {"reconstruction"}),
    "brain_grade": (BRAIN, ["segment the tumour and grade it", "grade this glioma", "HGG or LGG?"],
                    {"segmentation", "classification"}),
    "prostate_report": (PROSTATE, ["write a prostate report with PI-RADS", "detect lesions and assign PI-RADS, "
                                   "then report", "prostate MRI: findings, PI-RADS category, report"],
                        {"segmentation", "detection", "classification", "report"}),
    "cardiac_report": (CARDIAC, ["cardiac report with EF and ACDC group", "measure the ejection fraction and "
                                 "classify the pathology, write a report", "report LV function and diagnosis"],
                       {"segmentation", "quantification", "classification", "report"}),
    "brain_report": (BRAIN, ["write a brain tumour report with its grade", "segment, grade and report this glioma",
                             "report on the glioma and its grade"], {"segmentation", "classification", "report"}),
}


@pytest.fixture(scope="module")
def brain() -> OfflinePlanner:
    """The Brain over bcer's own tools: toy tools other test modules register (``xtoy.*``)
    must not compete with them when a goal is planned without a contract."""
    from bcer.tools.registry import REGISTRY, load_all

    load_all()
    return OfflinePlanner({k: v for k, v in REGISTRY.items() if v.fn.__module__.startswith("bcer.tools")})


def _reached(wf) -> set[str]:
    return {n.milestone for n in wf.nodes if n.milestone}


@pytest.mark.parametrize("task", sorted(PHRASINGS))
def test_task_planned_from_three_phrasings(brain: OfflinePlanner, task: str) -> None:
    case, goals, want = PHRASINGS[task]
    for goal in goals:
        sketch, wf, revisions = plan_and_compile(brain, goal, case, None)
        assert want <= _reached(wf), (goal, [n.tool for n in wf.nodes])
        assert revisions == 0
        assert all(step.why for step in sketch.steps)


@pytest.mark.parametrize("task", sorted(PHRASINGS))
def test_task_planned_under_its_contract(brain: OfflinePlanner, task: str) -> None:
    case, goals, _ = PHRASINGS[task]
    contract = load_contract(task)
    for goal in [contract.goal, *goals]:
        sketch, wf, _ = plan_and_compile(brain, goal, case, contract)
        assert set(contract.milestones) <= _reached(wf)
        assert {d.name for d in wf.deliverables} == {d.name for d in contract.deliverables}
        assert all(contract.allows(n.tool) for n in wf.nodes)


def test_upstream_steps_are_shared(brain: OfflinePlanner) -> None:
    _, wf, _ = plan_and_compile(brain, "", BRAIN, load_contract("brain_report"))
    tools = [n.tool for n in wf.nodes]
    assert tools.count("seg.brain_tumor") == 1 and tools[0] == "seg.brain_tumor"
    seg = wf.nodes[0].id
    consumers = [n for n in wf.nodes if any(v.startswith(f"@node.{seg}.") for v in n.inputs.values())]
    assert len(consumers) >= 2  # features, grade (and the report) all read the one segmentation
    by_name = {d.name: d for d in wf.deliverables}
    assert by_name["seg"].node == seg and by_name["seg"].field == "labels"


def test_sequence_ports_and_pairs_bind_by_role(brain: OfflinePlanner) -> None:
    _, wf, _ = plan_and_compile(brain, "", PROSTATE, load_contract("register_prostate"))
    (reg,) = wf.nodes
    assert reg.inputs == {"fixed": "@seq.T2w", "moving": "@seq.ADC"}
    assert {d.name: d.field for d in wf.deliverables} == {"transform": "transform", "adc_on_t2w": "resampled"}
    _, wf, _ = plan_and_compile(brain, "", PROSTATE, load_contract("prostate_report"))
    detect = next(n for n in wf.nodes if n.milestone == "detection")
    assert detect.inputs["adc"] == "@seq.ADC" and detect.inputs["dwi"] == "@seq.DWI"
    register = next(n for n in wf.nodes if n.milestone == "registration")
    assert detect.inputs["transform"] == f"@node.{register.id}.transform"  # the optional port, by name


def test_metadata_binds_to_params(brain: OfflinePlanner) -> None:
    _, wf, _ = plan_and_compile(brain, "", CARDIAC, load_contract("cardiac_report"))
    quant = next(n for n in wf.nodes if n.milestone == "quantification")
    assert quant.params["height_cm"] == "@case.height" and quant.params["weight_kg"] == "@case.weight"
    _, wf, _ = plan_and_compile(brain, "", SUPERRES, load_contract("superres"))
    (node,) = wf.nodes
    assert node.inputs == {"image": "@seq.T1"} and node.params["spacing"] == [1.0, 1.0, 1.25]


def test_cine_kspace_is_reconstructed_first(brain: OfflinePlanner) -> None:
    _, wf, _ = plan_and_compile(brain, "", CARDIAC_K, load_contract("cardiac_report"))
    first = wf.nodes[0]
    assert first.milestone == "reconstruction" and first.inputs == {"kspace": "@seq.KSPACE"}
    seg = next(n for n in wf.nodes if n.milestone == "segmentation")
    assert seg.inputs["cine"].startswith(f"@node.{first.id}.")


@pytest.mark.parametrize("goal", ["grade the glioma", "HGG or LGG?", "segment the brain tumour"])
def test_impossible_goal_is_refused(brain: OfflinePlanner, goal: str) -> None:
    with pytest.raises(ToolError) as e:
        brain.plan(goal, CARDIAC)
    assert e.value.code == ErrorCode.input_missing
    assert "brain" in e.value.message and "cardiac" in e.value.message and e.value.context["case"] == "c1"


def test_contract_on_wrong_case_is_refused(brain: OfflinePlanner) -> None:
    with pytest.raises(ToolError) as e:
        brain.plan("", CARDIAC, load_contract("brain_grade"))
    assert e.value.code == ErrorCode.input_missing and "cardiac" in e.value.message


def test_missing_sequence_names_the_missing_port(brain: OfflinePlanner) -> None:
    no_dwi = _case("p2", "prostate", {"T2w": "image", "ADC": "image"})
    with pytest.raises(ToolError) as e:
        brain.plan("", no_dwi, load_contract("prostate_report"))
    assert e.value.code == ErrorCode.input_missing and "dwi" in e.value.message
    assert e.value.context["milestone"] == "detection"


def test_unplannable_goal_is_a_schema_error(brain: OfflinePlanner) -> None:
    with pytest.raises(ToolError) as e:
        brain.plan("make it nice", BRAIN)
    assert e.value.code == ErrorCode.schema


def test_goal_parsing() -> None:
    assert goal_milestones("HGG or LGG?") == ["classification"]
    assert goal_milestones("Segment the tumour and grade it") == ["segmentation", "classification"]
    assert goal_domain("grade this glioma") == "brain" and goal_domain("denoise it") is None


def test_revise_fixes_compile_errors(brain: OfflinePlanner) -> None:
    contract = load_contract("brain_grade")
    sketch = brain.plan("", BRAIN, contract)
    broken = sketch.model_copy(deep=True)
    broken.steps = [s for s in broken.steps if not s.tool.startswith("classify.")]  # a milestone lost
    broken.steps[0].args["overlap"] = 7.5  # out of the params model's bounds
    broken.steps[0].args["no_such_param"] = 1
    with pytest.raises(CompileError) as e:
        compile_plan(broken, BRAIN, contract)
    codes = {x.code for x in e.value.errors}
    assert ErrorCode.schema in codes
    fixed = brain.revise(broken, e.value.errors, BRAIN, contract)
    assert fixed is not None
    wf = compile_plan(fixed, BRAIN, contract)
    assert set(contract.milestones) <= _reached(wf)
    assert "overlap" not in fixed.steps[0].args and wf.nodes[0].params["overlap"] != 7.5
    # a second error round on the revised sketch has nothing left to fix
    assert brain.revise(fixed, [], BRAIN, contract) is None


class _Ratio(NamedTuple):
    ratio: Table


def test_new_tool_enables_a_new_plan(brain: OfflinePlanner) -> None:
    """A toy tool with a new milestone: impossible before it is registered, planned after."""
    from bcer.tools.registry import REGISTRY, tool

    contract = TaskContract(id="toy", domain="brain", goal="tumour to brain ratio",
                            inputs=["T1", "T1c", "T2", "FLAIR"], milestones=["ratio_estimation"],
                            deliverables=[DeliverableSpec(name="ratio", kind=ArtifactKind.table,
                                                          milestone="ratio_estimation", file="ratio.json")])
    with pytest.raises(ToolError, match="ratio_estimation"):
        brain.plan(contract.goal, BRAIN, contract)

    def tumour_ratio(labels: Mask) -> _Ratio:
        """Fraction of labelled voxels (a toy)."""
        return _Ratio(Table([{"ratio": float(np.mean(np.asarray(labels.data) > 0))}]))

    tool("toy.tumour_ratio", milestone="ratio_estimation")(tumour_ratio)
    try:
        sketch, wf, _ = plan_and_compile(OfflinePlanner(), contract.goal, BRAIN, contract)
    finally:
        REGISTRY.pop("toy.tumour_ratio", None)
    assert [n.tool for n in wf.nodes] == ["seg.brain_tumor", "toy.tumour_ratio"]
    assert wf.nodes[1].inputs == {"labels": f"@node.{wf.nodes[0].id}.labels"}
    assert wf.deliverables[0].node == wf.nodes[1].id
