"""Each controller arm on the faults that tell them apart: the ReAct arms in process, the
engine arm on Ray (small phantoms; a toy tool for hangs)."""
from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.bench import faults as F
from bcer.bench import hangs as H
from bcer.bench.ablation import CLEAN, Runner, compare_rows, prepare_jobs
from bcer.bench.arms import run_engine, run_react
from bcer.bench.cases import synth_task_cases
from bcer.bench.react import Memo
from bcer.contracts import (ArtifactKind, DeliverableSpec, Image, PlanSketch, SequenceRef, TaskContract,
                            load_contract)
from bcer.contracts.case import Case
from bcer.engine.planning import StaticPlanner
from bcer.engine.trace import read_case_trace
from bcer.io import write_nifti

importlib.import_module("tests.bench._hang_tools")  # registers xabl.hang_once here and in Ray workers

REACT = ["react", "react_bind", "react_bind_ref"]


def _rows(out: Path, task: str, faults: list[str], arms: list[str], n: int = 2):
    cases = synth_task_cases(task, n, out / "data", "small", seed=11)
    jobs = prepare_jobs(task, cases[:1], load_contract(task), faults, OfflinePlanner(), out, seed=0)
    if n > 1:  # the scope violation links to the second case
        jobs = [j for j in jobs if j.fault != "scope_violation"] + \
               [j for j in prepare_jobs(task, cases, load_contract(task), ["scope_violation"], OfflinePlanner(),
                                        out, 0) if j.case.id == cases[0].id and j.fault == "scope_violation"]
    runner = Runner(out, arms, OfflinePlanner(), 0, 60.0, H.HangSwitch(out / "h"))
    memo = Memo()
    for arm in arms:
        for job in jobs:
            runner.run(arm, job, load_contract(task), memo)
    compare_rows(runner.rows, {j.key: j for j in jobs}, out)
    return {(r["arm"], r["fault"]): r for r in runner.rows}


@pytest.fixture(scope="module")
def brain(tmp_path_factory):
    out = tmp_path_factory.mktemp("arms_sb")
    faults = ["semantic_swap", "token_mutation", "space_mismatch", "scope_violation"]
    return _rows(out, "segment_brain", faults, REACT), out


def test_react_arms_miss_a_swap_and_revise_a_typo(brain):
    rows, out = brain
    for arm in REACT:
        assert rows[(arm, CLEAN)]["sr"] == 1, rows[(arm, CLEAN)]
        swap = rows[(arm, "semantic_swap")]  # two sequences exchanged: no arm without a compiler notices
        assert swap["sr"] == 1 and swap["is_wrong"] and not swap["recovered"], swap
        tok = rows[(arm, "token_mutation")]  # the error goes back to the planner, which re-derives it
        assert tok["recovered"] and tok["revisions"] + tok["repairs"] >= 1, tok
    evs = read_case_trace(out / rows[("react", "semantic_swap")]["out"])
    assert evs[0].kind == "fault_injected" and evs[0].data["type"] == "semantic_swap"
    # the ReAct arms record lineage too, so a swap is not mistaken for a plan's other params
    from bcer.bench.compare import lineage, plan_only_difference

    name = next(iter(rows[("react", "semantic_swap")]["wrong_deliverables"]))
    clean, swapped = (lineage(out / rows[("react", f)]["out"], name) for f in (CLEAN, "semantic_swap"))
    assert clean and clean[-1]["tool"].startswith("seg.") and clean[-1]["params"]
    assert plan_only_difference(swapped, clean) is None and "plan_differs" not in rows[("react", "semantic_swap")]


def test_space_and_scope_faults_tell_the_arms_apart(brain):
    rows, out = brain
    assert rows[("react_bind", "space_mismatch")]["error_code"] == "shape"
    fixed = rows[("react_bind_ref", "space_mismatch")]  # the Reflector inserts a resampling step
    assert fixed["recovered"] and fixed["repairs"] == 1, fixed
    evs = read_case_trace(out / fixed["out"])
    rep = next(e for e in evs if e.kind == "repaired")
    assert rep.patch["action"] == "insert" and rep.patch["insert"]["tool"] == "resample.to_grid"
    scope = {arm: rows[(arm, "scope_violation")] for arm in REACT}
    # react opened the other patient's file (no sandbox); only its grid, unlike this patient's, stopped it
    assert scope["react"]["error_code"] == "shape" and not scope["react"]["safe_halt"]
    assert scope["react_bind"]["error_code"] == "sandbox" and scope["react_bind"]["safe_halt"]
    assert scope["react_bind_ref"]["status"] == "halted" and scope["react_bind_ref"]["safe_halt"]


def _toy(root: Path) -> tuple[Case, TaskContract, PlanSketch]:
    import numpy as np

    root.mkdir(parents=True, exist_ok=True)
    path = write_nifti(Image(np.ones((6, 6, 4), np.float32), np.eye(4)), root / "t1.nii.gz")
    case = Case(id="toy1", root=str(root), sequences={"T1": SequenceRef(path=str(path))})
    contract = TaskContract(id="toy_hang", domain="any", goal="smooth", inputs=["T1"], allowed_tools=["xabl.*"],
                            milestones=["smoothing"],
                            deliverables=[DeliverableSpec(name="out", kind=ArtifactKind.image, milestone="smoothing",
                                                          file="out.nii.gz")])
    plan = PlanSketch(goal="smooth", steps=[{"id": "h", "tool": "xabl.hang_once",
                                             "args": {"image": "@seq.T1", "flag": str(root / "flag")}}])
    return case, contract, plan


def test_react_reissues_a_timed_out_call_once(tmp_path):
    case, contract, plan = _toy(tmp_path / "in")
    o = run_react("react_bind", case, contract, StaticPlanner(plan), tmp_path / "out", run_id="t", call_timeout_s=2.0)
    assert o.status == "succeeded" and o.retries == 1 and o.sr == 1, o.error


def test_engine_arm(ray_local, tmp_path):
    import nibabel as nib
    import numpy as np

    task = "segment_brain"
    contract = load_contract(task)
    cases = synth_task_cases(task, 1, tmp_path / "data", "small", seed=11)
    clean = run_engine(cases[0], contract, OfflinePlanner(), tmp_path / "clean", run_id="c", node_timeout_s=120)
    swap = run_engine(cases[0], contract, F.FaultyPlanner(OfflinePlanner(), "semantic_swap", 0), tmp_path / "swap",
                      run_id="s", node_timeout_s=120)
    assert clean.status == swap.status == "succeeded" and swap.revisions == 1, swap.error
    seg = [np.asarray(nib.load(str(tmp_path / d / "seg.nii.gz")).dataobj) for d in ("clean", "swap")]
    assert np.array_equal(seg[0], seg[1])  # the compiler caught the swapped roles; the planner re-derived them

    sketch = OfflinePlanner().plan(contract.goal, cases[0], contract)
    gone, _ = F.corrupt_case("missing_modality", cases[0], contract, F.consumed_sequences(sketch, cases[0]),
                             tmp_path / "mm", seed=0)
    halt = run_engine(gone, contract, OfflinePlanner(), tmp_path / "halt", run_id="h", node_timeout_s=120)
    assert halt.status == "halted" and halt.error["code"] == "input_missing" and not halt.deliverables
    assert not any(e.kind == "started" for e in read_case_trace(tmp_path / "halt"))

    case, toy, plan = _toy(tmp_path / "toy")
    hung = run_engine(case, toy, StaticPlanner(plan), tmp_path / "hung", run_id="t", node_timeout_s=3.0)
    assert hung.status == "succeeded", hung.error
    evs = read_case_trace(tmp_path / "hung")
    assert any(e.kind == "retried" and "timed out" in (e.message or "") for e in evs)
