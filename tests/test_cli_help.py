"""The `bcer` command as a new user meets it, without Ray: --version, -h on every command, help
without Python type names or reST markup, the choices of --task/--layout/--planner, `bcer tasks`,
`bcer tools TOOL` with bounds, and --set / --case-id checked before anything runs."""
from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

import bcer
from bcer.cli import main as cli
from bcer.cli.main import app

runner = CliRunner()
COMMANDS = [("tasks",), ("tools",), ("plan",), ("run",), ("cohort",), ("bench",), ("demo",), ("report",),
            ("trace",), ("data", "synth"), ("memory", "stats"), ("memory", "add"), ("memory", "search"),
            ("memory", "export"), ("data", "inspect")]
TYPE_NAMES = re.compile(r"<(str|int|float|bool|path|Path|list\[[^>]*\]|int range|float range)>")


def invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args], terminal_width=100)
    return result.exit_code, result.output


def flat(text: str) -> str:
    """Whitespace folded: error lines wrap at the console's width."""
    return " ".join(text.split())


def test_version_and_short_help_everywhere():
    code, out = invoke("--version")
    assert code == 0 and out.strip() == f"bcer {bcer.__version__}"
    for cmd in COMMANDS:
        code, out = invoke(*cmd, "-h")
        assert code == 0 and "Usage: " in out, cmd
        assert not TYPE_NAMES.search(out), (cmd, TYPE_NAMES.search(out).group(0))
        assert "``" not in out and ":class:" not in out, cmd  # no reST markup
        usage = next(ln for ln in out.splitlines() if ln.startswith("Usage: "))
        assert "{" not in usage and "}" not in usage, (cmd, usage)  # arguments by name, no placeholders
    code, out = invoke("tools")
    assert code == 0 and "`" not in out  # tool descriptions from docstrings, without their reST literals


def test_help_lists_the_choices_and_one_name_per_concept():
    from bcer.agents.specs import PLANNERS, REFLECTORS
    from bcer.contracts import list_contracts
    from bcer.datasets.layouts import layouts

    assert cli.O.PLANNERS == PLANNERS and cli.O.REFLECTORS == REFLECTORS
    assert set(cli.O.layout_names()) == set(layouts())  # module names are the layouts' NAMEs
    helps = {c: invoke(c, "-h")[1] for c in ("plan", "run", "cohort", "bench")}
    flat = {c: " ".join(h.split()) for c, h in helps.items()}
    for task in list_contracts():
        assert task in flat["cohort"] and task in flat["bench"]
    for c in ("plan", "run", "cohort"):
        for flag in ("--data DIR", "--task ID", "--layout NAME", "--set TOOL.PARAM=VALUE", "--planner [offline|llm|"
                     "llm,offline]", "--llm SPEC", "--json"):
            assert flag in flat[c], (c, flag)
        assert "brats" in flat[c] and "nnunet" in flat[c]
    for c in ("run", "cohort"):
        for flag in ("--out DIR", "--node-timeout SECONDS", "--gpu-concurrency K", "--report / --no-report",
                     "--r4 / --no-r4", "--model-actors / --no-model-actors"):
            assert flag in flat[c], (c, flag)
    assert "--case-id ID" in flat["cohort"] and "--exclude ID" in flat["cohort"] and "--limit N" in flat["cohort"]
    assert "--task ID" in flat["bench"] and "repeatable" in flat["bench"] and "--node-timeout" in flat["bench"]
    assert "--case " not in helps["run"] and "--tasks" not in helps["bench"]  # old names hidden
    assert "Exit code 0" in flat["cohort"] and "2: usage or input error" in flat["cohort"]


def test_tasks_lists_every_contract_with_domain_inputs_and_deliverables():
    from bcer.contracts import list_contracts, load_contract

    code, out = invoke("tasks", "--json")
    rows = {r["id"]: r for r in json.loads(out)}
    assert code == 0 and sorted(rows) == list_contracts()
    seg = rows["segment_brain"]
    assert seg["domain"] == "brain" and seg["inputs"] == ["T1", "T1c", "T2", "FLAIR"]
    assert [d.split(" ")[0] for d in rows["prostate_report"]["deliverables"]] == [
        d.name for d in load_contract("prostate_report").deliverables]
    assert "CINE (or KSPACE)" in rows["cardiac_report"]["inputs"]
    code, out = invoke("tasks")
    assert code == 0 and all(t in out for t in rows)


def test_tools_show_bounds_and_one_tool_in_full():
    code, out = invoke("tools")  # piped: one block per tool; the bounds are text, not rich markup
    assert code == 0 and "patch_distance=2 [min 1, max 8]" in out and "h_factor=0.8 [above 0.0, max 5.0]" in out
    code, out = invoke("tools", "denoise.nlm")
    assert code == 0 and out.startswith("denoise.nlm v") and "filter strength h = h_factor * sigma" in out
    assert "h_factor=0.8 [above 0.0, max 5.0]: filter strength" in out
    assert max(len(line) for line in out.splitlines()) <= 100
    code, out = invoke("tools", "denoise.nlmm")
    assert code == 2 and "did you mean 'denoise.nlm'" in flat(out)


def test_set_is_checked_against_the_tool_before_ray(monkeypatch, tmp_path):
    from bcer.engine import cluster

    def no_ray(*a, **k):
        raise AssertionError("Ray started before --set was checked")
    monkeypatch.setattr(cluster, "ensure_ray", no_ray)
    code, out = invoke("cohort", "--data", tmp_path, "--task", "denoise", "--set", "denoise.nlm.h_factor=9",
                       "--out", tmp_path / "o")
    assert code == 2 and "value_range" in out and "maximum 5.0" in flat(out), out
    code, out = invoke("plan", "--data", tmp_path, "--task", "denoise", "--set", "denoise.nlm.h_factr=0.9")
    assert code == 2 and "did you mean 'h_factor'" in flat(out), out
    code, out = invoke("bench", "--task", "denoise", "--set", "h_factor=0.9", "--out", tmp_path / "b")
    assert code == 2 and "TOOL.PARAM=VALUE" in flat(out)


def test_parse_sets_coerces_and_names_the_bound():
    from bcer.contracts import ToolError
    from bcer.overrides import parse_sets

    assert parse_sets(["denoise.nlm.h_factor=0.9", "denoise.nlm.patch_size=5", "denoise.nlm.rician=false"]) == {
        "denoise.nlm": {"h_factor": 0.9, "patch_size": 5, "rician": False}}
    with pytest.raises(ToolError) as e:
        parse_sets(["denoise.nlm.patch_distance=0"])
    assert e.value.code.value == "value_range" and "minimum 1" in str(e.value)
    with pytest.raises(ToolError) as e:
        parse_sets(["no.such.tool=1"])
    assert e.value.code.value == "bad_reference"


def test_case_selection_keeps_order_excludes_and_names_unknown_ids():
    from bcer.api import select_cases
    from bcer.contracts import Case, ToolError

    cases = [Case(id=f"c{i}", root=f"/d/c{i}", sequences={}) for i in range(4)]
    assert [c.id for c in select_cases(cases, ["c2", "c0"])] == ["c2", "c0"]
    assert [c.id for c in select_cases(cases, None, ["c1", "c3"])] == ["c0", "c2"]
    assert [c.id for c in select_cases(cases, ["c2", "c0"], ["c0"])] == ["c2"]
    with pytest.raises(ToolError) as e:
        select_cases(cases, ["c9"])
    assert e.value.code.value == "input_missing" and "c9" in str(e.value)


def test_choice_lists_name_the_near_choice():
    """One choice parser for --task, --arms, --faults, --planner and --reflector: a typo exits 2,
    before anything runs, with the near choice."""
    for args, near in ((("bench", "--task", "denoyse"), "'denoise'"),
                       (("bench", "--arms", "react_bnd"), "'react_bind'"),
                       (("bench", "--faults", "timeot"), "'timeout'"),
                       (("cohort", "--data", ".", "--reflector", "tier1,lm"), "'tier1,llm'")):
        code, out = invoke(*args)
        assert code == 2 and f"did you mean {near}" in flat(out), (args, out)
