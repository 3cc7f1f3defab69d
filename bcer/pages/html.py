"""Page skeleton, the shared stylesheet and small HTML helpers (everything escaped).

Pages are static files with relative links only: they open from disk, need no server, no
internet and no JavaScript.
"""
from __future__ import annotations

import os
import re
from html import escape
from pathlib import Path
from typing import Any, Iterable, Sequence

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1b1f23;background:#fafafa}
header{background:#263238;color:#eceff1;padding:10px 20px}header a{color:#b3e5fc}
header h1{margin:0;font-size:20px}header .sub{font-size:12px;color:#b0bec5}
main{padding:12px 20px;max-width:1400px}
h2{font-size:17px;border-bottom:1px solid #cfd8dc;padding-bottom:3px;margin-top:26px}
h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0;background:#fff}
th,td{border:1px solid #cfd8dc;padding:3px 7px;text-align:left;vertical-align:top;font-size:13px}
th{background:#eceff1}td.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;padding:1px 7px;border-radius:9px;color:#fff;font-size:12px}
.succeeded{background:#2e7d32}.failed{background:#c62828}.halted{background:#ad1457}.rejected{background:#6d4c41}
.implausible{background:#ef6c00}.unknown,.blocked,.skipped{background:#757575}.resumed{background:#1565c0}
.ok{color:#2e7d32}.bad{color:#c62828;font-weight:600}.muted{color:#78909c}
.grid{display:flex;flex-wrap:wrap;gap:14px}.fig{background:#fff;border:1px solid #cfd8dc;padding:6px}
.fig img{display:block}.fig figcaption{font-size:12px;color:#455a64;max-width:260px}
.orient{display:flex;justify-content:space-between;font-size:11px;color:#78909c}
svg.chart{background:#fff;border:1px solid #e0e0e0;margin:4px 0}
svg text.t{font-size:12px;fill:#263238}svg text.tick{font-size:10px;fill:#607d8b;text-anchor:middle}
svg text.l{text-anchor:start}svg .box{fill:#e3f2fd;stroke:#90caf9}svg .med{stroke:#1565c0;stroke-width:2}
svg .pt{fill:#546e7a}svg .out{fill:#d32f2f}svg .ax{stroke:#90a4ae}svg .grid{stroke:#eceff1}
svg .line{fill:none;stroke:#1565c0;stroke-width:1.5}svg .edge{stroke:#607d8b;stroke-width:1.2}
svg text.nid{font-size:11px;fill:#fff;font-weight:600}svg text.ntool{font-size:10px;fill:#fff}
pre.report{white-space:pre-wrap;background:#fff;border:1px solid #cfd8dc;padding:10px;max-width:1000px}
.report-body{background:#fff;border:1px solid #cfd8dc;padding:6px 14px;max-width:1000px}
a.ev{font-size:11px;color:#1565c0;text-decoration:none;background:#e3f2fd;border-radius:3px;padding:0 3px}
nav.toc a{margin-right:12px}
"""


def rel(target: Path, page: Path) -> str:
    """A relative URL from ``page`` to ``target`` (both on disk), with '/' separators."""
    return Path(os.path.relpath(target, page.parent)).as_posix()


def page(title: str, body: str, *, subtitle: str = "", css_href: str = "style.css", nav: str = "") -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f'<title>{escape(title)}</title><link rel="stylesheet" href="{escape(css_href)}"></head><body>'
            f'<header><h1>{escape(title)}</h1><div class="sub">{subtitle}</div>{nav}</header>'
            f'<main>{body}</main></body></html>')


def badge(status: str) -> str:
    s = status or "unknown"
    return f'<span class="badge {escape(re.sub(r"[^a-z]", "", s.lower()) or "unknown")}">{escape(s)}</span>'


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "NaN"
        return f"{value:.{digits}g}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], raw_cols: Sequence[int] = (),
          num_cols: Sequence[int] = ()) -> str:
    """An HTML table; cells are escaped except the columns in ``raw_cols`` (already HTML)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            text = c if i in raw_cols else escape(fmt(c))
            cells.append(f'<td class="num">{text}</td>' if i in num_cols else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def link(href: str, text: str) -> str:
    return f'<a href="{escape(href)}">{escape(text)}</a>'


_EVIDENCE = re.compile(r"`\[([A-Za-z_]\w*)\.(.+?)\]`")
_FOOTNOTE = re.compile(r"\[\^(\d+)\]")
_FOOTNOTE_DEF = re.compile(r"^\[\^(\d+)\]: `([A-Za-z_]\w*)\.(.+?)`$")


def markdown(source: str, evidence_href) -> str:
    """The small Markdown subset reports use (headings, bullets, code spans, paragraphs), with
    evidence markers ``[node.field.path]`` turned into links to their provenance, footnote
    markers ``[^n]`` into links to their definitions ``[^n]: `node.field.path` `` (themselves
    links to the provenance), and HTML comments (metadata markers) dropped."""
    out, in_list = [], False

    def text(s: str) -> str:
        s = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", _code(escape(s)))
        return _FOOTNOTE.sub(lambda m: f'<sup><a class="ev" href="#fn-{m.group(1)}">{m.group(1)}</a></sup>', s)

    def inline(s: str) -> str:
        parts, last = [], 0
        for m in _EVIDENCE.finditer(s):
            parts.append(text(s[last:m.start()]))
            node, path = m.group(1), m.group(2)
            parts.append(f'<a class="ev" href="{escape(evidence_href(node))}" '
                         f'title="provenance of {escape(node)}.{escape(path)}">{escape(node)}.{escape(path)}</a>')
            last = m.end()
        parts.append(text(s[last:]))
        return "".join(parts)

    for line in source.splitlines():
        fn = _FOOTNOTE_DEF.match(line)
        if line.startswith("<!--"):
            continue
        if fn:
            if in_list:
                out.append("</ul>")
                in_list = False
            n, node, path = fn.groups()
            out.append(f'<p id="fn-{n}" class="muted">{n}. <a class="ev" href="{escape(evidence_href(node))}">'
                       f'{escape(node)}.{escape(path)}</a></p>')
        elif line.startswith("#"):
            if in_list:
                out.append("</ul>")
                in_list = False
            level = min(len(line) - len(line.lstrip("#")) + 1, 5)
            out.append(f"<h{level}>{inline(line.lstrip('#').strip())}</h{level}>")
        elif line.lstrip().startswith(("- ", "* ")):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{inline(line.lstrip()[2:])}</li>")
        elif line.strip():
            if in_list:
                out.append("</ul>")
                in_list = False
            out.append(f"<p>{inline(line)}</p>")
    if in_list:
        out.append("</ul>")
    return "".join(out)


def _code(s: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", s)


__all__ = ["CSS", "badge", "fmt", "link", "markdown", "page", "rel", "table"]
