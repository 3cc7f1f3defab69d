"""The offline planner's revise re-derives a bad or missing input binding by its own planning
rules (never by spelling), from compile errors and from run-time observations alike."""
from __future__ import annotations

from bcer.agents.planners.offline import OfflinePlanner
from bcer.contracts import ErrorCode, SequenceRef, ToolError, load_contract
from bcer.contracts.case import Case
from bcer.engine.compiler import CompileError, compile_plan

PROSTATE = Case(id="p1", root="/data/p1", domain="prostate",
                sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in ("T2w", "ADC", "DWI")})
BRAIN = Case(id="b1", root="/data/b1", domain="brain",
             sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in ("T1", "T1c", "T2", "FLAIR")})


def _broken(case, task, step, **args):
    contract = load_contract(task)
    clean = OfflinePlanner().plan(contract.goal, case, contract)
    bad = clean.model_copy(deep=True)
    s = bad.step(step)
    for k, v in args.items():
        if v is None:
            s.args.pop(k)
        else:
            s.args[k] = v
    return clean, bad, contract


def test_swapped_roles_are_re_derived_from_compile_errors():
    clean, bad, contract = _broken(PROSTATE, "register_prostate", "register_rigid", fixed="@seq.ADC",
                                   moving="@seq.T2w")
    try:
        compile_plan(bad, PROSTATE, contract)
        raise AssertionError("the swap compiled")
    except CompileError as e:
        fixed = OfflinePlanner().revise(bad, e.errors, PROSTATE, contract)
    assert fixed is not None and fixed.step("register_rigid").args == clean.step("register_rigid").args


def test_a_misspelt_or_omitted_input_is_re_derived_from_a_runtime_observation():
    clean, bad, contract = _broken(BRAIN, "brain_grade", "quant_roi_features", mask="@node.seg_brain_tumor.lables")
    err = ToolError(ErrorCode.bad_reference, "names no result", step="quant_roi_features", arg="mask")
    assert OfflinePlanner().revise(bad, [err], BRAIN, contract) == clean
    clean, bad, contract = _broken(BRAIN, "brain_grade", "seg_brain_tumor", t1c=None)
    err = ToolError(ErrorCode.input_missing, "input 't1c' is missing", step="seg_brain_tumor", arg="t1c")
    assert OfflinePlanner().revise(bad, [err], BRAIN, contract) == clean


def test_nothing_to_change_is_none():
    """An error the planner cannot fix (the right binding failed) gives no revision, not a loop."""
    contract = load_contract("brain_grade")
    clean = OfflinePlanner().plan(contract.goal, BRAIN, contract)
    err = ToolError(ErrorCode.shape, "not on the same voxel grid", step="seg_brain_tumor", arg="t2")
    assert OfflinePlanner().revise(clean, [err], BRAIN, contract) is None
