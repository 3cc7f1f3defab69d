"""Exit codes a scheduler can act on (0 all delivered and plausible, 1 some case failed or
implausible, 2 usage or input error), --set values in provenance, --case-id/--exclude, and the
Python API's progress display and result objects."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bcer
from bcer.cli import main as cli
from bcer.cli.main import app

runner = CliRunner()
cli.console.width = 200
pytestmark = pytest.mark.timeout(300)
DENOISE = {"goal": "denoise T1", "steps": [{"id": "dn", "tool": "denoise.nlm", "args": {"image": "@seq.T1"}}]}


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def brains(tmp_path_factory) -> Path:
    from bcer.datasets.synth import synth_cohort

    data = tmp_path_factory.mktemp("brains")
    synth_cohort("brain", 3, data, layout="brats", seed=2, size="small")
    return data


def test_cohort_exit_codes(ray_local, brains, tmp_path):
    ids = [c.id for c in bcer.load_cases(brains)]
    sketch = tmp_path / "dn.json"
    sketch.write_text(json.dumps(DENOISE))
    # 0: every case delivered; --case-id/--exclude pick the cases; --set lands in provenance
    code, out = invoke("cohort", "--data", brains, "--plan", sketch, "--case-id", ids[2], "--case-id", ids[0],
                       "--exclude", ids[0], "--set", "denoise.nlm.h_factor=1.25", "--out", tmp_path / "ok",
                       "--no-report")
    assert code == 0, out
    done = sorted(p.parent.name for p in (tmp_path / "ok").glob("*/_DONE"))
    assert done == [ids[2]]
    prov = json.loads((tmp_path / "ok" / ids[2] / "provenance.json").read_text())
    chain = next(iter(prov["deliverables"].values()))["chain"]
    assert [n["params"]["h_factor"] for n in chain if n.get("tool") == "denoise.nlm"] == [1.25]
    # 1: every case failed (a cardiac task on brain scans: each case is rejected, the cohort finishes)
    code, out = invoke("cohort", "--data", brains, "--task", "cardiac_report", "--limit", "2",
                       "--out", tmp_path / "bad", "--no-report")
    assert code == 1 and "0/2 cases succeeded" in out and "exit code 1" in out, out
    # 2: an input error, nothing ran
    code, out = invoke("cohort", "--data", brains, "--task", "denoise", "--case-id", "nope", "--out", tmp_path / "x")
    assert code == 2 and "no case 'nope'" in out and not (tmp_path / "x").exists()
    code, out = invoke("cohort", "--data", tmp_path / "missing", "--task", "denoise", "--out", tmp_path / "x")
    assert code == 2


def test_run_input_errors_are_typed(brains, tmp_path):
    # 2 and a typed error before anything runs: no dataset, or a cohort folder given to `bcer run`
    code, out = invoke("run", "--task", "denoise", "--out", tmp_path / "r")
    assert code == 2 and "[input_missing] no dataset given" in out and "--data DIR" in out, out
    code, out = invoke("run", "--data", brains, "--task", "denoise", "--out", tmp_path / "r")
    assert code == 2 and "[value_range]" in out and "holds 3 cases" in out and "bcer cohort" in out, out
    assert not (tmp_path / "r").exists()


def test_run_and_report_exit_codes(ray_local, brains, tmp_path):
    case = next(p for p in sorted(brains.iterdir()) if p.is_dir())
    res = runner.invoke(app, ["run", "--data", str(case), "--task", "cardiac_report", "--out", str(tmp_path / "r"),
                              "--json", "--no-report"])
    row = json.loads(res.stdout)  # --json: stdout is JSON alone, the progress goes to stderr
    assert res.exit_code == 1 and row["status"] == "rejected" and row["error_code"] == "input_missing"
    code, out = invoke("report", tmp_path / "r", "--no-case-pages")
    assert code == 0 and (tmp_path / "r" / "report" / "index.html").exists()  # pages of a failed run: written
    code, out = invoke("report", tmp_path / "nothing_here")
    assert code == 2


def test_bench_exit_code_follows_its_cases(ray_local, brains, tmp_path):
    code, out = invoke("bench", "--task", "cardiac_report", "--data", brains, "--cases", "1", "--out", tmp_path / "b",
                       "--no-report")
    assert code == 1, out


def test_study_progress_and_run_case_result(ray_local, brains, tmp_path):
    from rich.console import Console

    cases = bcer.load_cases(brains)[:1]
    buf = io.StringIO()
    seen: list[str] = []
    result = bcer.Study(cases, plan=bcer.PlanSketch.model_validate(DENOISE), out=tmp_path / "s").run(
        progress=True, console=Console(file=buf, width=100), on_case_done=lambda r: seen.append(r["case"]))
    text = buf.getvalue()
    assert result.rows[0]["status"] == "succeeded" and seen == [cases[0].id]
    assert f"✓ {cases[0].id}" in text and "cases" in text  # the bar and the case's line
    one = bcer.run_case(cases[0], plan=bcer.PlanSketch.model_validate(DENOISE), out=tmp_path / "one")
    assert isinstance(one, bcer.CaseResult) and one.ok and one["status"] == one.status == "succeeded"
    row = one.to_dict()
    assert type(row) is dict and row["case"] == cases[0].id and one.cases.num_rows == 1
    assert (one.out / "_DONE").exists()
    stats = bcer.build_pages(tmp_path / "one", case_pages=False)
    assert Path(stats.index).exists() and stats.cohort_pages == 1


def test_case_progress_shows_the_running_nodes():
    """The hook's idea of "running": nodes whose upstream nodes are done and that are not."""
    from rich.console import Console
    from rich.progress import Progress

    from bcer.contracts.workflow import Workflow
    from bcer.progress import CaseProgress

    wf = Workflow.model_validate({"case_id": "c1", "goal": "g", "nodes": [
        {"id": "a", "tool": "denoise.nlm"}, {"id": "b", "tool": "denoise.nlm", "after": ["a"]},
        {"id": "c", "tool": "denoise.nlm", "after": ["a"]}, {"id": "d", "tool": "denoise.nlm", "after": ["b", "c"]}]})
    with Progress(console=Console(file=io.StringIO())) as bar:
        hook = CaseProgress(bar, 1)
        hook.on_case_start(case="c1", workflow=wf)
        assert hook.running("c1") == ["a"]
        hook.on_node_end(case="c1", node="a", status="succeeded")
        assert hook.running("c1") == ["b", "c"]
        hook.on_node_end(case="c1", node="b", status="succeeded")
        hook.on_node_end(case="c1", node="c", status="failed")
        assert hook.running("c1") == ["c"]  # a failed node is still the one to finish
        assert "c1: c" in bar.tasks[1].description
