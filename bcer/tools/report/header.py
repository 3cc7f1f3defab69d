"""What a report says about itself: the header it opens with and the evidence table it ends with.

**Metadata sections (for the report critic).** A rendered report has two sections that are
metadata, not findings, and that a critic of the prose must not check or repair:

* Markdown: the ``## About this report`` section (right after the title) and the
  ``## Evidence`` section (last: Markdown footnote definitions), each wrapped in ``<!-- bcer:metadata -->`` ...
  ``<!-- /bcer:metadata -->`` lines; :func:`strip_metadata` removes both.
* JSON (``Report.structured``): the keys named in ``structured["metadata_keys"]``
  (``header`` and ``evidence_table``).

In the Markdown text every number's evidence is a footnote marker ``[^n]`` after it; the
Evidence section defines each ``n`` as its id ``node.field.key``. ``Report.evidence`` and the
structured findings/impression sentences keep the inline `` `[node.field.key]` `` links the
critic reads.

The header: the case, the input series each node read (so which image each intensity comes
from), the method of every node behind the numbers (from the inputs' ``meta["lineage"]``,
:mod:`bcer.tools.methods`), any flags (an ED/ES near tie, a low-confidence segmentation),
bcer's version, the date the report was made, and :data:`DISCLAIMER` whenever a shipped
default network or classical method ran.
"""
from __future__ import annotations

import re
import time
from typing import Any

from ..methods import MethodCard

METADATA_OPEN, METADATA_CLOSE = "<!-- bcer:metadata -->", "<!-- /bcer:metadata -->"
HEADER_TITLE, EVIDENCE_TITLE = "About this report", "Evidence"
METADATA_KEYS = ("header", "evidence_table")
DISCLAIMER = ("Research use only; the default models were validated on synthetic data only; point --bundle / "
              "--model-dir at a validated model for real studies.")
_METADATA = re.compile(re.escape(METADATA_OPEN) + r".*?" + re.escape(METADATA_CLOSE) + r"\n?", re.S)


def strip_metadata(text: str) -> str:
    """The Markdown report without its metadata sections (header and evidence table)."""
    return _METADATA.sub("", text)


def _bcer_version() -> str:
    from ... import __version__

    return __version__


def _nodes(artifacts: list[Any]) -> tuple[str | None, dict[str, Any]]:
    case, nodes = None, {}
    for a in artifacts:
        lin = (getattr(a, "meta", None) or {}).get("lineage") if isinstance(getattr(a, "meta", None), dict) else None
        if isinstance(lin, dict):
            case = case or lin.get("case")
            nodes.update(lin.get("nodes") or {})
    return case, nodes


def _flag_lines(node: str, flags: dict[str, Any]) -> list[str]:
    """A raised flag as ``Flag: ...``; a confidence score (a flag with ``score``) always, raised or not."""
    out = []
    for name, f in flags.items():
        if not isinstance(f, dict):
            continue
        if f.get("flagged"):
            out.append(f"Flag: {name.replace('_', ' ')} at node `{node}`: {f.get('detail', '')}".rstrip(": "))
        elif "score" in f:
            out.append(f"Confidence at node `{node}`: {f.get('detail', '')}")
    return out


def header_of(artifacts: list[Any], now: float | None = None) -> dict[str, Any]:
    """The header's content from the report's input artifacts (their ``meta["lineage"]``)."""
    case, nodes = _nodes([a for a in artifacts if a is not None])
    methods, series, flags, disclaim = [], set(), [], False
    for node, n in nodes.items():
        card = MethodCard(**n["method"]) if isinstance(n.get("method"), dict) else None
        reads = dict(n.get("reads") or {})
        series.update(v.split(" ", 1)[1] for v in reads.values() if v.startswith("series "))
        methods.append({"node": node, "tool": n.get("tool"), "version": n.get("version"), "reads": reads,
                        "method": card.line() if card else n.get("tool"),
                        "kind": card.kind if card else "computation"})
        disclaim = disclaim or bool(card and card.needs_disclaimer())
        flags += _flag_lines(node, n.get("flags") or {})
    return {"case": case, "series": sorted(series), "methods": methods, "flags": flags,
            "bcer_version": _bcer_version(),
            "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(now)),
            "disclaimer": DISCLAIMER if disclaim else None}


def _reads_text(reads: dict[str, str]) -> str:
    return ", ".join(f"{port} from {src.split(' ', 1)[0]} `{src.split(' ', 1)[1]}`" for port, src in reads.items())


def header_lines(h: dict[str, Any]) -> list[str]:
    """The ``About this report`` section (metadata markers included). Every value that holds
    digits is in a code span."""
    lines = [METADATA_OPEN, f"## {HEADER_TITLE}"]
    if h.get("disclaimer"):
        lines.append(f"**{h['disclaimer']}**")
        lines.append("")
    lines.append(f"- Case: `{h.get('case') or 'unknown'}`")
    lines.append("- Input series: " + (", ".join(f"`{s}`" for s in h["series"]) if h["series"] else "none recorded"))
    if h["methods"]:
        lines.append("- Methods (each node behind the numbers, and what it read):")
        for m in h["methods"]:
            reads = _reads_text(m["reads"])
            lines.append(f"  - `{m['node']}` (`{m['tool']} {m['version']}`): `{m['method']}`"
                         + (f"; reads {reads}" if reads else ""))
    lines += [f"- {f}" for f in h["flags"]]
    lines.append(f"- bcer `{h['bcer_version']}`, report made `{h['created']}`")
    return lines + [METADATA_CLOSE]


def evidence_lines(table: list[dict[str, Any]]) -> list[str]:
    """The ``Evidence`` section: one Markdown footnote definition per reference,
    ``[^n]: `node.field.key` `` (the node and output field in provenance.json, and the key)."""
    if not table:
        return []
    lines = [METADATA_OPEN, f"## {EVIDENCE_TITLE}", "", "Each number's source: node, output field and key "
             "(the node's row in `provenance.json`).", ""]
    lines += [f"[^{r['ref']}]: `{r['id']}`" for r in table]
    return lines + [METADATA_CLOSE]


_LINK = re.compile(r"\s?`\[([^`]+?)\]`")


def footnoted(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``text`` with each inline evidence link `` `[id]` `` replaced by a footnote marker
    ``[^n]`` (one ``n`` per distinct id, in order of first use) and the table of ids."""
    refs: dict[str, int] = {}

    def sub(m: re.Match) -> str:
        n = refs.setdefault(m.group(1), len(refs) + 1)
        return f"[^{n}]"

    out = _LINK.sub(sub, text)
    return out, [{"ref": n, "id": i} for i, n in refs.items()]


__all__ = ["DISCLAIMER", "EVIDENCE_TITLE", "HEADER_TITLE", "METADATA_CLOSE", "METADATA_KEYS", "METADATA_OPEN",
           "evidence_lines", "footnoted", "header_lines", "header_of", "strip_metadata"]
