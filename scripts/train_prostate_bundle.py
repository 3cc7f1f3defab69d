"""Train the small prostate MONAI bundle shipped in ``bcer/assets/bundles/prostate_unet3d``.

A 3-D MONAI UNet (channels 8/16/32/64) labels background, peripheral zone (1) and transition
zone (2) on the canonical grid of ``bcer.tools.seg.prostate_net`` (T2w resampled axis-aligned
in RAS at 2 x 2 x 3 mm, z-scored), the very function ``seg.prostate`` uses at inference.

Data: ONLY the domain-randomised prostate family (``make_prostate(..., family="randomised")``,
seeds from ``TRAIN_SEED0``), mostly ``small`` with some ``full`` cases. The held-out family is
never generated here. Validation uses other randomised seeds (``VAL_SEED0``) through the tool's
own code path; its Dice goes to ``<bundle>/metrics.json``.

Augmentation (on 64 x 64 x 24 crops, 70 % around the gland, 30 % anywhere): left-right flips,
a smooth multiplicative bias, intensity scale/shift, Gaussian noise and blur.

Usage (CPU, a few tens of minutes on 2 cores)::

    OMP_NUM_THREADS=2 python scripts/train_prostate_bundle.py [--steps 2500] [--n-train 110] [--out DIR]

Fine-tuning the shipped weights (``--init``, a lower ``--lr``, lesion-carrying cases only)::

    OMP_NUM_THREADS=1 python scripts/train_prostate_bundle.py --init bcer/assets/bundles/prostate_unet3d/models/model.pt \
        --lr 1e-3 --lesions 1,2 --out /tmp/prostate_ft --cache /tmp/prostate_ft_cases.npz --version 0.2.0

``--eval-only`` prints the validation Dice of the bundle in ``--out`` (e.g. the shipped one, on the
current randomised family) without training or writing anything.
"""
from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from bcer.datasets.prostate import make_prostate
from bcer.metrics import dice
from bcer.tools.seg.bundle import clear_cache
from bcer.tools.seg.prostate_net import BUNDLE_NAME, CANONICAL_SPACING, canonical_grid, segment, to_canonical, zscore

log = logging.getLogger("train_prostate_bundle")
NET_DEF = {"_target_": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 3,
           "channels": [8, 16, 32, 64], "strides": [2, 2, 2], "num_res_units": 1}
ROI = (64, 64, 24)
TRAIN_SEED0, VAL_SEED0 = 20_000, 30_000  # randomised family only; disjoint seed ranges
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "bcer" / "assets" / "bundles" / BUNDLE_NAME


def canonical_case(ph) -> tuple[np.ndarray, np.ndarray]:
    """(z-scored T2w, labels 0/1/2) of one phantom on its canonical grid."""
    t2, zones = ph.sequences["T2w"], np.asarray(ph.labels["zones"].data)
    grid = canonical_grid(t2.affine, t2.shape, CANONICAL_SPACING)
    img = zscore(to_canonical(t2.data, t2.affine, grid))
    onehot = np.stack([to_canonical((zones == k).astype(np.float32), t2.affine, grid, smooth=False) for k in range(3)])
    onehot[0] += 1e-3  # outside the FOV: background
    return img, np.argmax(onehot, axis=0).astype(np.int64)


def build(n: int, seed0: int, full_every: int, lesions: tuple[int, ...] = (0, 1, 2)) -> list[tuple[np.ndarray, np.ndarray]]:
    """Canonical training cases; case i carries ``lesions[i % len(lesions)]`` lesions (lesion voxels
    are part of their zone in the labels, so lesion-carrying cases teach the gland to keep them)."""
    out = []
    for i in range(n):
        size = "full" if full_every and i % full_every == full_every - 1 else "small"
        ph = make_prostate(f"train{i:03d}", seed0 + i, size, n_lesions=lesions[i % len(lesions)], family="randomised")
        out.append(canonical_case(ph))
        if i % 20 == 0:
            log.info("case %d/%d (%s): canonical %s", i, n, size, out[-1][0].shape)
    return out


def _crop(img: np.ndarray, lab: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    pad = [(0, max(0, r - s)) for r, s in zip(ROI, img.shape)]
    img, lab = np.pad(img, pad), np.pad(lab, pad)
    if rng.random() < 0.7 and (lab > 0).any():
        c = np.argwhere(lab > 0).mean(axis=0) + rng.normal(0, [8, 8, 2.5])
        start = np.round(c - np.asarray(ROI) / 2).astype(int)
    else:
        start = np.array([rng.integers(0, s - r + 1) for s, r in zip(img.shape, ROI)])
    start = np.clip(start, 0, np.asarray(img.shape) - ROI)
    sl = tuple(slice(s, s + r) for s, r in zip(start, ROI))
    return img[sl], lab[sl]


def _augment(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from scipy import ndimage as ndi

    fov = x != 0
    g = np.stack(np.meshgrid(*[np.linspace(-1, 1, n) for n in x.shape], indexing="ij"), -1)
    log_bias = g @ rng.normal(0, 0.15, 3) + (g * g) @ rng.normal(0, 0.1, 3)
    y = x * np.exp(log_bias) * rng.uniform(0.85, 1.15) + rng.uniform(-0.2, 0.2)
    if rng.random() < 0.3:
        y = ndi.gaussian_filter(y, rng.uniform(0.3, 0.8))
    y = y + rng.normal(0, rng.uniform(0.0, 0.15), y.shape)
    return np.where(fov, y, 0.0).astype(np.float32)


def train(data: list[tuple[np.ndarray, np.ndarray]], steps: int, seed: int, batch: int = 2,
          init: Path | None = None, checkpoint: Path | None = None, lr: float = 3e-3) -> torch.nn.Module:
    from monai.bundle import ConfigParser
    from monai.losses import DiceCELoss

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    net = ConfigParser({"network_def": NET_DEF}).get_parsed_content("network_def")
    if init is not None:  # continue from earlier weights (a longer schedule in parts)
        net.load_state_dict(torch.load(init, weights_only=True))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True)
    net.train()
    t0, running = time.time(), []
    log.info("training %d steps, lr %.1e, init %s", steps, lr, init)
    for step in range(steps):
        xs, ys = [], []
        for _ in range(batch):
            img, lab = data[int(rng.integers(len(data)))]
            x, y = _crop(img, lab, rng)
            if rng.random() < 0.5:  # left-right: the pelvis is near symmetric
                x, y = x[::-1], y[::-1]
            xs.append(_augment(np.ascontiguousarray(x), rng))
            ys.append(np.ascontiguousarray(y))
        x = torch.from_numpy(np.stack(xs)[:, None])
        y = torch.from_numpy(np.stack(ys)[:, None])
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        sched.step()
        running.append(float(loss.detach()))
        if step % 100 == 0 or step == steps - 1:
            log.info("step %d/%d loss %.4f (%.0f s)", step, steps, float(np.mean(running[-100:])), time.time() - t0)
        if checkpoint is not None and step % 250 == 249:
            torch.save(net.state_dict(), checkpoint)
    return net.eval()


def write_bundle(net: torch.nn.Module, out: Path, args: argparse.Namespace) -> None:
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "models" / "model.pt")
    (out / "configs" / "inference.json").write_text(json.dumps({"network_def": NET_DEF}, indent=2) + "\n")
    meta = {
        "name": BUNDLE_NAME, "version": args.version,
        "description": "3-D UNet for the prostate peripheral (1) and transition (2) zones on T2w, on a canonical "
                       "RAS grid at 2 x 2 x 3 mm (bcer.tools.seg.prostate_net); trained by "
                       "scripts/train_prostate_bundle.py on bcer's domain-randomised prostate phantoms only "
                       "(never on the held-out family). Not for clinical use.",
        "task": "prostate zonal segmentation", "monai_version": __import__("monai").__version__,
        "training": {"steps": args.steps, "n_train_cases": args.n_train, "full_every": args.full_every,
                     "seed": args.seed, "family": "randomised", "lr": args.lr,
                     "lesions_per_case": list(args.lesions),
                     "train_seeds": [TRAIN_SEED0, TRAIN_SEED0 + args.n_train - 1], **_init_record(args.init)},
        "network_data_format": {
            "inputs": {"image": {"type": "image", "format": "magnitude", "modality": "MR", "num_channels": 1,
                                 "spatial_shape": list(ROI), "dtype": "float32"}},
            "outputs": {"pred": {"type": "image", "format": "segmentation", "num_channels": 3,
                                 "spatial_shape": list(ROI), "dtype": "float32",
                                 "channel_def": {"0": "background", "1": "PZ", "2": "TZ"}}}},
        "bcer": {"spatial_dims": 3, "normalize": "zscore", "output": "argmax", "label_values": [0, 1, 2],
                 "pixdim": list(CANONICAL_SPACING), "grid": "canonical RAS (bcer.tools.seg.prostate_net)"},
    }
    (out / "configs" / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def _init_record(init: Path | None) -> dict:
    """Where fine-tuning started: the init weights' bundle version and training record, if any."""
    if init is None:
        return {}
    meta_path = Path(init).resolve().parents[1] / "configs" / "metadata.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return {"init": {"weights": str(init), "version": meta.get("version"), "training": meta.get("training")}}


def zone_dice(zones: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Gland, PZ and TZ Dice of a zone map (0/1 PZ/2 TZ) against the truth's."""
    return {"gland": dice(zones > 0, truth > 0), "PZ": dice(zones == 1, truth == 1), "TZ": dice(zones == 2, truth == 2)}


def evaluate(out: Path, n_cases: int) -> dict:
    """Gland/PZ/TZ Dice on validation phantoms (randomised family, unseen seeds), through the tool's path."""
    clear_cache()
    rows = []
    for i in range(n_cases):
        size = "full" if i % 6 == 5 else "small"
        ph = make_prostate(f"val{i:03d}", VAL_SEED0 + i, size, n_lesions=i % 3, family="randomised")
        zones, _ = segment(ph.sequences["T2w"], out)
        truth = np.asarray(ph.labels["zones"].data)
        rows.append({"case": ph.case_id, "size": size, **zone_dice(zones, truth)})
        log.info("val %s", rows[-1])
    summary = {k: float(np.mean([r[k] for r in rows])) for k in ("gland", "PZ", "TZ")}
    summary["gland_min"] = float(np.min([r["gland"] for r in rows]))
    return {"family": "randomised", "val_seeds": [VAL_SEED0, VAL_SEED0 + n_cases - 1], "mean_dice": summary,
            "cases": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument("--n-train", type=int, default=110)
    ap.add_argument("--full-every", type=int, default=8, help="every Nth training case is full size")
    ap.add_argument("--n-val", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--init", type=Path, default=None, help="start from these weights (models/model.pt)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--cache", type=Path, default=None, help="keep/reuse the canonical training cases in this .npz")
    ap.add_argument("--lesions", type=lambda s: tuple(int(v) for v in s.split(",")), default=(0, 1, 2),
                    help="lesions per training case, cycled (make_prostate allows 0-2)")
    ap.add_argument("--version", default="0.1.0", help="bundle version written to metadata.json")
    ap.add_argument("--eval-only", action="store_true", help="print the validation Dice of the bundle in --out; no training")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.time()
    if args.eval_only:
        metrics = evaluate(args.out, args.n_val)
        print(json.dumps(metrics, indent=2))
        return
    if args.cache is not None and args.cache.is_file():  # canonical cases of an earlier run (same arguments)
        with np.load(args.cache) as z:
            data = [(z[f"img{i}"], z[f"lab{i}"].astype(np.int64)) for i in range(int(z["n"]))]
    else:
        data = build(args.n_train, TRAIN_SEED0, args.full_every, args.lesions)
        if args.cache is not None:
            np.savez_compressed(args.cache, n=len(data), **{f"img{i}": d[0] for i, d in enumerate(data)},
                                **{f"lab{i}": d[1].astype(np.uint8) for i, d in enumerate(data)})
    log.info("%d training cases ready in %.0f s", len(data), time.time() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    t_build, t1 = time.time() - t0, time.time()
    net = train(data, args.steps, args.seed, init=args.init, checkpoint=args.out / "checkpoint.pt", lr=args.lr)
    t_loop = time.time() - t1
    write_bundle(net, args.out, args)
    (args.out / "checkpoint.pt").unlink(missing_ok=True)
    metrics = evaluate(args.out, args.n_val)
    metrics["train_s"] = round(time.time() - t0, 1)  # cases + training + validation
    metrics["timing"] = {"build_s": round(t_build, 1), "train_loop_s": round(t_loop, 1),
                         "steps_per_s": round(args.steps / max(t_loop, 1e-9), 3), "torch_threads": torch.get_num_threads()}
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    log.info("validation Dice %s", metrics["mean_dice"])


if __name__ == "__main__":
    main()
