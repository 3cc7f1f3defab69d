"""Static HTML pages of a run: ``bcer report OUT`` writes ``OUT/report/index.html``.

The pages open from disk (no server, no internet, no JavaScript): a cohort page (or, for a
bench, an overview linking one cohort page per task) and one page per case.

>>> from bcer.pages import build_report          # doctest: +SKIP
>>> build_report("bench_out")                    # doctest: +SKIP
PosixPath('bench_out/report/index.html')
"""
from __future__ import annotations

from .build import ReportStats, build_report

__all__ = ["ReportStats", "build_report"]
