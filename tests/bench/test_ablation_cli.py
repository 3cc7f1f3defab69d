"""`bcer bench --arms/--faults` wiring: a tiny in-process ablation (ReAct arms only, no Ray) and
a typed refusal of unknown arms."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from bcer.cli import main as cli
from bcer.cli.main import app

runner = CliRunner()
cli.console.width = 200


def test_bench_runs_the_ablation_and_writes_its_json(tmp_path):
    out = tmp_path / "abl"
    res = runner.invoke(app, ["bench", "--tasks", "denoise", "--arms", "react,react_bind", "--faults",
                              "missing_modality,semantic_swap", "--cases", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "controller ablation" in res.output and "react_bind" in res.output
    report = json.loads((out / "ablation.json").read_text())
    assert report["config"]["arms"] == ["react", "react_bind"] and len(report["rows"]) == 2 * 3
    cells = {(c["arm"], c["fault"]): c for c in report["by_arm_fault"]}
    assert cells[("react", "missing_modality")]["safe_halt"] == 1.0  # one-step task: nothing written before
    assert cells[("react_bind", "semantic_swap")]["wrong_rate"] == 1.0  # FLAIR denoised instead of T1
    assert report["faults_injected"][0]["record"]["type"] == "missing_modality"


def test_unknown_arm_is_refused(tmp_path):
    res = runner.invoke(app, ["bench", "--arms", "reflexion", "--faults", "all", "--out", str(tmp_path)])
    assert res.exit_code != 0 and "unknown arm" in res.output
