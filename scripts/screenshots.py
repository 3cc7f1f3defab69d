"""Rebuild docs/screenshots from a real run, so the pictures in the README cannot go stale.

Synthesises a small brain cohort (phantoms), runs `brain_report` on it through the public API
(a local Ray cluster), builds the HTML pages and photographs the cohort page and one case page
in Debian's headless Chromium (the same driver set-up as tests/pages/test_browser.py):

    python scripts/screenshots.py [--cases 3] [--work /tmp/bcer_shots]

Needs /usr/bin/chromium and /usr/bin/chromedriver (`bash scripts/install_browser.sh`).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "screenshots"
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"]


def run_cohort(work: Path, n: int) -> Path:
    import bcer
    from bcer.datasets.synth import synth_cohort

    data, out = work / "data", work / "out"
    synth_cohort("brain", n, data, layout="brats", seed=1, size="small")
    result = bcer.Study(str(data), task="brain_report", out=str(out)).run(progress=True)
    print({r["case"]: r["status"] for r in result.rows})
    bcer.build_pages(out)
    return out


def shoot(pages: dict[str, Path], width: int = 1300, height: int = 900) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--window-size={width},{height}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        for name, page in pages.items():
            driver.get(page.as_uri())
            # the whole page, up to a readable height
            full = min(int(driver.execute_script("return document.body.scrollHeight")), 2400)
            driver.set_window_size(width, max(height, full))
            target = SHOTS / f"{name}.png"
            assert driver.save_screenshot(str(target)), target
            print(f"wrote {target} ({target.stat().st_size // 1024} KB) from {page}")
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=3)
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args()
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        raise SystemExit("needs Chromium and chromedriver: bash scripts/install_browser.sh")
    work = args.work or Path(tempfile.mkdtemp(prefix="bcer_shots_"))
    try:
        out = run_cohort(work, args.cases)
        report = out / "report"
        cases = sorted(p for p in report.rglob("*.html") if p.name != "index.html")
        SHOTS.mkdir(parents=True, exist_ok=True)
        shoot({"cohort_page": report / "index.html", "case_page": cases[0]})
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
