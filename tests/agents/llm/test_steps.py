"""Step-by-step plan decoding: the per-step grammar binds only what exists (sequences of the
case, outputs of steps already emitted, of the port's kind), the contract's milestones must all
appear, what has one option is autofilled (and recorded), unconstrained answers are checked,
re-asked with their errors and given up on with a typed error, and plans replay exactly."""
from __future__ import annotations

import importlib
import json

import jsonschema
import numpy as np
import pytest

from bcer.agents.planners.offline import OfflinePlanner, plannable_tools
from bcer.agents.llm import make_backend
from bcer.agents.llm.steps import StepState, check_step, choices, step_schema
from bcer.agents.planners.llm import LLMPlanner
from bcer.contracts import Case, ErrorCode, Image, PlanStep, SequenceRef, ToolError, load_contract
from bcer.contracts.event import Event
from bcer.engine.compiler import compile_plan
from bcer.io import write_nifti

fake = importlib.import_module("tests.agents._fake_llm")
SEG_STEP = PlanStep(id="seg_brain_tumor", tool="seg.brain_tumor",
                    args={"t1": "@seq.T1", "t1c": "@seq.T1c", "t2": "@seq.T2", "flair": "@seq.FLAIR"})


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Case:
    root = tmp_path_factory.mktemp("brain")
    seqs = {}
    for name in ("T1", "T1c", "T2", "FLAIR"):
        path = write_nifti(Image(np.ones((6, 5, 4), np.float32), np.eye(4)), root / f"s1_{name.lower()}.nii.gz")
        seqs[name] = SequenceRef(path=str(path))
    return Case(id="s1", root=str(root), domain="brain", sequences=seqs, metadata={"age": 61, "sex": "F"})


def _state(case: Case, task: str, steps: list[PlanStep] = ()) -> StepState:
    contract = load_contract(task)
    rank, pref = OfflinePlanner().ranking(contract.goal, case, contract)
    return StepState(case, contract, plannable_tools(case, contract), rank=rank, pref=pref, steps=list(steps))


def first_option(messages, schema, n) -> str:
    """A model that always takes the first (best-ranked) option of the step grammar."""
    branch = schema["anyOf"][0] if "anyOf" in schema else schema
    args = {p: v["enum"][0] for p, v in branch["properties"]["args"]["properties"].items()}
    return json.dumps({"tool": branch["properties"]["tool"]["const"], "args": args})


def test_grammar_binds_only_emitted_outputs_and_existing_sequences(case: Case) -> None:
    # before any step: the segmenter is the only tool that can come next (quant needs a mask,
    # the grade gathers evidence), and each of its ports has one option: nothing to ask
    first = choices(_state(case, "brain_grade"))
    assert [c.tool for c in first] == ["seg.brain_tumor"] and first[0].free() == {}
    assert first[0].forced() == SEG_STEP.args
    # after it: the tool that makes the deliverable ``features`` (its output has that name); its
    # mask binds the emitted segmenter (one producer: its first mask, no choice), its image a choice
    after = choices(_state(case, "brain_grade", [SEG_STEP]))
    assert [c.tool for c in after] == ["quant.roi_features"]  # the gatherer (the grade) waits
    assert after[0].forced() == {"mask": "@node.seg_brain_tumor.labels"}
    assert after[0].free() == {"image": ["@seq.T1", "@seq.T1c", "@seq.T2", "@seq.FLAIR"]}  # contract order
    schema = step_schema(after)
    good = {"tool": "quant.roi_features", "args": {"image": "@seq.T1c"}}
    jsonschema.validate(good, schema)
    assert check_step(json.dumps(good), after)[1] == {"image": "@seq.T1c"}
    assert check_step('{"tool": "quant.roi_features", "args": {}}', after)[1] == {"image": "@seq.T1"}  # default
    for bad in ({**good, "tool": "classify.glioma_grade"},                          # cannot come next
                {**good, "tool": "quant.roi_stats"},                                # not what makes `features`
                {**good, "args": {**good["args"], "mask": "@node.seg_brain_tumor_2.tc"}},  # no such step
                {**good, "args": {"image": "@node.quant_roi_features.features"}},   # not emitted, not an image
                {**good, "args": {"image": "@seq.T9"}},                             # no such sequence
                {**good, "args": {"image": "@case.sex"}}):                          # a case key is no image
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
        with pytest.raises(ToolError) as err:  # the same rules without the schema (a server ignoring it)
            check_step(json.dumps(bad), after)
        assert err.value.code in (ErrorCode.schema, ErrorCode.bad_reference)


def test_milestones_must_all_appear_and_a_missing_input_is_typed(case: Case) -> None:
    brain = LLMPlanner(fake.ScriptedBackend(first_option))
    contract = load_contract("brain_report")
    sketch = brain.plan(contract.goal, case, contract)
    reached = {plannable_tools(case, contract)[s.tool].milestone for s in sketch.steps}
    assert set(contract.milestones) <= reached and sketch.steps[-1].tool in ("report.structured",
                                                                             "classify.glioma_grade")
    compile_plan(sketch, case, contract)
    no_flair = case.model_copy(update={"sequences": {k: v for k, v in case.sequences.items() if k != "FLAIR"}})
    with pytest.raises(ToolError) as err:
        LLMPlanner(fake.ScriptedBackend(first_option)).plan(contract.goal, no_flair, contract)
    assert err.value.code is ErrorCode.input_missing and "segmentation" in err.value.message


def test_first_ranked_picks_give_the_offline_plan_and_autofill_is_recorded(case: Case) -> None:
    backend = fake.ScriptedBackend(first_option)
    brain = LLMPlanner(backend)
    contract = load_contract("brain_grade")
    sketch = brain.plan(contract.goal, case, contract)
    offline = OfflinePlanner().plan(contract.goal, case, contract)
    nodes = lambda s: sorted((n.tool, json.dumps({**n.inputs, **n.params}, sort_keys=True))
                             for n in compile_plan(s, case, contract).nodes)
    assert nodes(sketch) == nodes(offline)
    events = brain.pop_events(case.id)
    fills = [e["data"] for e in events if e["kind"] == "autofill"]
    assert {"step": "seg_brain_tumor", "arg": "t1c", "value": "@seq.T1c", "why": "the only compatible source",
            "source": "decoding"} in fills
    assert any(f["source"] == "finish" and f["step"] == "classify_glioma_grade" for f in fills)
    calls = [e for e in events if e["kind"] == "llm_call"]
    accepted = next(e for e in events if e["kind"] == "plan_accepted")["data"]
    # one call: the image of the features (the tools and every other binding have one option)
    assert len(calls) == len(backend.requests) == accepted["calls"] == 1
    assert accepted["model_choices"] == accepted["first_ranked"] == 1 and accepted["autofilled"] == len(fills)
    assert all(c["data"]["purpose"] == "step" and c["data"]["accepted"] for c in calls)
    for e in events:  # each is a valid trace line (the engine writes them through Event)
        Event(run="r", case=case.id, **{k: v for k, v in e.items()}).model_dump_json()


def test_unconstrained_answers_are_checked_re_asked_and_given_up_on(case: Case) -> None:
    contract = load_contract("brain_grade")
    prose = ('Sure! Here is the step:\n```json\n{"tool": "quant.roi_features", "args": {"image": "@seq.T1", '
             '"mask": "@node.seg_brain_tumor.labels"}}\n```')
    invented = json.dumps({"tool": "quant.roi_features", "args": {"image": "@seq.T9"}})
    answers = ["I would segment first.", invented, prose]
    backend = fake.ScriptedBackend(answers)
    brain = LLMPlanner(backend)
    sketch = brain.plan(contract.goal, case, contract)
    assert [s.tool for s in sketch.steps] == ["seg.brain_tumor", "quant.roi_features", "classify.glioma_grade"]
    calls = [e for e in brain.pop_events(case.id) if e["kind"] == "llm_call"]
    assert [c["data"]["accepted"] for c in calls] == [False, False, True]
    assert [c["error_code"] for c in calls[:2]] == ["schema", "bad_reference"]
    retry = backend.requests[1]["messages"]  # the re-ask carries the answer and its error
    assert retry[-2] == {"role": "assistant", "content": answers[0]} and "[schema]" in retry[-1]["content"]
    assert "T9" in backend.requests[2]["messages"][-1]["content"]
    with pytest.raises(ToolError) as err:
        LLMPlanner(fake.ScriptedBackend(["no idea"]), max_reasks=1).plan(contract.goal, case, contract)
    assert err.value.code is ErrorCode.schema and "giving up" in err.value.message and "2 tries" in err.value.message


def test_revise_bans_what_the_compiler_rejected(case: Case) -> None:
    contract = load_contract("brain_grade")
    backend = fake.ScriptedBackend(first_option)
    brain = LLMPlanner(backend)
    sketch = brain.plan(contract.goal, case, contract)
    quant = next(s for s in sketch.steps if s.tool.startswith("quant."))
    error = ToolError(ErrorCode.schema, "wrong image", step=quant.id, arg="image")
    revised = brain.revise(sketch, [error], case, contract)
    assert revised is not None
    new_quant = next(s for s in revised.steps if s.tool == quant.tool)
    assert new_quant.args["image"] != quant.args["image"]  # the rejected option is no longer offered
    branch = backend.requests[-1]["json_schema"]  # one tool: one branch
    assert branch["properties"]["args"]["properties"]["image"]["enum"] == ["@seq.T1c", "@seq.T2", "@seq.FLAIR"]


def test_every_call_is_recorded_and_replays_to_the_same_plan(case: Case, tmp_path) -> None:
    contract = load_contract("brain_report")
    rec = tmp_path / "calls.jsonl"
    planned = LLMPlanner(make_backend(fake.ScriptedBackend(first_option), record=rec)).plan(contract.goal, case,
                                                                                        contract)
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    assert lines and all(x["request"]["json_schema"]["title"] == "PlanStep" for x in lines)
    replayed = LLMPlanner(make_backend(f"replay:{rec}")).plan(contract.goal, case, contract)
    assert replayed == planned
