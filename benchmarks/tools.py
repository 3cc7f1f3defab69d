"""Tool benchmark: wall time of every registered tool on phantom inputs, plus classifier accuracy.

    python benchmarks/tools.py [--size full|small] [--timeout 240] [--repeats 1]
                               [--tools name,...] [--accuracy | --accuracy-only]
                               [--out benchmarks/results/tools.json]

Inputs come from the phantom generators (``--size full`` by default) or from other tools run
on them (e.g. ``classify.cardiac_acdc`` gets ``quant.cardiac_function`` of the ground-truth
labels); building them is not timed. Each tool then runs in a forked child process (inputs
shared copy-on-write) with a wall-clock limit; a tool that does not finish at full size
within ``--timeout`` seconds is recorded as such and timed again at ``small``, the largest
size that fits on a small shared machine. Tools without an input recipe here are listed as
skipped. ``--accuracy`` adds classifier accuracy on small phantoms: ACDC over 50 cases (10
per group) from ground-truth and ``seg.cardiac`` labels; prostate lesion detection/PI-RADS over
10 misaligned cases with the true and the ``register.rigid`` transform; glioma grade over 20
cases from ground-truth and ``seg.brain_tumor`` labels.
"""
from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import platform
import sys
import time
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bcer.contracts.artifacts import Transform  # noqa: E402
from bcer.metrics import box_iou  # noqa: E402
from bcer.tools.registry import call_tool, list_tools  # noqa: E402

log = logging.getLogger("benchmarks.tools")
Recipe = Callable[["Inputs"], tuple[dict[str, Any], dict[str, Any]]]


class Inputs:
    """Phantoms and upstream tool outputs of one size, built once and shared by the recipes."""

    def __init__(self, size: str, seed: int = 7):
        self.size, self.seed = size, seed
        self.build_s: dict[str, float] = {}

    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.build_s[name] = round(time.perf_counter() - t0, 3)
        return out

    @cached_property
    def brain(self):
        from bcer.datasets.brain import make_brain
        return self._timed("brain", lambda: make_brain("bench_b", self.seed, self.size, grade="HGG", noise=0.03,
                                                       bias=0.3))

    @cached_property
    def cardiac(self):
        from bcer.datasets.cardiac import make_cardiac
        return self._timed("cardiac", lambda: make_cardiac("bench_c", self.seed, self.size, group="MINF"))

    @cached_property
    def prostate(self):
        from bcer.datasets.prostate import make_prostate
        return self._timed("prostate", lambda: make_prostate("bench_p", self.seed, self.size, n_lesions=2))

    @cached_property
    def kspace3d(self):
        from bcer.datasets.kspace import make_kspace_case
        return self._timed("kspace3d", lambda: make_kspace_case("bench_k", self.seed, self.size, "cardiac", R=4,
                                                                frames="ed"))

    @cached_property
    def kspace_cine(self):
        from bcer.datasets.kspace import make_kspace_case
        return self._timed("kspace_cine", lambda: make_kspace_case("bench_kc", self.seed, self.size, "cardiac", R=4))

    @property
    def prostate_tx(self) -> Transform:
        return Transform(np.array(self.prostate.truth["misalignment"]["matrix"]), "rigid")

    @cached_property
    def function(self):
        ph = self.cardiac
        return call_tool("quant.cardiac_function", {"labels": ph.labels["seg"]},
                         {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]

    @cached_property
    def findings(self):
        ph = self.prostate
        return call_tool("detect.prostate_lesions", {
            "adc": ph.sequences["ADC"], "dwi": ph.sequences["DWI"], "gland": ph.labels["gland"],
            "zones": ph.labels["zones"], "t2w": ph.sequences["T2w"], "transform": self.prostate_tx})["findings"]

    @cached_property
    def brain_features(self):
        return call_tool("quant.roi_features", {"image": self.brain.sequences["T1c"],
                                                "mask": self.brain.labels["seg"]})["features"]


def _brain4(i: Inputs) -> dict[str, Any]:
    s = i.brain.sequences
    return {"t1": s["T1"], "t1c": s["T1c"], "t2": s["T2"], "flair": s["FLAIR"]}


RECIPES: dict[str, Recipe] = {
    "recon.zero_filled": lambda i: ({"kspace": i.kspace3d.sequences["KSPACE"]}, {}),
    "recon.grappa": lambda i: ({"kspace": i.kspace3d.sequences["KSPACE"]}, {}),
    "recon.sense": lambda i: ({"kspace": i.kspace3d.sequences["KSPACE"]}, {}),
    "recon.zero_filled_cine": lambda i: ({"kspace": i.kspace_cine.sequences["KSPACE"]}, {}),
    "recon.grappa_cine": lambda i: ({"kspace": i.kspace_cine.sequences["KSPACE"]}, {}),
    "recon.sense_cine": lambda i: ({"kspace": i.kspace_cine.sequences["KSPACE"]}, {}),
    "bias.n4": lambda i: ({"image": i.brain.sequences["T1"], "mask": i.brain.labels["brain"]}, {}),
    "denoise.nlm": lambda i: ({"image": i.brain.sequences["T1"]}, {}),
    "resample.to_spacing": lambda i: ({"image": i.prostate.sequences["T2w"]}, {"spacing": (1.0, 1.0, 1.0)}),
    "resample.to_grid": lambda i: ({"image": i.prostate.sequences["ADC"], "reference": i.prostate.sequences["T2w"]}, {}),
    "register.rigid": lambda i: ({"fixed": i.prostate.sequences["T2w"], "moving": i.prostate.sequences["ADC"]}, {}),
    "register.affine": lambda i: ({"fixed": i.prostate.sequences["T2w"], "moving": i.prostate.sequences["ADC"]}, {}),
    "register.apply": lambda i: ({"moving": i.prostate.sequences["ADC"], "transform": i.prostate_tx,
                                  "fixed": i.prostate.sequences["T2w"]}, {}),
    "register.apply_mask": lambda i: ({"mask": i.prostate.labels["gland_adc"], "transform": i.prostate_tx,
                                       "fixed": i.prostate.sequences["T2w"]}, {}),
    "seg.brain_tumor": lambda i: (_brain4(i), {}),
    "seg.cardiac": lambda i: ({"cine": i.cardiac.sequences["CINE"]}, {}),
    "seg.prostate": lambda i: ({"t2w": i.prostate.sequences["T2w"]}, {}),
    "cardiac.ed_es": lambda i: ({"labels": i.cardiac.labels["seg"], "cine": i.cardiac.sequences["CINE"]}, {}),
    "quant.cardiac_function": lambda i: ({"labels": i.cardiac.labels["seg"]},
                                         {"height_cm": i.cardiac.metadata["height"],
                                          "weight_kg": i.cardiac.metadata["weight"]}),
    "quant.roi_stats": lambda i: ({"image": i.brain.sequences["T1c"], "mask": i.brain.labels["seg"]}, {}),
    "quant.roi_features": lambda i: ({"image": i.brain.sequences["T1c"], "mask": i.brain.labels["seg"]},
                                     {"composites": {"WT": [1, 2, 4], "TC": [1, 4]}}),
    "detect.prostate_lesions": lambda i: ({"adc": i.prostate.sequences["ADC"], "dwi": i.prostate.sequences["DWI"],
                                           "gland": i.prostate.labels["gland"], "zones": i.prostate.labels["zones"],
                                           "t2w": i.prostate.sequences["T2w"], "transform": i.prostate_tx}, {}),
    "classify.cardiac_acdc": lambda i: ({"function": i.function}, {}),
    "classify.glioma_grade": lambda i: ({"features": i.brain_features}, {}),
    "classify.pirads": lambda i: ({"findings": i.findings}, {}),
    "report.structured": lambda i: ({"measurements": i.function,
                                     "classification": call_tool("classify.cardiac_acdc",
                                                                 {"function": i.function})["classification"]}, {}),
}


def _describe(value: Any) -> Any:
    data = getattr(value, "data", None)
    if isinstance(data, np.ndarray):
        return list(data.shape)
    if hasattr(value, "rows"):
        return f"{len(value.rows)} rows"
    if hasattr(value, "items") and isinstance(getattr(value, "items"), list):
        return f"{len(value.items)} findings"
    return type(value).__name__


def _child(name: str, inputs: dict[str, Any], params: dict[str, Any], repeats: int, q: mp.Queue) -> None:
    try:
        times, out = [], {}
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = call_tool(name, inputs, params)
            times.append(time.perf_counter() - t0)
        q.put({"status": "ok", "seconds": min(times), "seconds_all": [round(t, 4) for t in times],
               "outputs": {k: _describe(v) for k, v in out.items()}})
    except Exception as e:  # reported in the JSON; the benchmark goes on with the next tool
        q.put({"status": "error", "error": f"{type(e).__name__}: {e}"[:500]})


def _run_limited(name: str, inputs: dict[str, Any], params: dict[str, Any], repeats: int,
                 timeout: float) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, inputs, params, repeats, q), daemon=True)
    proc.start()
    t0 = time.perf_counter()
    try:
        res = q.get(timeout=timeout)
    except Exception:
        res = {"status": "timeout", "error": f"no result within {timeout:.0f} s"}
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()  # only the child this benchmark started
        proc.join()
    res["wall_s"] = round(time.perf_counter() - t0, 3)
    return res


def bench_tool(name: str, sizes: list[str], pools: dict[str, Inputs], repeats: int, timeout: float) -> dict[str, Any]:
    recipe = RECIPES.get(name)
    if recipe is None:
        return {"tool": name, "status": "skipped", "note": "no input recipe in benchmarks/tools.py"}
    attempts = []
    for size in sizes:
        try:
            inputs, params = recipe(pools[size])
        except Exception as e:
            attempts.append({"size": size, "status": "error", "error": f"building inputs: {type(e).__name__}: {e}"[:500]})
            continue
        res = _run_limited(name, inputs, params, repeats, timeout)
        res.update(size=size, inputs={k: _describe(v) for k, v in inputs.items()})
        attempts.append(res)
        log.info("%-26s %-5s %-7s %s", name, size, res["status"], res.get("seconds", res.get("error", "")))
        if res["status"] == "ok":
            break
    best = attempts[-1]
    row = {"tool": name, **best}
    if len(attempts) > 1:
        row["note"] = f"at {attempts[0]['size']}: {attempts[0]['status']} ({attempts[0].get('error', '')})"
    return row


def acdc_accuracy(n_per_group: int = 10, with_seg: bool = True) -> dict[str, Any]:
    """classify.cardiac_acdc accuracy over small phantoms, from truth labels and seg.cardiac."""
    from bcer.datasets.cardiac import GROUPS, make_cardiac

    out: dict[str, Any] = {"n": n_per_group * len(GROUPS), "size": "small"}
    sources = ["truth", "seg.cardiac"] if with_seg else ["truth"]
    for src in sources:
        correct, confusion, t0 = 0, {}, time.perf_counter()
        for g in GROUPS:
            for s in range(n_per_group):
                ph = make_cardiac(f"acc{s}", 1000 + s, "small", group=g)
                labels = ph.labels["seg"] if src == "truth" else call_tool(
                    "seg.cardiac", {"cine": ph.sequences["CINE"]})["labels"]
                fn = call_tool("quant.cardiac_function", {"labels": labels},
                               {"height_cm": ph.metadata["height"], "weight_kg": ph.metadata["weight"]})["function"]
                label = call_tool("classify.cardiac_acdc", {"function": fn})["classification"].label
                correct += label == g
                confusion[f"{g}->{label}"] = confusion.get(f"{g}->{label}", 0) + 1
        out[src] = {"accuracy": correct / out["n"], "confusion": confusion,
                    "seconds": round(time.perf_counter() - t0, 1)}
        log.info("ACDC accuracy from %s labels: %.3f", src, correct / out["n"])
    return out


def prostate_accuracy(n: int = 10) -> dict[str, Any]:
    """Lesion detection (box IoU >= 0.5 and side), false candidates and PI-RADS accuracy over
    small misaligned prostate phantoms, with the true transform and with ``register.rigid``'s."""
    from bcer.datasets.prostate import make_prostate

    out: dict[str, Any] = {"n_cases": n, "size": "small"}
    for src in ("truth_transform", "register.rigid"):
        found_ok, cat_ok, lesions, max_false, t0 = 0, 0, 0, 0, time.perf_counter()
        for s in range(n):
            ph = make_prostate(f"acc{s}", 2000 + s, "small", misalign=True)
            seq = ph.sequences
            tx = (Transform(np.array(ph.truth["misalignment"]["matrix"])) if src == "truth_transform" else
                  call_tool("register.rigid", {"fixed": seq["T2w"], "moving": seq["ADC"]})["transform"])
            f = call_tool("detect.prostate_lesions", {"adc": seq["ADC"], "dwi": seq["DWI"], "gland": ph.labels["gland"],
                                                      "zones": ph.labels["zones"], "t2w": seq["T2w"],
                                                      "transform": tx})["findings"]
            c = call_tool("classify.pirads", {"findings": f})["classification"]
            used = set()
            for les in ph.truth["lesions"]:
                lesions += 1
                best = max(f.items, key=lambda it: box_iou(it.box_voxel, les["box_voxel"]), default=None)
                if best is not None and box_iou(best.box_voxel, les["box_voxel"]) >= 0.5:
                    used.add(best.id)
                    found_ok += best.side == les["side"]
                    cat_ok += int(c.scores[best.id]) == les["category"]
            max_false = max(max_false, len(f.items) - len(used))
        out[src] = {"lesions": lesions, "found_iou50_right_side": found_ok / max(lesions, 1),
                    "pirads_accuracy": cat_ok / max(lesions, 1), "max_false_candidates_per_case": max_false,
                    "seconds": round(time.perf_counter() - t0, 1)}
        log.info("prostate (%s): %s", src, out[src])
    return out


def glioma_accuracy(n_per_grade: int = 10) -> dict[str, Any]:
    """classify.glioma_grade accuracy from truth labels and from seg.brain_tumor labels."""
    from bcer.datasets.brain import make_brain

    res: dict[str, list[bool]] = {"truth": [], "seg.brain_tumor": []}
    for s in range(n_per_grade):
        for grade in ("HGG", "LGG"):
            ph = make_brain(f"acc{s}", 3000 + s, "small", grade=grade)
            seg = call_tool("seg.brain_tumor", {"t1": ph.sequences["T1"], "t1c": ph.sequences["T1c"],
                                                "t2": ph.sequences["T2"], "flair": ph.sequences["FLAIR"]})["labels"]
            for src, labels in (("truth", ph.labels["seg"]), ("seg.brain_tumor", seg)):
                feats = call_tool("quant.roi_features", {"image": ph.sequences["T1c"], "mask": labels})["features"]
                res[src].append(call_tool("classify.glioma_grade", {"features": feats})["classification"].label == grade)
    return {"n": 2 * n_per_grade, "size": "small", **{k: float(np.mean(v)) for k, v in res.items()}}


def _accuracy() -> dict[str, Any]:
    return {"acdc_accuracy": acdc_accuracy(), "prostate_accuracy": prostate_accuracy(),
            "glioma_accuracy": glioma_accuracy()}


def _merge(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """A run of some tools (``--tools``) updates their rows in an existing result file."""
    if not path.exists():
        return doc
    old = json.loads(path.read_text())
    fresh = {r["tool"]: dict(r, run=doc["machine"]) for r in doc["tools"]}
    old["tools"] = [fresh.pop(r["tool"], r) for r in old.get("tools", [])] + list(fresh.values())
    return old


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="full", choices=["full", "small"])
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per tool and size")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--tools", default="", help="comma-separated tool names (default: every registered tool; "
                                                 "a subset updates its rows in --out)")
    ap.add_argument("--accuracy", action="store_true", help="add the classifier accuracy sections")
    ap.add_argument("--accuracy-only", action="store_true",
                    help="recompute only the accuracy sections of an existing --out file")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "tools.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    if args.accuracy_only:
        doc = json.loads(path.read_text()) if path.exists() else {"benchmark": "tools"}
        doc.update(_accuracy())
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return
    names = [s.name for s in list_tools()]
    if args.tools:
        names = [n for n in names if n in set(args.tools.split(","))]
    sizes = [args.size] + (["small"] if args.size != "small" else [])
    pools = {s: Inputs(s) for s in sizes}
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    rows = [bench_tool(n, sizes, pools, args.repeats, args.timeout) for n in names]
    doc = {"benchmark": "tools", "requested_size": args.size, "timeout_s": args.timeout, "repeats": args.repeats,
           "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                       "load_average_at_start": [round(x, 2) for x in load0],
                       "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
           "phantom_build_s": {s: p.build_s for s, p in pools.items()}, "tools": rows,
           "total_s": round(time.perf_counter() - t0, 1)}
    if args.tools:
        doc = _merge(path, doc)
    if args.accuracy:
        doc.update(_accuracy())
    path.write_text(json.dumps(doc, indent=2) + "\n")
    log.info("wrote %s (%.0f s)", path, time.perf_counter() - t0)


if __name__ == "__main__":
    main()
