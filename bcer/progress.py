"""Progress of a run in a terminal or a notebook (rich renders in both): one bar for the
cases, one line per case in flight with the nodes it is running, and the time the local Ray
cluster took to start and to stop, shown as such.

Used by the ``bcer`` command and by ``Study.run(progress=True)``.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

MAX_CASE_LINES = 8  # in-flight cases shown one line each; the others are counted in the bar


class CaseProgress:
    """An executor hook (see ``bcer.engine.trace``) that draws the bar and the case lines.

    The whole DAG of a case goes to Ray at once, so "running" means the nodes whose upstream
    nodes have all finished and which have not finished themselves.
    """

    def __init__(self, bar: Progress, total: int):
        self.bar = bar
        self.cases = bar.add_task("cases", total=total)
        self.lines: dict[str, TaskID] = {}
        self.graphs: dict[str, tuple[dict[str, set[str]], set[str]]] = {}

    def on_case_start(self, *, case: str, workflow: Any, **_: Any) -> None:
        ups: dict[str, set[str]] = {n.id: set(n.after) for n in workflow.nodes}
        for u, v in workflow.edges:
            ups.setdefault(v, set()).add(u)
        self.graphs[case] = (ups, set())
        if len(self.lines) < MAX_CASE_LINES and case not in self.lines:
            self.lines[case] = self.bar.add_task("", total=len(ups), start=True)
        self._draw(case)

    def on_node_end(self, *, case: str, node: str, status: str, **_: Any) -> None:
        if case in self.graphs and status == "succeeded":
            self.graphs[case][1].add(node)
        self._draw(case)

    def running(self, case: str) -> list[str]:
        ups, done = self.graphs.get(case, ({}, set()))
        return [n for n, before in ups.items() if n not in done and before <= done]

    def _draw(self, case: str) -> None:
        line = self.lines.get(case)
        if line is None:
            return
        ups, done = self.graphs[case]
        now = ", ".join(self.running(case)[:3]) or "finishing"
        self.bar.update(line, completed=len(done), description=f"  {escape(case)}: {escape(now)}")

    def case_done(self, row: dict[str, Any]) -> None:
        """``on_case_done`` of the cohort: one line per finished case, the bar advances."""
        case = row["case"]
        line = self.lines.pop(case, None)
        if line is not None:
            self.bar.remove_task(line)
        self.graphs.pop(case, None)
        ok = row["status"] == "succeeded"
        extra = " (resumed)" if row.get("resumed") else ""
        msg = "" if ok else f" {row['status']} {row.get('error_code')}: {row.get('error_message')}"
        self.bar.console.print(f"{'[green]✓[/]' if ok else '[red]✗[/]'} {escape(str(case))}{extra}{escape(msg)}")
        self.bar.advance(self.cases)


@contextmanager
def local_cluster(address: str | None, console: Console) -> Iterator[None]:
    """Start Ray before the bar (so its start-up is not counted as the cases' time) and, when
    this call started it, stop it after; both times are printed as such. Joined clusters and a
    Ray already running (a notebook, a test session) are left as they are."""
    import os

    import ray

    from .engine.cluster import ensure_ray

    if ray.is_initialized():
        yield
        return
    where = "local Ray cluster" if address is None and not os.environ.get("RAY_ADDRESS") else "Ray cluster"
    t0 = time.perf_counter()
    with console.status(f"starting the {where}"):
        resources = ensure_ray(address)
    console.print(f"{where} {'started' if where.startswith('local') else 'joined'} in "
                  f"{time.perf_counter() - t0:.1f} s ({resources.get('CPU', 0):g} CPU, {resources.get('GPU', 0):g} GPU)")
    try:
        yield
    finally:
        t1 = time.perf_counter()
        ray.shutdown()
        console.print(f"{where} {'stopped' if where.startswith('local') else 'left'} in "
                      f"{time.perf_counter() - t1:.1f} s")


def run_with_progress(run: Callable[..., Any], total: int, address: str | None,
                      console: Console | None = None) -> Any:
    """Call ``run(on_case_done=..., hooks=[...])`` under a progress display."""
    console = console or Console()
    with local_cluster(address, console):
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as bar:
            hook = CaseProgress(bar, total)
            return run(on_case_done=hook.case_done, hooks=[hook])


__all__ = ["CaseProgress", "local_cluster", "run_with_progress"]
