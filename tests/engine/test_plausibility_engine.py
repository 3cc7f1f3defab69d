"""Cases built to be wrong end ``implausible``, never SR 1 — through the real engine.

Small phantoms of each task run the offline planner's plan with one step swapped for a tool
of ``_wrong_tools`` that delivers a well-formed but wrong answer (a gland over the whole
pelvis, a lesion outside the gland, an EF of 120 %, ED and ES swapped, an LV cavity drawn
too small (its blood labelled myocardium), a reconstruction on
the encoded instead of the header's matrix, a tumour outside the brain). The contract's
validators accept every file (SR delivered 1); the case must still end ``implausible``
with SR 0, error ``value_range`` naming the check, no ``_DONE``, a failed ``plausibility``
event and the failed check in its row and in ``cohort.parquet``. One control (the real
reconstruction with the header's matrix) must succeed.
"""
from __future__ import annotations

import importlib
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.bench.cases import synth_task_cases
from bcer.contracts import Case, load_contract
from bcer.engine.cohort import CohortConfig, run_cohort
from bcer.engine.planning import StaticPlanner
from bcer.engine.trace import read_case_trace

importlib.import_module("tests.engine._wrong_tools")  # registers the xwrong.* tools in the driver

# name: (task, real tool replaced, wrong tool, the check that must fail)
WRONG = {
    "gland_over_pelvis": ("prostate_report", "seg.prostate", "xwrong.seg_pelvis", "gland_volume"),
    "lesion_outside_gland": ("prostate_report", "detect.prostate_lesions", "xwrong.lesions_outside",
                             "lesions_in_gland"),
    "ef_120": ("cardiac_report", "quant.cardiac_function", "xwrong.function_ef120", "ef_range"),
    "ed_below_es": ("cardiac_report", "cardiac.ed_es", "xwrong.ed_es_swapped", "ed_greater_than_es"),
    "cavity_too_small": ("cardiac_report", "seg.cardiac", "xwrong.seg_cardiac_small_cavity", "labels_match_cine"),
    "lost_frame": ("cardiac_report", "seg.cardiac", "xwrong.seg_cardiac_lost_frame", "cavities_every_frame"),
    "recon_wrong_matrix": ("recon_cardiac", "recon.sense", "xwrong.recon_encoded_matrix", "recon_matrix"),
    "tumour_outside_brain": ("segment_brain", "seg.brain_tumor", "xwrong.tumour_outside", "tumour_in_brain"),
}


def _case(task: str, root: Path) -> Case:
    (c,) = synth_task_cases(task, 1, root / task, "small", seed=5)
    if task == "recon_cardiac":  # what the fastMRI reader gives from the ISMRMRD reconSpace
        from bcer.io import load_sequence

        nx, ny = load_sequence(c.sequences["KSPACE"]).image_shape[:2]
        c = c.model_copy(update={"metadata": dict(c.metadata, recon_matrix=[nx, ny, 1])})
    return c


def _run(name: str, case: Case, task: str, swap: tuple[str, str] | None, out: Path) -> dict:
    contract = load_contract(task)
    contract = contract.model_copy(update={"allowed_tools": contract.allowed_tools + ["xwrong.*"]})
    sketch = OfflinePlanner().plan(contract.goal, case, contract)
    if swap:
        steps = [s for s in sketch.steps if s.tool == swap[0]]
        assert steps, f"{task}: the offline plan has no {swap[0]} step to swap"
        for s in steps:
            s.tool = swap[1]
    cfg = CohortConfig(out=out / name, planner=StaticPlanner(sketch), contract=contract, max_in_flight=1)
    (row,) = run_cohort([case], cfg).rows
    return row


@pytest.fixture(scope="module")
def outcomes(ray_local, tmp_path_factory) -> tuple[dict[str, dict], Path]:
    root = tmp_path_factory.mktemp("wrong")
    cases = {t: _case(t, root / "data") for t in sorted({w[0] for w in WRONG.values()})}
    jobs = {n: (cases[t], t, (real, wrong)) for n, (t, real, wrong, _) in WRONG.items()}
    jobs["control_recon"] = (cases["recon_cardiac"], "recon_cardiac", None)
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {n: pool.submit(_run, n, c, t, swap, root / "runs") for n, (c, t, swap) in jobs.items()}
        return {n: f.result() for n, f in futures.items()}, root / "runs"


@pytest.mark.parametrize("name", sorted(WRONG))
def test_a_case_built_to_be_wrong_ends_implausible(outcomes, name) -> None:
    rows, runs = outcomes
    task, _, _, check = WRONG[name]
    row = rows[name]
    assert row["status"] == "implausible", (row["status"], row["error_code"], row["error_message"])
    assert row["sr"] == 0 and row["sr_delivered"] == 1 and row["tcr"] == 1.0
    assert row["error_code"] == "value_range" and row["error_message"].startswith("plausibility check ")
    assert check in row["error_message"]
    failed = {p["check"]: p for p in row["plausibility"] if p["ok"] is False}
    assert check in failed and failed[check]["message"]
    case_dir = runs / name / row["case"]
    assert not (case_dir / "_DONE").exists()
    for d in load_contract(task).deliverables:  # delivered, well formed: only plausibility can tell
        assert (case_dir / d.file).stat().st_size > 0
    events = [e for e in read_case_trace(case_dir) if e.kind == "plausibility"]
    assert {e.data["check"] for e in events} == {c.check for c in load_contract(task).plausibility}
    assert any(e.data["check"] == check and e.error_code == "value_range" and e.data["ok"] is False for e in events)
    table = pq.read_table(runs / name / "cohort.parquet").to_pylist()[0]
    assert table["status"] == "implausible" and table["sr"] == 0 and table["sr_delivered"] == 1
    assert check in {p["check"] for p in json.loads(table["plausibility"]) if p["ok"] is False}
    prov = json.loads((case_dir / "provenance.json").read_text())
    assert any(p["check"] == check and p["ok"] is False for p in prov["plausibility"])


def test_the_values_that_made_them_implausible(outcomes) -> None:
    rows, _ = outcomes
    value = {n: next(p for p in rows[n]["plausibility"] if p["check"] == WRONG[n][3])["value"] for n in WRONG}
    assert value["gland_over_pelvis"] > 250          # mL
    assert value["ef_120"] == 120.0                  # %
    assert value["ed_below_es"] < 0                  # EDV - ESV, mL
    assert value["cavity_too_small"] > 0.15          # share of myocardium voxels as bright as blood
    assert value["lost_frame"] == 0.0                # the emptied frame's LV / the largest frame's
    assert value["lesion_outside_gland"] == 0.0      # share of the far lesion's box in the gland
    assert value["tumour_outside_brain"] < 0.5       # share of tumour voxels inside the brain
    assert value["recon_wrong_matrix"] == 2.0        # twice the header matrix's in-plane voxels
    assert rows["ef_120"]["error_node"] == "quant_cardiac_function"  # the node whose output failed


def test_the_same_case_with_the_real_tool_succeeds(outcomes) -> None:
    rows, runs = outcomes
    row = rows["control_recon"]
    assert row["status"] == "succeeded" and row["sr"] == 1 and row["sr_delivered"] == 1, row["error_message"]
    assert all(p["ok"] is True for p in row["plausibility"]), row["plausibility"]
    assert (runs / "control_recon" / row["case"] / "_DONE").exists()
