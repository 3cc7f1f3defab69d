"""Recon benchmark: bcer's zero-filled, GRAPPA and CG-SENSE beside sigpy's own pipeline
(``EspiritCalib`` + ``SenseRecon``) on the same phantom k-space.

    python benchmarks/recon.py [--size full|small] [--out benchmarks/results/recon.json]

Cases: cardiac (ED frame, 3-D k-space) and prostate (T2w), R = 4 and 8, 8 coils, 24 ACS
lines, regular pattern, noise 0.002 (``bcer.datasets.kspace.make_kspace_case``), the
central ``--max-slices`` slices (sigpy's ESPIRiT costs seconds per slice on 2 shared CPUs).
Two FOV variants of each case:

- ``as_generated``: ``make_kspace_case`` as is. Its phantoms fill the field of view to the
  edge, so each coil image (map x object) is cut by the FOV and not periodic: neither a
  k-space kernel (GRAPPA) nor band-limited maps (SENSE, ESPIRiT) can model that.
- ``fov_margin``: the same clean reference image zero-padded in-plane by 25 % per side (a
  larger FOV, as with readout oversampling) and pushed through the same forward model
  (``make_kspace``, same coils/R/ACS/noise).

NRMSE is ``bcer.metrics.nrmse_scaled``: magnitude inside the object (truth > 5 % of
max), after least-squares scaling, against the clean reference image. Times are wall-clock
seconds on the CPU for the whole k-space (sigpy runs slice by slice: it has no batch axis).
``sigpy_sense`` is sigpy's own pipeline (EspiritCalib + SenseRecon); ``sigpy_sense_bcer_maps``
is SenseRecon given bcer's maps, which isolates the CG solver (same lambda, iterations).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.contracts.artifacts import Image, KSpace  # noqa: E402
from bcer.datasets.kspace import make_kspace, make_kspace_case  # noqa: E402
from bcer.tools import call_tool  # noqa: E402
from bcer.tools.recon._coils import analyse_mask, as_slices  # noqa: E402
from bcer.tools.recon._maps import smooth_maps  # noqa: E402
from bcer.metrics import nrmse_scaled as nrmse  # noqa: E402

log = logging.getLogger("benchmarks.recon")
CG_ITERATIONS = 30
LAMBDA = 1e-3
PAD = 0.25


def bcer_maps(ks: KSpace) -> np.ndarray:
    """bcer's default ('smooth') SENSE maps, (Z, C, X, Y)."""
    data = np.asarray(ks.data)
    return smooth_maps(as_slices(data).astype(np.complex64), analyse_mask(ks.mask, data.shape[1:3]), np, 0.05)


def sigpy_sense(ks: KSpace, maps: np.ndarray | None = None) -> tuple[np.ndarray, float, float]:
    """sigpy per slice: ESPIRiT maps (unless ``maps`` are given), then SenseRecon (CG, same
    lambda and iteration count as bcer's recon.sense). Returns (|x| (X,Y,Z), t_maps, t_recon)."""
    from sigpy.mri.app import EspiritCalib, SenseRecon

    data = np.asarray(ks.data)
    weights = np.broadcast_to(np.asarray(ks.mask, dtype=np.float32), data.shape[1:3])
    out, t_maps, t_recon = [], 0.0, 0.0
    for z in range(data.shape[3]):
        y = np.ascontiguousarray(data[..., z])
        t0 = time.perf_counter()
        mps = (maps[z] if maps is not None else
               EspiritCalib(y, calib_width=int(ks.meta.get("n_acs", 24)), show_pbar=False).run())
        t1 = time.perf_counter()
        x = SenseRecon(y, mps, lamda=LAMBDA, weights=weights, max_iter=CG_ITERATIONS,
                       show_pbar=False).run()
        t_maps, t_recon = t_maps + t1 - t0, t_recon + time.perf_counter() - t1
        out.append(np.abs(x))
    return np.stack(out, axis=-1), t_maps, t_recon


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - t0


def load_case(domain: str, R: int, size: str, seed: int, max_slices: int,
              variant: str) -> tuple[KSpace, np.ndarray]:
    """(k-space, clean reference) of one benchmark case (module docstring: variants)."""
    case = make_kspace_case(f"bench-{domain}-R{R}", seed, size, domain=domain, R=R,
                            **({"frames": "ed"} if domain == "cardiac" else {}))
    ks, ref = case.sequences["KSPACE"], case.references["KSPACE"]
    z = np.asarray(ref.data).shape[2]
    z0 = max(0, z // 2 - max_slices // 2)
    zs = slice(z0, min(z, z0 + max_slices))
    truth = np.asarray(ref.data)[:, :, zs]
    affine = np.array(ref.affine, dtype=np.float64)
    affine[:3, 3] += affine[:3, :3] @ np.array([0.0, 0.0, z0])
    if variant == "as_generated":
        return KSpace(np.ascontiguousarray(ks.data[..., zs]), ks.mask, affine, dict(ks.meta)), truth
    px, py = int(PAD * truth.shape[0]), int(PAD * truth.shape[1])
    truth = np.pad(truth, ((px, px), (py, py), (0, 0)))
    affine[:3, 3] -= affine[:3, :3] @ np.array([px, py, 0.0])
    padded, _ = make_kspace(Image(truth, affine), n_coils=int(ks.meta["n_coils"]), R=R,
                            n_acs=int(ks.meta["n_acs"]), noise=0.002,
                            rng=np.random.default_rng([seed, R]))
    return padded, truth


def bench_case(domain: str, R: int, size: str, seed: int, max_slices: int, variant: str) -> dict[str, Any]:
    ks, truth = load_case(domain, R, size, seed, max_slices, variant)
    row: dict[str, Any] = {"domain": domain, "R": R, "variant": variant, "shape": list(ks.data.shape),
                           "effective_acceleration": round(ks.acceleration, 3), "methods": {}}
    runs = {
        "zero_filled": ("recon.zero_filled", {}),
        "grappa": ("recon.grappa", {}),
        "sense": ("recon.sense", {"iterations": CG_ITERATIONS, "lam": LAMBDA}),
    }
    for label, (name, params) in runs.items():
        out, secs = _timed(lambda: call_tool(name, {"kspace": ks}, params)["image"])
        row["methods"][label] = {"tool": name, "params": params, "seconds": round(secs, 3),
                                 "nrmse": round(nrmse(out.data, truth), 4)}
    maps = bcer_maps(ks)
    for label, m in (("sigpy_sense", None), ("sigpy_sense_bcer_maps", maps)):
        (img, t_maps, t_recon), secs = _timed(lambda: sigpy_sense(ks, m))
        row["methods"][label] = {
            "tool": "sigpy.mri.app." + ("SenseRecon" if m is not None else "EspiritCalib+SenseRecon"),
            "params": {"max_iter": CG_ITERATIONS, "lamda": LAMBDA}, "seconds": round(secs, 3),
            "seconds_maps": round(t_maps, 3), "seconds_recon": round(t_recon, 3),
            "nrmse": round(nrmse(img, truth), 4)}
    zf = row["methods"]["zero_filled"]["nrmse"]
    for label, m in row["methods"].items():
        m["nrmse_over_zero_filled"] = round(m["nrmse"] / zf, 3) if zf else None
        log.info("%-8s R=%d %-12s %-22s %7.3fs NRMSE %.4f (%.2f x zero-filled)", domain, R, variant,
                 label, m["seconds"], m["nrmse"], m["nrmse_over_zero_filled"])
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=["small", "full"], default="full")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "recon.json")
    ap.add_argument("--domains", nargs="+", default=["cardiac", "prostate"])
    ap.add_argument("--R", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-slices", type=int, default=4)
    ap.add_argument("--variants", nargs="+", default=["as_generated", "fov_margin"])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [bench_case(d, R, args.size, args.seed, args.max_slices, v)
            for d in args.domains for R in args.R for v in args.variants]
    result = {"benchmark": "recon", "size": args.size, "metric": "nrmse: ||a|x|-|y||| / |||y||| inside "
              "truth > 5% max, a least-squares gain", "cg_iterations": CG_ITERATIONS, "lam": LAMBDA,
              "max_slices": args.max_slices, "fov_margin_pad": PAD,
              "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "omp_num_threads": os.environ.get("OMP_NUM_THREADS")},
              "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    log.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
