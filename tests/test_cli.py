"""The `bcer` command end to end (typer's runner, in-process; Ray via the shared session)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bcer.cli import main as cli
from bcer.cli.main import app

runner = CliRunner()
cli.console.width = 200  # a wide terminal, so table cells are not wrapped mid-word
pytestmark = pytest.mark.timeout(300)


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def test_tools_lists_every_tool_with_ports_params_resources_and_gpu():
    code, out = invoke("tools", "--json")
    assert code == 0
    specs = {s["name"]: s for s in json.loads(out)}
    for name in ("denoise.nlm", "resample.to_spacing", "quant.roi_stats", "recon.grappa", "seg.brain_tumor",
                 "register.rigid", "report.structured"):
        assert name in specs, name
    nlm = specs["denoise.nlm"]
    assert nlm["inputs"][0]["kind"] == "image" and nlm["gpu"] == "optional"
    assert nlm["params_schema"]["properties"] and nlm["resources"]["num_cpus"] > 0
    code, out = invoke("tools")
    assert code == 0 and "register.rigid" in out


def test_data_synth_inspect_plan_run_trace(ray_local, tmp_path):
    data = tmp_path / "brats"
    code, out = invoke("data", "synth", "--domain", "brain", "--n", "2", "--out", data, "--seed", "5")
    assert code == 0 and "wrote 2 brain cases" in out
    code, out = invoke("data", "inspect", data, "--json")
    info = json.loads(out)
    assert code == 0 and len(info) == 2 and set(info[0]["sequences"]) == {"T1", "T1c", "T2", "FLAIR"}
    case_dir = Path(info[0]["root"])

    code, out = invoke("plan", "--data", case_dir, "--task", "segment_brain")
    assert code == 0 and "seg.brain_tumor" in out and "deliverable" in out
    code, out = invoke("plan", "--case", case_dir, "--task", "segment_brain")  # the old name still works
    assert code == 0 and "seg.brain_tumor" in out

    code, out = invoke("plan", "--case", case_dir, "--task", "no_such_task")
    assert code == 2 and "no task contract" in out

    sketch = tmp_path / "sketch.json"
    sketch.write_text(json.dumps({"goal": "denoise T1", "steps": [
        {"id": "dn", "tool": "denoise.nlm", "args": {"image": "@seq.t1"}},
        {"id": "stats", "tool": "quant.roi_stats", "args": {"image": "@node.dn.image", "mask": "@seq.T1"}}]}))
    code, out = invoke("plan", "--case", case_dir, "--plan", sketch)
    assert code == 2 and "mask" in out  # an image token bound to a mask port is a typed compile error

    sketch.write_text(json.dumps({"goal": "denoise T1", "steps": [
        {"id": "dn", "tool": "denoise.nlm", "args": {"image": "@seq.t1"}}]}))
    out_dir = tmp_path / "out"
    code, out = invoke("run", "--data", case_dir, "--plan", sketch, "--out", out_dir, "--no-report")
    assert code == 0, out
    done = [p for p in out_dir.iterdir() if (p / "_DONE").exists()]
    # a lean case folder: its trace is in the cohort's events.parquet, its row in _DONE
    assert len(done) == 1 and not (done[0] / "events.jsonl").exists()
    assert json.loads((done[0] / "_DONE").read_text())["status"] == "succeeded"
    code, out = invoke("trace", done[0])
    assert code == 0 and "succeeded" in out and "denoise.nlm" in out

    code, out = invoke("cohort", "--data", data, "--task", "segment_brain", "--out", tmp_path / "cohort")
    assert code == 0 and "2/2 cases succeeded" in out
    assert "SR delivered 100%, SR plausible 100%" in out and "implausible 0" in out
    code, out = invoke("cohort", "--data", data, "--task", "segment_brain", "--out", tmp_path / "cohort")
    assert code == 0 and "resumed 2" in out

    # --cache: a second cohort on another folder reuses every node; --node-timeout is accepted
    cache = tmp_path / "cache"
    for name in ("c1", "c2"):
        code, out = invoke("cohort", "--data", data, "--task", "segment_brain", "--out", tmp_path / name,
                           "--cache", cache, "--node-timeout", "600")
        assert code == 0 and "2/2 cases succeeded" in out, out
    import pyarrow.parquet as pq

    kinds = pq.read_table(tmp_path / "c2" / "events.parquet").column("kind").to_pylist()
    assert kinds.count("cache_hit") == kinds.count("succeeded") > 0


def test_bench_tables_show_sr_delivered_and_plausible_side_by_side():
    from bcer.cli.views import console, print_bench

    summary = {"chain": "long", "cases": 4, "sr": 0.5, "sr_delivered": 1.0, "tcr": 1.0, "median_case_s": 2.0,
               "quality": {}, "failures": [{"case": "c1", "status": "implausible", "error_code": "value_range",
                                            "error_message": "plausibility check 'ef_range' failed", "node": "q"}]}
    report = {"tasks": {"cardiac_report": summary}, "total_wall_s": 9.0, "synth_s": 1.0, "run_s": 8.0}
    width, console.width = console.width, 200  # no wrapping inside cells
    try:
        with console.capture() as cap:
            print_bench(report)
    finally:
        console.width = width
    out = cap.get()
    assert "SR (delivered) 100%, SR (plausible) 50%" in " ".join(out.split())  # the title wraps
    assert "SR (delivered)" in out and "SR (plausible)" in out and "c1: implausible value_range" in out


def _reviewed_case(tmp_path, task: str, i: int, done: bool) -> Path:
    """A case folder as a run leaves it: report.{md,json} reviewed by R4, result.json, _DONE."""
    from bcer.agents.r4.reviewer import R4Reviewer
    from bcer.bench.report_inputs import report_inputs
    from bcer.engine.outputs import write_artifact
    from bcer.engine.review import ReviewRequest
    from bcer.tools.registry import call_tool

    inputs, info = report_inputs(task, i)
    report = call_tool("report.structured", inputs)["report"]
    res = R4Reviewer().review(ReviewRequest(info["case"], task, "run1", "report_structured", report, inputs))
    d = tmp_path / "runs" / info["case"]
    write_artifact(res.report, d / "report.md")
    (d / "result.json").write_text(json.dumps({"task": task, "status": "succeeded" if done else "failed"}))
    if done:
        (d / "_DONE").write_text(json.dumps({"run_id": "run1"}))
    return d


def test_memory_add_stats_search_export(tmp_path):
    for i in range(3):
        _reviewed_case(tmp_path, "prostate_report", i, done=i != 2)
    mem = tmp_path / "mem"
    code, out = invoke("memory", "stats", "--memory", mem, "--embedder", "hash")
    assert code == 2 and "no exemplar memory" in out
    code, out = invoke("memory", "add", tmp_path / "runs", "--memory", mem, "--embedder", "hash")
    assert code == 0, out
    assert "added 2" in out and "rejected 1" in out and "case not validated" in out
    code, out = invoke("memory", "stats", "--memory", mem, "--embedder", "hash", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["exemplars"] == 2 and stats["tasks"]["prostate_report"]["index"] == "flat"
    code, out = invoke("memory", "search", "prostate report; multifocal; lesion_2", "--task",
                       "prostate_report", "--memory", mem, "--embedder", "hash", "-k", "2")
    lines = [x for x in out.splitlines() if x and x[0].isdigit()]
    assert code == 0 and len(lines) == 2 and "pr001 (borderline" in lines[0], out
    code, out = invoke("memory", "export", tmp_path / "mem.jsonl", "--memory", mem, "--embedder", "hash")
    rows = [json.loads(x) for x in (tmp_path / "mem.jsonl").read_text().splitlines()]
    assert code == 0 and len(rows) == 2 and all(r["task"] == "prostate_report" and r["plan"] for r in rows)
    code, out = invoke("memory", "add", tmp_path / "runs", "--memory", mem, "--embedder", "minilm")
    assert code == 2 and "embedder" in out  # a memory is never mixed across embedders


def test_r4_is_an_on_off_switch(tmp_path):
    code, out = invoke("run", "--data", tmp_path, "--task", "cardiac_report", "--r4", "maybe", "--out", tmp_path / "o")
    assert code == 2 and "unexpected extra argument" in out.lower()  # typer's usage error, before anything runs


def test_plan_with_a_recorded_llm_and_bad_controller_flags(tmp_path):
    """`bcer plan --planner llm --llm replay:FILE` replays a recorded model (no model here) and
    prints its LLM calls; unknown planner/reflector/backend specs are typed errors."""
    import importlib

    import numpy as np

    from bcer.agents.llm import make_backend
    from bcer.agents.planners.llm import LLMPlanner
    from bcer.api import load_cases, plan_case
    from bcer.contracts import Image
    from bcer.io import write_nifti

    fake = importlib.import_module("tests.agents._fake_llm")
    case_dir = tmp_path / "sub-01"
    for suffix in ("T2w", "FLAIR"):  # no T1: denoise's input is a choice between its alternatives
        write_nifti(Image(np.ones((6, 6, 4), np.float32), np.eye(4)), case_dir / "anat" / f"sub-01_{suffix}.nii.gz")
    rec = tmp_path / "calls.jsonl"
    answer = {"tool": "denoise.nlm", "args": {"image": "@seq.FLAIR"}}  # one step (step-by-step decoding)
    recording = make_backend(fake.ScriptedBackend([json.dumps(answer)]), record=rec)
    plan_case(load_cases(case_dir)[0], task="denoise", planner=LLMPlanner(recording))
    code, out = invoke("plan", "--data", case_dir, "--task", "denoise", "--planner", "llm", "--llm", f"replay:{rec}")
    assert code == 0, out
    assert "denoise.nlm" in out and "llm_call" in out and "plan_accepted" in out
    code, out = invoke("plan", "--data", case_dir, "--task", "denoise", "--planner", "gpt")
    assert code == 2 and "unknown planner 'gpt'" in out and "llm,offline" in out  # the choices, named
    code, out = invoke("plan", "--data", case_dir, "--task", "denoise", "--planner", "ofline")
    assert code == 2 and "did you mean 'offline'" in out  # a typo gets the near choice
    code, out = invoke("plan", "--data", case_dir, "--task", "denoise", "--planner", "llm", "--llm", "carrier-pigeon")
    assert code == 2 and "value_range" in out
    code, out = invoke("plan", "--data", case_dir, "--task", "denoise", "--planner", "llm")
    assert code == 2 and "need an LLM backend" in out
