"""How fast and how big the HTML pages of a 200-case cohort are (issue: < 10 s, < 50 MB).

A real ``prostate_report`` cohort of ``--real`` small phantom cases is run through the engine
once; its case folders are then cloned (new case ids, same deliverables and inputs) up to
``--cases``, and ``cohort.parquet``/``events.parquet`` rebuilt, so the page builder sees a
cohort of the target size with real content. Measured: the cohort page alone, then the full
report (cohort page + one page per case with thumbnails), wall seconds and bytes on disk.
Screenshots of the cohort page and one case page go to ``docs/screenshots/``.

    .venv/bin/python benchmarks/report_pages.py --cases 200 --real 8

Writes ``benchmarks/results/report_pages.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "report_pages.json"
SHOTS = ROOT / "docs" / "screenshots"


def real_cohort(work: Path, n: int) -> Path:
    from bcer.api import Study
    from bcer.datasets.synth import synth_cohort

    data = work / "data"
    synth_cohort("prostate", n, data, layout="bids", seed=21, size="small")
    out = work / "out"
    Study(str(data), task="prostate_report", out=out, max_in_flight=2).run()
    return out


def clone_to(out: Path, n: int) -> None:
    """Clone case folders until the cohort has ``n`` cases; rebuild the cohort tables."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "cohort.parquet").to_pylist()
    events = pq.read_table(out / "events.parquet").to_pylist()
    base_rows, base_events = list(rows), list(events)
    i = 0
    while len(rows) < n:
        src = base_rows[i % len(base_rows)]
        new_id = f"{src['case']}-c{i:04d}"
        shutil.copytree(out / src["case"], out / new_id)
        row = dict(src, case=new_id)
        (out / new_id / "result.json").write_text(json.dumps(row, default=str))
        rows.append(row)
        shift = 0.5 * (i + 1)  # spread the cloned runs over time, as a longer cohort would be
        events += [dict(e, case=new_id, time=e["time"] + shift) for e in base_events if e["case"] == src["case"]]
        i += 1
    pq.write_table(pa.Table.from_pylist(rows), out / "cohort.parquet")
    pq.write_table(pa.Table.from_pylist(events), out / "events.parquet")


def screenshots(report: Path) -> list[str]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--window-size=1300,1000"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    SHOTS.mkdir(parents=True, exist_ok=True)
    case_page = sorted((report / "cases").rglob("*.html"))[0]
    written = []
    for page, name in ((report / "index.html", "cohort_page.png"), (case_page, "case_page.png")):
        driver.get(page.as_uri())
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1300, min(height + 40, 2400))  # the top of the page, legible
        driver.save_screenshot(str(SHOTS / name))
        written.append(str((SHOTS / name).relative_to(ROOT)))
    driver.quit()
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--real", type=int, default=8, help="cases actually run before cloning")
    ap.add_argument("--no-screenshots", action="store_true")
    args = ap.parse_args()
    from bcer.pages import build_report

    work = Path(tempfile.mkdtemp(prefix="bcer_pages_"))
    t0 = time.time()
    out = real_cohort(work, args.real)
    run_s = time.time() - t0
    clone_to(out, args.cases)
    cohort_only = build_report(out, case_pages=False)
    shutil.rmtree(out / "report")
    full = build_report(out)
    shots = [] if args.no_screenshots else screenshots(out / "report")
    result = {
        "cases": args.cases, "real_cases_run": args.real, "run_s": round(run_s, 1),
        "cohort_page_s": round(cohort_only.seconds_cohort_pages, 3),
        "cohort_page_bytes": cohort_only.bytes,
        "full_report": {"cohort_page_s": round(full.seconds_cohort_pages, 3),
                        "case_pages": full.case_pages, "case_pages_s": round(full.seconds_case_pages, 2),
                        "bytes": full.bytes, "mb": round(full.bytes / 1e6, 2)},
        "goals": {"cohort_page_under_10_s": cohort_only.seconds_cohort_pages < 10,
                  "report_under_50_mb": full.bytes < 50e6},
        "screenshots": shots, "problems": full.problems[:20],
        "machine": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "python": platform.python_version()},
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
