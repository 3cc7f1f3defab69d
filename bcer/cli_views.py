"""What the `bcer` command prints: rich tables and lines for plans, runs, benches and the
ablation (the commands themselves live in ``bcer.cli``)."""
from __future__ import annotations

from typing import Optional

from rich.console import Console
from rich.table import Table

console = Console()


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


def param_line(name: str, schema: dict) -> str:
    bounds = [f"{k[:3]} {schema[k]}" for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
              if k in schema]
    default = schema.get("default", "required")
    return f"{name}={default!r}" + (f" [{', '.join(bounds)}]" if bounds else "")


__all__ = ["console", "fmt_quality", "fmt_spacing", "narrow", "param_line", "pct", "print_ablation", "print_bench",
           "print_planning", "print_summary"]
