"""The LLM planner with a scripted backend: the schema, the prompt, rejection of invalid answers,
revisions with the compiler's errors, pass@k, fallback, and the events it records."""
from __future__ import annotations

import importlib
import json

import jsonschema
import numpy as np
import pytest

from bcer.agents.planners.offline import OfflinePlanner, plannable_tools
from bcer.agents.planners.llm import LLMPlanner, plan_schema  # whole-plan decoding (decoding="plan")
from bcer.contracts import Case, ErrorCode, Image, SequenceRef, ToolError, load_contract
from bcer.engine.planning import plan_and_compile
from bcer.io import write_nifti

fake = importlib.import_module("tests.agents._fake_llm")
AFFINE = np.diag([1.0, 1.0, 2.0, 1.0])
SEG = {"tool": "seg.brain_tumor", "id": "seg_brain_tumor",
       "args": {"t1": "@seq.T1", "t1c": "@seq.T1c", "t2": "@seq.T2", "flair": "@seq.FLAIR"}}


@pytest.fixture(scope="module")
def case(tmp_path_factory) -> Case:
    root = tmp_path_factory.mktemp("brain")
    seqs = {}
    for name in ("T1", "T1c", "T2", "FLAIR"):
        path = write_nifti(Image(np.ones((6, 5, 4), np.float32), AFFINE), root / f"c1_{name.lower()}.nii.gz")
        seqs[name] = SequenceRef(path=str(path))
    return Case(id="c1", root=str(root), domain="brain", sequences=seqs,
                metadata={"age": 61, "sex": "F"}, ground_truth={"values": {"grade": "HGG-SECRET"}})


def plan_json(*steps: dict) -> str:
    return json.dumps({"steps": list(steps)})


def test_schema_restricts_tools_ids_args_and_tokens(case: Case) -> None:
    contract = load_contract("segment_brain")
    tools = plannable_tools(case, contract)
    schema = plan_schema(tools, case)
    branches = schema["properties"]["steps"]["items"]["anyOf"]
    assert sorted(b["properties"]["tool"]["const"] for b in branches) == sorted(tools) == ["resample.to_grid",
                                                                                          "seg.brain_tumor"]
    jsonschema.validate(json.loads(plan_json(SEG)), schema)
    bad_steps = [{**SEG, "tool": "denoise.nlm"},                                  # not allowed by the task
                 {**SEG, "id": "x"},                                               # not the tool's step id
                 {**SEG, "args": {**SEG["args"], "t1": "@seq.T9"}},                # no such sequence
                 {**SEG, "args": {**SEG["args"], "t1": "@seq.T2"}},                # a port named after T1 takes T1
                 {**SEG, "args": {**SEG["args"], "t1": "@node.seg_brain_tumor.report"}},  # no such output
                 {**SEG, "args": {**SEG["args"], "shell": "rm -rf /"}},            # not a port or param
                 {**SEG, "args": {"t1": "@seq.T1"}}]                               # required ports unbound
    for bad in bad_steps:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({"steps": [bad]}, schema)
    # params take the tool's own schema, or a metadata token
    jsonschema.validate({"steps": [{**SEG, "args": {**SEG["args"], "overlap": 0.5}}]}, schema)
    jsonschema.validate({"steps": [{**SEG, "args": {**SEG["args"], "overlap": "@case.age"}}]}, schema)


def test_schema_offers_only_sequences_the_contract_gives_the_port(case: Case) -> None:
    """The compiler's role rules in the schema: on a case with T1 and T2, denoise's input is T1
    (T2 is its alternative only when T1 is missing), so constrained decoding cannot bind T2."""
    contract = load_contract("denoise")
    tools = plannable_tools(case, contract)
    step = {"tool": "denoise.nlm", "id": "denoise_nlm", "args": {"image": "@seq.T1"}}
    schema = plan_schema(tools, case, contract=contract)
    jsonschema.validate({"steps": [step]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [{**step, "args": {"image": "@seq.T2"}}]}, schema)
    jsonschema.validate({"steps": [{**step, "args": {"image": "@seq.T2"}}]}, plan_schema(tools, case))  # no contract
    only_t2 = case.model_copy(update={"sequences": {"T2": case.sequences["T2"]}})
    schema = plan_schema(plannable_tools(only_t2, contract), only_t2, contract=contract)
    jsonschema.validate({"steps": [{**step, "args": {"image": "@seq.T2"}}]}, schema)  # the alternative stands in


def test_valid_answer_compiles_and_is_recorded(case: Case) -> None:
    contract = load_contract("segment_brain")
    backend = fake.ScriptedBackend([plan_json(SEG)])
    brain = LLMPlanner(backend, decoding="plan")
    sketch, wf, revisions = plan_and_compile(brain, contract.goal, case, contract)
    assert [n.tool for n in wf.nodes] == ["seg.brain_tumor"] and revisions == 0
    prompt = "\n".join(m["content"] for m in backend.requests[0]["messages"])
    for expected in (contract.goal, "@seq.T1c", "seg.brain_tumor", "segmentation", "labels (mask", "metadata keys: age, sex",
                     "shape 6x5x4", "spacing 1x1x2"):
        assert expected in prompt
    assert "HGG-SECRET" not in prompt and "61" not in prompt  # no ground truth, no metadata values
    assert backend.requests[0]["json_schema"]["title"] == "PlanSketch" and backend.requests[0]["temperature"] == 0
    events = brain.pop_events(case.id)
    assert [e["kind"] for e in events] == ["llm_call", "plan_accepted"]
    call = events[0]["data"]
    assert call["accepted"] is True and call["backend"] == "fake" and call["model"] == "scripted"
    assert len(call["prompt_digest"]) == 64 and call["prompt_tokens"] == 100 and call["purpose"] == "plan"
    assert brain.pop_events(case.id) == []  # drained


def test_invalid_answers_are_rejected_then_revised_with_errors(case: Case) -> None:
    contract = load_contract("segment_brain")
    answers = ["{not json", plan_json({**SEG, "tool": "shell.exec"}),
               plan_json({**SEG, "args": {**SEG["args"], "t1": "@seq.T9"}}), plan_json(SEG)]
    backend = fake.ScriptedBackend(answers)
    brain = LLMPlanner(backend, max_revisions=3, decoding="plan")
    sketch = brain.plan(contract.goal, case, contract)
    assert [s.tool for s in sketch.steps] == ["seg.brain_tumor"]
    events = brain.pop_events(case.id)
    rejected = [e for e in events if e["kind"] == "plan_rejected"]
    assert [e["error_code"] for e in rejected] == ["schema", "bad_reference", "bad_reference"]
    assert "T9" in rejected[2]["message"]
    accepted = [e for e in events if e["kind"] == "plan_accepted"]
    assert accepted[0]["data"]["revisions"] == 3
    # each revision round carries the previous answer and the compiler's typed errors
    last = backend.requests[3]["messages"]
    assert last[-2] == {"role": "assistant", "content": answers[2]}
    assert "[bad_reference]" in last[-1]["content"] and "T9" in last[-1]["content"]


def test_no_valid_plan_is_a_typed_error_or_the_fallback(case: Case) -> None:
    contract = load_contract("segment_brain")
    with pytest.raises(ToolError) as err:
        LLMPlanner(fake.ScriptedBackend(["nope"]), max_revisions=1, decoding="plan").plan(contract.goal, case, contract)
    assert err.value.code is ErrorCode.schema and "after 1 revision" in err.value.message
    brain = LLMPlanner(fake.ScriptedBackend(["nope"]), fallback=OfflinePlanner(), max_revisions=1, decoding="plan")
    assert brain.name == "llm,offline"
    sketch = brain.plan(contract.goal, case, contract)
    assert [s.tool for s in sketch.steps] == ["seg.brain_tumor"]
    kinds = [e["kind"] for e in brain.pop_events(case.id)]
    assert kinds.count("llm_call") == 2 and kinds[-1] == "plan_fallback"
    down = LLMPlanner(fake.ScriptedBackend([ToolError("resource", "server down")]), fallback=OfflinePlanner(),
                    decoding="plan")
    down.plan(contract.goal, case, contract)
    events = down.pop_events(case.id)
    assert events[0]["kind"] == "llm_call" and events[0]["error_code"] == "resource"
    assert events[-1]["kind"] == "plan_fallback" and events[-1]["error_code"] == "resource"


def test_pass_at_k_takes_the_first_candidate_that_compiles(case: Case) -> None:
    contract = load_contract("segment_brain")
    backend = fake.ScriptedBackend([["[]", plan_json({**SEG, "tool": "seg.cardiac"}), plan_json(SEG)]])
    brain = LLMPlanner(backend, k=3, decoding="plan")
    sketch = brain.plan(contract.goal, case, contract)
    assert sketch.steps[0].tool == "seg.brain_tumor" and len(backend.requests) == 1
    assert backend.requests[0]["n"] == 3 and backend.requests[0]["temperature"] > 0
    events = brain.pop_events(case.id)
    assert [e["data"]["candidate"] for e in events if e["kind"] == "plan_rejected"] == [0, 1]


def test_revise_asks_once_more_and_wrong_domain_is_not_asked(case: Case) -> None:
    contract = load_contract("segment_brain")
    backend = fake.ScriptedBackend([plan_json(SEG)])
    brain = LLMPlanner(backend, decoding="plan")
    broken = brain.plan(contract.goal, case, contract).model_copy(deep=True)
    broken.steps[0].args["t1"] = "@seq.T9"
    revised = brain.revise(broken, [ToolError("bad_reference", "no T9", step="seg_brain_tumor", arg="t1")],
                           case, contract)
    assert revised is not None and revised.steps[0].args["t1"] == "@seq.T1"
    assert "no T9" in backend.requests[-1]["messages"][-1]["content"]
    with pytest.raises(ToolError) as err:
        LLMPlanner(backend, decoding="plan").plan("grade", case, load_contract("cardiac_report"))
    assert err.value.code is ErrorCode.input_missing and len(backend.requests) == 2  # no model call


def test_a_step_repeated_word_for_word_is_one_step() -> None:
    from bcer.agents.planners.llm import parse_plan

    step = {"tool": "denoise.nlm", "id": "denoise_nlm", "args": {"image": "@seq.T1"}}
    sketch = parse_plan(plan_json(step, step), "g", "brain", {"denoise.nlm"})
    assert [s.id for s in sketch.steps] == ["denoise_nlm"]
    other = {**step, "args": {"image": "@seq.T2"}}  # same id, other content: kept for the compiler to reject
    assert len(parse_plan(plan_json(step, other), "g", "brain", {"denoise.nlm"}).steps) == 2
