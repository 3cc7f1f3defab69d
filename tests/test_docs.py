"""The README and docs/ as a new user reads them: every relative link resolves, every command
block of the README either runs here or is marked (slow / needs cluster / needs GPU) and then
names only commands and flags the CLI has, the README stays short, and the results page
covers every result file.

Markers: an HTML comment on the line before a fenced block, ``<!-- docs-test: run -->`` (run
it, in a temporary folder, each line must exit 0) or ``<!-- docs-test: slow (why) -->`` /
``needs cluster`` / ``needs GPU`` (checked against ``bcer ... -h`` instead of run).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
BLOCK = re.compile(r"(?:<!--\s*docs-test:\s*(?P<mark>[^>]*?)\s*-->\s*\n)?```(?P<lang>\w*)\n(?P<body>.*?)```", re.S)
pytestmark = pytest.mark.timeout(300)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def test_every_relative_link_resolves():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, broken


def readme_blocks() -> list[tuple[str, str, str]]:
    return [(m["mark"] or "", m["lang"], m["body"]) for m in BLOCK.finditer((ROOT / "README.md").read_text())]


def test_readme_is_short_and_every_command_block_is_marked():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, len(lines)
    text = "\n".join(lines)
    assert "Limitations" in text[:3000] and "synthetic data only" in text and "--bundle" in text[:3000]
    for mark, lang, body in readme_blocks():
        if lang in ("bash", "sh", "python"):
            assert re.match(r"(run|slow|needs (cluster|GPU))\b", mark), f"unmarked {lang} block:\n{body}"


def commands(body: str) -> list[list[str]]:
    """The block's command lines (continuations joined, comments dropped), split like a shell."""
    joined = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


def test_runnable_readme_blocks_run(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               COLUMNS="100", PYTHONPATH=str(ROOT))
    ran = 0
    for mark, lang, body in readme_blocks():
        if not mark.startswith("run"):
            continue
        assert lang == "bash"
        for argv in commands(body):
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
            assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
            ran += 1
    assert ran >= 5  # --version, tasks, tools, synth, inspect
    assert (tmp_path / "data" / "brats").is_dir()


def _check_bcer(argv: list[str]) -> None:
    from bcer.cli.main import app

    words = [a for a in argv[1:]]
    sub: list[str] = []
    for w in words:  # the subcommand path: the words before the first option or argument
        if w.startswith("-") or "/" in w or "." in w:
            break
        sub.append(w)
    res = CliRunner().invoke(app, [*sub, "-h"], terminal_width=200)
    assert res.exit_code == 0, (argv, res.output)
    for flag in (w.split("=", 1)[0] for w in words if w.startswith("--")):
        assert re.search(rf"(^|[\s,/]){re.escape(flag)}\b", res.output), (argv, flag)


def test_marked_readme_blocks_name_real_commands_and_flags():
    import bcer

    checked = 0
    for mark, lang, body in readme_blocks():
        if not mark or mark.startswith("run"):
            continue
        if lang == "python":
            compile(body, "README", "exec")
            for name in re.findall(r"\bbcer\.(\w+)", body):
                assert name in bcer.__all__, name
            checked += 1
            continue
        for argv in commands(body):
            if argv[0] == "bcer":
                _check_bcer(argv)
            elif argv[0] == "make":
                assert re.search(rf"^{argv[1]}:", (ROOT / "Makefile").read_text(), re.M), argv
            elif argv[0] == "ray" and "bcer" in argv:
                _check_bcer(argv[argv.index("bcer"):])
            checked += 1
    assert checked >= 8


def test_results_page_covers_every_result_file():
    page = (ROOT / "docs" / "results.md").read_text()
    missing = [p.name for p in sorted((ROOT / "benchmarks" / "results").glob("*.json")) if f"`{p.name}`" not in page]
    assert not missing, f"rerun `python scripts/results_page.py`: {missing}"
    for diary in ("ninth look", "this stop", "load average"):
        assert diary not in page
