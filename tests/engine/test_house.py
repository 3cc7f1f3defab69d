"""House rules of the engine's imports beyond the layering rules (tests/test_layering.py): the
case run does not import its executor, the repair models live in contracts."""
from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "bcer" / "engine"


def imported(path: Path) -> set[str]:
    """Every module a file imports (relative imports resolved against the file's package)."""
    package = list(path.relative_to(ENGINE.parent.parent).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


def test_no_import_loop_between_the_case_run_and_its_executor():
    assert not any(m.startswith("bcer.engine.executor") for m in imported(ENGINE / "case" / "run.py"))
    assert any(m.startswith("bcer.engine.case.run") for m in imported(ENGINE / "executor.py"))


def test_repair_models_live_in_contracts_and_stay_importable_from_the_reflector():
    from bcer.agents.repair import reflector
    from bcer.contracts import repair

    assert reflector.Failure is repair.Failure and reflector.Patch is repair.Patch and reflector.Halt is repair.Halt


def test_one_driver_loop_polls_the_event_loop():
    """Cohorts and compiled workflows run from the same loop (``engine.driver``): no other
    engine module waits on the event loop itself."""
    polling = {p.relative_to(ENGINE).as_posix() for p in ENGINE.rglob("*.py")
               if ".loop.poll(" in p.read_text() or "loop.poll(" in p.read_text()}
    assert polling == {"driver.py"}


def test_the_documented_path_of_a_case_names_at_most_twelve_files_that_exist():
    root = ENGINE.parents[1]
    text = (root / "docs" / "architecture.md").read_text()
    block = text.split("<!-- case-path -->")[1].split("<!-- /case-path -->")[0]
    files = [line.split("`")[1] for line in block.strip().splitlines()]
    assert 0 < len(files) <= 12 and len(set(files)) == len(files)
    assert [f for f in files if not (root / f).is_file()] == []
