"""Train the cardiac 2-D UNet on domain-randomised cines (SynthSeg recipe) and compare it
with the shipped bundle on a phantom family neither was trained on.

Training images are synthesised on the fly from label cines of the cardiac phantom
generator (``bcer.datasets.randomise``: random Gaussian mixture per label over random
background clutter, random resolution, slice thickness and gaps with partial voluming,
bias field, Rician noise, gamma, random affine and elastic warps, flips and field of view).
One draw per cine is shared by all its frames (one scanner, one patient), so the temporal
standard deviation channel of ``bcer.tools.seg.cardiac_net`` sees real motion only. Axis
permutations are off: the network reads short-axis slices. The network, its input channels,
pre-processing and training loop are ``scripts/train_bundle.py``'s (same ``NET_DEF``,
``PIXDIM``, crops and augmentation), so the two bundles differ only in their training images.

Label cines come from the cardiac generator's families (all five ACDC groups, every third
case borderline) and from the independent family's hearts (``bcer.datasets.independent``,
written apart from the cardiac generator; training seeds disjoint from its evaluation seeds),
used in turn (``--sources``). With ``--anatomy`` a generator cine is the whole thorax
(``bcer.datasets.cardiac_family.anatomy_label_cine``: heart, body, fat, lungs, aorta, liver,
pericardial fat, atrium, RV wall, each its own random contrast), as SynthSeg trains on whole
label maps; the independent hearts stay heart-only. ``--init`` fine-tunes given weights.
The folds: ``--sources randomised`` leaves the held-out and independent families out;
``randomised,independent`` the held-out family; ``heldout,independent --eval-family
randomised --init none`` the randomised family (every shipped weight saw it).

The evaluation (``--eval-cases``) runs the whole chain (``benchmarks/cardiac_families.py``'s
``run_case``: seg.cardiac's network -> cardiac.ed_es -> quant.cardiac_function ->
classify.cardiac_acdc) on ``--eval-family``, for the shipped bundle, the new one and any
``--also NAME=DIR``; with ``--steps 0`` it only scores. It measures only. Limitation: the
randomised and held-out families draw their hearts from the same heart model (another
acquisition and surroundings, not another shape model), so a fold between them leaves out
an acquisition family, not a shape model. A model trained with the independent hearts can
no longer be scored on the independent family.

Determinism: all draws come from seeded generators, torch runs deterministic algorithms on
``--threads`` threads. Usage::

    OMP_NUM_THREADS=1 python scripts/train_cardiac_dr.py --n-train 40 --max-train-s 480 --out /tmp/cardiac_dr
        [--eval-cases 8] [--result /tmp/cardiac_dr.json]
    # the whole-thorax member of the cardiac candidate 0.4.0 (benchmarks/models/cardiac_unet2d_ens)
    OMP_NUM_THREADS=2 python scripts/train_cardiac_dr.py --anatomy --lr 1e-3 --n-train 400 --steps 16000 \
        --init bcer/assets/bundles/cardiac_unet2d/models/model.pt --threads 2 --out /tmp/cardiac_anatomy

The weights are written to ``--out`` only; the shipped default bundle is replaced by hand, and
only by a model measured better on a family it never saw.
"""
from __future__ import annotations

import argparse
import importlib.util
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

from bcer.datasets.cardiac import GROUPS, make_cardiac
from bcer.datasets.cardiac_family import ANATOMY_LABELS, anatomy_label_cine
from bcer.datasets.independent import make_heart_case
from bcer.datasets.randomise import RANGES, synthesise
from bcer.tools.seg.bundle import WEIGHTS_OWN_KEYS

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "bcer" / "assets" / "bundles" / "cardiac_unet2d"
log = logging.getLogger("train_cardiac_dr")
# short-axis network: no axis permutation, in-plane resolution of cine MRI, thick SAX slices
CARDIAC_RANGES = replace(RANGES, permute=0.0, rotate_deg=10.0, inplane_mm=(1.2, 3.0), thickness_mm=(5.0, 10.0),
                         gap_mm=(0.0, 2.0), fov=(0.8, 1.0))
TRAIN_SEED0 = 200_000  # disjoint from train_bundle.py's 100_000... and every evaluation seed


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


TB = _load("train_bundle", ROOT / "scripts" / "train_bundle.py")


# label cines: the cardiac generator's families, or the independent hearts
SOURCES = ("randomised", "heldout", "independent")
FAMILIES = ("randomised", "heldout")
N_ANATOMY = len(ANATOMY_LABELS) + 1  # label values of a whole-anatomy cine, air (0) included
# the blood of a whole-anatomy cine: LV, RV, left atrium, aorta (one tissue on a scan)
BLOOD_POOLS = ((3, 1, 10, 7),)


def label_cine(i: int, source: str, anatomy: bool = False, thickening: bool = False, hypertrophy: bool = False
               ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The i-th training label cine of ``source``: (labels (X, Y, Z, T), affine, ED/ES frames);
    seeds disjoint from every evaluation. With ``anatomy`` a generator family's cine holds the
    whole thorax (``cardiac_family.ANATOMY_LABELS``: heart 1-3, every other structure its own
    code), so the network learns the heart against its real neighbours, not against noise.
    ``thickening``: each heart's systolic walls thicken by a gain between the phantoms' law and
    myocardial volume conservation; ``hypertrophy``: half the hearts get a concentric free wall
    up to 25 mm (``anatomy_label_cine``; whole-anatomy cines only)."""
    group = GROUPS[i % 5]
    if source == "independent":  # written apart from the cardiac generator (bcer.datasets.independent)
        ph = make_heart_case(f"dr{i:04d}", TRAIN_SEED0 + i, group)
    elif anatomy:
        return anatomy_label_cine(TRAIN_SEED0 + i, source, group, thickening=thickening, hypertrophy=hypertrophy)
    else:
        ph = make_cardiac(f"dr{i:04d}", TRAIN_SEED0 + i, "small", group=group, family=source, borderline=i % 3 == 2)
    seg = ph.labels["seg"]
    return np.asarray(seg.data), np.asarray(seg.affine), {k: int(ph.truth[k]) for k in ("ed_frame", "es_frame")}


def synth_cine(i: int, sources: tuple[str, ...] = ("randomised",), anatomy: bool = False, thickening: bool = False,
               blood: bool = False, hypertrophy: bool = False
               ) -> tuple[np.ndarray, np.ndarray, tuple[float, ...], dict[str, int]]:
    """A randomised cine (X, Y, Z, T), its targets (0 / 1 RV / 2 MYO / 3 LV) and spacing from
    the i-th label cine (sources in turn). ``blood``: in half the whole-anatomy cines the blood
    pools (``BLOOD_POOLS``) share one contrast, so the LV must be told from the atrium and the
    aorta by its shape and wall, not by a brightness of its own."""
    source = sources[i % len(sources)]
    seg, affine, truth = label_cine(i, source, anatomy, thickening, hypertrophy)
    # a whole-anatomy cine names its label count, so a structure missing from some frames (the
    # atrium) cannot shift the draws: every frame keeps the cine's one contrast per label
    n_labels = N_ANATOMY if anatomy and source != "independent" else None
    frames, labels = [], []
    for t in range(seg.shape[3]):  # one seed per cine: every frame gets the same draws
        s = synthesise(seg[..., t], affine, np.random.default_rng([TRAIN_SEED0, i]), CARDIAC_RANGES,
                       n_labels=n_labels, same_contrast=BLOOD_POOLS if blood and n_labels else ())
        frames.append(s.image)
        labels.append(np.where(s.labels <= 3, s.labels, 0))  # the heart is the target, the thorax is not
    sp = tuple(float(v) for v in np.linalg.norm(s.affine[:3, :3], axis=0))
    return np.stack(frames, -1), np.stack(labels, -1).astype(np.int16), sp, truth


def cine_samples(i: int, rng: np.random.Generator, sources: tuple[str, ...] = ("randomised",),
                 anatomy: bool = False, thickening: bool = False, blood: bool = False, hypertrophy: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Stored windows and labels of the i-th synthetic cine, as ``train_bundle.cine_samples``."""
    cine, seg, sp, truth = synth_cine(i, sources, anatomy, thickening, blood, hypertrophy)
    z, t = seg.shape[2], seg.shape[3]
    x, lab = TB.prepare(cine, sp, seg)
    centre = np.argwhere(lab > 0)[:, :2].mean(axis=0).astype(int)
    frames = {truth["ed_frame"], truth["es_frame"]}
    rest = [f for f in range(t) if f not in frames]
    frames |= set(rng.choice(rest, size=min(TB.FRAMES_PER_CINE - len(frames), len(rest)), replace=False).tolist())
    idx = [k * t + f for k in range(z) for f in sorted(frames)]
    xs = TB._window(np.moveaxis(x[..., idx], -1, 0), tuple(centre), TB.STORE)
    ys = TB._window(np.moveaxis(lab[..., idx], -1, 0), tuple(centre), TB.STORE)
    return xs.astype(np.float16), ys.astype(np.int8)


def write_bundle(net: torch.nn.Module, out: Path, args: argparse.Namespace, train_s: float) -> None:
    (out / "configs").mkdir(parents=True, exist_ok=True)
    (out / "models").mkdir(parents=True, exist_ok=True)
    torch.save(net.state_dict(), out / "models" / "model.pt")
    shipped = json.loads((SHIPPED / "configs" / "metadata.json").read_text())
    (out / "configs" / "inference.json").write_text(json.dumps({"network_def": TB.NET_DEF}, indent=2))
    # one network: the shipped bundle's ensemble members and its flag threshold are not this model's
    own = {k: v for k, v in shipped["bcer"].items() if k not in WEIGHTS_OWN_KEYS}
    meta = {**{k: shipped[k] for k in ("network_data_format", "task")}, "bcer": own,
            "name": "cardiac_unet2d_dr", "version": "0.0.1",
            "description": "2-D UNet for RV/MYO/LV on short-axis cine slices trained on domain-randomised synthetic "
                           "cines (scripts/train_cardiac_dr.py). Synthetic training only, not validated on patient "
                           "scans. Not for clinical use.",
            "monai_version": __import__("monai").__version__,
            "training": {"script": "scripts/train_cardiac_dr.py", "steps": args.steps, "batch": args.batch,
                         "lr": args.lr, "n_train_cines": args.n_train, "seed": args.seed,
                         "label_source": [{"randomised": "bcer.datasets.cardiac randomised family",
                                           "heldout": "bcer.datasets.cardiac held-out family",
                                           "independent": "bcer.datasets.independent hearts"}[k] for k in args.sources],
                         "whole_anatomy_cines": args.anatomy, "init": str(args.init),
                         "volume_thickening": args.thickening, "shared_blood_contrast": args.blood_pools,
                         "concentric_hypertrophy": args.hypertrophy,
                         "replay_cines": args.replay,
                         "train_seeds": [TRAIN_SEED0, TRAIN_SEED0 + args.n_train - 1],
                         "randomisation_ranges": asdict(CARDIAC_RANGES), "torch_threads": torch.get_num_threads(),
                         "train_seconds": round(train_s, 1), "hardware": platform.processor() or platform.machine()}}
    (out / "configs" / "metadata.json").write_text(json.dumps(meta, indent=2))


def evaluate(bundles: dict[str, str], n_cases: int, family: str = "heldout") -> dict[str, Any]:
    """Every bundle through the whole chain on the first ``n_cases`` cines of ``family``."""
    from bcer.datasets.cardiac import family_ranges  # noqa: F401  (the family table the benchmark reads)
    from bcer.tools.seg.bundle import clear_cache

    bench = _load("cardiac_families", ROOT / "benchmarks" / "cardiac_families.py")
    out: dict[str, Any] = {}
    for name, path in bundles.items():
        clear_cache()
        rows = []
        for i in range(n_cases):
            ph = make_cardiac(f"{family}{i:03d}", seed=i, size="small", group=GROUPS[i % 5], family=family)
            try:
                rows.append(bench.run_case(ph, path, method="network"))
            except Exception as e:  # a failed case is a row (counted wrong), not the end of the measurement
                rows.append({"case": ph.case_id, "group": ph.truth["group"], "error": f"{type(e).__name__}: {e}"})
        ok = [r for r in rows if "error" not in r]
        out[name] = {"per_case": rows, "summary": bench.summarise(ok) | {"failed_cases": len(rows) - len(ok)}}
        log.info("%s: %s", name, out[name]["summary"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/cardiac_dr"))
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--n-train", type=int, default=90)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-train-s", type=float, default=None)
    ap.add_argument("--eval-cases", type=int, default=0)
    ap.add_argument("--result", type=Path, default=None)
    ap.add_argument("--sources", default="randomised",
                    help=f"label cine sources, comma-separated, used in turn: {', '.join(SOURCES)} (randomised,"
                         "independent: the fold that leaves the held-out family out; heldout,independent with "
                         "--eval-family randomised: the fold that leaves the randomised family out)")
    ap.add_argument("--anatomy", action="store_true",
                    help="a generator family's label cines hold the whole thorax (every structure its own contrast)")
    ap.add_argument("--thickening", action="store_true",
                    help="with --anatomy: each heart's systolic walls thicken by a gain drawn between the phantoms' "
                         "slice-area law and myocardial volume conservation (cardiac_family.THICKENING_GAIN_MAX)")
    ap.add_argument("--blood-pools", action="store_true",
                    help="with --anatomy: in half the cines LV, RV, atrium and aorta share one random contrast")
    ap.add_argument("--hypertrophy", action="store_true",
                    help="with --anatomy: half the hearts get a concentric free wall drawn up to 25 mm "
                         "(cardiac_family.HYPERTROPHY_WALL_MAX_MM; the families' free walls end at 15 mm)")
    ap.add_argument("--replay", type=int, default=0, metavar="N",
                    help="also train on the first N training cines of the shipped network (train_bundle.py's "
                         "randomised-family phantoms, seeds from its TRAIN_SEED0): rehearsal, so fine-tuning on "
                         "randomised images does not forget the phantoms the ensemble's other member reads well")
    ap.add_argument("--init", default="none",
                    help="weights to start from (fine-tuning), e.g. the shipped models/model.pt; 'none': from scratch")
    ap.add_argument("--lr", type=float, default=3e-3, help="peak learning rate of the one-cycle schedule")
    ap.add_argument("--eval-family", default="heldout", choices=FAMILIES,
                    help="the generator family scored by --eval-cases (never one of --sources)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                    help="another bundle to score beside the shipped one (repeatable); with --steps 0 nothing is "
                         "trained and only these are scored")
    args = ap.parse_args()
    args.sources = tuple(args.sources.split(","))
    if not set(args.sources) <= set(SOURCES):
        ap.error(f"--sources must be among {SOURCES}")
    if args.thickening and not args.anatomy:
        ap.error("--thickening needs --anatomy (it applies to the generator's whole-anatomy cines)")
    if args.hypertrophy and not args.anatomy:
        ap.error("--hypertrophy needs --anatomy (it applies to the generator's whole-anatomy cines)")
    if args.blood_pools and not args.anatomy:
        ap.error("--blood-pools needs --anatomy (the atrium and the aorta are labelled in whole-anatomy cines only)")
    if any("=" not in a for a in args.also):
        ap.error("--also takes NAME=DIR")
    if args.eval_cases and args.eval_family in args.sources:
        ap.error(f"--eval-family {args.eval_family} is a training source: it would not be left out")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.time()
    prep_s = train_s = 0.0
    bundles = {"shipped": str(SHIPPED)}
    if args.steps > 0:
        rng = np.random.default_rng(args.seed)
        parts = [cine_samples(i, rng, args.sources, args.anatomy, args.thickening, args.blood_pools, args.hypertrophy)
                 for i in range(args.n_train)]
        parts += [TB.cine_samples(j, rng, {}) for j in range(args.replay)]
        x_all, y_all = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        prep_s = time.time() - t0
        log.info("%d synthetic slices from %d cines (%.0f s)", len(x_all), args.n_train, prep_s)
        init = None if args.init == "none" else Path(args.init)
        net, args.steps = TB.train(x_all, y_all, args.steps, args.seed, args.batch, args.max_train_s, init, args.lr)
        train_s = time.time() - t0
        write_bundle(net, args.out, args, train_s)
        bundles["domain_randomised"] = str(args.out)
    bundles |= dict(a.split("=", 1) for a in args.also)
    if args.eval_cases:
        res = evaluate(bundles, args.eval_cases, args.eval_family)
        record = {"setup": {"script": "scripts/train_cardiac_dr.py", "args": {k: str(v) for k, v in vars(args).items()},
                            "prep_seconds": round(prep_s, 1), "train_seconds": round(train_s, 1),
                            "hardware": f"{platform.machine()}, {args.threads} torch thread(s), shared 2-core machine",
                            "eval_family": f"cardiac {args.eval_family} family (bcer.datasets.cardiac_family), "
                                           f"seeds 0..{args.eval_cases - 1}, size small; no training source",
                            "shipped": json.loads((SHIPPED / "configs" / "metadata.json").read_text())["version"],
                            "bundles": bundles,
                            "label_sources": list(args.sources),
                            "note": "synthetic phantoms only; the randomised and held-out families share one heart "
                                    "shape model (they differ in acquisition and surroundings), so a fold that "
                                    "leaves one out leaves out an acquisition family, not a shape model"},
                  "cardiac": res}
        if args.result:
            args.result.write_text(json.dumps(record, indent=2, default=float))
        log.info("written %s", args.result)


if __name__ == "__main__":
    main()
