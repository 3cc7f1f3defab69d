"""The `bcer` command: tools, plan, run, cohort, trace, demo, data, bench."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import cli_options as O
from . import cli_views as V
from .contracts import ToolError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="bcer: planned MRI analysis workflows on Ray, from one case to cohorts.")
data_app = typer.Typer(no_args_is_help=True, help="Synthesise phantom cohorts and inspect datasets.")
app.add_typer(data_app, name="data")
memory_app = typer.Typer(no_args_is_help=True, help="The R4 exemplar memory: stats, add, search, export.")
app.add_typer(memory_app, name="memory")
console = V.console  # one console: tests set its width through bcer.cli


def _fail(err: Exception) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error[/]: {escape(str(err))}")  # "[schema] ..." is text, not markup
    raise typer.Exit(2)


def _interrupted(out: Path) -> None:
    console.print(f"[bold yellow]interrupted[/]: tables of the finished cases are in {out}; "
                  "rerun the same command to resume")
    raise typer.Exit(130)


def _seq(items: Optional[list[str]]) -> Optional[dict[str, str]]:
    from .datasets.layouts.flat import parse_mapping

    return parse_mapping(items) if items else None


def _bundles(items: Optional[list[str]]) -> Optional[dict[str, str]]:
    from .actors.bundles import parse_bundle_args

    return parse_bundle_args(items) if items else None


def _dirs(items: Optional[list[Path]]) -> tuple[str, ...]:
    return tuple(str(p) for p in items or ())


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="log at INFO level")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command()
def tools(as_json: bool = typer.Option(False, "--json", help="print ToolSpecs as JSON")) -> None:
    """List every registered tool with its ports, params, resources and GPU path."""
    from .tools import list_tools

    specs = list_tools()
    if as_json:
        typer.echo(json.dumps([s.model_dump(mode="json") for s in specs], indent=2))
        return
    if V.narrow(140):  # piped or a small terminal: one block per tool instead of a squeezed table
        for s in specs:
            # soft wrap: a long line is left to the terminal, so no continuation line starts at column 0
            console.print(f"[bold]{s.name}[/] [dim]v{s.version}[/] — {s.description}", soft_wrap=True)
            console.print("  in:  " + ", ".join(f"{p.name}: {p.kind.value}{'' if p.required else '?'}"
                                                for p in s.inputs), soft_wrap=True)
            console.print("  out: " + ", ".join(f"{p.name}: {p.kind.value}" for p in s.outputs), soft_wrap=True)
            for k, v in s.params_schema.get("properties", {}).items():
                console.print(f"  param {V.param_line(k, v)}", soft_wrap=True)
            console.print(f"  cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB "
                          f"gpu-path={s.gpu} milestone={s.milestone or '-'}", soft_wrap=True)
        console.print(f"{len(specs)} tools")
        return
    t = Table(title=f"{len(specs)} tools", show_lines=True)
    t.add_column("tool", no_wrap=True)
    for col in ("inputs", "outputs", "params (default, bounds)", "resources", "gpu", "milestone"):
        t.add_column(col)
    for s in specs:
        t.add_row(f"{s.name}\n[dim]{s.description}[/]",
                  "\n".join(f"{p.name}: {p.kind.value}{'' if p.required else '?'}" for p in s.inputs),
                  "\n".join(f"{p.name}: {p.kind.value}" for p in s.outputs),
                  "\n".join(V.param_line(k, v) for k, v in s.params_schema.get("properties", {}).items()),
                  f"cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB",
                  s.gpu, s.milestone or "")
    console.print(t)


@app.command()
def plan(case: Path = typer.Option(..., "--case", help="case folder (or dataset folder with one case)"),
         goal: O.Goal = None,
         task: O.Task = None,
         plan_file: O.PlanFile = None,
         layout: O.Layout = None,
         seq: O.Seq = None,
         bundle: O.Bundle = None,
         model_dir: O.ModelDir = None,
         planner: O.Planner = "offline", llm: O.LLM = None,
         llm_record: O.LLMRecord = None,
         as_json: bool = typer.Option(False, "--json", help="print sketch and workflow as one JSON object")) -> None:
    """Print the plan sketch and the compiled DAG without running anything."""
    from .api import plan_case

    events: list[dict] = []
    try:
        sketch, workflow, revisions = plan_case(case, task=task, goal=goal, plan=plan_file, layout=layout,
                                                bundles=_bundles(bundle), model_dirs=_dirs(model_dir), seq=_seq(seq),
                                                planner=planner, llm=llm, llm_record=llm_record, events=events)
    except (ToolError, FileNotFoundError) as e:
        V.print_planning(events)
        _fail(e)
    if as_json:
        typer.echo(json.dumps({"sketch": sketch.model_dump(mode="json"), "workflow": workflow.model_dump(mode="json"),
                               "revisions": revisions, "planning_events": events}, indent=2, default=str))
        return
    V.print_planning(events)
    console.print_json(sketch.model_dump_json())
    if V.narrow(120):
        console.print(f"workflow for {workflow.case_id} ({len(workflow.nodes)} nodes, {revisions} revisions)")
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
    t = Table(title=f"workflow for {workflow.case_id} ({len(workflow.nodes)} nodes, {revisions} revisions)")
    for col in ("node", "tool", "inputs", "params", "after", "milestone", "required"):
        t.add_column(col)
    for n in workflow.nodes:
        t.add_row(n.id, n.tool, ", ".join(f"{k}={v}" for k, v in n.inputs.items()),
                  ", ".join(f"{k}={v}" for k, v in n.params.items()), ", ".join(n.after),
                  n.milestone or "", "yes" if n.required else "no")
    console.print(t)
    for d in workflow.deliverables:
        console.print(f"deliverable [bold]{d.name}[/] ← @node.{d.node}.{d.field} → {d.file}")



def _progress_run(study) -> "object":
    cases = study.cases()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task("cases", total=len(cases))

        def done(row: dict) -> None:
            mark = "[green]✓[/]" if row["status"] == "succeeded" else "[red]✗[/]"
            extra = " (resumed)" if row.get("resumed") else ""
            msg = (f" {row['status']} {row.get('error_code')}: {row.get('error_message')}"
                   if row["status"] != "succeeded" else "")
            bar.console.print(f"{mark} {row['case']}{extra}{msg}")
            bar.advance(job)

        study.data = cases
        return study.run(on_case_done=done)



@app.command()
def run(case: Path = typer.Option(..., "--case", help="case folder"),
        goal: O.Goal = None, task: O.Task = None,
        plan_file: O.PlanFile = None,
        out: Path = typer.Option(Path("bcer_out"), help="output folder"),
        address: O.Address = None,
        layout: O.Layout = None,
        cache: O.Cache = None,
        node_timeout: O.NodeTimeout = None,
        seq: O.Seq = None,
        bundle: O.Bundle = None,
        model_dir: O.ModelDir = None,
        r4: O.R4 = "on",
        memory: O.Memory = None,
        planner: O.Planner = "offline", llm: O.LLM = None,
        llm_record: O.LLMRecord = None, reflector: O.Reflector = "tier1") -> None:
    """Run one case."""
    from .api import Study, load_cases

    shared = _study_kwargs(locals())
    try:
        cases = load_cases(case, layout, _seq(seq))
        if len(cases) != 1:
            _fail(ValueError(f"{case} holds {len(cases)} cases; use `bcer cohort`"))
        result = _progress_run(Study(cases, max_in_flight=1, **shared))
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted(out)
    row = result.rows[0]
    console.print_json(json.dumps({k: row.get(k) for k in ("case", "status", "sr", "sr_delivered", "tcr", "error_code",
                                                            "error_message", "deliverables", "measurements",
                                                            "plausibility")},
                                  default=str))
    raise typer.Exit(0 if row["status"] == "succeeded" else 1)


@app.command()
def cohort(data: Path = typer.Option(..., "--data", help="dataset folder"),
           task: O.Task = None, goal: O.Goal = None,
           plan_file: O.PlanFile = None,
           out: Path = typer.Option(Path("bcer_out")), address: O.Address = None,
           layout: O.Layout = None,
           max_in_flight: Optional[int] = typer.Option(None, help="cases running at once (default: 8 per CPU)"),
           limit: Optional[int] = typer.Option(None, help="first N cases only"),
           cache: O.Cache = None,
           node_timeout: O.NodeTimeout = None,
           seq: O.Seq = None,
           bundle: O.Bundle = None,
           model_dir: O.ModelDir = None,
           r4: O.R4 = "on",
           memory: O.Memory = None,
           planner: O.Planner = "offline", llm: O.LLM = None,
           llm_record: O.LLMRecord = None, reflector: O.Reflector = "tier1",
           gpu_concurrency: Optional[int] = typer.Option(None, "--gpu-concurrency", min=1,
                                                         help="at most K nodes per GPU at once"),
           model_actors: bool = typer.Option(False, "--model-actors/--no-model-actors",
                                             help="serve --bundle tools from one model actor per GPU"),
           report: O.Report = True,
           as_json: bool = typer.Option(False, "--json", help="print the summary and rows as JSON")) -> None:
    """Run many cases; a failing case becomes a row, the others finish; reruns skip _DONE cases."""
    from .api import Study

    shared = _study_kwargs(locals())
    try:
        result = _progress_run(Study(data, layout=layout, max_in_flight=max_in_flight, limit=limit, seq=_seq(seq),
                                     gpu_concurrency=gpu_concurrency, model_actors=model_actors, **shared))
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    except KeyboardInterrupt:
        _interrupted(out)
    if as_json:
        typer.echo(json.dumps({"summary": result.summary(), "rows": result.rows}, indent=2, default=str))
    else:
        V.print_summary(result)
    if report:
        _pages(result.out)


def _study_kwargs(cli: dict[str, Any]) -> dict[str, Any]:
    """The ``Study`` arguments of the options ``run`` and ``cohort`` share, from the command's
    ``locals()`` (CLI names to API names, flags parsed): declared once for both commands."""
    return dict(task=cli["task"], goal=cli["goal"], plan=cli["plan_file"], out=cli["out"], address=cli["address"],
                bundles=_bundles(cli["bundle"]), model_dirs=_dirs(cli["model_dir"]), r4=_r4_flag(cli["r4"]),
                memory=cli["memory"], planner=cli["planner"], llm=cli["llm"], llm_record=cli["llm_record"],
                reflector=cli["reflector"], cache=cli["cache"], node_timeout_s=cli["node_timeout"])


def _r4_flag(value: str) -> bool:
    v = value.strip().lower()
    if v not in ("on", "off"):
        _fail(ValueError(f"--r4 must be on or off, got {value!r}"))
    return v == "on"


@app.command()
def trace(case_dir: Path = typer.Argument(..., help="a case output folder (holds events.jsonl)"),
          as_json: bool = typer.Option(False, "--json", help="print the events as a JSON list")) -> None:
    """Timeline of a case's events."""
    from .engine.trace import read_events

    path = case_dir / "events.jsonl" if case_dir.is_dir() else case_dir
    if not path.exists():
        _fail(FileNotFoundError(f"no events.jsonl in {case_dir}"))
    events = read_events(path)
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
def bench(tasks: str = typer.Option("all", help="all | task id[,task id...]"),
          cases: int = typer.Option(10, "--cases", help="cases per task"),
          out: Path = typer.Option(Path("bench_out"), help="output folder (bench.json + per-case outputs)"),
          address: O.Address = None,
          size: str = typer.Option("small", help="phantom size: small | full"),
          data: Optional[Path] = typer.Option(None, help="read cases from this folder instead of synthesising"),
          seed: int = typer.Option(0), max_in_flight: int = typer.Option(2, help="cases in flight per task"),
          cache: O.Cache = None,
          node_timeout: O.NodeTimeout = None,
          bundle: O.Bundle = None,
          model_dir: O.ModelDir = None,
          planner: O.Planner = "offline", llm: O.LLM = None,
          llm_record: O.LLMRecord = None, reflector: O.Reflector = "tier1",
          report: O.Report = True,
          as_json: bool = typer.Option(False, "--json", help="print the per-task summary as JSON"),
          arms: Optional[str] = typer.Option(None, help="controller ablation: all | react,react_bind,"
                                             "react_bind_ref,bcer (with --faults)"),
          faults: Optional[str] = typer.Option(None, help="controller ablation: all | fault type[,...] "
                                               "(token_mutation, path_mutation, argument_omission, semantic_swap, "
                                               "space_mismatch, missing_modality, scope_violation, timeout)"),
          timeout: float = typer.Option(60.0, help="ablation: per-call / per-node timeout in seconds"),
          family: str = typer.Option("base", help="phantom family: base | randomised | heldout "
                                                  "(heldout: measure only, never tune on it)")) -> None:
    """Task-contract benchmark: SR/TCR per task with quality against ground truth beside it.
    With --arms/--faults: the controller ablation (SR, TCR, ERR, safe-halt and wrong-deliverable
    rates per arm, task and fault; ``OUT/ablation.json``)."""
    from .bench import resolve_tasks, run_bench

    arms = arms if isinstance(arms, str) else None  # typer defaults when called as a function (demo)
    faults = faults if isinstance(faults, str) else None
    if arms or faults:
        _ablation(tasks, arms or "all", faults or "all", cases, out, address, size, data, seed, max_in_flight,
                  timeout if isinstance(timeout, (int, float)) else 60.0, planner, llm, llm_record)
        return
    try:
        ids = resolve_tasks(tasks)
        bundles = _bundles(bundle)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            job = bar.add_task("cases", total=len(ids) * cases)
            result = run_bench(ids, cases, out, address=address, size=size, data=data, seed=seed,
                               max_in_flight=max_in_flight, on_case_done=lambda row: bar.advance(job),
                               bundles=bundles, model_dirs=_dirs(model_dir), planner=planner, llm=llm,
                               llm_record=llm_record, reflector=reflector, cache=cache, node_timeout_s=node_timeout,
                               family=family if isinstance(family, str) else "base")
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


def _ablation(tasks: str, arms: str, faults: str, cases: int, out: Path, address: Optional[str], size: str,
              data: Optional[Path], seed: int, max_in_flight: int, timeout: float, planner: str = "offline",
              llm: Optional[str] = None, llm_record: Optional[Path] = None) -> None:
    """The controller ablation; every arm plans with the same planner (and LLM backend)."""
    from .actors.specs import Controller
    from .bench.ablation import run_ablation
    from .bench.arms import resolve_arms
    from .bench.faults import resolve_faults
    from .bench import resolve_tasks

    try:
        ids, arm_ids, fault_ids = resolve_tasks(tasks), resolve_arms(arms), resolve_faults(faults)
    except (ToolError, ValueError) as e:
        _fail(e)
    total = len(ids) * cases * len(arm_ids) * (len(fault_ids) + 1)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task("runs", total=total)
        planner = planner if isinstance(planner, str) else "offline"  # typer defaults when called as a function
        with Controller(planner, llm=llm if isinstance(llm, str) else None,
                        llm_record=llm_record if isinstance(llm_record, Path) else None, address=address,
                        memo=True) as ctl:
            report = run_ablation(ids, arm_ids, fault_ids, cases, out, size=size, seed=seed, timeout_s=timeout,
                                  max_in_flight=max_in_flight, address=address, data=data, planner=ctl.planner,
                                  on_row=lambda row: bar.advance(job))
    V.print_ablation(report)



@app.command()
def demo(out: Path = typer.Option(Path("demo_out"), help="output folder"),
         cases: int = typer.Option(1, "--cases", help="cases per task"),
         address: O.Address = None,
         tasks: str = typer.Option("all", help="all | task id[,task id...]"),
         planner: O.Planner = "offline", llm: O.LLM = None,
         llm_record: O.LLMRecord = None, reflector: O.Reflector = "tier1") -> None:
    """Synthesise a small mixed cohort (brain, prostate, cardiac, k-space) and run every task
    end to end on Ray (offline Brain by default; ``--planner llm --llm local`` plans with the
    local CPU model); prints SR/TCR and quality per task."""
    console.print(f"[bold]bcer demo[/]: {cases} synthetic case(s) per task, {planner} planner"
                  f"{' (' + llm + ')' if llm else ''}, {'cluster ' + address if address else 'local Ray'}; "
                  f"outputs in {out}")
    bench(tasks=tasks, cases=cases, out=out, address=address, size="small", data=None, seed=0,
          max_in_flight=2, cache=None, node_timeout=None, bundle=None, model_dir=None, planner=planner, llm=llm,
          llm_record=llm_record, reflector=reflector, report=True, as_json=False, arms=None, faults=None, timeout=60.0,
          family="base")
    console.print(f"inspect a case: [bold]bcer trace {out}/runs/<task>/<case>[/]  ·  tables: {out}/runs/<task>/cohort.parquet")



def _pages(out: Path, **kwargs) -> None:
    """Write OUT/report and print where; a failure here never fails the run that produced OUT."""
    from .pages import build_report

    try:
        stats = build_report(out, **kwargs)
    except Exception as e:  # the run's outputs are already safe on disk; say what went wrong
        console.print(f"[yellow]pages not written[/]: {type(e).__name__}: {e}")
        return
    console.print(f"pages: [bold]{stats.index}[/] ({stats.case_pages} case pages, {stats.bytes / 1e6:.1f} MB)")
    for p in stats.problems[:10]:
        console.print(f"  [yellow]![/] {p}")


@app.command()
def report(out: Path = typer.Argument(..., help="a cohort or bench output folder"),
           max_case_pages: int = typer.Option(500, help="case pages per cohort (failures first)"),
           case_pages: bool = typer.Option(True, "--case-pages/--no-case-pages", help="also write one page per case"),
           as_json: bool = typer.Option(False, "--json", help="print what was written as JSON")) -> None:
    """Write static HTML pages (cohort, cases) under OUT/report; they open from disk, no server needed."""
    from .pages import build_report

    try:
        stats = build_report(out, max_case_pages=max_case_pages, case_pages=case_pages)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
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
def data_synth(domain: str = typer.Option(..., help="brain | cardiac | prostate"),
               n: int = typer.Option(4, "--n", help="number of cases"),
               layout: Optional[str] = typer.Option(None, help="dataset layout (default per domain)"),
               out: Path = typer.Option(..., help="output folder"), seed: int = typer.Option(0),
               size: str = typer.Option("small", help="small (fast tests) | full (realistic)"),
               family: str = typer.Option("base", help="phantom family: base | randomised (tuning/training) "
                                                       "| heldout (measurement only)")) -> None:
    """Write a phantom cohort with exact ground truth in a real dataset layout."""
    from .datasets.synth import synth_cohort

    try:
        cases = synth_cohort(domain, n, out, layout=layout, seed=seed, size=size, family=family)
    except (ToolError, ValueError) as e:
        _fail(e)
    console.print(f"wrote {len(cases)} {domain} cases ({size}, {family} family) to {out}")


from .cli_data import data_inspect  # noqa: E402  (bcer data inspect: layout, cases, runnable tasks)

data_app.command("inspect")(data_inspect)


def _open_memory(path: Path, readonly: bool, embedder: str):
    from .memory import ExemplarMemory

    if readonly and not (path / "manifest.json").exists() and not (path / "wal.jsonl").exists():
        _fail(FileNotFoundError(f"no exemplar memory in {path}"))
    return ExemplarMemory(path, embedder, readonly=readonly)


_MEM_OPT = typer.Option(..., "--memory", help="exemplar-memory folder")
_EMB_OPT = typer.Option("minilm", help="embedder the memory was built with: minilm | hash")


@memory_app.command("stats")
def memory_stats(memory: Path = _MEM_OPT, embedder: str = _EMB_OPT,
                 as_json: bool = typer.Option(False, "--json")) -> None:
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


@memory_app.command("add")
def memory_add(runs: list[Path] = typer.Argument(..., help="case output folders, or cohort folders holding them"),
               memory: Path = _MEM_OPT, embedder: str = _EMB_OPT) -> None:
    """Curate the reviewed reports of finished cases into the memory (only validated cases
    (``_DONE``) whose report the R4 loop left without material issue are added)."""
    from .actors.memory import MemoryClient
    from .actors.r4.reviewer import R4Reviewer
    from .contracts.artifacts import Report
    from .engine.review import CurateRequest

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
            row = json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else {}
            rep = Report(data.get("text", ""), data.get("structured", {}), data.get("evidence", []), data.get("meta", {}))
            res = reviewer.curate(CurateRequest(case_id=d.name, task=row.get("task"), run_id=done.get("run_id", ""),
                                                report=rep, verified=bool(done), status=row.get("status", "")))
            counts[res["action"]] = counts.get(res["action"], 0) + 1
            console.print(f"{d.name}: {res['action']} ({res['reason']})")
    finally:
        mem.close()
    console.print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


@memory_app.command("search")
def memory_search(query: str = typer.Argument(..., help="evidence summary or free text"),
                  memory: Path = _MEM_OPT, task: str = typer.Option(..., help="task id"),
                  k: int = typer.Option(3, "-k"), profile: Optional[str] = typer.Option(None),
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


@memory_app.command("export")
def memory_export(target: Path = typer.Argument(..., help="output file: .jsonl or .parquet"),
                  memory: Path = _MEM_OPT, embedder: str = _EMB_OPT) -> None:
    """Every exemplar record as JSON lines or Parquet."""
    try:
        path = _open_memory(memory, True, embedder).export(target)
    except ToolError as e:
        _fail(e)
    console.print(f"wrote {path}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
