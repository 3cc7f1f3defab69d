"""Train a brain-tumour network on domain-randomised images (SynthSeg recipe) for
``seg.brain_tumor``, and write it as a bcer minimal MONAI bundle.

Every training image is synthesised on the fly from a label map with
``bcer.datasets.randomise``'s steps: random background clutter, one random affine and
elastic warp of the anatomy, then **per contrast** (T1, T1c, T2, FLAIR) its own Gaussian
mixture, its own acquired resolution, slice thickness and gap with partial voluming, bias
field, Rician noise and gamma; finally one set of random flips, axis permutation and field of
view for all four. Half the draws use fully random mixtures (any contrast order, in every
channel independently); the other half give brain and tumour labels the usual contrast
relations (``bcer.datasets.brain``'s level tables, each level jittered by +-30 %), so that
"enhancing" can mean brighter on T1c than on T1 (``P_PRIOR``). Two earlier runs with fully
random mixtures only had learnt nothing after 1600 and 2400 steps (Dice 0 on fresh draws) and
were stopped.

Label maps (``label_map``), on a 3 mm grid around the MNI152 template that nilearn ships:

* normal anatomy: CSF, grey and white matter (the template's tissue maps, argmax); in half
  the maps a head around it (extra-axial CSF, skull and scalp shells of random thickness),
  in the other half a skull-stripped brain;
* tumours from two shape sources: the brain phantom's nested distance-field tumour
  (``bcer.datasets.brain``: necrosis, enhancing rim, oedema; or an LGG core) confined to one
  hemisphere, and a second shape model written here: a randomly rotated ellipsoid with a
  smooth random radial perturbation, placed anywhere in the brain (so it may cross the
  midline), with random compartment fractions (necrosis may be absent, the rim may be thin
  or thick, the oedema narrow or wide);
* one tumour in most maps, two or three separate ones in about a third, none in a tenth.

The independent evaluation family (``bcer.datasets.independent``) is never generated here:
it is the family left out, scored once afterwards through ``brain_report``
(``benchmarks/segmenters_lofo.py --candidate seg.brain_tumor=DIR``).

A data process synthesises while the training process optimises (one CPU thread each).
Seeded: label maps, every draw and torch. Usage::

    python scripts/train_brain_dr.py --steps 8500 --out /tmp/brain_dr [--minutes 62]

The published candidate (``benchmarks/models/brain_tumor_unet3d_dr``) is that command: 8500
steps, batch 2, lr 1e-3, 52 min on two CPU threads (one training, one synthesising).

The weights go to ``--out`` only; a default is replaced by hand, and only by a model
measured better on the family it never saw.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from scipy import ndimage as ndi

from bcer.datasets.brain import TISSUE_INTENSITY, TUMOUR_INTENSITY, _mni_tissues, _tumour_centre, _tumour_labels
from bcer.datasets.randomise import RANGES, _seed, acquire, clutter, gmm, reorient, scanner, warp
from bcer.tools.seg.bundle import _normalize

log = logging.getLogger("train_brain_dr")
SPACING = 3.0  # mm, the network's grid (bcer.pixdim)
ROI = (64, 64, 64)  # 192 mm: about the whole brain in one window
PAD = 8  # voxels around the template: room for skull and scalp
CONTRASTS = ("T1", "T1c", "T2", "FLAIR")
LABEL_VALUES = (0, 1, 2, 4)  # network class -> BraTS label
TRAIN_SEED0 = 50_000  # disjoint from every evaluation seed
# brain-MRI acquisitions: thin 3-D to thick 2-D stacks; the scanner steps as in RANGES
BRAIN_RANGES = replace(RANGES, inplane_mm=(0.8, 3.0), thickness_mm=(1.0, 6.0), gap_mm=(0.0, 1.5), fov=(0.75, 1.0))
NET_DEF = {"_target_": "UNet", "spatial_dims": 3, "in_channels": 4, "out_channels": 4,
           "channels": [16, 32, 64, 128], "strides": [2, 2, 2], "num_res_units": 1}
# label values of the synthetic anatomy (above the BraTS values; all become class 0)
CSF, GM, WM, EXTRA, SKULL, SCALP = 5, 6, 7, 8, 9, 10
# Share of draws whose brain and tumour means follow the usual contrast relations (each level
# of bcer.datasets.brain's tables times U(1 - PRIOR_JITTER, 1 + PRIOR_JITTER)); the rest are
# fully random mixtures. Billot et al. (2020) train with both kinds: the fully random ones teach
# contrast invariance, the prior-informed ones what "enhancing" means (brighter on T1c than T1).
P_PRIOR, PRIOR_JITTER = 0.5, 0.3


def template() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tissue labels 0/CSF/GM/WM, brain mask, affine) of the MNI template on the 3 mm grid, padded."""
    frac, aff = _mni_tissues(2)
    f = np.stack([ndi.zoom(x, 2.0 / SPACING, order=1) for x in frac])
    f = np.pad(f, [(0, 0)] + [(PAD, PAD)] * 3)
    f[0][f.sum(axis=0) == 0] = 1.0  # padding is background
    scale = np.diag([SPACING / 2.0] * 3 + [1.0])
    affine = aff @ scale
    affine[:3, 3] -= affine[:3, :3] @ np.full(3, PAD)
    brain = f[0] < 0.5
    tissue = np.where(brain, CSF + np.argmax(f[1:], axis=0), 0).astype(np.int16)
    return tissue, brain, affine


def _head(tissue: np.ndarray, brain: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Extra-axial CSF, skull and scalp as shells of random thickness (voxels) around the brain."""
    out, inner = tissue.copy(), brain
    for label in (EXTRA, SKULL, SCALP):
        outer = ndi.binary_dilation(inner, iterations=int(rng.integers(1, 3)))
        out[outer & ~inner] = label
        inner = outer
    return out


def ellipsoid_tumour(rng: np.random.Generator, brain: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """BraTS labels of one perturbed ellipsoid tumour anywhere in the brain."""
    inner = ndi.distance_transform_edt(brain) * SPACING > 12.0
    cands = np.argwhere(inner)
    centre = cands[rng.integers(len(cands))].astype(float)
    radii = rng.uniform(8.0, 30.0, 3) / SPACING  # voxels (the oedema's outer surface)
    q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    idx = np.indices(brain.shape, dtype=np.float32).reshape(3, -1).T - centre
    d = np.sqrt((((idx @ q) / radii) ** 2).sum(axis=1)).reshape(brain.shape)
    field = ndi.gaussian_filter(rng.standard_normal(brain.shape), rng.uniform(1.5, 4.0))
    d = d * (1.0 + rng.uniform(0.1, 0.35) * field / max(float(field.std()), 1e-6))
    lab = np.zeros(brain.shape, np.int16)
    lab[d < 1.0] = 2
    core = rng.uniform(0.35, 0.8)  # share of the radius that is tumour core
    if rng.random() < 0.7:  # high grade: enhancing rim around optional necrosis
        lab[d < core] = 4
        necro = core * rng.uniform(0.0, 0.8)
        lab[d < necro] = 1
    else:  # low grade: a non-enhancing core
        lab[d < core] = 1
    return np.where(brain, lab, 0).astype(np.int16)


def phantom_tumour(rng: np.random.Generator, brain: np.ndarray, affine: np.ndarray) -> np.ndarray:
    """BraTS labels of one tumour of the brain phantom's shape model, in one hemisphere."""
    side, grade = str(rng.choice(["left", "right"])), str(rng.choice(["HGG", "LGG"]))
    centre = _tumour_centre(rng, side, 28.0 if grade == "HGG" else 22.0)
    return _tumour_labels(rng, affine, brain.shape, brain.astype(np.int16), grade, side, centre,
                          float(rng.uniform(0.6, 1.5)))


def _merge(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Union of two tumours: a core label (1, 4) wins over oedema (2) and background."""
    take = (new > 0) & ((old == 0) | ((old == 2) & (new != 2)))
    return np.where(take, new, old)


def label_map(i: int, base: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """The i-th training label map: tumour labels 1/2/4 over the anatomy labels 5..10."""
    tissue, brain, affine = base
    rng = np.random.default_rng([TRAIN_SEED0, i])
    n = int(rng.choice([0, 1, 2, 3], p=[0.1, 0.6, 0.22, 0.08]))
    seg = np.zeros(brain.shape, np.int16)
    for _ in range(n):
        source = ellipsoid_tumour if rng.random() < 0.5 else phantom_tumour
        seg = _merge(seg, source(rng, brain, affine))
    anatomy = _head(tissue, brain, rng) if rng.random() < 0.5 else tissue
    return np.where(seg > 0, seg, anatomy).astype(np.int16)


def prior_image(lab: np.ndarray, rng: np.random.Generator, contrast: str, r: Any) -> np.ndarray:
    """One contrast with prior-informed means for brain and tumour labels (jittered), random
    means for everything else (clutter, scalp, skull), random SDs."""
    tissue, tumour = TISSUE_INTENSITY[contrast], TUMOUR_INTENSITY
    core = "necrotic" if (lab == 4).any() else "core_lgg"
    known = {CSF: tissue[1], EXTRA: tissue[1], GM: tissue[2], WM: tissue[3], 1: tumour[core][contrast],
             2: tumour["oedema"][contrast], 4: tumour["enhancing"][contrast]}
    top = int(lab.max()) + 1
    means = rng.uniform(*r.mean, top).astype(np.float32)
    for v, level in known.items():
        if v < top:
            means[v] = level * rng.uniform(1 - PRIOR_JITTER, 1 + PRIOR_JITTER) / 1.3  # 1.3: brightest level near 1
    sds = rng.uniform(*r.std, top).astype(np.float32)
    return (means[lab] + sds[lab] * rng.standard_normal(lab.shape).astype(np.float32)).astype(np.float32)


def draw(lab: np.ndarray, affine: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One randomised 4-contrast image of a label map: (z-scored (4, X, Y, Z), classes 0..3)."""
    r, sp = BRAIN_RANGES, np.full(3, SPACING)
    top = int(lab.max()) + 1
    n = int(rng.integers(r.clutter_classes[0], r.clutter_classes[1] + 1))
    bg = clutter(lab.shape, rng, n, smooth_vox=float(rng.uniform(2.0, 5.0)))
    full = np.where(lab == 0, top + bg - 1, lab).astype(np.int16)
    full[(bg == 1) & (lab == 0)] = 0  # one clutter class stays air
    full, _ = warp(full, sp, rng, r)
    target = np.zeros(full.shape, np.int64)
    for k, v in enumerate(LABEL_VALUES[1:], start=1):
        target[full == v] = k
    chans, prior = [], rng.random() < P_PRIOR
    for contrast in CONTRASTS:  # every contrast its own mixture, acquisition and scanner
        img = prior_image(full, rng, contrast, r) if prior else gmm(full, rng, r)[0]
        img, _ = acquire(img, sp, rng, r)
        img, _ = scanner(img, rng, r)
        chans.append(img)
    geo = _seed(rng)  # one geometry for all four: the same draws from the same seed
    out = [reorient(c, target, affine, np.random.default_rng(geo), r) for c in chans]
    x = _normalize(np.stack([o[0] for o in out]) + 1e-3, "zscore")  # +1e-3: the bundle's zscore skips 0s
    return x, out[0][1].astype(np.int64)


def crop(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random ROI window (zero-padded where the volume is smaller), biased to the tumour."""
    pad = [(0, max(0, r - s)) for r, s in zip(ROI, y.shape)]
    x, y = np.pad(x, [(0, 0)] + pad), np.pad(y, pad)
    if (y > 0).any() and rng.random() < 0.8:
        pts = np.argwhere(y > 0)
        start = pts[rng.integers(len(pts))] - np.asarray(ROI) // 2 + rng.integers(-16, 17, 3)
    else:
        start = np.array([rng.integers(0, s - r + 1) for s, r in zip(y.shape, ROI)])
    start = np.clip(start, 0, np.asarray(y.shape) - ROI)
    sl = tuple(slice(s, s + r) for s, r in zip(start, ROI))
    return np.ascontiguousarray(x[(slice(None), *sl)]), np.ascontiguousarray(y[sl])


class Stream(torch.utils.data.IterableDataset):
    """Endless (image, target) windows: each synthesised volume gives ``reuse`` windows."""

    def __init__(self, n_maps: int, seed: int, reuse: int = 3) -> None:
        self.n_maps, self.seed, self.reuse = n_maps, seed, reuse

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        torch.set_num_threads(1)
        base = template()
        maps = [label_map(i, base) for i in range(self.n_maps)]
        rng = np.random.default_rng([self.seed, 0xB4])
        while True:
            x, y = draw(maps[int(rng.integers(len(maps)))], base[2], rng)
            for _ in range(self.reuse):
                xc, yc = crop(x, y, rng)
                yield torch.from_numpy(xc), torch.from_numpy(yc[None])


def train(args: argparse.Namespace) -> tuple[torch.nn.Module, dict[str, Any]]:
    from monai.bundle import ConfigParser
    from monai.losses import DiceCELoss

    torch.manual_seed(args.seed)
    net = ConfigParser({"network_def": NET_DEF}).get_parsed_content("network_def")
    if args.init:  # continue a finished run: same network, new image draws (pass another --seed)
        net.load_state_dict(torch.load(args.init / "models" / "model.pt", map_location="cpu"))
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    # Dice over the batch and over the tumour classes only: a crop without necrosis must not
    # teach "never predict necrosis" (per-sample Dice of an absent class punishes any voxel)
    loss_fn = DiceCELoss(to_onehot_y=True, softmax=True, include_background=False, batch=True)
    data = torch.utils.data.DataLoader(Stream(args.n_maps, args.seed), batch_size=args.batch,
                                       num_workers=args.workers, persistent_workers=args.workers > 0)
    t0, losses, step = time.time(), [], 0
    deadline = t0 + 60.0 * args.minutes if args.minutes else float("inf")
    for step, (x, y) in enumerate(data, start=1):
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % 200 == 0:
            log.info("step %d loss %.4f (%.0f s)", step, float(np.mean(losses[-200:])), time.time() - t0)
            torch.save(net.state_dict(), args.out / "checkpoint.pt")
        if step >= args.steps or time.time() > deadline:
            break
    return net.eval(), {"steps_done": step, "train_seconds": round(time.time() - t0, 1),
                        "final_loss": round(float(np.mean(losses[-200:])), 4)}


def _init_record(init: Path | None) -> dict[str, Any] | None:
    """What a continued run started from: the earlier bundle's version and its training record."""
    if init is None:
        return None
    meta = json.loads((init / "configs" / "metadata.json").read_text())
    return {"version": meta["version"], "training": meta["training"]}


def write_bundle(net: torch.nn.Module, args: argparse.Namespace, run: dict[str, Any]) -> None:
    out = args.out
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "models" / "model.pt")
    (out / "configs" / "inference.json").write_text(json.dumps({"network_def": NET_DEF}, indent=2) + "\n")
    shape = {"type": "image", "spatial_shape": list(ROI), "dtype": "float32"}
    meta = {"name": "brain_tumor_unet3d_dr", "version": args.version, "task": "brain tumour segmentation (BraTS labels)",
            "description": "3-D UNet for BraTS labels (1 necrotic core, 2 oedema, 4 enhancing) from T1, T1c, T2 and "
                           "FLAIR at 3 mm, trained by scripts/train_brain_dr.py (from scratch, or continued from an "
                           "earlier version: training.initialised_from) on domain-randomised "
                           "images synthesised from label maps (MNI152 anatomy, phantom and ellipsoid tumours). "
                           "Synthetic training only, not validated on patient scans. Not for clinical use.",
            "monai_version": __import__("monai").__version__,
            "bcer": {"spatial_dims": 3, "normalize": "zscore", "output": "argmax", "label_values": list(LABEL_VALUES),
                     "pixdim": [SPACING] * 3},
            "network_data_format": {
                "inputs": {"image": {**shape, "format": "magnitude", "modality": "MR", "num_channels": 4,
                                     "channel_def": dict(enumerate(CONTRASTS))}},
                "outputs": {"pred": {**shape, "format": "segmentation", "num_channels": 4,
                                     "channel_def": {0: "background", 1: "necrotic_core", 2: "oedema",
                                                     3: "enhancing"}}}},
            "training": {"script": "scripts/train_brain_dr.py", "steps": args.steps, **run, "batch": args.batch,
                         "initialised_from": _init_record(args.init),
                         "p_prior_contrast": P_PRIOR, "prior_jitter": PRIOR_JITTER,
                         "lr": args.lr, "n_label_maps": args.n_maps, "seed": args.seed,
                         "train_seeds": [TRAIN_SEED0, f"0..{args.n_maps - 1}"],
                         "label_sources": ["MNI152 tissue maps (nilearn)", "bcer.datasets.brain tumour shape model",
                                           "perturbed ellipsoid tumours (this script)"],
                         "randomisation_ranges": asdict(BRAIN_RANGES), "torch_threads": torch.get_num_threads(),
                         "data_workers": args.workers, "hardware": platform.machine() + ", CPU"}}
    (out / "configs" / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/brain_dr"))
    ap.add_argument("--steps", type=int, default=8000)
    ap.add_argument("--minutes", type=float, default=0.0, help="stop early after this many minutes (0: never)")
    ap.add_argument("--n-maps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--version", default="0.1.0")
    ap.add_argument("--init", type=Path, default=None, help="a bundle written by this script to continue from")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    net, run = train(args)
    write_bundle(net, args, run)
    (args.out / "checkpoint.pt").unlink(missing_ok=True)
    log.info("done: %s", run)


if __name__ == "__main__":
    main()
