"""`bcer report` and readable terminal output: piped tables keep every column legible; --json."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bcer.cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.timeout(300)


def test_report_command_json(cohort_out):
    result = runner.invoke(app, ["report", str(cohort_out), "--json", "--no-case-pages"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["cohort_pages"] == 1 and info["case_pages"] == 0 and Path(info["index"]).exists()
    result = runner.invoke(app, ["report", str(cohort_out / "no_such")])
    assert result.exit_code == 2 and "no bcer cohort" in result.output


def test_piped_tools_listing_is_readable():
    """Piped (no TTY, 80 columns): one block per tool, every name and param whole on its line."""
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([sys.executable, "-m", "bcer.cli", "tools"], capture_output=True, text=True, env=env,
                         timeout=120, check=True).stdout
    from bcer.tools.registry import REGISTRY, load_all

    load_all()  # the subprocess sees bcer's own tools (other test modules register toy tools here)
    specs = [r.spec for r in REGISTRY.values() if r.fn.__module__.startswith("bcer.")]
    heads = [line.split(" ")[0] for line in out.splitlines() if line and not line.startswith(" ")]
    for s in specs:
        assert s.name in heads, s.name
        for param in s.params_schema.get("properties", {}):
            assert f"param {param}=" in out, (s.name, param)
    assert f"{len(specs)} tools" in out
    assert all(len(line) < 400 for line in out.splitlines())


def test_trace_json_and_narrow_table(cohort_out):
    case = next(p.parent for p in cohort_out.glob("*/_DONE"))
    result = runner.invoke(app, ["trace", str(case), "--json"])
    assert result.exit_code == 0
    kinds = [e["kind"] for e in json.loads(result.output)]
    assert kinds[0] == "case_started" and kinds[-1] == "case_finished"
    result = runner.invoke(app, ["trace", str(case)])  # the narrow table still shows kind, node and detail
    assert result.exit_code == 0 and "case_finished" in result.output and "seg_prostate" in result.output
