"""Tier 1 repairs a grid mismatch by inserting a resampling step, and halts at once only for
missing data or sandbox violations (an unbound port is a planning slip, not missing data)."""
from __future__ import annotations

from bcer.agents.repair.reflector import RESAMPLER, Failure, Halt, Patch, Reflector, halts_at_once
from bcer.contracts import PlanSketch, SequenceRef, TaskContract, load_contract
from bcer.contracts.case import Case
from bcer.engine.compiler import compile_plan

BRAIN = Case(id="b1", root="/data/b1", domain="brain",
             sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in ("T1", "T1c", "T2", "FLAIR")})


def _wf(contract):
    plan = PlanSketch(goal="g", steps=[{"id": "seg", "tool": "seg.brain_tumor", "args": {
        "t1": "@seq.T1", "t1c": "@seq.T1c", "t2": "@seq.T2", "flair": "@seq.FLAIR"}}])
    return compile_plan(plan, BRAIN, contract)


def _failure(wf, code="shape", **context):
    err = {"code": code, "message": "inputs 't1' and 'flair' are not on the same voxel grid", "hint": "",
           "context": context}
    return Failure(case_id="b1", node=wf.node("seg"), error=err,
                   available={f"@seq.{k}": "image" for k in BRAIN.sequences})


def test_grid_mismatch_inserts_a_resampling_onto_the_reference():
    contract = load_contract("segment_brain")
    wf = _wf(contract)
    patch = Reflector().repair(_failure(wf, arg="flair", reference="t1"), wf, BRAIN, contract)
    assert isinstance(patch, Patch) and patch.action == "insert" and patch.tier == 1
    assert patch.insert.tool == RESAMPLER and patch.insert.inputs == {"image": "@seq.FLAIR", "reference": "@seq.T1"}
    assert patch.inputs["flair"] == f"@node.{patch.insert.id}.image"
    assert {k: v for k, v in patch.inputs.items() if k != "flair"} == {
        "t1": "@seq.T1", "t1c": "@seq.T1c", "t2": "@seq.T2"}


def test_no_regrid_without_a_named_reference_or_an_allowed_resampler():
    contract = load_contract("segment_brain")
    wf = _wf(contract)
    assert isinstance(Reflector().repair(_failure(wf, arg="flair"), wf, BRAIN, contract), Halt)
    strict = contract.model_copy(update={"allowed_tools": ["seg.*"]})
    assert isinstance(Reflector().repair(_failure(wf, arg="flair", reference="t1"), wf, BRAIN, strict), Halt)


def test_what_halts_at_once():
    wf = _wf(TaskContract(id="x", domain="brain", goal="g"))
    node = wf.node("seg")
    unbound = node.model_copy(update={"inputs": {k: v for k, v in node.inputs.items() if k != "t2"}})
    mk = lambda code, n=node, **ctx: Failure(case_id="b1", node=n, error={"code": code, "message": "m",
                                                                          "context": ctx})
    assert halts_at_once(mk("sandbox", arg="t2"))
    assert halts_at_once(mk("input_missing", file="/data/b1/T2.nii.gz", arg="t2"))
    assert not halts_at_once(mk("input_missing", unbound, arg="t2"))  # the plan left it unbound
    assert not halts_at_once(mk("shape", arg="t2"))
