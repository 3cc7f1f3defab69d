"""Fault injection: each of the eight types is deterministic per seed and really corrupts what
it claims to (a reference that resolves to nothing, a path that names nothing, a swapped pair,
a moved grid with the same world content, a missing file, a symlink out of the case, a hang)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.bench import faults as F
from bcer.bench import hangs as H
from bcer.bench.cases import synth_task_cases
from bcer.contracts import ErrorCode, ToolError, load_contract
from bcer.engine.binder import resolved_ref, sequence_key
from bcer.engine.sandbox import Sandbox
from bcer.io import load_sequence

BRAIN = OfflinePlanner()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_cases")
    return {t: synth_task_cases(t, 2 if t != "recon_cardiac" else 1, root / t, "small", seed=5)
            for t in ("brain_grade", "register_prostate", "recon_cardiac")}


def _plan(task, case):
    contract = load_contract(task)
    return BRAIN.plan(contract.goal, case, contract), contract


@pytest.mark.parametrize("fault", [f for f, c in F.CATALOGUE.items() if c.layer == F.PLAN])
@pytest.mark.parametrize("task", ["brain_grade", "register_prostate"])
def test_plan_faults_are_deterministic_and_really_wrong(cases, task, fault):
    case = cases[task][0]
    sketch, contract = _plan(task, case)
    a = F.draw_plan_fault(fault, sketch, case, contract, seed=1)
    b = F.draw_plan_fault(fault, sketch, case, contract, seed=1)
    assert a.to_dict() == b.to_dict() and a.recoverable and a.layer == F.PLAN
    bad = F.corrupt_sketch(sketch, a)
    assert bad != sketch and sketch == _plan(task, case)[0]  # the clean sketch is untouched
    args = bad.step(a.step).args
    if fault == "token_mutation":
        name = a.after.split(".")[1]
        if a.after.startswith("@seq."):
            assert sequence_key(case, name) is None
        else:
            assert name not in {s.id for s in sketch.steps} or a.after.split(".")[2] != a.before.split(".")[2]
        assert args[a.arg] == a.after and a.after != a.before
    elif fault == "path_mutation":
        assert not os.path.exists(args[a.arg]) and not args[a.arg].startswith("@")
    elif fault == "argument_omission":
        assert a.arg not in args and a.arg in sketch.step(a.step).args
    else:
        p, q = a.arg.split(",")
        assert (args[p], args[q]) == (sketch.step(a.step).args[q], sketch.step(a.step).args[p])


def test_faulty_planner_corrupts_once_and_revises_with_the_real_planner(cases):
    case = cases["register_prostate"][0]
    sketch, contract = _plan("register_prostate", case)
    fp = F.FaultyPlanner(BRAIN, "semantic_swap", seed=0, rng_key=case.id)
    bad = fp.plan(contract.goal, case.model_copy(update={"id": "renamed"}), contract)
    assert fp.fault.detail and bad.step("register_rigid").args["fixed"] == "@seq.ADC"
    assert fp.fault.to_dict() == F.draw_plan_fault("semantic_swap", sketch, case, contract, 0).to_dict()


def test_no_swap_target_in_a_one_input_kspace_task(cases):
    case = cases["recon_cardiac"][0]
    sketch, contract = _plan("recon_cardiac", case)
    with pytest.raises(F.NotApplicable):
        F.draw_plan_fault("semantic_swap", sketch, case, contract, seed=0)


def test_moved_volume_keeps_world_content():
    from bcer.tools.resample import resample_onto

    rng = np.random.default_rng(0)
    data = rng.random((9, 7, 5)).astype(np.float32)
    aff = np.array([[0, -1.2, 0, 10], [1.1, 0, 0, -4], [0, 0, 2.5, 3], [0, 0, 0, 1.0]])
    for seed in range(6):
        moved, maff, how = F._moved_volume(data, aff, F.fault_rng("space_mismatch", "x", seed))
        assert moved.shape != data.shape or not np.allclose(maff, aff), how
        back = resample_onto(moved, maff, aff, data.shape, "linear")
        np.testing.assert_allclose(back, data, atol=1e-5, err_msg=how)


def test_data_faults_corrupt_a_copy(cases, tmp_path):
    c0, c1 = cases["brain_grade"]
    sketch, contract = _plan("brain_grade", c0)
    used = F.consumed_sequences(sketch, c0)
    assert used[0] == "T1" and set(used) == {"T1", "T1c", "T2", "FLAIR"}
    moved, f = F.corrupt_case("space_mismatch", c0, contract, used, tmp_path / "sm", seed=2)
    again, g = F.corrupt_case("space_mismatch", c0, contract, used, tmp_path / "sm2", seed=2)
    assert f.sequence == g.sequence != "T1" and f.detail == g.detail  # never the reference grid
    a = load_sequence(resolved_ref(c0, f.sequence))
    b = load_sequence(resolved_ref(moved, f.sequence))
    assert a.shape != b.shape or not np.allclose(a.affine, b.affine)
    assert Path(moved.root) == tmp_path / "sm" and Path(c0.sequences[f.sequence].path).exists()

    gone, f = F.corrupt_case("missing_modality", c0, contract, used, tmp_path / "mm", seed=0)
    assert not f.recoverable and f.sequence in gone.sequences
    assert not Path(resolved_ref(gone, f.sequence).path).exists()

    out, f = F.corrupt_case("scope_violation", c0, contract, used, tmp_path / "sv", seed=0, donor=c1)
    link = Path(resolved_ref(out, f.sequence).path)
    assert link.is_symlink() and c1.id in str(link.resolve())
    with pytest.raises(ToolError) as e:
        Sandbox(out.root, tmp_path / "o").check_read(link)
    assert e.value.code is ErrorCode.sandbox


def test_hang_switch_hangs_exactly_once(tmp_path):
    sw = H.HangSwitch(tmp_path / "h")
    assert not H.should_hang("c1", "seg", sw.file)
    sw.arm("c1", "seg")
    assert H.should_hang("c1", "seg", sw.file)
    assert not H.should_hang("c1", "seg", sw.file) and not H.should_hang("c2", "seg", sw.file)


def test_resolve_and_typo():
    assert F.resolve_faults("all") == list(F.FAULT_TYPES) and len(F.FAULT_TYPES) == 8
    assert F.resolve_faults("timeout,semantic_swap") == ["timeout", "semantic_swap"]
    with pytest.raises(ToolError) as e:
        F.resolve_faults("bit_flip")
    assert e.value.code is ErrorCode.value_range
    import random

    assert F.typo("labels", random.Random(3)) == F.typo("labels", random.Random(3)) != "labels"
    assert {c.name for c in F.CATALOGUE.values() if not c.recoverable} == {"missing_modality", "scope_violation"}
