"""One case's page: status and checks, overlays of every mask and box on its inputs, the workflow
DAG with node status and timings, the event timeline, the report with every number linked to its
provenance, and the raw files.

A case folder may be incomplete (a failed, halted or rejected case; a deleted file): the page
then says what is missing, it never fails.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import overlay as ov
from . import svg
from .html import badge, fmt, link, markdown, page, rel, table
from .load import CohortView

log = logging.getLogger(__name__)
MAX_FIGURES = 12


@dataclass
class Figure:
    file: Path
    caption: str
    orient: tuple[str, str] = ("R", "L")  # what the left and right edges of the picture face


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---- inputs and deliverables as volumes ---------------------------------------------------
class _Volumes:
    """Loads inputs (any layout reader) and NIfTI deliverables once per case page."""

    def __init__(self, case_dir: Path, provenance: dict[str, Any]):
        self.case_dir = case_dir
        self.inputs: dict[str, dict[str, Any]] = {}
        for d in (provenance.get("deliverables") or {}).values():
            for name, ref in (d.get("inputs") or {}).items():
                if ref and ref.get("path"):
                    self.inputs.setdefault(name, ref)
        self._cache: dict[str, ov.Volume | None] = {}
        self.problems: list[str] = []

    def input(self, name: str) -> ov.Volume | None:
        if name not in self._cache:
            self._cache[name] = self._load_input(name)
        return self._cache[name]

    def _load_input(self, name: str) -> ov.Volume | None:
        from ..contracts.case import SequenceRef
        from ..io import load_sequence

        ref = self.inputs[name]
        fmt_ = ref.get("format") or "nifti"
        if fmt_ == "nifti" and Path(ref["path"]).is_file():  # any dimensionality (cine is 4-D)
            return self.nifti(Path(ref["path"]), name)
        if "kind" not in ref:  # provenance written before inputs recorded kind/options: not re-readable exactly
            self.problems.append(f"input {name}: provenance does not record how it was read (kind/options)")
            return None
        try:
            art = load_sequence(SequenceRef(path=ref["path"], format=fmt_, kind=ref["kind"],
                                            options=ref.get("options") or {}))
        except Exception as e:  # the input may have moved since the run: say so on the page
            self.problems.append(f"input {name} ({ref['path']}) could not be read: {type(e).__name__}: {e}")
            return None
        if getattr(art, "kind", None) is not None and art.kind.value == "kspace":
            return self._zero_filled(name, art)
        return ov.Volume(np.asarray(art.data), np.asarray(art.affine), name)

    def _zero_filled(self, name: str, kspace: Any) -> ov.Volume | None:
        from ..tools.registry import call_tool

        tool = "recon.zero_filled_cine" if np.asarray(kspace.data).ndim > 4 else "recon.zero_filled"
        try:
            img = call_tool(tool, {"kspace": kspace})["image" if tool == "recon.zero_filled" else "cine"]
        except Exception as e:  # a view is best effort: any failure is listed, the page still builds
            self.problems.append(f"zero-filled view of {name} failed: {type(e).__name__}: {e}")
            return None
        return ov.Volume(np.asarray(img.data), np.asarray(img.affine), f"{name} (zero-filled)")

    def nifti(self, path: Path, name: str | None = None) -> ov.Volume | None:
        key = str(path)
        if key not in self._cache:
            try:
                import nibabel as nib

                img = nib.load(str(path))
                self._cache[key] = ov.Volume(np.asarray(img.dataobj), np.asarray(img.affine), name or path.name)
            except Exception as e:  # nibabel raises many types on a damaged file: listed, page still builds
                self.problems.append(f"{path.name} could not be read: {type(e).__name__}: {e}")
                self._cache[key] = None
        return self._cache[key]

    def matching_input(self, vol: ov.Volume, names: list[str] | None = None) -> ov.Volume | None:
        """The input on the same grid as ``vol`` (else the first 3-/4-D image input)."""
        candidates = [n for n in (names or list(self.inputs)) if n in self.inputs]
        loaded = [(n, self.input(n)) for n in candidates]
        loaded = [(n, v) for n, v in loaded if v is not None]
        for n, v in loaded:
            if v.data.shape[:3] == vol.data.shape[:3] and np.allclose(v.affine, vol.affine, atol=1e-3):
                return v
        return loaded[0][1] if loaded else None


def _is_mask(vol: ov.Volume) -> bool:
    d = np.asarray(vol.data)
    if not np.issubdtype(d.dtype, np.integer) and not np.issubdtype(d.dtype, np.bool_):
        return False
    return len(np.unique(d[:: max(1, d.shape[0] // 16)])) <= 32


# ---- figures --------------------------------------------------------------------------------
class _Figures:
    def __init__(self, vols: _Volumes, img_dir: Path, size: int = 240):
        self.vols, self.img_dir, self.size = vols, img_dir, size
        self.figures: list[Figure] = []

    def add(self, base: ov.Volume, k: int | list[int], caption: str, masks=(), boxes=(), window=None,
            axis: int = 2) -> None:
        """One figure: slice ``k``, or a strip of slices when ``k`` is a list."""
        if len(self.figures) >= MAX_FIGURES:
            return
        try:
            img = (ov.render_strip(base, k, masks, boxes, self.size, window, axis) if isinstance(k, list)
                   else ov.render_slice(base, k, masks, boxes, self.size, window, axis))
        except Exception as e:  # one bad overlay must not cost the page
            self.vols.problems.append(f"overlay '{caption}' failed: {type(e).__name__}: {e}")
            return
        path = ov.save_png(img, self.img_dir / f"fig{len(self.figures):02d}.png")
        self.figures.append(Figure(path, caption, ("A", "P") if axis == 0 else ("R", "L")))

    def _show(self, base: ov.Volume, caption: str, masks=(), boxes=(), window=None) -> None:
        """``base`` (3-D, any orientation) on its acquisition plane: a strip of slices through the
        masks (every slice a box touches, when there are boxes)."""
        b = ov.canonical(base)
        axis = ov.slice_axis(b)
        ks = ov.strip_slices(b, masks, boxes, axis)
        where = f"slice {ks[0] + 1}" if len(ks) == 1 else f"slices {', '.join(str(k + 1) for k in ks)}"
        self.add(b, ks, f"{caption} ({where} of {b.data.shape[axis]})", masks, boxes, window, axis)

    def mask(self, name: str, mask: ov.Volume, chain_inputs: list[str], frames: dict[str, int]) -> None:
        base = self.vols.matching_input(mask, chain_inputs)
        if base is None:
            base = ov.Volume(np.asarray(mask.data > 0, np.float32), mask.affine, "mask only")
        if mask.data.ndim == 4 and base.data.ndim == 4:
            window = ov._window(base.data)
            for phase, t in (frames or {"frame 0": 0}).items():
                self._show(base.frame(t), f"{name} on {base.name}, {phase} (frame {t})", [mask.frame(t)],
                           window=window)
            return
        self._show(base.frame(frames.get("ED")), f"{name} on {base.name}", [mask.frame(frames.get("ED"))])

    def findings(self, name: str, items: list[dict[str, Any]], chain_inputs: list[str], masks: list[ov.Volume]) -> None:
        names = sorted(chain_inputs, key=lambda n: (n.upper() not in ("T2W", "T2", "T1C", "T1"), n))
        base = next((v for v in (self.vols.input(n) for n in names if n in self.vols.inputs) if v is not None), None)
        boxes = [it["box_world"] for it in items if it.get("box_world")]
        if base is None or not boxes:
            return
        b = base.frame(None)
        self._show(b, f"{name}: {len(boxes)} box(es) on {base.name}", masks, boxes)
        for it in items[:3] if len(boxes) > 1 else []:
            if it.get("box_world"):
                self._show(b, f"{it.get('id', 'lesion')} ({it.get('side', '?')}, {it.get('zone', '')})", masks,
                           [it["box_world"]])

    def image(self, name: str, out: ov.Volume, chain_inputs: list[str]) -> None:
        o = ov.canonical(out.frame(None))
        axis = ov.slice_axis(o)
        k = o.data.shape[axis] // 2
        world = ov.slice_world(o, k, axis)
        for n in chain_inputs[:3]:
            src = self.vols.input(n) if n in self.vols.inputs else None
            if src is None:
                continue
            s = src.frame(None)
            proxy = ov.Volume(np.expand_dims(ov.sample_nearest(s, world), axis), _slice_affine(o.affine, k, axis),
                              s.name)
            self.add(proxy, 0, f"input {s.name} (same world slice)", window=ov._window(s.data), axis=axis)
        self.add(o, k, f"{name} (deliverable)", axis=axis)


def _slice_affine(affine: np.ndarray, k: int, axis: int = 2) -> np.ndarray:
    """The affine of a one-slice volume holding slice ``k`` along ``axis``."""
    a = np.asarray(affine, np.float64).copy()
    shift = np.zeros(3)
    shift[axis] = float(k)
    a[:3, 3] = a[:3, :3] @ shift + a[:3, 3]
    return a


def _frames(case_dir: Path, provenance: dict[str, Any]) -> dict[str, int]:
    """ED/ES frames of a cardiac case, from its phases deliverable (empty otherwise)."""
    for name, d in (provenance.get("deliverables") or {}).items():
        for f in d.get("files", {}):
            if f.endswith(".json"):
                data = _json(case_dir / f) or {}
                rows = data.get("rows") if isinstance(data, dict) else None
                if rows and isinstance(rows[0], dict) and "ed_frame" in rows[0] and "es_frame" in rows[0]:
                    return {"ED": int(rows[0]["ed_frame"]), "ES": int(rows[0]["es_frame"])}
    return {}


def build_figures(case_dir: Path, provenance: dict[str, Any], img_dir: Path) -> tuple[list[Figure], list[str]]:
    """Thumbnails for every mask, findings and image deliverable of the case."""
    vols = _Volumes(case_dir, provenance)
    figs = _Figures(vols, img_dir)
    frames = _frames(case_dir, provenance)
    delivs = provenance.get("deliverables") or {}
    masks: list[ov.Volume] = []
    findings: list[tuple[str, list, list[str]]] = []
    for name, d in delivs.items():
        chain_inputs = list((d.get("inputs") or {}).keys())
        for f in d.get("files", {}):
            path = case_dir / f
            if not path.exists():
                continue
            if f.endswith((".nii", ".nii.gz")):
                vol = vols.nifti(path)
                if vol is None:
                    continue
                if _is_mask(vol):
                    masks.append(vol)
                    figs.mask(name, vol, chain_inputs, frames)
                else:
                    figs.image(name, vol, chain_inputs)
            elif f.endswith(".json"):
                data = _json(path)
                if isinstance(data, dict) and data.get("kind") == "findings":
                    findings.append((name, data.get("items") or [], chain_inputs))
    for name, items, chain_inputs in findings:
        figs.findings(name, items, chain_inputs, [m for m in masks if m.data.ndim == 3])
    return figs.figures, vols.problems


# ---- sections ---------------------------------------------------------------------------------
def _node_status(events: list[dict[str, Any]]) -> tuple[dict[str, str], dict[str, float]]:
    status: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for e in events:
        node, kind = e.get("node"), e.get("kind")
        if not node:
            continue
        if kind in ("started", "succeeded", "failed", "blocked", "skipped", "cache_hit"):
            status[node] = {"started": "running", "cache_hit": "cached"}.get(kind, kind)
        if kind == "succeeded" and e.get("duration_s") is not None:
            seconds[node] = float(e["duration_s"])
    return status, seconds


def _timeline(events: list[dict[str, Any]]) -> str:
    if not events:
        return '<p class="muted">no events.jsonl: the case never started</p>'
    t0 = min(float(e.get("time") or 0) for e in events)
    rows = []
    for e in events:
        kind = e.get("kind", "")
        cls = {"failed": "bad", "repaired": "bad", "fallback": "bad", "succeeded": "ok"}.get(kind, "")
        detail = " ".join(str(x) for x in (e.get("error_code"), e.get("message")) if x)
        if e.get("patch"):
            detail += " patch: " + json.dumps(e["patch"], default=str)[:300]
        rows.append([f"{float(e.get('time') or 0) - t0:.3f}", f'<span class="{cls}">{escape(kind)}</span>',
                     e.get("node") or "", e.get("tool") or "", e.get("attempt") or "",
                     "" if e.get("duration_s") is None else f"{float(e['duration_s']):.3f}", e.get("worker") or "",
                     detail[:400]])
    return table(["t+s", "kind", "node", "tool", "attempt", "duration s", "worker", "detail"], rows,
                 raw_cols=(1,), num_cols=(0, 5))


def _provenance(provenance: dict[str, Any], workflow: dict[str, Any] | None) -> str:
    nodes: dict[str, dict[str, Any]] = {}
    for d in (provenance.get("deliverables") or {}).values():
        for rec in d.get("chain", []):
            nodes.setdefault(rec.get("node"), rec)
    for n in (workflow or {}).get("nodes", []):
        nodes.setdefault(n["id"], {"node": n["id"], "tool": n["tool"], "version": n.get("version"),
                                   "params": n.get("params"), "inputs": n.get("inputs"), "status": "not in provenance"})
    if not nodes:
        return '<p class="muted">no provenance.json</p>'
    out = []
    for nid, rec in nodes.items():
        params = ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in (rec.get("params") or {}).items())
        ins = "<br>".join(f"{escape(p)} = {escape(str(t))}"
                          + (f' <code class="muted">{escape(str((rec.get("input_digests") or {}).get(p) or "")[:16])}</code>'
                             if (rec.get("input_digests") or {}).get(p) else "")
                          for p, t in (rec.get("inputs") or {}).items())
        outs = "<br>".join(f"{escape(f)} <code class='muted'>{escape(str(dg)[:16])}</code>"
                           for f, dg in (rec.get("output_digests") or {}).items())
        out.append(f'<tr id="node-{escape(str(nid))}"><td><b>{escape(str(nid))}</b></td><td>{escape(str(rec.get("tool")))}'
                   f' v{escape(str(rec.get("version")))}</td><td>{escape(params)}</td><td>{ins}</td><td>{outs}</td>'
                   f'<td>{escape(str(rec.get("device", "")))} {escape(str(rec.get("worker", "")))}<br>'
                   f'{escape(fmt(rec.get("duration_s")))} s, attempt {escape(str(rec.get("attempt", "")))}'
                   f'{"<br>cache hit" if rec.get("cache_hit") else ""}{escape(str(rec.get("status", "")))}</td></tr>')
    return ("<table><thead><tr><th>node</th><th>tool</th><th>params</th><th>inputs (digest)</th>"
            "<th>outputs (digest)</th><th>where</th></tr></thead><tbody>" + "".join(out) + "</tbody></table>")


def _methods(provenance: dict[str, Any]) -> str:
    """Each node's method (its card in provenance.json) and flags: a low-confidence segmentation
    or an ED/ES near tie in red, with the research-use line when a default method ran."""
    from ..tools.methods import MethodCard
    from ..tools.report.header import DISCLAIMER

    nodes: dict[str, dict[str, Any]] = {}
    for d in (provenance.get("deliverables") or {}).values():
        for rec in d.get("chain", []):
            nodes.setdefault(rec.get("node"), rec)
    rows, disclaim = [], False
    for nid, rec in nodes.items():
        try:
            card = MethodCard(**rec["method"]) if isinstance(rec.get("method"), dict) else None
        except ValueError:  # a card written by another bcer version: shown raw
            card = None
        disclaim = disclaim or bool(card and card.needs_disclaimer())
        flags = []
        for name, f in (rec.get("flags") or {}).items():
            if isinstance(f, dict):
                cls = "bad" if f.get("flagged") else "ok"
                word = name.replace("_", " ") if f.get("flagged") else f"not {name.replace('_', ' ')}"
                flags.append(f'<span class="{cls}">{escape(word)}</span>: {escape(str(f.get("detail", "")))}')
        rows.append([f'<a href="#node-{escape(str(nid))}">{escape(str(nid))}</a>',
                     f'{rec.get("tool")} v{rec.get("version")}',
                     card.line() if card else json.dumps(rec.get("method"), default=str) if rec.get("method") else "",
                     "<br>".join(flags)])
    if not rows:
        return '<p class="muted">no provenance.json</p>'
    head = f'<p class="bad"><b>{escape(DISCLAIMER)}</b></p>' if disclaim else ""
    return head + table(["node", "tool", "method", "flags"], rows, raw_cols=(0, 3))


def _checks(row: dict[str, Any]) -> str:
    checks = row.get("plausibility") or []
    if not isinstance(checks, list) or not checks:
        return '<p class="muted">no plausibility checks recorded for this case</p>'
    rows = [[c.get("check"), c.get("deliverable"), '<span class="ok">ok</span>' if c.get("ok") else
             '<span class="bad">FAILED</span>', fmt(c.get("value")), fmt(c.get("limit")), c.get("message")]
            for c in checks if isinstance(c, dict)]
    return table(["check", "deliverable", "result", "value", "limit", "message"], rows, raw_cols=(2,))


def _files(case_dir: Path, page_path: Path) -> str:
    files = sorted(p for p in case_dir.rglob("*") if p.is_file()) if case_dir.is_dir() else []
    if not files:
        return '<p class="muted">the case folder is empty or missing</p>'
    rows = [[link(rel(p, page_path), str(p.relative_to(case_dir))), p.stat().st_size] for p in files]
    return table(["file", "bytes"], rows, raw_cols=(0,), num_cols=(1,))


def _report(case_dir: Path, provenance: dict[str, Any]) -> str:
    md = next((case_dir / f for d in (provenance.get("deliverables") or {}).values()
               for f in d.get("files", {}) if f.endswith(".md")), None)
    if md is None:
        md = next(iter(sorted(case_dir.glob("*.md"))), None)
    if md is None or not md.exists():
        return ""
    return ('<h2 id="report">Report</h2><p class="muted">every number has a footnote that links to the node that '
            'produced it (its row in the provenance table below)</p><div class="report-body">'
            + markdown(md.read_text(encoding="utf-8", errors="replace"), lambda node: f"#node-{node}") + "</div>")


def _deliverables(row: dict[str, Any], cv: CohortView, contract_names: list[str], case_dir: Path,
                  page_path: Path) -> str:
    written = row.get("deliverables") or {}
    if not isinstance(written, dict):
        written = {}
    names = list(dict.fromkeys([*contract_names, *written]))
    if not names:
        return '<p class="muted">no deliverables</p>'
    rows = []
    for n in names:
        relpath = written.get(n)
        p = (cv.root / relpath) if relpath and not Path(relpath).is_absolute() else Path(relpath) if relpath else None
        if p is not None and not p.exists() and relpath:
            p = cv.root.parent / relpath
        if p is not None and p.exists():
            rows.append([n, link(rel(p, page_path), p.name), '<span class="ok">written</span>'])
        else:
            rows.append([n, "", '<span class="bad">missing</span>'])
    return table(["deliverable", "file", "state"], rows, raw_cols=(1, 2))


def build_case_page(cv: CohortView, row: dict[str, Any], report_dir: Path, page_path: Path,
                    cohort_href: str, contract_names: list[str] | None = None) -> Path:
    """Write one case's page at ``page_path`` (thumbnails under ``report_dir/img``)."""
    case = str(row.get("case"))
    case_dir = cv.root / case
    provenance = _json(case_dir / "provenance.json") or {}
    # workflow.json with the full audit (or a case that did not succeed), else the DAG in provenance
    workflow = _json(case_dir / "workflow.json") or provenance.get("dag")
    events = cv.case_events(case)
    img_dir = report_dir / "img" / cv.name / case
    try:
        figures, problems = build_figures(case_dir, provenance, img_dir) if provenance else ([], [])
    except Exception as e:  # the page still shows everything else
        log.exception("figures of %s failed", case)
        figures, problems = [], [f"figures failed: {type(e).__name__}: {e}"]
    status, seconds = _node_status(events)
    body = [f'<p>{badge(str(row.get("status")))} task <b>{escape(cv.name)}</b> · SR (delivered) '
            f'{fmt(row.get("sr_delivered"))} · SR (plausible) {fmt(row.get("sr"))} · TCR {fmt(row.get("tcr"))} · '
            f'{fmt(row.get("duration_s"))} s · repairs {fmt(row.get("repairs"))}'
            + (" · resumed" if row.get("resumed") else "") + "</p>"]
    if row.get("error_code") or row.get("error_message"):
        body.append(f'<p class="bad">{escape(str(row.get("error_code") or ""))}: '
                    f'{escape(str(row.get("error_message") or ""))}'
                    + (f' (node {escape(str(row.get("error_node")))})' if row.get("error_node") else "") + "</p>")
    body.append('<nav class="toc"><a href="#methods">methods</a><a href="#checks">checks</a><a href="#figures">images</a><a href="#dag">workflow</a>'
                '<a href="#events">events</a><a href="#report">report</a><a href="#provenance">provenance</a>'
                '<a href="#files">files</a></nav>')
    body.append('<h2>Deliverables</h2>' + _deliverables(row, cv, contract_names or [], case_dir, page_path))
    body.append('<h2 id="methods">Methods and flags</h2>' + _methods(provenance))
    body.append('<h2 id="checks">Plausibility checks</h2>' + _checks(row))
    body.append('<h2 id="figures">Images</h2><p class="muted">slices in each volume\'s acquisition plane, '
                'radiological convention (patient right on the viewer\'s left; edge labels say which way the picture '
                'faces); masks filled and outlined, lesion boxes in yellow</p>')
    if figures:
        body.append('<div class="grid">' + "".join(
            f'<figure class="fig"><img src="{escape(rel(f.file, page_path))}" alt="{escape(f.caption)}">'
            f'<div class="orient"><span>{f.orient[0]}</span><span>{f.orient[1]}</span></div><figcaption>{escape(f.caption)}</figcaption></figure>'
            for f in figures) + "</div>")
    else:
        body.append('<p class="muted">no image deliverables to show</p>')
    for p in problems:
        body.append(f'<p class="bad">{escape(p)}</p>')
    if workflow:
        nodes = [svg.DagNode(n["id"], n["tool"], status.get(n["id"], "pending"), seconds.get(n["id"]),
                             f"#node-{n['id']}") for n in workflow.get("nodes", [])]
        body.append('<h2 id="dag">Workflow</h2>' + svg.dag(nodes, [tuple(e) for e in workflow.get("edges", [])]))
    else:
        body.append('<h2 id="dag">Workflow</h2><p class="muted">no workflow.json (the case was not compiled)</p>')
    body.append('<h2 id="events">Event timeline</h2>' + _timeline(events))
    body.append(_report(case_dir, provenance) or '<h2 id="report">Report</h2><p class="muted">no report deliverable</p>')
    body.append('<h2 id="provenance">Provenance</h2>' + _provenance(provenance, workflow))
    body.append('<h2 id="files">Raw files</h2>' + _files(case_dir, page_path))
    css = rel(report_dir / "style.css", page_path)
    html = page(f"{case} · {cv.name}", "".join(body), css_href=css,
                subtitle=f'<a href="{escape(cohort_href)}">← cohort {escape(cv.name)}</a>')
    page_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = page_path.with_name(page_path.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(page_path)
    return page_path


__all__ = ["Figure", "build_case_page", "build_figures"]
