"""The `bcer` command: tasks, tools, plan, run, cohort, bench, report, trace, demo, data, memory.

Exit codes of run, cohort and bench: 0 every case delivered and plausible, 1 some case failed
or was implausible, 2 a usage or input error (nothing ran); 130 interrupted. ``bcer report``:
0 pages written, 1 the pages could not be built, 2 not a bcer output folder.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.table import Table

from . import options as O
from . import views as V
from ..contracts import ErrorCode, ToolError
from ..options import StudyOptions

# plain help (click's layout, as nnU-Net's and Ray's CLIs): every metavar is ours, no type names.
# typer prints a positional argument's Python type (``<path>``) beside its metavar whatever the
# metavar says; the metavar alone is the help we want.
typer.core.TyperArgument.display_type_rich = lambda self, ctx: None  # type: ignore[method-assign]
# and a required argument is written bare in the usage line (click's and argparse's convention),
# not in typer's braces, which read like a placeholder to fill in
typer.core.TyperArgument._usage_display_name = lambda self: (  # type: ignore[method-assign]
    (self.display_name_raw if self.required else f"[{self.display_name_raw}]") + ("..." if self.nargs != 1 else ""))
_CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, context_settings=_CTX,
                  help="bcer: planned MRI analysis workflows on Ray, from one case to cohorts.")
data_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, context_settings=_CTX,
                       help="Synthesise phantom cohorts and inspect datasets.")
app.add_typer(data_app, name="data")
memory_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, context_settings=_CTX,
                         help="The R4 exemplar memory: stats, add, search, export.")
app.add_typer(memory_app, name="memory")
console = V.console  # one console: tests set its width through bcer.cli.main

EXIT_OK, EXIT_CASES, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


_fail = V.fail  # a typed error: printed, exit code 2


def _interrupted(out: Path) -> None:
    console.print(f"[bold yellow]interrupted[/]: tables of the finished cases are in {out}; "
                  "rerun the same command to resume")
    raise typer.Exit(EXIT_INTERRUPTED)


def _exit_for(rows: list[dict]) -> None:
    """0 when every case was delivered and plausible, else 1 (a scheduler reads this)."""
    from rich.console import Console

    bad = [r for r in rows if r.get("status") != "succeeded"]
    if bad:
        Console(stderr=True).print(f"[red]{len(bad)} of {len(rows)} case(s) not delivered or implausible[/]: exit code 1")
    raise typer.Exit(EXIT_CASES if bad or not rows else EXIT_OK)


def _data(data: Optional[Path], old_case: Optional[Path]) -> Path:
    if data is None and old_case is None:
        _fail(ToolError(ErrorCode.input_missing, "no dataset given", hint="give the dataset or case folder with "
                        "--data DIR", arg="--data"))
    return data or old_case  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"bcer {__version__}")
        raise typer.Exit()


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log at INFO level"),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="print the version and exit")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
def tasks(as_json: O.Json = False) -> None:
    """List the task contracts: id, domain, inputs and deliverables."""
    rows = V.task_rows()
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    V.print_tasks(rows)


@app.command()
def tools(name: Optional[str] = typer.Argument(None, metavar="TOOL", help="show one tool in full (e.g. denoise.nlm)"),
          as_json: O.Json = False) -> None:
    """List every registered tool with its ports, params (defaults, bounds), resources and GPU path."""
    from ..tools import list_tools

    specs = list_tools()
    if name is not None:
        from ..tools.registry import get_tool

        try:
            specs = [get_tool(name).spec]
        except ToolError as e:
            _fail(e)
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json") for s in specs], indent=2))
        return
    if name is not None or V.narrow(140):  # piped, small terminal or one tool: one block per tool
        V.print_tool_blocks(specs, detail=name is not None)
        if name is None:
            console.print(f"{len(specs)} tools - one in full, with its param descriptions: bcer tools TOOL")
        return
    V.print_tool_table(specs)


@app.command()
@O.study_options(*O.PLANNING)
def plan(data: O.Data = None, case: O.OldCase = None, opts: Optional[StudyOptions] = None,
         as_json: O.Json = False) -> None:
    """Print the plan sketch and the compiled DAG of one case without running anything."""
    from ..api import plan_case

    events: list[dict] = []
    try:
        sketch, workflow, revisions = plan_case(_data(data, case), opts, events=events)
    except (ToolError, FileNotFoundError) as e:
        V.print_planning(events)
        _fail(e)
    if as_json:
        typer.echo(json.dumps({"sketch": sketch.model_dump(mode="json"), "workflow": workflow.model_dump(mode="json"),
                               "revisions": revisions, "planning_events": events}, indent=2, default=str))
        return
    V.print_planning(events)
    console.print_json(sketch.model_dump_json())
    _print_workflow(workflow, revisions)


def _print_workflow(workflow, revisions: int) -> None:
    title = f"workflow for {workflow.case_id} ({len(workflow.nodes)} nodes, {revisions} revisions)"
    if V.narrow(120):
        console.print(title)
        for n in workflow.nodes:
            console.print(f"[bold]{n.id}[/] {n.tool}{'' if n.required else ' (optional)'}"
                          f"{' milestone=' + n.milestone if n.milestone else ''}")
            for k, v in n.inputs.items():
                console.print(f"  {k} <- {v}", soft_wrap=True)
            if n.params:
                console.print("  " + ", ".join(f"{k}={v}" for k, v in n.params.items()), soft_wrap=True)
        for d in workflow.deliverables:
            console.print(f"deliverable {d.name} <- @node.{d.node}.{d.field} -> {d.file}", soft_wrap=True)
        return
    t = Table(title=title)
    for col in ("node", "tool", "inputs", "params", "after", "milestone", "required"):
        t.add_column(col)
    for n in workflow.nodes:
        t.add_row(n.id, n.tool, ", ".join(f"{k}={v}" for k, v in n.inputs.items()),
                  ", ".join(f"{k}={v}" for k, v in n.params.items()), ", ".join(n.after),
                  n.milestone or "", "yes" if n.required else "no")
    console.print(t)
    for d in workflow.deliverables:
        console.print(f"deliverable [bold]{d.name}[/] ← @node.{d.node}.{d.field} → {d.file}")


def _run_study(study, as_json: bool = False):
    """The study under the progress display (on stderr with --json, so stdout stays JSON);
    typed errors exit 2, Ctrl-C 130."""
    from rich.console import Console

    from ..progress import run_with_progress

    try:
        cases = study.cases()
        if not cases:
            _fail(ToolError(ErrorCode.input_missing, "no case left to run",
                            hint="check --case-id / --exclude / --limit"))
        chosen = study.replace(data=cases, case_ids=None, exclude=None, limit=None)
        return run_with_progress(chosen.run, len(cases), study.options.address,
                                 Console(stderr=True) if as_json else console)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted(study.options.out)


@app.command()
@O.study_options(*O.PLANNING, *O.RUNNING, *O.PER_CASE)
def run(data: O.Data = None, case: O.OldCase = None, opts: Optional[StudyOptions] = None,
        report: O.Report = True, as_json: O.Json = False) -> None:
    """Run one case (a case folder, or a dataset folder holding one case).

    Exit code 0: delivered and plausible; 1: failed or implausible; 2: usage or input error.
    """
    from ..api import Study, load_cases

    try:
        cases = load_cases(_data(data, case), opts.layout, opts.seq)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    if len(cases) != 1:
        _fail(ToolError(ErrorCode.value_range, f"{data or case} holds {len(cases)} cases",
                        hint="use `bcer cohort` (--case-id ID picks one)", arg="--data"))
    result = _run_study(Study(cases, opts, max_in_flight=1), as_json)
    row = result.rows[0]
    keys = ("case", "status", "sr", "sr_delivered", "tcr", "error_code", "error_message", "deliverables",
            "measurements", "plausibility")
    if as_json:
        typer.echo(json.dumps({k: row.get(k) for k in keys}, indent=2, default=str))
    else:
        console.print_json(json.dumps({k: row.get(k) for k in keys}, default=str))
    if report:
        _pages(result.out)
    _exit_for(result.rows)


@app.command()
@O.study_options(*O.PLANNING, *O.RUNNING, *O.PER_CASE, *O.COHORT)
def cohort(data: O.DataRequired, opts: Optional[StudyOptions] = None, report: O.Report = True,
           as_json: O.Json = False) -> None:
    """Run every case of a dataset folder; a failing case becomes a row and the others finish;
    a rerun on the same --out skips the finished cases.

    Exit code 0: every case delivered and plausible; 1: some case failed or implausible;
    2: usage or input error (nothing ran).
    """
    from ..api import Study

    result = _run_study(Study(data, opts), as_json)
    if as_json:
        typer.echo(json.dumps({"summary": result.summary(), "rows": result.rows}, indent=2, default=str))
    else:
        V.print_summary(result)
    if report:
        _pages(result.out)
    _exit_for(result.rows)


@app.command()
def trace(case_dir: Path = typer.Argument(..., metavar="CASE_OUT",
                                          help="a case's output folder (OUT/CASE), or an events.jsonl"),
          as_json: O.Json = False) -> None:
    """Timeline of a case's events (its events.jsonl, or its rows of the cohort's events.parquet)."""
    from ..engine.trace import read_case_trace, read_events

    try:
        events = read_case_trace(case_dir) if case_dir.is_dir() else read_events(case_dir)
    except (FileNotFoundError, OSError) as e:
        _fail(FileNotFoundError(str(e)))
    if as_json:
        typer.echo(json.dumps([e.model_dump(mode="json") for e in events], indent=2, default=str))
        return
    t0 = min((e.time for e in events), default=0.0)
    t = Table(title=f"{len(events)} events of {events[0].case if events else case_dir}")
    for col in ("t+s", "kind", "node", "tool"):
        t.add_column(col, no_wrap=True)
    narrow = V.narrow(120)
    for col in ("attempt", "duration", "worker", "detail"):
        if narrow and col in ("worker", "attempt"):
            continue  # keep the columns that tell the story readable in 80 columns
        t.add_column(col, overflow="fold")
    for e in events:
        colour = {"failed": "red", "repaired": "yellow", "succeeded": "green", "fallback": "yellow"}.get(e.kind, "")
        detail = " ".join(x for x in (e.error_code, e.message, json.dumps(e.patch) if e.patch else None) if x)
        cells = [f"{e.time - t0:7.3f}", f"[{colour}]{e.kind}[/]" if colour else e.kind, e.node or "", e.tool or ""]
        dur = f"{e.duration_s:.3f}" if e.duration_s is not None else ""
        cells += [dur, detail[:120]] if narrow else [str(e.attempt), dur, e.worker or "", detail[:120]]
        t.add_row(*cells)
    console.print(t)


@app.command()
@O.study_options("set_", "bundle", "model_dir", "planner", "llm", "llm_record", *O.RUNNING, out=Path("bench_out"))
def bench(task: O.Tasks = None, tasks_old: Optional[str] = typer.Option(None, "--tasks", hidden=True),
          cases: int = typer.Option(10, "--cases", metavar="N", min=1, help="cases per task"),
          size: str = typer.Option("small", metavar="SIZE", help="phantom size: small | full"),
          family: str = typer.Option("base", metavar="FAMILY", help="phantom family: base | randomised | heldout "
                                     "(heldout: measure only, never tune on it)"),
          data: Optional[Path] = typer.Option(None, "--data", metavar="DIR",
                                              help="read cases from this folder instead of synthesising"),
          seed: int = typer.Option(0, metavar="N", help="phantom seed"), opts: Optional[StudyOptions] = None,
          max_in_flight: int = typer.Option(2, "--max-in-flight", metavar="N", min=1, help="cases in flight per task"),
          report: O.Report = True, as_json: O.Json = False,
          arms: Optional[str] = typer.Option(None, metavar="ARMS", help="controller ablation: all | react,react_bind,"
                                             "react_bind_ref,bcer (with --faults)"),
          faults: Optional[str] = typer.Option(None, metavar="FAULTS", help="controller ablation: all | fault "
                                               "type[,...] (token_mutation, path_mutation, argument_omission, "
                                               "semantic_swap, space_mismatch, missing_modality, scope_violation, "
                                               "timeout)"),
          timeout_old: Optional[float] = typer.Option(None, "--timeout", hidden=True)) -> None:
    """Task-contract benchmark on phantoms with ground truth: SR/TCR per task with quality beside it.
    With --arms/--faults: the controller ablation (OUT/ablation.json; its per-node limit is
    --node-timeout, default 60 s).

    Exit code 0: every case delivered and plausible; 1: some case failed or implausible;
    2: usage or input error.
    """
    from ..bench import resolve_tasks, run_bench
    from ..progress import local_cluster

    chosen = list(task or []) or ([t for t in tasks_old.split(",") if t.strip()] if tasks_old else ["all"])
    chosen = "all" if chosen == ["all"] else chosen
    out = opts.out
    if arms or faults:
        limit = opts.node_timeout_s or timeout_old or 60.0
        _ablation(chosen, arms or "all", faults or "all", cases, out, opts.address, size, data, seed, max_in_flight,
                  limit, opts.planner, opts.llm, opts.llm_record)
        return
    try:
        ids = resolve_tasks(chosen)
        with local_cluster(opts.address, console), V.case_bar(len(ids) * cases) as advance:
            result = run_bench(ids, cases, out, address=opts.address, size=size, data=data, seed=seed,
                               max_in_flight=max_in_flight, on_case_done=advance, bundles=opts.bundles,
                               model_dirs=opts.model_dirs, planner=opts.planner, llm=opts.llm,
                               llm_record=opts.llm_record, reflector=opts.reflector, cache=opts.cache,
                               node_timeout_s=opts.node_timeout_s, family=family, params=opts.params)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted(out)
    if as_json:
        typer.echo(json.dumps({k: result[k] for k in ("config", "tasks", "total_wall_s")}, indent=2, default=str))
    else:
        V.print_bench(result)
    if report:
        _pages(out)
    _exit_for(result["cases"])


def _ablation(tasks, arms: str, faults: str, cases: int, out: Path, address: Optional[str], size: str,
              data: Optional[Path], seed: int, max_in_flight: int, timeout: float, planner: str = "offline",
              llm: Optional[str] = None, llm_record: Optional[Path] = None) -> None:
    """The controller ablation; every arm plans with the same planner (and LLM backend)."""
    from ..agents.specs import Controller
    from ..bench import resolve_tasks
    from ..bench.ablation import run_ablation
    from ..bench.arms import resolve_arms
    from ..bench.faults import resolve_faults

    try:
        ids, arm_ids, fault_ids = resolve_tasks(tasks), resolve_arms(arms), resolve_faults(faults)
    except (ToolError, ValueError) as e:
        _fail(e)
    total = len(ids) * cases * len(arm_ids) * (len(fault_ids) + 1)
    with V.case_bar(total, "runs") as advance:
        with Controller(planner, llm=llm, llm_record=llm_record, address=address, memo=True) as ctl:
            report = run_ablation(ids, arm_ids, fault_ids, cases, out, size=size, seed=seed, timeout_s=timeout,
                                  max_in_flight=max_in_flight, address=address, data=data, planner=ctl.planner,
                                  on_row=advance)
    V.print_ablation(report)


@app.command()
def demo(out: O.Out = Path("demo_out"),
         cases: int = typer.Option(1, "--cases", metavar="N", min=1, help="cases per task"),
         task: O.Tasks = None, address: O.Address = None,
         planner: O.Planner = "offline", llm: O.LLM = None, llm_record: O.LLMRecord = None,
         reflector: O.Reflector = "tier1") -> None:
    """Synthesise a small mixed cohort (brain, prostate, cardiac, k-space) and run every task end
    to end on Ray (the offline planner by default; --planner llm --llm local plans with the local
    CPU model); prints SR/TCR and quality per task and writes the HTML pages.

    Exit code 0: every case delivered and plausible; 1: some case failed or implausible.
    """
    console.print(f"[bold]bcer demo[/]: {cases} synthetic case(s) per task, {planner} planner"
                  f"{' (' + llm + ')' if llm else ''}, {'cluster ' + address if address else 'local Ray'}; "
                  f"outputs in {out}")
    try:
        bench(task=task, tasks_old=None, cases=cases, out=out, size="small", family="base", data=None, seed=0,
              address=address, max_in_flight=2, planner=planner, llm=llm, llm_record=llm_record,
              reflector=reflector, report=True, as_json=False, arms=None, faults=None, timeout_old=None)
    finally:
        console.print(f"open [bold]{out}/report/index.html[/]  ·  a case's timeline: bcer trace "
                      f"{out}/runs/TASK/CASE  ·  tables: {out}/runs/TASK/cohort.parquet")


def _pages(out: Path, **kwargs) -> None:
    """Write OUT/report and print where; a failure here never fails the run that produced OUT."""
    from ..pages import build_report

    try:
        stats = build_report(out, **kwargs)
    except Exception as e:  # the run's outputs are already safe on disk; say what went wrong
        console.print(f"[yellow]pages not written[/]: {type(e).__name__}: {e}")
        return
    console.print(f"pages: [bold]{stats.index}[/] ({stats.case_pages} case pages, {stats.bytes / 1e6:.1f} MB)")
    for p in stats.problems[:10]:
        console.print(f"  [yellow]![/] {p}")


@app.command()
def report(out: Path = typer.Argument(..., metavar="OUT", help="a cohort or bench output folder"),
           max_case_pages: int = typer.Option(500, metavar="N", help="case pages per cohort (failures first)"),
           case_pages: bool = typer.Option(True, "--case-pages/--no-case-pages", help="also write one page per case"),
           as_json: O.Json = False) -> None:
    """Write static HTML pages (cohort, cases) under OUT/report; they open from disk, no server needed.

    Exit code 0: pages written (problems found are listed); 1: the pages could not be built;
    2: OUT is not a bcer output folder.
    """
    from ..pages import build_report

    try:
        stats = build_report(out, max_case_pages=max_case_pages, case_pages=case_pages)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    except Exception as e:  # a broken output folder: say what, exit 1 (not a usage error)
        console.print(f"[bold red]pages not written[/]: {type(e).__name__}: {e}")
        raise typer.Exit(EXIT_CASES)
    if as_json:
        typer.echo(json.dumps({"index": str(stats.index), "cohort_pages": stats.cohort_pages,
                               "case_pages": stats.case_pages, "bytes": stats.bytes,
                               "seconds_cohort_pages": round(stats.seconds_cohort_pages, 3),
                               "seconds_case_pages": round(stats.seconds_case_pages, 3),
                               "problems": stats.problems}, indent=2))
        return
    console.print(f"wrote [bold]{stats.index}[/]: {stats.cohort_pages} cohort page(s) in "
                  f"{stats.seconds_cohort_pages:.1f} s, {stats.case_pages} case page(s) in "
                  f"{stats.seconds_case_pages:.1f} s, {stats.bytes / 1e6:.1f} MB")
    for p in stats.problems:
        console.print(f"  [yellow]![/] {p}")


@data_app.command("synth")
def data_synth(domain: str = typer.Option(..., metavar="DOMAIN", help="brain | cardiac | prostate"),
               n: int = typer.Option(4, "--n", metavar="N", min=1, help="number of cases"),
               layout: Optional[str] = typer.Option(None, metavar="NAME", help="dataset layout (default per domain)"),
               out: Path = typer.Option(..., metavar="DIR", help="output folder"),
               seed: int = typer.Option(0, metavar="N", help="phantom seed"),
               size: str = typer.Option("small", metavar="SIZE", help="small (fast tests) | full (realistic)"),
               family: str = typer.Option("base", metavar="FAMILY", help="phantom family: base | randomised (tuning/training) "
                                                       "| heldout (measurement only)")) -> None:
    """Write a phantom cohort with exact ground truth in a real dataset layout."""
    from ..datasets.synth import synth_cohort

    try:
        cases = synth_cohort(domain, n, out, layout=layout, seed=seed, size=size, family=family)
    except (ToolError, ValueError) as e:
        _fail(e)
    console.print(f"wrote {len(cases)} {domain} cases ({size}, {family} family) to {out}")


from .data import data_inspect  # noqa: E402  (bcer data inspect: layout, cases, runnable tasks)

data_app.command("inspect")(data_inspect)


from .memory import memory_add, memory_export, memory_search, memory_stats  # noqa: E402

for _name, _fn in (("stats", memory_stats), ("add", memory_add), ("search", memory_search), ("export", memory_export)):
    memory_app.command(_name)(_fn)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
