"""The HTML pages: structure on incomplete cohorts, overlay geometry against truth, charts, CLI."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from bcer.pages import build_report
from bcer.pages import overlay as ov
from bcer.pages import svg

pytestmark = pytest.mark.timeout(600)


class Links(HTMLParser):
    """Collects hrefs, image sources and element ids of one page."""

    def __init__(self):
        super().__init__()
        self.hrefs, self.srcs, self.ids = [], [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if tag == "img" and a.get("src"):
            self.srcs.append(a["src"])
        if tag == "link" and a.get("href"):
            self.hrefs.append(a["href"])


def parse(page: Path) -> Links:
    p = Links()
    p.feed(page.read_text())
    return p


def check_links(report_dir: Path) -> int:
    """Every internal link of every page resolves to a file (and its #anchor to an element id)."""
    pages = sorted(report_dir.rglob("*.html"))
    checked = 0
    for page in pages:
        links = parse(page)
        for ref in links.hrefs + links.srcs:
            assert not ref.startswith(("http:", "https:", "//")), f"{page.name} links outside: {ref}"
            target, _, anchor = ref.partition("#")
            path = (page.parent / target).resolve() if target else page
            assert path.exists(), f"{page.relative_to(report_dir)}: broken link {ref}"
            if anchor and path.suffix == ".html":
                assert anchor in parse(path).ids, f"{page.name}: no #{anchor} in {path.name}"
            checked += 1
    return checked


def test_cohort_with_rejected_failed_and_missing_deliverable(cohort_out):
    stats = build_report(cohort_out, workers=1)
    report = cohort_out / "report"
    index = (report / "index.html").read_text()
    # a case's row: result.json (a case that did not succeed), or _DONE (a lean succeeded case)
    rows = {r["case"]: r for r in map(json.loads, (p.read_text() for p in [*cohort_out.glob("*/result.json"),
                                                                            *cohort_out.glob("*/_DONE")]))}
    statuses = sorted(r["status"] for r in rows.values())
    assert statuses == ["failed", "rejected", "succeeded"]
    failures = index[index.index("<h2>Failures</h2>"):index.index("<h2>Key measurements</h2>")]
    for r in rows.values():
        if r["status"] != "succeeded":
            assert r["case"] in failures and r["error_code"] in failures and r["status"] in failures
    assert stats.case_pages == 3 and stats.cohort_pages == 1 and not stats.problems
    ok = next(r for r in rows.values() if r["status"] == "succeeded")
    case_page = (report / "cases" / "prostate_report" / f"{ok['case']}.html").read_text()
    findings_row = re.search(r"<tr><td>findings</td>.*?</tr>", case_page).group(0)
    assert "missing" in findings_row  # the deleted deliverable is named as missing, the page still built
    assert 'id="node-seg_prostate"' in case_page and "<svg" in case_page
    rejected = next(r for r in rows.values() if r["status"] == "rejected")
    rej_page = (report / "cases" / "prostate_report" / f"{rejected['case']}.html").read_text()
    assert "input_missing" in rej_page and "no workflow.json" in rej_page
    assert check_links(report) > 20


def test_bench_pages_have_every_overlay_kind_and_evidence_links(bench_out):
    stats = build_report(bench_out, workers=2)
    report = bench_out / "report"
    assert stats.cohort_pages == 11 and stats.case_pages == 10 and not stats.problems  # index + 10 tasks
    overview = (report / "index.html").read_text()
    for task in ("prostate_report", "cardiac_report", "recon_cardiac", "register_prostate", "segment_brain"):
        assert f"task-{task}.html" in overview
        case_pages = list((report / "cases" / task).glob("*.html"))
        assert len(case_pages) == 1
        html = case_pages[0].read_text()
        assert html.count("<img ") >= 2, task
    cardiac = next((report / "cases" / "cardiac_report").glob("*.html")).read_text()
    assert re.search(r"ED \(frame \d+\)", cardiac) and re.search(r"ES \(frame \d+\)", cardiac)
    recon = next((report / "cases" / "recon_cardiac").glob("*.html")).read_text()
    assert "zero-filled" in recon
    prostate = next((report / "cases" / "prostate_report").glob("*.html")).read_text()
    assert "box(es) on T2w" in prostate
    # every evidence marker of the report is a link to the provenance row of its node
    ev = re.findall(r'<a class="ev" href="#node-([^"]+)"', prostate)
    assert len(ev) >= 5 and all(f'id="node-{n}"' in prostate for n in ev)
    assert check_links(report) > 50
    assert stats.bytes < 5e6


def test_overlay_lands_through_world_coordinates():
    """A mask on a rotated, shifted grid is drawn where its voxels are in the world."""
    base = ov.Volume(np.full((40, 30, 10), 100.0), np.diag([2.0, 2.0, 4.0, 1.0]))
    base.affine[:3, 3] = [-40.0, -30.0, -20.0]
    rot = np.array([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])  # 90° about z
    maff = np.eye(4)
    maff[:3, :3] = rot * 1.0
    maff[:3, 3] = [5.0, -7.0, -20.0]
    mask = ov.Volume(np.zeros((30, 30, 30), np.int16), maff)
    target = np.array([-10.0, 6.0, 0.0])  # a world point inside the base volume
    mv = np.rint(ov.world_to_voxel(maff, target[None])[0]).astype(int)
    mask.data[mv[0], mv[1], mv[2]] = 1
    b = ov.canonical(base)
    k = ov.best_slice(b, [mask])
    assert k == int(np.rint(ov.world_to_voxel(b.affine, target[None])[0, 2]))
    lab = ov.sample_nearest(mask, ov.slice_world(b, k))
    hit = np.argwhere(lab == 1)
    assert len(hit) == 1
    world = ov.slice_world(b, k)[hit[0][0], hit[0][1]]
    assert np.linalg.norm(world - target) <= 1.5  # within the nearest-voxel distance of the base grid
    img = np.asarray(ov.render_slice(b, k, [mask], size=b.data.shape[0] * 2))
    # radiological display: RAS +x is the patient's right, drawn on the viewer's left
    red = np.argwhere((img[..., 0] > 200) & (img[..., 1] < 100))
    assert len(red) > 0
    col = red[:, 1].mean() / img.shape[1]
    x_frac = (target[0] - (-40.0)) / (40 * 2.0)  # position of the target along +x in the base field
    assert abs(col - (1 - x_frac)) < 0.06


def test_box_outline_and_slice_choice():
    base = ov.canonical(ov.Volume(np.ones((50, 50, 20)), np.diag([1.0, 1.0, 3.0, 1.0])))
    box = [[10.0, 20.0, 30.0], [20.0, 28.0, 36.0]]
    k = ov.best_slice(base, [], [box])
    assert k == 11  # world z 33 / 3 mm
    outline = ov._box_outline(box, ov.slice_world(base, k), base)
    ij = np.argwhere(outline)
    assert ij[:, 0].min() == 10 and ij[:, 0].max() == 20 and ij[:, 1].min() == 20 and ij[:, 1].max() == 28


def test_tukey_outliers_and_strip_plot_links():
    q1, med, q3, fence = svg.tukey_outliers([1, 2, 3, 4, 5, 6, 7, 8, 100])
    assert (q1, med, q3) == (3, 5, 7) and fence == 6
    pts = [svg.Point(f"c{i}", v, f"cases/c{i}.html") for i, v in enumerate([1, 2, 3, 4, 5, 6, 7, 8, 100])]
    html, outs = svg.strip_plot(pts, "volume", "mL")
    assert [p.label for p in outs] == ["c8"] and html.count('<a href="cases/c') == 9
    assert "no values" in svg.strip_plot([], "x")[0]


def test_dag_layers_follow_edges():
    nodes = [svg.DagNode("a", "t.a", "succeeded", 1.0), svg.DagNode("b", "t.b", "failed"),
             svg.DagNode("c", "t.c", "blocked")]
    out = svg.dag(nodes, [("a", "b"), ("b", "c")])
    ya, yb, yc = (float(re.search(rf'<rect x="\d+" y="(\d+)"[^>]*><title>{n} ', out).group(1)) for n in "abc")
    assert ya < yb < yc and svg.STATUS_COLOURS["failed"] in out


def test_report_on_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(FileNotFoundError):
        build_report(tmp_path)
