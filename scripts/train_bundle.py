"""Train the small cardiac MONAI bundle shipped in ``bcer/assets/bundles/cardiac_unet2d``.

A 2-D MONAI UNet (channels 8/16/32/64) segments RV (1), MYO (2) and LV (3) on each short-axis
slice of each cine frame. It is trained on ``small`` cardiac phantoms (all five ACDC groups)
with a fixed seed, on CPU in a few minutes, then evaluated through the same code path the
``seg.cardiac`` tool uses (``bcer.tools.seg.bundle.run_bundle``) on held-out phantoms whose
seeds never appear in training. The Dice scores go to ``<bundle>/metrics.json``.

Usage::

    OMP_NUM_THREADS=2 python scripts/train_bundle.py [--steps 300] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from bcer.datasets.cardiac import make_cardiac
from bcer.tools.seg.bundle import _normalize, clear_cache, run_bundle

log = logging.getLogger("train_bundle")
GROUPS = ("NOR", "DCM", "HCM", "MINF", "RV")
NAMES = {0: "background", 1: "RV", 2: "MYO", 3: "LV"}
NET_DEF = {"_target_": "UNet", "spatial_dims": 2, "in_channels": 1, "out_channels": 4,
           "channels": [8, 16, 32, 64], "strides": [2, 2, 2], "num_res_units": 1}
ROI = 64
TRAIN_SEED0, HELD_OUT_SEED0 = 1000, 9000  # disjoint seed ranges: held-out cases are never seen


def _cine_stack(phantom) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """(X, Y, Z*T) normalised images and labels of one phantom, as the tool feeds the bundle."""
    cine, lab = phantom.sequences["CINE"], phantom.labels["seg"]
    x, y, z, t = cine.data.shape
    img = _normalize(np.asarray(cine.data, np.float32).reshape(1, x, y, z * t), "zscore")[0]
    return img, np.asarray(lab.data).reshape(x, y, z * t).astype(np.int64), cine.spacing


def _fit(a: np.ndarray, size: int) -> np.ndarray:
    """Centre-crop or zero-pad the first two axes to ``size``."""
    out = np.zeros((size, size) + a.shape[2:], a.dtype)
    sx, sy = min(size, a.shape[0]), min(size, a.shape[1])
    ax, ay = (a.shape[0] - sx) // 2, (a.shape[1] - sy) // 2
    bx, by = (size - sx) // 2, (size - sy) // 2
    out[bx:bx + sx, by:by + sy] = a[ax:ax + sx, ay:ay + sy]
    return out


def build_slices(n_cases: int, seed0: int) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """All (slice, frame) images and labels of ``n_cases`` phantoms, fitted to ROI x ROI."""
    imgs, labs, spacings = [], [], []
    for i in range(n_cases):
        ph = make_cardiac(f"train{i:03d}", seed=seed0 + i, size="small", group=GROUPS[i % 5])
        img, lab, sp = _cine_stack(ph)
        keep = lab.reshape(-1, lab.shape[-1]).any(axis=0)  # slices that show the heart
        keep |= np.random.default_rng(seed0 + i).random(keep.size) < 0.15  # and a few that don't
        imgs.append(_fit(img[..., keep], ROI))
        labs.append(_fit(lab[..., keep], ROI))
        spacings.append(sp[0])
    return (np.moveaxis(np.concatenate(imgs, -1), -1, 0), np.moveaxis(np.concatenate(labs, -1), -1, 0),
            spacings)


def _augment(x: torch.Tensor, y: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """In-plane dihedral flips/transposes: phantom grids come flipped and oblique."""
    if torch.rand(1, generator=gen) < 0.5:
        x, y = x.flip(-1), y.flip(-1)
    if torch.rand(1, generator=gen) < 0.5:
        x, y = x.flip(-2), y.flip(-2)
    if torch.rand(1, generator=gen) < 0.5:
        x, y = x.transpose(-1, -2), y.transpose(-1, -2)
    scale = 1.0 + 0.2 * (torch.rand(1, generator=gen) - 0.5)  # contrast jitter
    return x * scale, y


def train(steps: int, n_train: int, seed: int, batch: int = 16) -> tuple[torch.nn.Module, float]:
    from monai.bundle import ConfigParser
    from monai.losses import DiceCELoss

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    imgs, labs, spacings = build_slices(n_train, TRAIN_SEED0)
    log.info("training on %d slices from %d phantoms", len(imgs), n_train)
    x_all = torch.from_numpy(imgs[:, None].astype(np.float32))
    y_all = torch.from_numpy(labs[:, None])
    net = ConfigParser({"network_def": NET_DEF}).get_parsed_content("network_def")
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    net.train()
    for step in range(steps):
        idx = torch.randint(0, len(x_all), (batch,), generator=gen)
        x, y = _augment(x_all[idx], y_all[idx], gen)
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            log.info("step %d loss %.4f", step, float(loss))
    return net.eval(), float(np.median(spacings))


def write_bundle(net: torch.nn.Module, out: Path, pixdim: float, args: argparse.Namespace) -> None:
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "models" / "model.pt")
    (out / "configs" / "inference.json").write_text(json.dumps({"network_def": NET_DEF}, indent=2))
    meta = {
        "name": "cardiac_unet2d", "version": "0.1.0",
        "description": "2-D UNet for RV/MYO/LV on short-axis cine slices; trained on bcer 'small' "
                       "phantoms (64x56 matrix, ~3 mm, ~190 mm field of view) by scripts/train_bundle.py. "
                       "Larger fields of view (e.g. 'full' phantoms, ~350 mm) are out of distribution. "
                       "Not for clinical use.",
        "task": "cardiac cine segmentation", "monai_version": __import__("monai").__version__,
        "training": {"steps": args.steps, "n_train_cases": args.n_train, "seed": args.seed,
                     "train_seeds": [TRAIN_SEED0, TRAIN_SEED0 + args.n_train - 1], "size": "small"},
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "magnitude", "num_channels": 1,
                                 "spatial_shape": [ROI, ROI], "dtype": "float32"}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": 4,
                                 "spatial_shape": [ROI, ROI], "dtype": "float32",
                                 "channel_def": {str(k): v for k, v in NAMES.items()}}}},
        "bcer": {"spatial_dims": 2, "normalize": "zscore", "output": "argmax",
                 "label_values": [0, 1, 2, 3], "pixdim": [pixdim, pixdim]},
    }
    (out / "configs" / "metadata.json").write_text(json.dumps(meta, indent=2))


def evaluate(out: Path, n_cases: int) -> dict:
    """Dice per structure on held-out phantoms, through the tool's bundle code path."""
    clear_cache()
    per_case = []
    for i in range(n_cases):
        ph = make_cardiac(f"heldout{i:03d}", seed=HELD_OUT_SEED0 + i, size="small", group=GROUPS[i % 5])
        cine, truth = ph.sequences["CINE"], np.asarray(ph.labels["seg"].data)
        x, y, z, t = cine.data.shape
        pred, _ = run_bundle(str(out), np.asarray(cine.data, np.float32).reshape(1, x, y, z * t),
                             spacing=cine.spacing, roi_size=ROI)
        pred = pred.reshape(x, y, z, t)
        row = {"case": ph.case_id, "group": ph.truth.get("group")}
        for k in (1, 2, 3):
            a, b = pred == k, truth == k
            row[NAMES[k]] = float(2 * np.logical_and(a, b).sum() / max(a.sum() + b.sum(), 1))
        per_case.append(row)
    mean = {NAMES[k]: float(np.mean([r[NAMES[k]] for r in per_case])) for k in (1, 2, 3)}
    return {"held_out_seeds": [HELD_OUT_SEED0, HELD_OUT_SEED0 + n_cases - 1], "mean_dice": mean,
            "per_case": per_case}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1]
                    / "bcer" / "assets" / "bundles" / "cardiac_unet2d")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--n-train", type=int, default=15)
    ap.add_argument("--n-eval", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    net, pixdim = train(args.steps, args.n_train, args.seed)
    write_bundle(net, args.out, pixdim, args)
    metrics = evaluate(args.out, args.n_eval)
    metrics["train_seconds"] = round(time.time() - t0, 1)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    log.info("held-out mean Dice %s (%.0f s)", metrics["mean_dice"], metrics["train_seconds"])


if __name__ == "__main__":
    main()
