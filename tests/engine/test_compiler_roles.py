"""Compile rule 3b: a sequence must fit the role of the port it feeds, so a semantic swap (right
kind, wrong data) is a typed compile error instead of a silently wrong deliverable."""
from __future__ import annotations

import pytest

from bcer.contracts import ErrorCode, PlanSketch, SequenceRef, load_contract
from bcer.contracts.case import Case
from bcer.engine.compiler import CompileError, compile_plan

BRAIN = Case(id="b1", root="/data/b1", domain="brain",
             sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in ("T1", "T1c", "T2", "FLAIR")})
PROSTATE = Case(id="p1", root="/data/p1", domain="prostate",
                sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in ("T2w", "ADC", "DWI")})


def _plan(tool: str, **args) -> PlanSketch:
    return PlanSketch(goal="g", steps=[{"id": "s", "tool": tool, "args": args}])


def _errors(plan, case, task):
    with pytest.raises(CompileError) as e:
        compile_plan(plan, case, load_contract(task))
    return {(x.context.get("arg"), x.code) for x in e.value.errors}, e.value


def test_a_port_named_after_a_sequence_takes_it():
    seg = dict(t1="@seq.T1", t1c="@seq.T1c", t2="@seq.T2", flair="@seq.FLAIR")
    assert compile_plan(_plan("seg.brain_tumor", **seg), BRAIN, load_contract("segment_brain")).nodes
    errs, e = _errors(_plan("seg.brain_tumor", **{**seg, "t1c": "@seq.FLAIR", "flair": "@seq.T1c"}), BRAIN,
                      "segment_brain")
    assert errs == {("t1c", ErrorCode.schema), ("flair", ErrorCode.schema)}
    assert "@seq.T1c" in e.errors[0].hint
    # without the named sequence in the case, another one may stand in (not a swap)
    no_t1c = BRAIN.model_copy(update={"sequences": {k: v for k, v in BRAIN.sequences.items() if k != "T1c"}})
    assert compile_plan(_plan("seg.brain_tumor", **{**seg, "t1c": "@seq.T1"}), no_t1c)


def test_contract_roles_pin_fixed_and_moving():
    ok = _plan("register.rigid", fixed="@seq.T2w", moving="@seq.ADC")
    assert compile_plan(ok, PROSTATE, load_contract("register_prostate"))
    errs, e = _errors(_plan("register.rigid", fixed="@seq.ADC", moving="@seq.T2w"), PROSTATE, "register_prostate")
    assert errs == {("fixed", ErrorCode.schema), ("moving", ErrorCode.schema)}
    assert "takes T2w" in e.errors[0].message
    assert compile_plan(ok.model_copy(update={"steps": [ok.steps[0].model_copy(
        update={"args": {"fixed": "@seq.ADC", "moving": "@seq.T2w"}})]}), PROSTATE)  # no contract: no roles


def test_an_alternative_input_only_stands_in_for_a_missing_one():
    errs, e = _errors(_plan("denoise.nlm", image="@seq.FLAIR"), BRAIN, "denoise")
    assert errs == {("image", ErrorCode.schema)} and "alternative to the task's input T1" in e.errors[0].message
    assert compile_plan(_plan("denoise.nlm", image="@seq.T1"), BRAIN, load_contract("denoise"))
    no_t1 = BRAIN.model_copy(update={"sequences": {k: v for k, v in BRAIN.sequences.items() if k != "T1"}})
    assert compile_plan(_plan("denoise.nlm", image="@seq.FLAIR"), no_t1, load_contract("denoise"))
