"""``bcer memory stats|add|search|export``: the R4 exemplar memory from the command line.

Registered on the ``memory`` command group by ``bcer.cli.main``; kept apart so the main CLI module
holds the run commands.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import options as O
from .views import console, fail as _fail
from ..contracts import ToolError


def _open_memory(path: Path, readonly: bool, embedder: str):
    from ..memory import ExemplarMemory

    if readonly and not (path / "manifest.json").exists() and not (path / "wal.jsonl").exists():
        _fail(FileNotFoundError(f"no exemplar memory in {path}"))
    return ExemplarMemory(path, embedder, readonly=readonly)


_MEM_OPT = typer.Option(..., "--memory", metavar="DIR", help="exemplar-memory folder")
_EMB_OPT = typer.Option("minilm", metavar="NAME", help="embedder the memory was built with: minilm | hash")


def memory_stats(memory: Path = _MEM_OPT, embedder: str = _EMB_OPT,
                 as_json: O.Json = False) -> None:
    """Exemplars per task, index kind, support, profiles, pending WAL entries."""
    try:
        s = _open_memory(memory, True, embedder).stats()
    except ToolError as e:
        _fail(e)
    if as_json:
        typer.echo(json.dumps(s, indent=2, default=str))
        return
    t = Table(title=f"{s['exemplars']} exemplars in {memory} ({s['embedder']}, generation {s['generation']}, "
                    f"{s['wal_pending']} in the WAL)")
    for col in ("task", "exemplars", "support", "index", "profiles"):
        t.add_column(col)
    for task, v in s["tasks"].items():
        t.add_row(task, str(v["exemplars"]), str(v["support"]), v["index"],
                  ", ".join(f"{k}={n}" for k, n in v["profiles"].items()))
    console.print(t)


def memory_add(runs: list[Path] = typer.Argument(..., metavar="RUN...", help="case output folders, or cohort folders holding them"),
               memory: Path = _MEM_OPT, embedder: str = _EMB_OPT) -> None:
    """Curate the reviewed reports of finished cases into the memory (only validated cases, those
    with _DONE, whose report the R4 loop left without material issue are added)."""
    from ..agents.memory_actor import MemoryClient
    from ..agents.r4.reviewer import R4Reviewer
    from ..contracts.artifacts import Report
    from ..engine.review import CurateRequest

    dirs = sorted({p.parent for r in runs for p in ([r / "report.json"] if (r / "report.json").exists()
                                                     else r.glob("*/report.json"))})
    if not dirs:
        _fail(FileNotFoundError(f"no report.json under {', '.join(map(str, runs))}"))
    try:
        mem = _open_memory(memory, False, embedder)
    except ToolError as e:
        _fail(e)
    reviewer, counts = R4Reviewer(MemoryClient(mem)), {}
    try:
        for d in dirs:
            data = json.loads((d / "report.json").read_text())
            done = json.loads((d / "_DONE").read_text()) if (d / "_DONE").exists() else {}
            # the row: result.json (full audit, or a case that did not succeed), else _DONE (lean)
            row = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else done
            rep = Report(data.get("text", ""), data.get("structured", {}), data.get("evidence", []), data.get("meta", {}))
            run_id = done.get("run_id", done.get("run", ""))  # an audited _DONE / a lean one (the row)
            res = reviewer.curate(CurateRequest(case_id=d.name, task=row.get("task"), run_id=run_id,
                                                report=rep, verified=bool(done), status=row.get("status", "")))
            counts[res["action"]] = counts.get(res["action"], 0) + 1
            console.print(f"{d.name}: {res['action']} ({res['reason']})")
    finally:
        mem.close()
    console.print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def memory_search(query: str = typer.Argument(..., metavar="QUERY", help="evidence summary or free text"),
                  memory: Path = _MEM_OPT, task: str = typer.Option(..., metavar="ID", help="task id"),
                  k: int = typer.Option(3, "-k", metavar="K", min=1, help="exemplars to return"),
                  profile: Optional[str] = typer.Option(None, metavar="NAME", help="only exemplars of this profile"),
                  embedder: str = _EMB_OPT) -> None:
    """Top-k exemplars of a task nearest to the query (cosine)."""
    try:
        hits = _open_memory(memory, True, embedder).search(task, query, k, profile=profile)
    except ToolError as e:
        _fail(e)
    for h in hits:
        r = h["record"]
        console.print(f"[bold]{h['score']:.3f}[/] {r['id']} {r['case']} ({r['profile']}, {r['label']}, "
                      f"support {r['support']})\n  {r['profile_text']}")


def memory_export(target: Path = typer.Argument(..., metavar="FILE", help="output file: .jsonl or .parquet"),
                  memory: Path = _MEM_OPT, embedder: str = _EMB_OPT) -> None:
    """Every exemplar record as JSON lines or Parquet."""
    try:
        path = _open_memory(memory, True, embedder).export(target)
    except ToolError as e:
        _fail(e)
    console.print(f"wrote {path}")
