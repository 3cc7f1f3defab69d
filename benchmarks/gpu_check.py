"""One-command check of every GPU path: ``python benchmarks/gpu_check.py``.

Discovers the tools registered with ``gpu="optional"``/``"required"``, builds small phantom
inputs for each from ``EXAMPLES`` (tool name -> factory), runs the tool on ``device="cpu"``
and ``device="cuda"`` and reports, as JSON on stdout (and in ``--out``), per tool: the
maximum relative error of every output array, ``max|gpu - cpu| / max|cpu|`` (relative to
the output's dynamic range, so near-zero voxels do not blow it up; label maps report the
fraction of differing voxels), the tool's tolerance, CPU and GPU seconds (best of
``--repeat`` after one warm-up call) and the speed-up.

Without a GPU it prints ``{"gpu": false, ...}`` with the reason and exits 0. ``--cpu-only``
runs the CPU path twice instead (checks the factories and the comparison here). Exit
status 1 when a tool errors, has no example factory, or exceeds its tolerance on a GPU.

To cover a new GPU tool, add ``"<tool name>": Example(factory, tolerance)`` to ``EXAMPLES``;
the factory returns ``(inputs by port name, params dict)`` built from small phantoms.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.contracts.artifacts import KSpace, Mask, Transform  # noqa: E402
from bcer.optional import cuda_available, optional_import  # noqa: E402
from bcer.tools import call_tool, get_tool, list_tools  # noqa: E402

log = logging.getLogger("benchmarks.gpu_check")
BUNDLES = Path(__file__).resolve().parents[1] / "bcer" / "assets" / "bundles"


@dataclass(frozen=True)
class Example:
    factory: Callable[[str], tuple[dict[str, Any], dict[str, Any]]]  # phantom size -> (inputs, params)
    tolerance: float = 1e-4  # float32 default (issue 4); iterative solvers get their own


@lru_cache(maxsize=None)
def _kspace(cine: bool, size: str) -> Any:
    from bcer.datasets.kspace import make_kspace_case

    case = make_kspace_case("gpu-k", 0, size, domain="cardiac", R=4, frames="all" if cine else "ed")
    ks = case.sequences["KSPACE"]
    if cine:  # four frames are enough to compare the paths and keep the CPU side short
        ks = KSpace(np.ascontiguousarray(ks.data[..., :4]), ks.mask, ks.affine, dict(ks.meta))
    return ks


@lru_cache(maxsize=None)
def _brain(size: str) -> Any:
    from bcer.datasets.brain import make_brain

    return make_brain("gpu-b", 0, size)


def _recon(cine: bool) -> Callable[[str], tuple[dict[str, Any], dict[str, Any]]]:
    return lambda size: ({"kspace": _kspace(cine, size)}, {})


def _cardiac_seg(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from bcer.datasets.cardiac import make_cardiac

    bundle = BUNDLES / "cardiac_unet2d"
    params = {"bundle_dir": str(bundle)} if bundle.is_dir() else {}
    return {"cine": make_cardiac("gpu-c", 0, size).sequences["CINE"]}, params


def _prostate_seg(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from bcer.datasets.prostate import make_prostate

    return {"t2w": make_prostate("gpu-p", 0, size).sequences["T2w"]}, {}


def _brain_seg(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    seqs = _brain(size).sequences
    return {"t1": seqs["T1"], "t1c": seqs["T1c"], "t2": seqs["T2"], "flair": seqs["FLAIR"]}, {}


def _denoise(size: str) -> tuple[dict[str, Any], dict[str, Any]]:
    # a prostate T2w rather than a brain: the brain phantoms need nilearn's MNI152 templates,
    # which a bare GPU image lacks (the tool is the same whatever the anatomy)
    from bcer.datasets.degraded import make_denoise_case

    return {"image": make_denoise_case("gpu-dn", 0, size, domain="prostate").sequences["T2w"]}, {}


EXAMPLES: dict[str, Example] = {
    "recon.zero_filled": Example(_recon(False)),
    "recon.zero_filled_cine": Example(_recon(True)),
    # GRAPPA solves small normal equations and CG-SENSE iterates 30 times in complex64:
    # cuFFT and pocketfft round differently, and the solves amplify that a little.
    "recon.grappa": Example(_recon(False), 1e-3),
    "recon.grappa_cine": Example(_recon(True), 1e-3),
    "recon.sense": Example(_recon(False), 1e-3),
    "recon.sense_cine": Example(_recon(True), 1e-3),
    # CPU is scikit-image (approximate exp), GPU the torch NLM (exact exp): 6.3e-3 measured on CPU.
    "denoise.nlm": Example(_denoise, 1e-2),
    "seg.cardiac": Example(_cardiac_seg, 0.01),  # label maps: fraction of voxels that differ
    "seg.prostate": Example(_prostate_seg, 0.01),
    "seg.brain_tumor": Example(_brain_seg, 0.01),
}


def bind(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """Map example artifacts to the tool's ports: by port name, else by artifact kind."""
    ports = get_tool(name).spec.inputs
    bound = {p.name: given[p.name] for p in ports if p.name in given}
    spare = [a for k, a in given.items() if k not in bound]
    for p in ports:
        if p.name in bound:
            continue
        match = next((a for a in spare if getattr(a, "kind", None) == p.kind), None)
        if match is not None:
            bound[p.name] = match
            spare.remove(match)
    return bound


def arrays(artifact: Any) -> dict[str, tuple[np.ndarray, bool]]:
    """Comparable arrays of an output artifact: name -> (array, is_label_map)."""
    if isinstance(artifact, Transform):
        return {"matrix": (np.asarray(artifact.matrix, dtype=np.float64), False)}
    data = getattr(artifact, "data", None)
    if data is None:
        return {}
    return {"data": (np.asarray(data), isinstance(artifact, Mask))}


def compare(ref: dict[str, Any], other: dict[str, Any]) -> float:
    """Worst relative error over every output array (see module docstring)."""
    worst = 0.0
    for field, art in ref.items():
        for key, (a, labels) in arrays(art).items():
            b, _ = arrays(other[field])[key]
            if a.shape != b.shape:
                return float("inf")
            if labels:
                err = float(np.mean(a != b)) if a.size else 0.0
            else:
                a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
                scale = float(np.max(np.abs(a64))) if a.size else 0.0
                err = float(np.max(np.abs(a64 - b64)) / scale) if scale > 0 else float(np.max(np.abs(b64), initial=0.0))
            worst = max(worst, err)
    return worst


def timed(name: str, inputs: dict[str, Any], params: dict[str, Any], device: str,
          repeat: int) -> tuple[dict[str, Any], float]:
    """Output of one call and the best wall time of ``repeat`` calls after a warm-up."""
    out = call_tool(name, inputs, params, device=device)  # warm-up: plans, kernels, caches
    best = float("inf")
    for _ in range(repeat):
        if device != "cpu":
            _sync()
        t0 = time.perf_counter()
        out = call_tool(name, inputs, params, device=device)
        if device != "cpu":
            _sync()
        best = min(best, time.perf_counter() - t0)
    return out, best


def _device_name() -> str | None:
    torch, ok = optional_import("torch")
    if ok and torch.cuda.is_available():
        return str(torch.cuda.get_device_name(0))
    return None


def _sync() -> None:
    cp, ok = optional_import("cupy")
    if ok:
        cp.cuda.Device().synchronize()
    torch, ok = optional_import("torch")
    if ok and torch.cuda.is_available():
        torch.cuda.synchronize()


def check_tool(name: str, gpu_device: str, repeat: int, size: str = "small") -> dict[str, Any]:
    example = EXAMPLES.get(name)
    if example is None:
        return {"status": "no_example", "message": f"add an EXAMPLES entry for {name} in {Path(__file__).name}"}
    row: dict[str, Any] = {"tolerance": example.tolerance}
    try:
        given, params = example.factory(size)
        inputs = bind(name, given)
        cpu_out, row["cpu_s"] = timed(name, inputs, params, "cpu", repeat)
        gpu_out, row["gpu_s"] = timed(name, inputs, params, gpu_device, repeat)
    except Exception as e:  # report and go on: one broken tool must not hide the others
        code = getattr(getattr(e, "code", None), "value", type(e).__name__)
        return {**row, "status": "error", "code": code, "message": str(e)[:500]}
    row["max_rel_error"] = compare(cpu_out, gpu_out)
    row["speedup"] = round(row["cpu_s"] / row["gpu_s"], 2) if row["gpu_s"] > 0 else None
    row["cpu_s"], row["gpu_s"] = round(row["cpu_s"], 4), round(row["gpu_s"], 4)
    row["status"] = "ok" if row["max_rel_error"] <= example.tolerance else "mismatch"
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="CPU vs GPU agreement and speed-up of every GPU tool")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gpu_check.json")
    ap.add_argument("--tools", nargs="*", default=None, help="only these tool names")
    ap.add_argument("--repeat", type=int, default=3, help="timed calls per path (at least 1)")
    ap.add_argument("--size", choices=("small", "full"), default="small", help="phantom size")
    ap.add_argument("--cpu-only", action="store_true", help="run the CPU path twice (no GPU needed)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    names = [s.name for s in list_tools() if s.gpu in ("optional", "required")]
    if args.tools:
        names = [n for n in names if n in set(args.tools)]
    args.repeat = max(1, args.repeat)
    report: dict[str, Any] = {"gpu": bool(cuda_available()), "cpu_only": args.cpu_only, "size": args.size,
                              "repeat": args.repeat, "device_name": _device_name(), "tools": {}}
    if not report["gpu"] and not args.cpu_only:
        report["message"] = ("no GPU: neither torch.cuda nor cupy sees a CUDA device; nothing to "
                             "compare (run on a GPU machine, or --cpu-only to check the examples)")
        report["tools"] = {n: {"status": "skipped", "has_example": n in EXAMPLES} for n in names}
        print(json.dumps(report, indent=2))
        return 0
    device = "cpu" if args.cpu_only else "cuda"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        report["tools"][name] = check_tool(name, device, args.repeat, args.size)
        log.info("%-24s %s", name, report["tools"][name])
        args.out.write_text(json.dumps(report, indent=2))  # after every tool: a killed run keeps what it measured
    bad = [n for n, r in report["tools"].items() if r["status"] != "ok"]
    report["failed"] = bad
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
