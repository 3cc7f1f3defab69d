"""Inline SVG charts for the pages: distributions with linked outliers, a Gantt chart of nodes
over workers, throughput, and a workflow DAG. Plain SVG (no JavaScript, no CDN), so a page
opens from disk and every mark that stands for a case is a link to it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Iterable, Sequence

STATUS_COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "halted": "#ad1457", "blocked": "#9e9e9e",
                  "skipped": "#757575", "pending": "#bdbdbd", "running": "#f9a825", "implausible": "#ef6c00",
                  "rejected": "#6d4c41", "cached": "#1565c0", "unknown": "#9e9e9e"}
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]


def colour_for(key: str, keys: Sequence[str]) -> str:
    return PALETTE[list(keys).index(key) % len(PALETTE)] if key in keys else PALETTE[-1]


@dataclass
class Point:
    """One case's value in a distribution; ``href`` links the mark to the case page."""

    label: str
    value: float
    href: str | None = None


def tukey_outliers(values: Sequence[float], k: float = 1.5) -> tuple[float, float, float, float]:
    """(q1, median, q3, fence width): a value outside ``[q1 - k*iqr, q3 + k*iqr]`` is an outlier."""
    v = sorted(values)
    if not v:
        return (math.nan,) * 4  # type: ignore[return-value]

    def q(p: float) -> float:
        i = (len(v) - 1) * p
        lo, hi = math.floor(i), math.ceil(i)
        return v[lo] + (v[hi] - v[lo]) * (i - lo)

    q1, med, q3 = q(0.25), q(0.5), q(0.75)
    return q1, med, q3, k * (q3 - q1)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not math.isfinite(lo) or not math.isfinite(hi) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step) + 1)]


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e4 else f"{x:.3e}"


def strip_plot(points: Sequence[Point], title: str, unit: str = "", width: int = 520, height: int = 92
               ) -> tuple[str, list[Point]]:
    """A box-and-strip plot of one measurement; outliers (Tukey fences) in red, each a link.

    Returns:
        (the SVG text, the outlier points).
    """
    vals = [p.value for p in points if math.isfinite(p.value)]
    if not vals:
        return f'<svg class="chart" width="{width}" height="30"><text x="4" y="20">{escape(title)}: no values</text></svg>', []
    q1, med, q3, fence = tukey_outliers(vals)
    lo, hi = min(vals), max(vals)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    x0, x1, ymid = 10, width - 10, 44

    def sx(v: float) -> float:
        return x0 + (v - lo) / (hi - lo) * (x1 - x0)

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="{escape(title)}">',
             f'<text x="{x0}" y="14" class="t">{escape(title)}{" (" + escape(unit) + ")" if unit else ""} '
             f'— n={len(vals)}, median {_fmt(med)}</text>',
             f'<rect x="{sx(q1):.1f}" y="{ymid - 12}" width="{max(sx(q3) - sx(q1), 1):.1f}" height="24" '
             f'class="box"/>',
             f'<line x1="{sx(med):.1f}" x2="{sx(med):.1f}" y1="{ymid - 12}" y2="{ymid + 12}" class="med"/>']
    outliers = []
    for i, p in enumerate(points):
        if not math.isfinite(p.value):
            continue
        out = p.value < q1 - fence or p.value > q3 + fence
        if out:
            outliers.append(p)
        jitter = ((i * 7919) % 17 - 8) * 0.9
        mark = (f'<circle cx="{sx(p.value):.1f}" cy="{ymid + jitter:.1f}" r="{4 if out else 3}" '
                f'class="{"out" if out else "pt"}"><title>{escape(p.label)}: {_fmt(p.value)} {escape(unit)}</title>'
                f'</circle>')
        parts.append(f'<a href="{escape(p.href)}">{mark}</a>' if p.href else mark)
    for t in _ticks(lo, hi):
        parts.append(f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{ymid + 16}" y2="{ymid + 20}" class="ax"/>'
                     f'<text x="{sx(t):.1f}" y="{ymid + 32}" class="tick">{_fmt(t)}</text>')
    parts.append("</svg>")
    return "".join(parts), outliers


@dataclass
class Bar:
    """One node's run on one worker (seconds from the cohort's start)."""

    lane: str
    start: float
    end: float
    label: str
    colour: str
    href: str | None = None


def gantt(bars: Sequence[Bar], width: int = 1000, lane_h: int = 14, max_lanes: int = 64) -> str:
    """Nodes over workers: one lane per worker process, one bar per node run."""
    if not bars:
        return '<p class="muted">no node timings in the events</p>'
    lanes = sorted({b.lane for b in bars})
    shown = lanes[:max_lanes]
    t_end = max(b.end for b in bars) or 1.0
    left, right = 130, width - 10
    h = 24 + lane_h * len(shown)

    def sx(t: float) -> float:
        return left + t / t_end * (right - left)

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h + 20}" '
             f'role="img" aria-label="Gantt chart of nodes over workers">']
    for i, lane in enumerate(shown):
        y = 20 + i * lane_h
        parts.append(f'<text x="2" y="{y + lane_h - 3}" class="tick l">{escape(lane[-20:])}</text>'
                     f'<line x1="{left}" x2="{right}" y1="{y + lane_h}" y2="{y + lane_h}" class="grid"/>')
    for b in bars:
        if b.lane not in shown:
            continue
        y = 20 + shown.index(b.lane) * lane_h
        w = max(sx(b.end) - sx(b.start), 1.0)
        rect = (f'<rect x="{sx(b.start):.1f}" y="{y + 1}" width="{w:.1f}" height="{lane_h - 2}" fill="{b.colour}">'
                f'<title>{escape(b.label)} ({b.end - b.start:.2f} s)</title></rect>')
        parts.append(f'<a href="{escape(b.href)}">{rect}</a>' if b.href else rect)
    for t in _ticks(0.0, t_end):
        parts.append(f'<text x="{sx(t):.1f}" y="{h + 14}" class="tick">{_fmt(t)} s</text>')
    parts.append("</svg>")
    note = f'<p class="muted">{len(lanes) - len(shown)} more worker lanes not drawn</p>' if len(lanes) > len(shown) else ""
    return "".join(parts) + note


def throughput(finish_times: Iterable[float], width: int = 520, height: int = 140) -> str:
    """Cases finished over time (cumulative), with the mean rate."""
    ts = sorted(t for t in finish_times if math.isfinite(t))
    if not ts:
        return '<p class="muted">no finished cases in the events</p>'
    t_end = max(ts[-1], 1e-6)
    left, bottom, top, right = 40, height - 22, 16, width - 10

    def sx(t: float) -> float:
        return left + t / t_end * (right - left)

    def sy(n: float) -> float:
        return bottom - n / len(ts) * (bottom - top)

    pts = [f"{sx(0):.1f},{sy(0):.1f}"]
    for i, t in enumerate(ts, 1):
        pts += [f"{sx(t):.1f},{sy(i - 1):.1f}", f"{sx(t):.1f},{sy(i):.1f}"]
    rate = len(ts) / t_end
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="throughput">',
             f'<text x="{left}" y="12" class="t">{len(ts)} cases in {t_end:.1f} s ({rate:.2f} cases/s)</text>',
             f'<polyline points="{" ".join(pts)}" class="line"/>',
             f'<line x1="{left}" x2="{right}" y1="{bottom}" y2="{bottom}" class="ax"/>']
    for t in _ticks(0.0, t_end):
        parts.append(f'<text x="{sx(t):.1f}" y="{bottom + 14}" class="tick">{_fmt(t)} s</text>')
    parts.append(f'<text x="2" y="{top + 4}" class="tick l">{len(ts)}</text></svg>')
    return "".join(parts)


@dataclass
class DagNode:
    id: str
    tool: str
    status: str
    seconds: float | None = None
    href: str | None = None


def dag(nodes: Sequence[DagNode], edges: Iterable[tuple[str, str]], box_w: int = 170, box_h: int = 38) -> str:
    """The workflow drawn in layers (topological generations), nodes coloured by status."""
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in nodes)
    g.add_edges_from((a, b) for a, b in edges if a in g and b in g)
    try:
        layers = [sorted(layer) for layer in nx.topological_generations(g)]
    except nx.NetworkXUnfeasible:  # a cycle cannot come from the compiler; draw one row rather than fail
        layers = [sorted(g.nodes)]
    gap_x, gap_y = 40, 18
    width = max(len(layer) for layer in layers) * (box_w + gap_x) + gap_x if layers else 200
    height = len(layers) * (box_h + gap_y) + gap_y
    pos = {nid: (gap_x + j * (box_w + gap_x), gap_y + i * (box_h + gap_y))
           for i, layer in enumerate(layers) for j, nid in enumerate(layer)}
    by_id = {n.id: n for n in nodes}
    parts = [f'<svg class="chart dag" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'role="img" aria-label="workflow DAG">',
             '<defs><marker id="arr" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
             '<path d="M0,0 L8,4 L0,8 z" fill="#607d8b"/></marker></defs>']
    for a, b in g.edges:
        (xa, ya), (xb, yb) = pos[a], pos[b]
        parts.append(f'<line x1="{xa + box_w / 2:.0f}" y1="{ya + box_h}" x2="{xb + box_w / 2:.0f}" y2="{yb}" '
                     f'class="edge" marker-end="url(#arr)"/>')
    for nid, (x, y) in pos.items():
        n = by_id[nid]
        fill = STATUS_COLOURS.get(n.status, "#9e9e9e")
        secs = f" · {n.seconds:.2f} s" if n.seconds is not None else ""
        box = (f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="5" fill="{fill}" class="node">'
               f'<title>{escape(n.id)} ({escape(n.tool)}): {escape(n.status)}{secs}</title></rect>'
               f'<text x="{x + 6}" y="{y + 15}" class="nid">{escape(n.id[:24])}</text>'
               f'<text x="{x + 6}" y="{y + 30}" class="ntool">{escape(n.tool[:22])}{escape(secs)}</text>')
        parts.append(f'<a href="{escape(n.href)}">{box}</a>' if n.href else box)
    parts.append("</svg>")
    return "".join(parts)


__all__ = ["Bar", "DagNode", "PALETTE", "Point", "STATUS_COLOURS", "colour_for", "dag", "gantt", "strip_plot",
           "throughput", "tukey_outliers"]
