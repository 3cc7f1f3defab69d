"""Retrain the prostate zonal network on domain-randomised images (SynthSeg recipe) and judge it
once, against the shipped bundle, on the independent family neither was trained on.

Training images are synthesised on the fly from label maps (``bcer.datasets.randomise.synthesise``:
random background clutter, a random Gaussian mixture per label so any contrast order occurs,
random affine and elastic warps, random acquired resolution, slice thickness and gaps with
partial voluming, bias field, Rician noise, gamma, random flips, axis permutations and field
of view). Every batch element is a fresh draw; no image is seen twice. The synthetic volume
then takes the tool's own inference path (``prostate_net.canonical_grid`` / ``to_canonical`` /
``zscore``), so permuted and flipped grids are learnt exactly as ``seg.prostate`` will meet them.

Label maps: the prostate generator's ``randomised`` and ``heldout`` families (two parameter
tables of one pelvis shape model; glands with 0-2 lesions). A lesion is its own label when the
image is drawn (so it gets its own random contrast) and belongs to its zone in the target.
The independent family (``bcer.datasets.independent.gland``: another shape model, another image
model) is never generated here: it is the left-out family, scored once at the end
(``--eval-cases``) by gland / PZ / TZ Dice through ``prostate_net.segment`` for the shipped
bundle and the new one.

Other folds: ``--families randomised,independent --eval-family heldout`` takes its label maps in
turn from the generator's randomised family and from independent glands (zones and lesions of
``make_gland_case`` at seeds from 50_000, disjoint from its evaluation seeds 0-999 and 1000-1999)
and leaves the generator's ``heldout`` family out; it is scored on held-out prostates at seeds
from 60_000 (never a training seed). The held-out family shares the pelvis shape model with the
randomised family, so this fold leaves out an acquisition and parameter family, not a shape model.

The network, crops and loss are ``scripts/train_prostate_bundle.py``'s (same ``NET_DEF``,
``ROI``, ``_crop``); training starts from the shipped weights (``--init``; ``--init none`` starts
from scratch). Seeded: the label maps, every draw and torch. Usage::

    OMP_NUM_THREADS=1 python scripts/train_prostate_dr.py --steps 6000 --out /tmp/prostate_dr \
        [--eval-cases 12] [--result /tmp/prostate_dr.json]

The weights go to ``--out`` only; the shipped default is replaced by hand, and only by a model
measured better on the family it never saw.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bcer.datasets.prostate import make_prostate
from bcer.datasets.randomise import RANGES, synthesise
from bcer.tools.seg.bundle import WEIGHTS_OWN_KEYS
from bcer.tools.seg.prostate_net import CANONICAL_SPACING, canonical_grid, segment, to_canonical, zscore

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "bcer" / "assets" / "bundles" / "prostate_unet3d"
log = logging.getLogger("train_prostate_dr")
# prostate T2w: any acquisition plane (the canonical grid undoes permutations), thin to thick slices
PROSTATE_RANGES = replace(RANGES, inplane_mm=(0.5, 2.5), thickness_mm=(2.0, 6.0), gap_mm=(0.0, 1.0), fov=(0.75, 1.0))
TRAIN_SEED0 = 40_000  # disjoint from train_prostate_bundle.py's 20_000 / 30_000 and every evaluation seed
FAMILIES = ("randomised", "heldout")  # the default fold: the independent family is left out
SOURCES = ("randomised", "heldout", "independent")
INDEPENDENT_SEED0, HELDOUT_EVAL_SEED0 = 50_000, 60_000
sys.path.insert(0, str(ROOT / "scripts"))  # the sibling trainer, whatever the working folder
import train_prostate_bundle as TP  # noqa: E402  (its network, crops and training loop)



ZONES_LUT = np.array([0, 1, 2, 1, 2])  # label -> target of the zones-only maps (a lesion joins its zone)
# --anatomy-sizes: gland and transition-zone sizes from adult anatomy, not from one generator
# family. Adult prostates hold about 12-85 mL (a small normal gland to benign hyperplasia); the
# transition zone is 5-10 % of a young man's gland and grows to over half of it with hyperplasia.
# Semi-axes (left-right, antero-posterior, cranio-caudal) of 17-32 x 12-23 x 14-27 mm give
# 12-83 mL; a TZ scale of 0.40-0.85 per axis gives a TZ share of about 6-60 %. The generator's
# randomised family spans 12-45 mL and 22-40 % (its PZ share, 60-78 %, is narrower than anatomy's).
ANATOMY_SIZES = {"gland_semi_mm": ((17, 32), (12, 23), (14, 27)), "tz_scale": (0.40, 0.85)}


def anatomy_map(i: int, fam: str, sizes: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The i-th whole-pelvis label map of a generator family (every tissue its own label), its
    affine and its label -> target table. ``sizes``: glands and zones drawn from
    ``ANATOMY_SIZES`` instead of the family's ranges (a draw whose gland no field of view
    holds is replaced by the next seed of its own stream, ``+ 100_000``)."""
    from contextlib import nullcontext

    from bcer.contracts.errors import ToolError
    from bcer.datasets.pelvis import PELVIS_TISSUES
    from bcer.datasets.prostate import family_ranges
    from bcer.datasets.prostate_family import anatomy_label_map

    tissues = list(PELVIS_TISSUES)
    size = "full" if i % 10 == 9 else "small"
    with family_ranges(fam, **ANATOMY_SIZES) if sizes else nullcontext():
        for k in range(8):
            try:
                lab, _, affine = anatomy_label_map(TRAIN_SEED0 + i + 100_000 * k, fam, i % 3, size)
                break
            except ToolError:
                if k == 7:
                    raise
    lut = np.zeros(len(tissues) + 2 * 3 + 1, np.int64)  # up to 3 lesions, in PZ or TZ
    lut[tissues.index("PZ")], lut[tissues.index("TZ")] = 1, 2
    lut[len(tissues) + 1::2], lut[len(tissues) + 2::2] = 1, 2
    return lab, affine, lut


def label_map(i: int, families: tuple[str, ...] = FAMILIES, anatomy: bool = False, sizes: bool = False
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The i-th label map, its affine and its label -> target (0, 1 PZ, 2 TZ) table. Zones-only
    maps: 1 PZ, 2 TZ, 3 lesion in PZ, 4 lesion in TZ. With ``anatomy`` a generator family's map
    holds the whole pelvis (:func:`anatomy_map`)."""
    fam = families[i % len(families)]
    if anatomy and fam != "independent":
        return anatomy_map(i, fam, sizes)
    if fam == "independent":
        from bcer.datasets.independent import make_gland_case  # another shape model (the fold that leaves heldout out)
        ph = make_gland_case(f"dr{i:04d}", INDEPENDENT_SEED0 + i, i % 3)
    else:
        size = "full" if i % 10 == 9 else "small"
        ph = make_prostate(f"dr{i:04d}", TRAIN_SEED0 + i, size, n_lesions=i % 3, family=fam)
    zones, les = np.asarray(ph.labels["zones"].data), np.asarray(ph.labels["lesions"].data) > 0
    lab = np.where(les, zones + 2, zones).astype(np.int16)
    lab[les & (zones == 0)] = 0  # a lesion voxel outside both zones stays background, as in the target
    return lab, np.asarray(ph.labels["zones"].affine, np.float64), ZONES_LUT


def draw(lab: np.ndarray, affine: np.ndarray, lut: np.ndarray, rng: np.random.Generator
         ) -> tuple[np.ndarray, np.ndarray]:
    """One randomised image of a label map on the canonical grid: (z-scored image, targets 0/1/2)."""
    s = synthesise(lab, affine, rng, PROSTATE_RANGES)
    grid = canonical_grid(s.affine, s.image.shape, CANONICAL_SPACING)
    img = zscore(to_canonical(s.image + 1e-3, s.affine, grid))  # +1e-3: only outside the field of view is 0
    target = lut[s.labels]
    onehot = np.stack([to_canonical((target == k).astype(np.float32), s.affine, grid, smooth=False) for k in range(3)])
    onehot[0] += 1e-3
    return img, np.argmax(onehot, axis=0).astype(np.int64)


class Randomised:
    """The training set as ``TP.train`` indexes it: item k is a fresh random image of label map k.

    Each access draws from the set's own seeded generator, so a run is reproducible while no
    image repeats."""

    def __init__(self, maps: list[tuple[np.ndarray, np.ndarray]], seed: int) -> None:
        self.maps, self.rng = maps, np.random.default_rng([seed, 0xD0])

    def __len__(self) -> int:
        return len(self.maps)

    def __getitem__(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        return draw(*self.maps[k], self.rng)


def write_bundle(net: torch.nn.Module, out: Path, args: argparse.Namespace, train_s: float) -> None:
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "models" / "model.pt")
    shipped = json.loads((SHIPPED / "configs" / "metadata.json").read_text())
    (out / "configs" / "inference.json").write_text(json.dumps({"network_def": TP.NET_DEF}, indent=2) + "\n")
    # one network: the shipped bundle's ensemble members and its flag threshold are not this model's
    own = {k: v for k, v in shipped["bcer"].items() if k not in WEIGHTS_OWN_KEYS}
    meta = {**{k: shipped[k] for k in ("network_data_format", "task")}, "bcer": own,
            "name": "prostate_unet3d", "version": args.version,
            "description": "3-D UNet for the prostate peripheral (1) and transition (2) zones on T2w, on a canonical "
                           "RAS grid at 2 x 2 x 3 mm; fine-tuned by scripts/train_prostate_dr.py on domain-randomised "
                           "images synthesised from label maps (" + " + ".join(args.families) + "; 'independent' is "
                           "bcer.datasets.independent, the others bcer's prostate generator). Synthetic training "
                           "only, not validated on patient scans. Not for clinical use.",
            "monai_version": __import__("monai").__version__,
            "training": {"script": "scripts/train_prostate_dr.py", "steps": args.steps, "batch": 2, "lr": args.lr,
                         "n_label_maps": args.n_maps, "label_families": list(args.families),
                         "whole_anatomy_maps": args.anatomy, "seed": args.seed,
                         "anatomy_sizes": ANATOMY_SIZES if args.anatomy_sizes else None,
                         "train_seeds": [TRAIN_SEED0, TRAIN_SEED0 + args.n_maps - 1],
                         "randomisation_ranges": asdict(PROSTATE_RANGES), "init": str(args.init),
                         "torch_threads": torch.get_num_threads(), "train_seconds": round(train_s, 1),
                         "hardware": platform.machine() + ", CPU"}}
    (out / "configs" / "metadata.json").write_text(json.dumps(meta, indent=2) + "\n")


def eval_cases(family: str, n_cases: int) -> list[Any]:
    """The left-out family's first ``n_cases`` cases (seeds no fold trains on)."""
    if family == "independent":
        from bcer.datasets.independent import phantoms
        return list(phantoms("prostate_report", n_cases))
    return [make_prostate(f"ho{i:03d}", HELDOUT_EVAL_SEED0 + i, "small", n_lesions=i % 3, family=family)
            for i in range(n_cases)]


def evaluate(bundles: dict[str, Path], n_cases: int, family: str = "independent") -> dict[str, Any]:
    """Gland / PZ / TZ Dice of each bundle on the first ``n_cases`` cases of the left-out family."""
    from bcer.tools.seg.bundle import clear_cache

    cases = eval_cases(family, n_cases)
    out: dict[str, Any] = {}
    for name, path in bundles.items():
        clear_cache()
        rows = []
        for ph in cases:
            zones, _ = segment(ph.sequences["T2w"], path)
            truth = np.asarray(ph.labels["zones"].data)
            rows.append({"case": ph.case_id, **{k: round(v, 4) for k, v in TP.zone_dice(zones, truth).items()}})
        mean = {k: round(float(np.mean([r[k] for r in rows])), 4) for k in ("gland", "PZ", "TZ")}
        out[name] = {"mean_dice": mean, "gland_min": min(r["gland"] for r in rows), "per_case": rows}
        log.info("%s on the %s family: %s", name, family, mean)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/prostate_dr"))
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--n-maps", type=int, default=160)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--init", default=str(SHIPPED / "models" / "model.pt"), help="weights to start from, or 'none'")
    ap.add_argument("--version", default="0.3.0")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help=f"label-map sources, comma-separated, used in turn: {', '.join(SOURCES)}")
    ap.add_argument("--anatomy", action="store_true",
                    help="generator-family label maps hold the whole pelvis, every tissue its own label (SynthSeg's "
                         "full label maps), instead of the zones alone against random clutter")
    ap.add_argument("--anatomy-sizes", action="store_true",
                    help="with --anatomy: glands of 12-83 mL with a transition zone of about 6-60 %% of the gland "
                         "(adult anatomy, ANATOMY_SIZES) instead of the generator family's sizes")
    ap.add_argument("--eval-family", default="independent", choices=SOURCES,
                    help="the left-out family scored at the end (must not be among --families)")
    ap.add_argument("--eval-cases", type=int, default=0)
    ap.add_argument("--result", type=Path, default=None)
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                    help="score this bundle too at the end (repeatable), beside the shipped one and the new one")
    args = ap.parse_args()
    args.families = tuple(args.families.split(","))
    if not set(args.families) <= set(SOURCES) or args.eval_family in args.families:
        ap.error(f"--families must be among {SOURCES} and leave --eval-family out")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    t0 = time.time()
    if args.steps:  # --steps 0: only score the bundle already in --out (and --also)
        if args.anatomy_sizes and not args.anatomy:
            ap.error("--anatomy-sizes needs --anatomy")
        maps = [label_map(i, args.families, args.anatomy, args.anatomy_sizes) for i in range(args.n_maps)]
        log.info("%d label maps (%.0f s)", len(maps), time.time() - t0)
        args.out.mkdir(parents=True, exist_ok=True)
        init = None if args.init == "none" else Path(args.init)
        net = TP.train(Randomised(maps, args.seed), args.steps, args.seed, init=init,
                       checkpoint=args.out / "checkpoint.pt", lr=args.lr)
        write_bundle(net, args.out, args, time.time() - t0)
        (args.out / "checkpoint.pt").unlink(missing_ok=True)
    # a scoring-only run reports the training time its bundle's metadata recorded
    train_s = (time.time() - t0 if args.steps else
               json.loads((args.out / "configs" / "metadata.json").read_text())["training"]["train_seconds"])
    if args.eval_cases:
        bundles = {"shipped": SHIPPED, "domain_randomised": args.out,
                   **{k: Path(v) for k, v in (a.split("=", 1) for a in args.also)}}
        res = evaluate(bundles, args.eval_cases, args.eval_family)
        record = {"script": "scripts/train_prostate_dr.py", "args": {k: str(v) for k, v in vars(args).items()},
                  "train_seconds": round(train_s, 1), "hardware": f"{platform.machine()}, {args.threads} torch thread(s)",
                  "eval_family": f"{args.eval_family}: the first {args.eval_cases} cases (never trained on)",
                  "note": "synthetic phantoms only", "results": res}
        (args.result or args.out / "independent_eval.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
