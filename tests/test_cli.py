"""The `bcer` command end to end (typer's runner, in-process; Ray via the shared session)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bcer import cli
from bcer.cli import app

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

    code, out = invoke("plan", "--case", case_dir, "--task", "segment_brain")
    assert code == 0 and "seg.brain_tumor" in out and "deliverable" in out

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
    code, out = invoke("run", "--case", case_dir, "--plan", sketch, "--out", out_dir)
    assert code == 0, out
    done = [p for p in out_dir.iterdir() if (p / "_DONE").exists()]
    assert len(done) == 1 and (done[0] / "events.jsonl").exists()
    code, out = invoke("trace", done[0])
    assert code == 0 and "succeeded" in out and "denoise.nlm" in out

    code, out = invoke("cohort", "--data", data, "--task", "segment_brain", "--out", tmp_path / "cohort")
    assert code == 0 and "2/2 cases succeeded" in out
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
