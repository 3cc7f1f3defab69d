"""The pages in a real browser (Debian's headless Chromium through chromedriver): every image
loads, every internal link resolves, no console errors. Never skipped: CI installs Chromium
(`.ci/run`), and a machine without it fails here with the install command."""
from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from bcer.pages import build_report

pytestmark = pytest.mark.timeout(600)
CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1300,1000"]


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.fail(f"the page tests need Chromium ({CHROMIUM}) and chromedriver ({DRIVER}): run "
                    "`bash scripts/install_browser.sh` (`make test` does)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


_IMAGES = "return Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])"
# getAttribute, not .href: an SVG <a> has an SVGAnimatedString there
_LINKS = ("return Array.from(document.querySelectorAll('a[href], link[href]'))"
          ".map(a => new URL(a.getAttribute('href'), document.baseURI).href)")


def visit_all(driver, report_dir: Path) -> dict[str, int]:
    """Open every page of the report; assert images, links and the console. Returns counts."""
    counts = {"pages": 0, "images": 0, "links": 0}
    for page in sorted(report_dir.rglob("*.html")):
        driver.get(page.as_uri())
        assert driver.title, f"{page.name}: no title"
        for src, complete, width in driver.execute_script(_IMAGES):
            assert complete and width > 0, f"{page.relative_to(report_dir)}: image did not load: {src}"
            counts["images"] += 1
        for href in driver.execute_script(_LINKS):
            url = urlparse(href)
            assert url.scheme == "file", f"{page.name}: non-local link {href}"
            target = Path(unquote(url.path))
            assert target.exists(), f"{page.relative_to(report_dir)}: link to a missing file {href}"
            if url.fragment and target.suffix == ".html" and target == page:
                assert driver.execute_script("return !!document.getElementById(arguments[0])", url.fragment), \
                    f"{page.name}: anchor #{url.fragment} missing"
            counts["links"] += 1
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert not errors, f"{page.relative_to(report_dir)}: console errors {errors}"
        counts["pages"] += 1
    return counts


def test_bench_pages_in_chromium(browser, bench_out, tmp_path):
    build_report(bench_out)
    counts = visit_all(browser, bench_out / "report")
    assert counts["pages"] == 21 and counts["images"] >= 15 and counts["links"] > 100
    browser.get((bench_out / "report" / "index.html").as_uri())
    shot = tmp_path / "bench.png"
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000


def test_incomplete_cohort_pages_in_chromium(browser, cohort_out):
    build_report(cohort_out)
    counts = visit_all(browser, cohort_out / "report")
    assert counts["pages"] == 4 and counts["images"] >= 1  # the gland overlay of the one finished case


def test_a_broken_image_is_caught(browser, tmp_path):
    """The check itself can fail: a page with a missing image and a console error is reported."""
    page = tmp_path / "report" / "bad.html"
    page.parent.mkdir()
    page.write_text("<!DOCTYPE html><html><head><title>bad</title></head><body><img src='nope.png'>"
                    "<script>console.error('boom')</script></body></html>")
    with pytest.raises(AssertionError, match="image did not load"):
        visit_all(browser, page.parent)
    shutil.rmtree(page.parent)
