"""Writing the report folder: stylesheet, cohort page(s), case pages (in worker processes).

Layout under ``OUT/report/``::

    index.html                 the cohort page, or the bench overview
    task-<task>.html           one cohort page per task (bench only)
    cases/<task>/<case>.html   one page per case
    img/<task>/<case>/*.png    case thumbnails
    style.css

Case pages are built for at most ``max_case_pages`` cases per cohort, failures and outliers
first; the cohort page links the others to their raw folder instead. Every file is written
to a temporary name and renamed, so an interrupted build never leaves a torn page.
"""
from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .html import CSS, rel
from .load import CohortView, RunView, load_run

log = logging.getLogger(__name__)


@dataclass
class ReportStats:
    """What a build wrote and how long it took."""

    index: Path
    cohort_pages: int = 0
    case_pages: int = 0
    seconds_cohort_pages: float = 0.0
    seconds_case_pages: float = 0.0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def _case_page_path(report_dir: Path, cohort: str, case: str) -> Path:
    return report_dir / "cases" / cohort / f"{case}.html"


def _chosen(cv: CohortView, max_pages: int) -> list[str]:
    """Case ids that get a page: failures first, then the rest in cohort order."""
    bad = [str(r["case"]) for r in cv.rows if r.get("status") != "succeeded" or not r.get("sr")]
    rest = [str(r["case"]) for r in cv.rows if str(r["case"]) not in set(bad)]
    return (bad + rest)[:max_pages]


def _contract_names(task: str) -> list[str]:
    try:
        from ..contracts import load_contract

        return [d.name for d in load_contract(task).deliverables]
    except Exception:  # a custom plan has no contract: the page lists what was written
        return []


def _build_case(args: tuple) -> tuple[str, str | None]:
    """Worker: one case page. Returns (case, error or None); never raises."""
    root, name, quality, row, report_dir, page_path, cohort_href, names = args
    from .case import build_case_page

    try:
        cv = CohortView(name=name, root=Path(root), rows=[row], quality=quality)
        build_case_page(cv, row, Path(report_dir), Path(page_path), cohort_href, names)
        return str(row.get("case")), None
    except Exception as e:  # one broken case must not cost the others their pages
        log.exception("case page %s failed", row.get("case"))
        return str(row.get("case")), f"{type(e).__name__}: {e}"


def _case_jobs(cv: CohortView, report_dir: Path, cohort_page: Path, chosen: list[str]) -> list[tuple]:
    names = _contract_names(cv.name)
    by_id = {str(r.get("case")): r for r in cv.rows}
    jobs = []
    for case in chosen:
        page_path = _case_page_path(report_dir, cv.name, case)
        jobs.append((str(cv.root), cv.name, {case: cv.quality.get(case, {})}, by_id[case], str(report_dir),
                     str(page_path), rel(cohort_page, page_path), names))
    return jobs


def build_report(out: str | Path, *, max_case_pages: int = 500, workers: int | None = None,
                 case_pages: bool = True) -> ReportStats:
    """Build ``OUT/report/`` for a cohort or bench folder; returns what was written.

    Args:
        out: a cohort output folder or a bench folder.
        max_case_pages: case pages per cohort (failures first); others link to their folder.
        workers: processes for case pages (default: up to 4, at most the CPU count).
        case_pages: False writes only the cohort page(s).

    Raises:
        FileNotFoundError: ``out`` holds no cohort or bench.
    """
    run: RunView = load_run(out)
    report_dir = run.out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    _write(report_dir / "style.css", CSS)
    index = report_dir / "index.html"
    stats = ReportStats(index=index)
    jobs: list[tuple] = []
    t0 = time.time()
    from .cohort import bench_page, cohort_page

    for cv in run.cohorts:
        page_path = report_dir / f"task-{cv.name}.html" if run.is_bench else index
        chosen = set(_chosen(cv, max_case_pages if case_pages else 0))

        def href(case: str, _cv=cv, _page=page_path, _chosen=chosen) -> str | None:
            if case in _chosen:
                return rel(_case_page_path(report_dir, _cv.name, case), _page)
            folder = _cv.root / case
            return rel(folder, _page) + "/" if folder.is_dir() else None

        task = ((run.bench or {}).get("tasks") or {}).get(cv.name)
        back = rel(index, page_path) if run.is_bench else ""
        _write(page_path, cohort_page(cv, page_path, report_dir, href, task, back))
        stats.cohort_pages += 1
        stats.problems += [f"{cv.name}: {p}" for p in cv.problems]
        jobs += _case_jobs(cv, report_dir, page_path, [c for c in _chosen(cv, max_case_pages) if c in chosen])
    if run.is_bench:
        _write(index, bench_page(run, index, report_dir, lambda t: f"task-{t}.html"))
        stats.cohort_pages += 1
    stats.seconds_cohort_pages = time.time() - t0
    t1 = time.time()
    stats.case_pages, errors = _run_jobs(jobs, workers)
    stats.problems += errors
    stats.seconds_case_pages = time.time() - t1
    stats.bytes = sum(p.stat().st_size for p in report_dir.rglob("*") if p.is_file())
    log.info("report: %d cohort page(s) in %.2f s, %d case page(s) in %.2f s, %.1f MB -> %s", stats.cohort_pages,
             stats.seconds_cohort_pages, stats.case_pages, stats.seconds_case_pages, stats.bytes / 1e6, index)
    return stats


def _run_jobs(jobs: list[tuple], workers: int | None) -> tuple[int, list[str]]:
    if not jobs:
        return 0, []
    n = workers if workers is not None else min(4, os.cpu_count() or 1, len(jobs))
    if n <= 1 or len(jobs) < 4:
        results = [_build_case(j) for j in jobs]
    else:
        import multiprocessing as mp

        # spawn, not fork: the caller may hold Ray's threads (the report is built after a cohort)
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(_build_case, jobs, chunksize=max(1, len(jobs) // (4 * n))))
    errors = [f"case page {case}: {err}" for case, err in results if err]
    return sum(1 for _, err in results if err is None), errors


__all__ = ["ReportStats", "build_report"]
