"""The cohort page (SR/TCR delivered and plausible, status counts, failures, distributions of the
key measurements with linked outliers, a Gantt chart of nodes over workers, throughput, every
case) and, for a bench, the overview page that links one cohort page per task."""
from __future__ import annotations

from collections import Counter
from html import escape
from pathlib import Path
from typing import Any, Callable

from . import svg
from .html import badge, fmt, link, page, rel, table
from .load import CohortView, RunView
from .measures import cohort_series

CaseHref = Callable[[str], "str | None"]


def _mean(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(vals) / len(vals) if vals else None


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f} %"


def summary(cv: CohortView) -> dict[str, Any]:
    """Counts and rates of one cohort (SR delivered vs plausible side by side)."""
    n = len(cv.rows)
    return {"cases": n, "status": Counter(str(r.get("status")) for r in cv.rows),
            "sr_delivered": _mean([r.get("sr_delivered") or 0 for r in cv.rows]) if n else None,
            "sr": _mean([r.get("sr") or 0 for r in cv.rows]) if n else None,
            "tcr": _mean([r.get("tcr") or 0.0 for r in cv.rows]) if n else None,
            "resumed": sum(bool(r.get("resumed")) for r in cv.rows)}


def _summary_block(cv: CohortView) -> str:
    s = summary(cv)
    counts = " ".join(f"{badge(k)} {v}" for k, v in sorted(s["status"].items()))
    desc = cv.description.get("bcer") or {}
    gen = (cv.description.get("GeneratedBy") or [{}])[0].get("Description", "")
    return (f'<p><b>{s["cases"]}</b> cases: {counts}{" · resumed " + str(s["resumed"]) if s["resumed"] else ""}</p>'
            + table(["SR (delivered)", "SR (plausible)", "TCR", "run", "planner / goal"],
                    [[_pct(s["sr_delivered"]), _pct(s["sr"]), _pct(s["tcr"]), desc.get("run_id", ""), gen]]))


def _failures(cv: CohortView, href: CaseHref) -> str:
    bad = [r for r in cv.rows if r.get("status") != "succeeded" or not r.get("sr")]
    if not bad:
        return '<p class="ok">no failed, halted, rejected or implausible case</p>'
    rows = []
    for r in bad:
        h = href(str(r.get("case")))
        rows.append([link(h, str(r.get("case"))) if h else escape(str(r.get("case"))), badge(str(r.get("status"))),
                     r.get("error_node") or "", r.get("error_code") or "", (r.get("error_message") or "")[:300]])
    return table(["case", "status", "node", "code", "message"], rows, raw_cols=(0, 1))


def _distributions(cv: CohortView, href: CaseHref) -> tuple[str, int]:
    series = cohort_series(cv)
    if not series:
        return '<p class="muted">no numeric measurements in this cohort</p>', 0
    parts, outlier_rows = [], []
    for s in series:
        pts = [svg.Point(c, v, href(c)) for c, v in s.values.items()]
        chart, outs = svg.strip_plot(pts, s.title, s.unit)
        parts.append(chart)
        outlier_rows += [[link(p.href, p.label) if p.href else escape(p.label), escape(s.title), fmt(p.value),
                          escape(s.unit)] for p in outs]
    html = '<div class="grid">' + "".join(parts) + "</div>"
    if outlier_rows:
        html += "<h3>Outliers (beyond 1.5 IQR)</h3>" + table(["case", "measurement", "value", "unit"],
                                                             outlier_rows, raw_cols=(0, 1, 3))
    return html, len(outlier_rows)


def _gantt_and_throughput(cv: CohortView, href: CaseHref) -> str:
    events = cv.events
    if not events:
        return '<p class="muted">no events</p>'
    times = [float(e["time"]) for e in events if e.get("time") is not None]
    t0 = min(times) if times else 0.0
    tools = sorted({str(e.get("tool")) for e in events if e.get("kind") == "succeeded"})
    bars = []
    for e in events:
        if e.get("kind") != "succeeded" or e.get("duration_s") is None or not e.get("node"):
            continue
        end = float(e["time"]) - t0
        h = href(str(e.get("case")))
        bars.append(svg.Bar(lane=str(e.get("worker") or "?"), start=max(end - float(e["duration_s"]), 0.0), end=end,
                            label=f'{e.get("case")}/{e.get("node")}/{e.get("tool")}',
                            colour=svg.colour_for(str(e.get("tool")), tools),
                            href=f'{h}#node-{e.get("node")}' if h else None))
    finished = [float(e["time"]) - t0 for e in events if e.get("kind") == "case_finished"]
    legend = " ".join(f'<span style="color:{svg.colour_for(t, tools)}">■</span> {escape(t)}' for t in tools[:20])
    return (f"<h3>Nodes over workers</h3><p class='muted'>{legend}</p>" + svg.gantt(bars)
            + "<h3>Throughput</h3>" + svg.throughput(finished))


def _cases_table(cv: CohortView, href: CaseHref) -> str:
    rows = []
    for r in cv.rows:
        h = href(str(r.get("case")))
        rows.append([link(h, str(r.get("case"))) if h else escape(str(r.get("case"))), badge(str(r.get("status"))),
                     fmt(r.get("sr_delivered")), fmt(r.get("sr")), fmt(r.get("tcr"), 3), fmt(r.get("duration_s"), 3),
                     fmt(r.get("repairs")), "yes" if r.get("resumed") else "", r.get("error_code") or ""])
    return table(["case", "status", "SR delivered", "SR plausible", "TCR", "seconds", "repairs", "resumed", "error"],
                 rows, raw_cols=(0, 1), num_cols=(2, 3, 4, 5, 6))


def _quality(bench_task: dict[str, Any] | None) -> str:
    if not bench_task or not bench_task.get("quality"):
        return ""
    rows = []
    for name, q in bench_task["quality"].items():
        goal = "" if q.get("threshold") is None else ("≥ " if q.get("higher_is_better", True) else "≤ ") + fmt(q["threshold"])
        met = {True: '<span class="ok">yes</span>', False: '<span class="bad">no</span>'}.get(q.get("met"), "")
        rows.append([name, fmt(q.get("mean")), q.get("n"), goal, met])
    return "<h2>Quality against ground truth</h2>" + table(["metric", "mean", "n", "threshold", "met"], rows,
                                                           raw_cols=(4,), num_cols=(1, 2))


def cohort_page(cv: CohortView, page_path: Path, report_dir: Path, href: CaseHref,
                bench_task: dict[str, Any] | None = None, back: str = "") -> str:
    """The HTML of one cohort page (links computed relative to ``page_path``)."""
    dist, n_out = _distributions(cv, href)
    body = ["<h2>Summary</h2>" + _summary_block(cv), _quality(bench_task),
            "<h2>Failures</h2>" + _failures(cv, href),
            f"<h2>Key measurements</h2><p class='muted'>one dot per case (click to open it); "
            f"{n_out} outlier(s) in red</p>" + dist,
            "<h2>Execution</h2>" + _gantt_and_throughput(cv, href),
            "<h2>Cases</h2>" + _cases_table(cv, href)]
    if cv.problems:
        body.append("<h2>Could not read</h2><ul>" + "".join(f"<li>{escape(p)}</li>" for p in cv.problems) + "</ul>")
    return page(f"cohort {cv.name}", "".join(body), css_href=rel(report_dir / "style.css", page_path),
                subtitle=(f'<a href="{escape(back)}">← overview</a> · ' if back else "") + escape(str(cv.root)))


def bench_page(run: RunView, page_path: Path, report_dir: Path, task_href: Callable[[str], str]) -> str:
    """The overview of a bench: one row per task, linking its cohort page."""
    bench = run.bench or {}
    rows = []
    for cv in run.cohorts:
        s = summary(cv)
        q = (bench.get("tasks") or {}).get(cv.name, {}).get("quality") or {}
        met = sum(1 for v in q.values() if v.get("met")) if q else None
        rows.append([link(task_href(cv.name), cv.name), s["cases"], _pct(s["sr_delivered"]), _pct(s["sr"]),
                     _pct(s["tcr"]), " ".join(f"{badge(k)} {v}" for k, v in sorted(s["status"].items())),
                     "" if met is None else f"{met}/{len(q)}"])
    cfg = bench.get("config") or {}
    body = ("<h2>Tasks</h2>" + table(["task", "cases", "SR (delivered)", "SR (plausible)", "TCR", "status",
                                      "quality thresholds met"], rows, raw_cols=(0, 5))
            + "<h2>Configuration</h2>" + table(["key", "value"], [[k, str(v)] for k, v in cfg.items()])
            + f"<p class='muted'>total wall {fmt(bench.get('total_wall_s'))} s (synthesis {fmt(bench.get('synth_s'))} s)</p>")
    return page("bcer bench", body, css_href=rel(report_dir / "style.css", page_path), subtitle=escape(str(run.out)))


__all__ = ["bench_page", "cohort_page", "summary"]
