"""``bcer data inspect DIR``: the layout bcer detects and, per case, the tasks it can run.

Registered on the ``data`` command group by ``bcer.cli.main``; kept apart so the dataset view
does not grow the main CLI module.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from . import options as O
from . import views as V
from ..contracts import ToolError


def _cell_sequences(seqs: dict) -> str:
    return "\n".join(f"{k}: {v['error']}" if "error" in v else
                     f"{k}: {v.get('shape')} @ {V.fmt_spacing(v.get('spacing'))} {v.get('orientation', '')}"
                     for k, v in seqs.items())


def _cell_truth(gt: dict) -> str:
    labels, values = gt.get("labels", []), gt.get("values", [])
    more = f" +{len(values) - 4}" if len(values) > 4 else ""
    return "\n".join(x for x in (f"labels: {', '.join(labels)}" if labels else "",
                                 f"values: {', '.join(values[:4])}{more}" if values else "") if x) or "-"


def data_inspect(root: Path = typer.Argument(..., metavar="DATA", help="dataset folder, one case folder, or a mapping file"),
                 layout: O.Layout = None, as_json: bool = typer.Option(False, "--json", help="print JSON"),
                 seq: O.Seq = None) -> None:
    """Name the detected layout and, per case, its sequences, ground truth, problems and the
    tasks it can run."""
    from ..datasets.layouts._inspect import inspect
    from ..datasets.layouts.flat import parse_mapping

    try:
        rows = inspect(root, layout, parse_mapping(seq) if seq else None)
    except ToolError as e:
        V.console.print(f"[bold red]error[/]: {escape(str(e))}")
        raise typer.Exit(2)
    if as_json:
        typer.echo(json.dumps(rows, indent=2, default=str))
        return
    name = rows[0]["layout"] if rows else layout
    t = Table(title=f"layout {name}: {len(rows)} case(s) in {root}")
    for col in ("case", "domain", "sequences", "ground truth", "tasks", "problems"):
        t.add_column(col)
    for c in rows:
        gt = c.get("ground_truth") or {}
        t.add_row(c["case"], c["domain"], _cell_sequences(c["sequences"]),
                  _cell_truth(gt),
                  "\n".join(c["tasks"]) or "-", escape("\n".join(c["issues"])))
    V.console.print(t)
