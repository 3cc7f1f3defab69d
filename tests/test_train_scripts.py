"""The brain-tumour training script's synthesis (scripts/train_brain_dr.py): four contrasts
on one geometry, targets that are the tumour labels, the two contrast modes."""
from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import ndimage

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_brain_dr.py"


@pytest.fixture(scope="module")
def T():
    spec = importlib.util.spec_from_file_location("train_brain_dr", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_brain_dr"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def base(T):
    return T.template()


def test_label_maps_hold_anatomy_and_tumours(T, base) -> None:
    tissue, brain, affine = base
    assert set(np.unique(tissue)) == {0, T.CSF, T.GM, T.WM}
    assert 1.2e6 < brain.sum() * T.SPACING ** 3 < 2.0e6  # an adult brain, 1.2-2.0 L, in mm³
    maps = [T.label_map(i, base) for i in range(12)]
    assert all(((m == 1) | (m == 2) | (m == 4))[~brain].sum() == 0 for m in maps)  # tumours inside the brain
    assert sum(bool(np.isin(m, (1, 2, 4)).any()) for m in maps) >= 9  # most maps carry a tumour
    assert any((m == T.SCALP).any() for m in maps) and any(not (m == T.SCALP).any() for m in maps)


def test_four_contrasts_share_one_geometry_and_the_targets(T, base, monkeypatch) -> None:
    """With blur, noise, bias and warps switched off every label is one constant per contrast:
    the within-label SD is 0 in all four channels exactly when image and target line up."""
    flat = dataclasses.replace(T.BRAIN_RANGES, noise=(0.0, 0.0), bias=0.0, std=(0.0, 0.0), inplane_mm=(0.5, 0.5),
                               thickness_mm=(0.5, 0.5), gap_mm=(0.0, 0.0), elastic_mm=0.0, rotate_deg=0.0,
                               scale=(1.0, 1.0), shear=0.0, gamma=(1.0, 1.0))
    monkeypatch.setattr(T, "BRAIN_RANGES", flat)
    lab = next(m for m in (T.label_map(i, base) for i in range(20)) if (m == 4).any() and (m == 1).any())
    x, y = T.draw(lab, base[2], np.random.default_rng(3))
    assert x.shape[0] == 4 and x.shape[1:] == y.shape and set(np.unique(y)) <= {0, 1, 2, 3}
    for k in (1, 2, 3):
        assert (y == k).sum() > 10
        assert max(float(x[c][y == k].std()) for c in range(4)) < 1e-5
    # the target counts equal the label map's (flips and permutations keep voxels; the field
    # of view may cut, never add)
    for k, v in ((1, 1), (2, 2), (3, 4)):
        assert 0 < (y == k).sum() <= (lab == v).sum()


def test_prior_draws_make_enhancing_brighter_on_t1c_than_t1(T, base) -> None:
    lab = next(m for m in (T.label_map(i, base) for i in range(20)) if (m == 4).any())
    rng, et, wm = np.random.default_rng(0), lab == 4, lab == T.WM
    ratio = {c: np.mean([(img := T.prior_image(lab, rng, c, T.BRAIN_RANGES))[et].mean() / img[wm].mean()
                         for _ in range(20)]) for c in ("T1", "T1c")}
    # the phantom's tables: enhancing/WM is 1.25/0.86 on T1c and 0.50/0.85 on T1 (jitter +-30 % each)
    assert ratio["T1c"] == pytest.approx(1.25 / 0.86, rel=0.15) and ratio["T1"] == pytest.approx(0.5 / 0.85, rel=0.15)


def _cardiac_script():
    spec = importlib.util.spec_from_file_location("train_cardiac_dr", SCRIPT.with_name("train_cardiac_dr.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_cardiac_dr"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_cardiac_fold_draws_label_cines_from_both_sources() -> None:
    """scripts/train_cardiac_dr.py --sources randomised,independent: cines alternate between the
    cardiac generator's randomised family and the independent hearts; each synthesised cine's
    labels keep the LV larger at the truth's ED frame than at its ES frame."""
    from bcer.datasets.cardiac import GROUPS
    from bcer.datasets.independent import make_heart_case

    mod = _cardiac_script()
    both = ("randomised", "independent")
    heart = make_heart_case("dr0001", mod.TRAIN_SEED0 + 1, GROUPS[1])
    np.testing.assert_array_equal(mod.label_cine(1, "independent")[0], np.asarray(heart.labels["seg"].data))
    for i in (0, 1):
        cine, seg, sp, truth = mod.synth_cine(i, both)
        assert cine.shape == seg.shape and set(np.unique(seg)) == {0, 1, 2, 3} and len(sp) == 3
        lv = (seg == 3).sum(axis=(0, 1, 2))
        assert lv[truth["ed_frame"]] > lv[truth["es_frame"]]


def test_cardiac_whole_anatomy_cines_share_one_contrast_and_keep_the_heart_targets() -> None:
    """--anatomy: a generator cine holds the thorax; its synthesised frames share one draw per
    label (the static body has the same intensity in every frame, so the temporal-std channel
    sees motion only), and the targets are exactly the heart's labels after the same warp."""
    from bcer.datasets.cardiac_family import ANATOMY_LABELS

    mod = _cardiac_script()
    lab, _, truth = mod.label_cine(0, "randomised", anatomy=True)
    assert len(np.unique(lab)) >= 7 and lab.max() <= max(ANATOMY_LABELS)
    cine, seg, _, t2 = mod.synth_cine(0, ("randomised",), anatomy=True)
    assert t2 == truth and set(np.unique(seg)) == {0, 1, 2, 3}
    moving = (seg != seg[..., :1]).any(axis=-1)
    still = ~ndimage.binary_dilation(moving | (seg > 0).any(axis=-1), iterations=3)
    # away from the beating heart every frame is the same image up to the per-frame noise
    noise = np.std(cine[still], axis=-1).mean()
    assert noise < 0.2 * np.std(cine[still][:, 0])
    lv = (seg == 3).sum(axis=(0, 1, 2))
    assert lv[truth["ed_frame"]] > lv[truth["es_frame"]]


def test_cardiac_thickening_cines_reach_the_synthesis_and_need_anatomy() -> None:
    """--thickening: the script's label cine is anatomy_label_cine(thickening=True) (same LV,
    thicker systolic wall); without --anatomy it is a usage error, before anything is built."""
    import subprocess

    from bcer.datasets.cardiac_family import anatomy_label_cine

    mod = _cardiac_script()
    lab, _, truth = mod.label_cine(2, "randomised", anatomy=True, thickening=True)
    want, _, _ = anatomy_label_cine(mod.TRAIN_SEED0 + 2, "randomised", mod.GROUPS[2], thickening=True)
    np.testing.assert_array_equal(lab, want)
    plain, _, _ = mod.label_cine(2, "randomised", anatomy=True)
    es = truth["es_frame"]
    assert (lab[..., es] == 2).sum() > (plain[..., es] == 2).sum()
    done = subprocess.run([sys.executable, str(SCRIPT.with_name("train_cardiac_dr.py")), "--thickening", "--steps", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--thickening needs --anatomy" in done.stderr
    done = subprocess.run([sys.executable, str(SCRIPT.with_name("train_cardiac_dr.py")), "--blood-pools", "--steps", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "--blood-pools needs --anatomy" in done.stderr


def test_cardiac_blood_pools_share_one_contrast_in_about_half_the_cines(monkeypatch) -> None:
    """--blood-pools: the script asks synthesise for the LV, RV, atrium and aorta as one tissue
    on whole-anatomy cines only; drawn per cine, so every frame of a cine agrees."""
    mod = _cardiac_script()
    seen = []
    real = mod.synthesise

    def spy(*a, **k):
        out = real(*a, **k)
        g = out.params["gmm"]
        seen.append((k.get("same_contrast"), len({tuple(g[str(v)]) for v in (3, 1, 10, 7) if str(v) in g})))
        return out
    monkeypatch.setattr(mod, "synthesise", spy)
    mod.synth_cine(0, ("randomised",), anatomy=True, blood=True)
    assert seen and all(sc == mod.BLOOD_POOLS for sc, _ in seen)
    assert len({n for _, n in seen}) == 1  # one decision per cine, the same in every frame
    seen.clear()
    mod.synth_cine(0, ("randomised",), anatomy=True)
    assert all(sc == () for sc, _ in seen)


def test_prostate_script_label_sources_and_whole_anatomy_targets() -> None:
    """scripts/train_prostate_dr.py: the fold that leaves the held-out family out takes label maps in
    turn from the randomised family and independent glands; with --anatomy a generator map holds
    the whole pelvis and its table sends exactly the PZ, TZ and lesion labels to their zones."""
    spec = importlib.util.spec_from_file_location("train_prostate_dr", SCRIPT.with_name("train_prostate_dr.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["train_prostate_dr"] = mod
    spec.loader.exec_module(mod)
    from bcer.datasets.prostate_family import anatomy_label_map

    fold = ("randomised", "independent")
    for i in (0, 1):
        lab, _, lut = mod.label_map(i, fold)
        assert set(np.unique(lab)) <= {0, 1, 2, 3, 4} and list(lut) == [0, 1, 2, 1, 2]
    lab, affine, lut = mod.label_map(2, ("randomised",), anatomy=True)
    _, zones, _ = anatomy_label_map(mod.TRAIN_SEED0 + 2, "randomised", 2)
    np.testing.assert_array_equal(lut[lab], zones)
    assert len(np.unique(lab)) > 8  # the pelvis around the gland, not the zones alone
    x, y = mod.draw(lab, affine, lut, np.random.default_rng(0))
    assert x.shape == y.shape and set(np.unique(y)) == {0, 1, 2}


def test_prostate_anatomy_sizes_span_more_glands_than_the_family() -> None:
    """--anatomy-sizes: the label maps' glands and transition zones come from ANATOMY_SIZES (adult
    anatomy), so over the same seeds they reach larger glands and smaller transition-zone shares
    than the randomised family's own ranges; the family's ranges are restored afterwards."""
    from bcer.datasets.prostate import FAMILIES

    mod = sys.modules.get("train_prostate_dr")
    if mod is None:
        spec = importlib.util.spec_from_file_location("train_prostate_dr", SCRIPT.with_name("train_prostate_dr.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules["train_prostate_dr"] = mod
        spec.loader.exec_module(mod)
    before = dict(FAMILIES["randomised"])

    def glands(sizes: bool) -> list[tuple[float, float]]:
        out = []
        for i in range(0, 24, 3):
            lab, affine, lut = mod.label_map(i, ("randomised",), anatomy=True, sizes=sizes)
            target, ml = lut[lab], abs(np.linalg.det(affine[:3, :3])) / 1000.0
            pz, tz = np.count_nonzero(target == 1) * ml, np.count_nonzero(target == 2) * ml
            out.append((pz + tz, pz / (pz + tz)))
        return out

    family, anatomy = glands(False), glands(True)
    assert FAMILIES["randomised"] == before
    assert max(g for g, _ in anatomy) > max(g for g, _ in family) + 5  # mL
    assert max(s for _, s in anatomy) > max(s for _, s in family) + 0.05  # PZ share of the gland
