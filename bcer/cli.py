"""The `bcer` command: tools, plan, run, cohort, trace, demo, data, bench."""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .contracts import ToolError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="bcer: planned MRI analysis workflows on Ray, from one case to cohorts.")
data_app = typer.Typer(no_args_is_help=True, help="Synthesise phantom cohorts and inspect datasets.")
app.add_typer(data_app, name="data")
console = Console()


def _fail(err: Exception) -> None:
    console.print(f"[bold red]error[/]: {err}")
    raise typer.Exit(2)


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
    t = Table(title=f"{len(specs)} tools", show_lines=True)
    t.add_column("tool", no_wrap=True)
    for col in ("inputs", "outputs", "params (default, bounds)", "resources", "gpu", "milestone"):
        t.add_column(col)
    for s in specs:
        t.add_row(f"{s.name}\n[dim]{s.description}[/]",
                  "\n".join(f"{p.name}: {p.kind.value}{'' if p.required else '?'}" for p in s.inputs),
                  "\n".join(f"{p.name}: {p.kind.value}" for p in s.outputs),
                  "\n".join(_param_line(k, v) for k, v in s.params_schema.get("properties", {}).items()),
                  f"cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB",
                  s.gpu, s.milestone or "")
    console.print(t)


def _param_line(name: str, schema: dict) -> str:
    bounds = [f"{k[:3]} {schema[k]}" for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
              if k in schema]
    default = schema.get("default", "required")
    return f"{name}={default!r}" + (f" [{', '.join(bounds)}]" if bounds else "")


@app.command()
def plan(case: Path = typer.Option(..., "--case", help="case folder (or dataset folder with one case)"),
         goal: Optional[str] = typer.Option(None, help="goal text"),
         task: Optional[str] = typer.Option(None, help="task contract id"),
         plan_file: Optional[Path] = typer.Option(None, "--plan", help="plan sketch JSON to compile"),
         layout: Optional[str] = typer.Option(None, help="dataset layout (default: detect)")) -> None:
    """Print the plan sketch and the compiled DAG without running anything."""
    from .api import plan_case

    try:
        sketch, workflow, revisions = plan_case(case, task=task, goal=goal, plan=plan_file, layout=layout)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    console.print_json(sketch.model_dump_json())
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
            msg = f" {row.get('error_code')}: {row.get('error_message')}" if row["status"] != "succeeded" else ""
            bar.console.print(f"{mark} {row['case']}{extra}{msg}")
            bar.advance(job)

        study.data = cases
        return study.run(on_case_done=done)


def _print_summary(result) -> None:
    s = result.summary()
    console.print(f"[bold]{s['succeeded']}/{s['cases']}[/] cases succeeded "
                  f"(SR {100 * s['sr']:.0f}%, TCR {100 * s['tcr']:.0f}%, resumed {s['resumed']}); "
                  f"outputs in {result.out}")


@app.command()
def run(case: Path = typer.Option(..., "--case", help="case folder"),
        goal: Optional[str] = typer.Option(None), task: Optional[str] = typer.Option(None),
        plan_file: Optional[Path] = typer.Option(None, "--plan", help="plan sketch JSON (skips the planner)"),
        out: Path = typer.Option(Path("bcer_out"), help="output folder"),
        address: Optional[str] = typer.Option(None, help="Ray address (default: local cluster)"),
        layout: Optional[str] = typer.Option(None)) -> None:
    """Run one case."""
    from .api import Study, load_cases

    try:
        cases = load_cases(case, layout)
        if len(cases) != 1:
            _fail(ValueError(f"{case} holds {len(cases)} cases; use `bcer cohort`"))
        result = _progress_run(Study(cases, task=task, goal=goal, plan=plan_file, out=out,
                                     address=address, max_in_flight=1))
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    row = result.rows[0]
    console.print_json(json.dumps({k: row.get(k) for k in ("case", "status", "sr", "tcr", "error_code",
                                                            "error_message", "deliverables", "measurements")},
                                  default=str))
    raise typer.Exit(0 if row["status"] == "succeeded" else 1)


@app.command()
def cohort(data: Path = typer.Option(..., "--data", help="dataset folder"),
           task: Optional[str] = typer.Option(None), goal: Optional[str] = typer.Option(None),
           plan_file: Optional[Path] = typer.Option(None, "--plan"),
           out: Path = typer.Option(Path("bcer_out")), address: Optional[str] = typer.Option(None),
           layout: Optional[str] = typer.Option(None),
           max_in_flight: int = typer.Option(4, help="cases running at once"),
           limit: Optional[int] = typer.Option(None, help="first N cases only")) -> None:
    """Run many cases; a failing case becomes a row, the others finish; reruns skip _DONE cases."""
    from .api import Study

    try:
        result = _progress_run(Study(data, task=task, goal=goal, plan=plan_file, out=out, layout=layout,
                                     address=address, max_in_flight=max_in_flight, limit=limit))
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    _print_summary(result)


@app.command()
def trace(case_dir: Path = typer.Argument(..., help="a case output folder (holds events.jsonl)")) -> None:
    """Timeline of a case's events."""
    from .engine.trace import read_events

    path = case_dir / "events.jsonl" if case_dir.is_dir() else case_dir
    if not path.exists():
        _fail(FileNotFoundError(f"no events.jsonl in {case_dir}"))
    events = read_events(path)
    t0 = min((e.time for e in events), default=0.0)
    t = Table(title=f"{len(events)} events of {events[0].case if events else case_dir}")
    for col in ("t+s", "kind", "node", "tool"):
        t.add_column(col, no_wrap=True)
    for col in ("attempt", "duration", "worker", "detail"):
        t.add_column(col)
    for e in events:
        colour = {"failed": "red", "repaired": "yellow", "succeeded": "green", "fallback": "yellow"}.get(e.kind, "")
        detail = " ".join(x for x in (e.error_code, e.message, json.dumps(e.patch) if e.patch else None) if x)
        t.add_row(f"{e.time - t0:7.3f}", f"[{colour}]{e.kind}[/]" if colour else e.kind, e.node or "",
                  e.tool or "", str(e.attempt), f"{e.duration_s:.3f}" if e.duration_s is not None else "",
                  e.worker or "", detail[:120])
    console.print(t)


@app.command()
def bench(tasks: str = typer.Option("all", help="all | task id[,task id...]"),
          cases: int = typer.Option(10, "--cases", help="cases per task"),
          out: Path = typer.Option(Path("bench_out"), help="output folder (bench.json + per-case outputs)"),
          address: Optional[str] = typer.Option(None, help="Ray address (default: local cluster)"),
          size: str = typer.Option("small", help="phantom size: small | full"),
          data: Optional[Path] = typer.Option(None, help="read cases from this folder instead of synthesising"),
          seed: int = typer.Option(0), max_in_flight: int = typer.Option(2, help="cases in flight per task"),
          family: str = typer.Option("base", help="phantom family: base | randomised | heldout "
                                                  "(heldout: measure only, never tune on it)")) -> None:
    """Task-contract benchmark: SR/TCR per task with quality against ground truth beside it."""
    from .bench import resolve_tasks, run_bench

    try:
        ids = resolve_tasks(tasks)
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console) as bar:
            job = bar.add_task("cases", total=len(ids) * cases)
            report = run_bench(ids, cases, out, address=address, size=size, data=data, seed=seed,
                               max_in_flight=max_in_flight, on_case_done=lambda row: bar.advance(job),
                               family=family)
    except (ToolError, FileNotFoundError) as e:
        _fail(e)
    _print_bench(report)


def _print_bench(report: dict) -> None:
    for task, s in report["tasks"].items():
        t = Table(title=f"{task} ({s['chain']}): {s['cases']} cases, SR {100 * s['sr']:.0f}%, "
                        f"TCR {100 * s['tcr']:.0f}%, median {s['median_case_s']} s/case")
        for col in ("metric", "mean", "n", "threshold", "met"):
            t.add_column(col)
        for name, q in s["quality"].items():
            goal = "" if q["threshold"] is None else ("≥ " if q["higher_is_better"] else "≤ ") + f"{q['threshold']:g}"
            met = {True: "[green]yes[/]", False: "[red]no[/]", None: ""}[q["met"]]
            t.add_row(name, "" if q["mean"] is None else f"{q['mean']:.4g}", str(q["n"]), goal, met)
        console.print(t)
        for f in s["failures"]:
            console.print(f"  [red]✗[/] {f['case']}: {f['status']} {f['error_code']}: {f['error_message']}")
    t = Table(title=f"bench summary ({report['config'].get('family') or 'given data'} family)")
    for col in ("task", "cases", "SR", "TCR", "quality (mean; ✓ threshold met)", "median s/case"):
        t.add_column(col)
    for task, s in report["tasks"].items():
        qual = ", ".join(f"{k}={_fmt_quality(q)}" for k, q in s["quality"].items())
        t.add_row(task, str(s["cases"]), f"{100 * s['sr']:.0f}%", f"{100 * s['tcr']:.0f}%", qual,
                  str(s["median_case_s"]))
    console.print(t)
    console.print(f"total wall time {report['total_wall_s']:.1f} s (synthesis {report['synth_s']:.1f} s, "
                  f"runs {report['run_s']:.1f} s)")


@app.command()
def demo(out: Path = typer.Option(Path("demo_out"), help="output folder"),
         cases: int = typer.Option(1, "--cases", help="cases per task"),
         address: Optional[str] = typer.Option(None, help="Ray address (default: local cluster)")) -> None:
    """Synthesise a small mixed cohort (brain, prostate, cardiac, k-space) and run all nine tasks
    end to end with the offline Brain on Ray; prints SR/TCR and quality per task."""
    console.print(f"[bold]bcer demo[/]: {cases} synthetic case(s) per task, offline planner, "
                  f"{'cluster ' + address if address else 'local Ray'}; outputs in {out}")
    bench(tasks="all", cases=cases, out=out, address=address, size="small", data=None, seed=0,
          max_in_flight=2, family="base")
    console.print(f"inspect a case: [bold]bcer trace {out}/runs/<task>/<case>[/]  ·  tables: {out}/runs/<task>/cohort.parquet")


def _fmt_quality(q: dict) -> str:
    value = "-" if q["mean"] is None else f"{q['mean']:.3g}"
    return value + {True: " ✓", False: " ✗", None: ""}[q["met"]]


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


@data_app.command("inspect")
def data_inspect(root: Path = typer.Argument(...), layout: Optional[str] = typer.Option(None),
                 as_json: bool = typer.Option(False, "--json")) -> None:
    """Cases, sequences, shapes, spacings, metadata and available ground truth of a dataset."""
    from .datasets.synth import inspect_dataset

    try:
        info = inspect_dataset(root, layout)
    except ToolError as e:
        _fail(e)
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    t = Table(title=f"{len(info)} cases in {root}")
    for col in ("case", "domain", "sequences", "metadata", "ground truth"):
        t.add_column(col)
    for c in info:
        seqs = "\n".join(f"{k}: {v.get('shape')} @ {_fmt_sp(v.get('spacing'))} {v.get('orientation', '')}"
                         for k, v in c.get("sequences", {}).items())
        t.add_row(c.get("case", ""), c.get("domain", ""), seqs,
                  ", ".join(f"{k}={v}" for k, v in c.get("metadata", {}).items())[:80],
                  ", ".join(c.get("ground_truth", []) or []))
    console.print(t)


def _fmt_sp(sp) -> str:
    return "x".join(f"{v:.2f}" for v in sp) if sp else "?"


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
