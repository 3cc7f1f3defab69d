"""What the `bcer` command prints: rich tables and lines for plans, runs, benches and the
ablation (the commands themselves live in ``bcer.cli.main``)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()


def fail(err: Exception) -> None:
    """Print a typed error and exit with code 2 (a usage or input error: nothing ran)."""
    import typer
    from rich.markup import escape

    console.print(f"[bold red]error[/]: {escape(str(err))}")  # "[schema] ..." is text, not markup
    raise typer.Exit(2)


@contextmanager
def case_bar(total: int, label: str = "cases") -> Iterator[Callable[..., None]]:
    """A bar over ``total`` items; yields the callback that advances it by one."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        job = bar.add_task(label, total=total)
        yield lambda *_a, **_k: bar.advance(job)


def print_planning(events: list[dict]) -> None:
    """llm: one line per planning event (LLM calls with tokens and latency, verdicts, fallbacks)."""
    from rich.markup import escape

    for e in events:
        d = e.get("data") or {}
        tokens = (f" {d.get('prompt_tokens')}+{d.get('completion_tokens')} tokens {d.get('latency_s')} s"
                  if "latency_s" in d else "")
        colour = {"plan_rejected": "red", "plan_accepted": "green", "plan_fallback": "yellow"}.get(e["kind"], "dim")
        console.print(f"[{colour}]{e['kind']}[/] {escape(str(e.get('message', '')))}{tokens}")


def print_summary(result) -> None:
    s = result.summary()
    console.print(f"[bold]{s['succeeded']}/{s['cases']}[/] cases succeeded "
                  f"(SR delivered {100 * s['sr_delivered']:.0f}%, SR plausible {100 * s['sr']:.0f}%, "
                  f"TCR {100 * s['tcr']:.0f}%, implausible {s['implausible']}, resumed {s['resumed']}); "
                  f"outputs in {result.out}")


def print_ablation(report: dict) -> None:
    faults = report["config"]["faults"]
    t = Table(title="controller ablation: ERR (recoverable) / safe-halt (unrecoverable), wrong-deliverable rate; "
                    f"{report['config']['n_cases']} case(s) per task, over {len(report['config']['tasks'])} task(s)")
    t.add_column("arm")
    for f in faults:
        t.add_column(f)
    t.add_column("all")
    cells = {(c["arm"], c["fault"]): c for c in report["by_arm_fault"]}
    for arm in report["config"]["arms"]:
        row = []
        for f in faults:
            c = cells[(arm, f)]
            rate = c.get("err", c.get("safe_halt"))
            row.append("n/a" if rate is None else f"{100 * rate:.0f}% · {100 * c['wrong_rate']:.0f}% (n={c['n']})")
        a = report["by_arm"][arm]
        row.append(f"ERR {pct(a['err'])} · halt {pct(a['safe_halt'])} · wrong {a['wrong_deliverables']}")
        t.add_row(arm, *row)
    console.print(t)
    console.print(f"rows: {len(report['rows'])}; wall {report['timing']['total_s']} s; details in ablation.json")


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def print_bench(report: dict) -> None:
    for task, s in report["tasks"].items():
        t = Table(title=f"{task} ({s['chain']}): {s['cases']} cases, SR (delivered) "
                        f"{100 * s.get('sr_delivered', s['sr']):.0f}%, SR (plausible) {100 * s['sr']:.0f}%, "
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
    t = Table(title=f"bench summary ({report.get('config', {}).get('family') or 'given data'} family)")
    for col in ("task", "cases", "SR (delivered)", "SR (plausible)", "TCR", "quality (mean; ✓ threshold met)",
                "median s/case"):
        t.add_column(col)
    for task, s in report["tasks"].items():
        qual = ", ".join(f"{k}={fmt_quality(q)}" for k, q in s["quality"].items())
        t.add_row(task, str(s["cases"]), f"{100 * s.get('sr_delivered', s['sr']):.0f}%", f"{100 * s['sr']:.0f}%",
                  f"{100 * s['tcr']:.0f}%", qual, str(s["median_case_s"]))
    console.print(t)
    console.print(f"total wall time {report['total_wall_s']:.1f} s (synthesis {report['synth_s']:.1f} s, "
                  f"runs {report['run_s']:.1f} s)")


def fmt_quality(q: dict) -> str:
    value = "-" if q["mean"] is None else f"{q['mean']:.3g}"
    return value + {True: " ✓", False: " ✗", None: ""}[q["met"]]


def fmt_spacing(sp) -> str:
    return "x".join(f"{v:.2f}" for v in sp) if sp else "?"


def narrow(need: int) -> bool:
    """True when output is piped or the terminal is narrower than ``need`` columns."""
    return not console.is_terminal or console.width < need


_BOUND_WORDS = (("minimum", "min"), ("exclusiveMinimum", "above"), ("maximum", "max"), ("exclusiveMaximum", "below"))


def param_line(name: str, schema: dict) -> str:
    """``h_factor=0.8 [above 0.0, max 5.0]``: plain text (print it through ``escape``: rich
    would read ``[...]`` as markup)."""
    bounds = [f"{word} {schema[k]}" for k, word in _BOUND_WORDS if k in schema]
    if "enum" in schema:
        bounds.append("one of " + "|".join(map(str, schema["enum"])))
    default = schema.get("default", "required")
    return f"{name}={default!r}" + (f" [{', '.join(bounds)}]" if bounds else "")


def plain(text: str) -> str:
    """A docstring sentence as help text: reST literals (````x````, ```x```) and roles (``:func:`x```)
    shown as the bare name."""
    import re

    text = re.sub(r":[a-z]+:`([^`]+)`", r"\1", text)
    return re.sub(r"``?([^`]+)``?", r"\1", text)


def print_tool_blocks(specs: list, detail: bool = False) -> None:
    """One block per tool; with ``detail`` every param's description on its own line."""
    from rich.markup import escape

    if detail:
        for s in specs:
            print_tool(s)
        return
    for s in specs:
        # soft wrap: a long line is left to the terminal, so no continuation line starts at column 0
        console.print(f"[bold]{escape(s.name)}[/] [dim]v{s.version}[/] — {escape(plain(s.description))}", soft_wrap=True)
        console.print("  in:  " + escape(", ".join(f"{p.name}: {p.kind.value}{'' if p.required else '?'}"
                                                   for p in s.inputs)), soft_wrap=True)
        console.print("  out: " + escape(", ".join(f"{p.name}: {p.kind.value}" for p in s.outputs)), soft_wrap=True)
        for k, v in s.params_schema.get("properties", {}).items():
            console.print(f"  param {escape(param_line(k, v))}", soft_wrap=True)
        console.print(f"  cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB "
                      f"gpu-path={s.gpu} milestone={s.milestone or '-'}", soft_wrap=True)


def print_tool(s) -> None:
    """One tool in full, wrapped to the terminal (at most 100 columns), indented."""
    import textwrap

    from rich.markup import escape

    width = max(40, min(console.width, 100))

    def say(text: str, indent: str = "", first: str | None = None) -> None:
        for line in textwrap.wrap(text, width, initial_indent=indent if first is None else first,
                                  subsequent_indent=indent + "    "):
            console.print(escape(line), soft_wrap=True, highlight=False)

    say(f"{s.name} v{s.version}")
    say(plain(s.description), "  ")
    say("inputs: " + ", ".join(f"{p.name} ({p.kind.value}{'' if p.required else ', optional'})" for p in s.inputs),
        "  ")
    say("outputs: " + ", ".join(f"{p.name} ({p.kind.value})" for p in s.outputs), "  ")
    props = s.params_schema.get("properties", {})
    say("params:" if props else "params: none", "  ")
    for k, v in props.items():
        say(param_line(k, v) + (f": {plain(v['description'])}" if v.get("description") else ""), "    ")
    say(f"resources: cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB; "
        f"GPU path: {s.gpu}; milestone: {s.milestone or '-'}", "  ")
    console.print(f"  set a param: --set {escape(s.name)}.PARAM=VALUE", highlight=False)


def print_tool_table(specs: list) -> None:
    from rich.markup import escape

    t = Table(title=f"{len(specs)} tools", show_lines=True)
    t.add_column("tool", no_wrap=True)
    for col in ("inputs", "outputs", "params (default, bounds)", "resources", "gpu", "milestone"):
        t.add_column(col)
    for s in specs:
        t.add_row(f"{escape(s.name)}\n[dim]{escape(plain(s.description))}[/]",
                  escape("\n".join(f"{p.name}: {p.kind.value}{'' if p.required else '?'}" for p in s.inputs)),
                  escape("\n".join(f"{p.name}: {p.kind.value}" for p in s.outputs)),
                  escape("\n".join(param_line(k, v) for k, v in s.params_schema.get("properties", {}).items())),
                  f"cpu={s.resources.num_cpus:g} gpu={s.resources.num_gpus:g} mem={s.resources.memory_mb}MB",
                  s.gpu, s.milestone or "")
    console.print(t)


def task_rows() -> list[dict]:
    """id, domain, chain, inputs (with alternatives) and deliverables of every task contract."""
    from ..contracts import list_contracts, load_contract

    rows = []
    for tid in list_contracts():
        c = load_contract(tid)
        inputs = [s + (" (or " + " or ".join(c.input_alternatives[s]) + ")" if s in c.input_alternatives else "")
                  for s in c.inputs]
        rows.append({"id": c.id, "domain": c.domain, "chain": c.chain, "inputs": inputs,
                     "deliverables": [f"{d.name} ({d.file})" for d in c.deliverables], "goal": c.goal})
    return rows


def print_tasks(rows: list[dict]) -> None:
    from rich.markup import escape

    if narrow(100):
        for r in rows:
            console.print(f"[bold]{r['id']}[/] ({r['domain']}, {r['chain']} chain) — {escape(r['goal'])}",
                          soft_wrap=True)
            console.print("  inputs: " + escape(", ".join(r["inputs"])), soft_wrap=True)
            console.print("  deliverables: " + escape(", ".join(r["deliverables"])), soft_wrap=True)
        return
    t = Table(title=f"{len(rows)} tasks")
    for col in ("task", "domain", "chain", "inputs", "deliverables"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["id"], r["domain"], r["chain"], escape(", ".join(r["inputs"])),
                  escape("\n".join(r["deliverables"])))
    console.print(t)


__all__ = ["case_bar", "console", "fail", "fmt_quality", "fmt_spacing", "narrow", "param_line", "pct", "print_ablation", "print_bench",
           "print_planning", "print_summary", "print_tasks", "print_tool_blocks", "print_tool_table", "task_rows"]
