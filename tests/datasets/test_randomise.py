"""Domain randomisation (bcer.datasets.randomise): the statistics of what it draws."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from scipy import ndimage as ndi

from bcer.contracts.geometry import vox2world
from bcer.datasets.randomise import RANGES, SOURCES, acquire, gmm, reorient, synthesise, warp

AFF = np.diag([2.0, 2.0, 2.0, 1.0])


def _two_boxes() -> np.ndarray:
    lab = np.zeros((32, 32, 24), np.int16)
    lab[4:15, 6:26, 5:19] = 1
    lab[17:28, 6:26, 5:19] = 2
    return lab


def _interior_median(img: np.ndarray, lab: np.ndarray, v: int) -> float:
    return float(np.median(img[ndi.binary_erosion(lab == v, iterations=2)]))


def test_a_labels_intensity_varies_and_contrast_inverts_across_draws() -> None:
    """Any contrast occurs: label 1 is brighter than label 2 in some draws, darker in others;
    with the mean range pinned to one value the two stay equal (the control)."""
    lab = _two_boxes()
    diffs = []
    for seed in range(12):
        s = synthesise(lab, AFF, np.random.default_rng(seed), clutter_background=False)
        diffs.append(_interior_median(s.image, s.labels, 1) - _interior_median(s.image, s.labels, 2))
    diffs = np.asarray(diffs)
    assert (diffs > 0.1).any() and (diffs < -0.1).any() and diffs.std() > 0.15
    pinned = replace(RANGES, mean=(0.5, 0.5), std=(0.0, 0.0), noise=(0.0, 0.0), bias=0.0)
    s = synthesise(lab, AFF, np.random.default_rng(0), pinned, clutter_background=False)
    assert abs(_interior_median(s.image, s.labels, 1) - _interior_median(s.image, s.labels, 2)) < 0.02


def test_gmm_draws_one_gaussian_per_label() -> None:
    lab = _two_boxes()
    img, draws = gmm(lab, np.random.default_rng(5), RANGES)
    for v, (mu, sd) in draws.items():
        x = img[lab == v]
        assert x.mean() == pytest.approx(mu, abs=4 * sd / np.sqrt(x.size) + 1e-6)
        assert x.std() == pytest.approx(sd, rel=0.05, abs=1e-6)
        assert RANGES.mean[0] <= mu <= RANGES.mean[1] and RANGES.std[0] <= sd <= RANGES.std[1]


def test_labels_warp_and_move_with_the_image() -> None:
    """The image's edges are the returned labels' boundaries (after warp, blur, flips,
    permutation and crop), and the affine keeps every voxel's world position."""
    lab = _two_boxes()
    checked = 0
    for seed in range(40):
        s = synthesise(lab, AFF, np.random.default_rng(seed), clutter_background=False)
        assert s.image.shape == s.labels.shape
        means = [s.params["gmm"][k][0] for k in ("0", "1", "2")]
        if min(abs(a - b) for i, a in enumerate(means) for b in means[i + 1:]) < 0.25 or s.params["scanner"]["noise_sigma"] > 0.03:
            continue  # edges are only visible where the drawn contrast shows them above the noise
        grad = np.linalg.norm(np.stack(np.gradient(s.image)), axis=0)
        edge = ndi.binary_dilation(s.labels > 0) & ~ndi.binary_erosion(s.labels > 0)
        inside = ndi.binary_erosion(s.labels > 0, iterations=3)
        assert grad[edge].mean() > 3 * grad[inside].mean(), seed
        checked += 1
        if checked == 3:
            break
    assert checked == 3
    world_x = vox2world(AFF, np.indices(lab.shape).reshape(3, -1).T)[:, 0].reshape(lab.shape).astype(np.float32)
    for seed in range(6):
        img, out, aff, g = reorient(world_x, lab, AFF, np.random.default_rng(seed), RANGES)
        ijk = np.indices(img.shape).reshape(3, -1).T
        np.testing.assert_allclose(img.reshape(-1), vox2world(aff, ijk)[:, 0], atol=1e-4)
        assert out.shape == img.shape and set(np.unique(out)) <= {0, 1, 2}


def test_warp_affine_volume_and_elastic_displacement() -> None:
    """The affine part changes the volume by its determinant; the elastic field then moves
    the boundary (the same draws without it give another, but overlapping, shape)."""
    from bcer.metrics import dice

    lab = np.zeros((40, 40, 40), np.int16)
    lab[14:26, 14:26, 14:26] = 1  # room to rotate and grow inside the grid
    rigid = replace(RANGES, elastic_mm=0.0)
    for seed in range(3):
        out, p = warp(lab, np.array([2.0, 2.0, 2.0]), np.random.default_rng(seed), rigid)
        det = abs(np.linalg.det(np.asarray(p["affine_mm"])))
        assert np.count_nonzero(out) / np.count_nonzero(lab) == pytest.approx(det, rel=0.03)
        bent, _ = warp(lab, np.array([2.0, 2.0, 2.0]), np.random.default_rng(seed), RANGES)
        assert 0.6 < dice(bent > 0, out > 0) < 0.97


def test_thick_slices_blur_along_the_slice_axis_only() -> None:
    noise = np.random.default_rng(0).standard_normal((40, 40, 40)).astype(np.float32)
    thick = replace(RANGES, inplane_mm=(1.0, 1.0), thickness_mm=(6.0, 6.0), gap_mm=(1.0, 1.0))
    img, p = acquire(noise, np.array([1.0, 1.0, 1.0]), np.random.default_rng(3), thick)

    def lag1(ax: int) -> float:
        a, b = np.moveaxis(img, ax, 0)[:-1].ravel(), np.moveaxis(img, ax, 0)[1:].ravel()
        return float(np.corrcoef(a, b)[0, 1])

    corr = [lag1(ax) for ax in range(3)]
    assert int(np.argmax(corr)) == p["slice_axis"] and corr[p["slice_axis"]] > 0.9
    assert max(c for ax, c in enumerate(corr) if ax != p["slice_axis"]) < 0.3


def test_same_seed_same_sample_and_sources() -> None:
    lab = _two_boxes()
    a, b = (synthesise(lab, AFF, np.random.default_rng(9)) for _ in range(2))
    np.testing.assert_array_equal(a.image, b.image)
    np.testing.assert_array_equal(a.labels, b.labels)
    c = synthesise(lab, AFF, np.random.default_rng(10))
    assert a.image.shape != c.image.shape or not np.array_equal(a.image, c.image)
    for name, want in (("cardiac", {1, 2, 3}), ("prostate", {1, 2})):
        src, aff, names = SOURCES[name](3)
        assert want <= set(np.unique(src).tolist()) <= set(names) | {0}
        s = synthesise(src, aff, np.random.default_rng(0))
        assert set(np.unique(s.labels).tolist()) <= set(names) | {0} and 0.0 <= s.image.min() < s.image.max() <= 1.0


def test_n_labels_keeps_one_draw_per_label_when_a_label_is_missing() -> None:
    """Two frames of one cine, drawn with the same seed, where a structure (label 3) is present
    in one frame only: with ``n_labels`` the labels both frames hold get the same Gaussians;
    without it the absent label shifts the draws of the background clutter (the control)."""
    a = _two_boxes()
    a[20:26, 10:16, 8:12] = 3
    b = np.where(a == 3, 2, a).astype(np.int16)

    def draws(lab: np.ndarray, n_labels: int | None) -> dict[str, tuple]:
        return synthesise(lab, AFF, np.random.default_rng(7), n_labels=n_labels).params["gmm"]

    da, db = draws(a, 4), draws(b, 4)
    assert set(da) == set(db) and da == db  # every label value drawn in both, the same way
    na, nb = draws(a, None), draws(b, None)
    assert set(na) != set(nb) and [na[k] for k in ("0", "1", "2")] == [nb[k] for k in ("0", "1", "2")]
    assert na[str(max(map(int, na)))] != nb[str(max(map(int, nb)))]


def test_same_contrast_groups_share_a_draw_in_about_the_given_share_of_images() -> None:
    """``same_contrast``: a group of labels (one tissue) takes one draw with probability p, each
    its own otherwise; labels outside the group never share. Without a group nothing changes,
    draw for draw."""
    lab = _two_boxes()
    lab[10:14, 2:5, 2:5] = 3
    group = ((1, 3),)
    shared = []
    for seed in range(60):
        _, d = gmm(lab, np.random.default_rng(seed), RANGES, same_contrast=group, same_contrast_p=0.5)
        shared.append(d[1] == d[3])
        assert d[2] != d[1]  # not in the group
    assert 18 <= sum(shared) <= 42  # binomial(60, 0.5): about 30
    _, always = gmm(lab, np.random.default_rng(0), RANGES, same_contrast=group, same_contrast_p=1.0)
    _, never = gmm(lab, np.random.default_rng(0), RANGES, same_contrast=group, same_contrast_p=0.0)
    assert always[1] == always[3] and never[1] != never[3]
    img_a, d_a = gmm(lab, np.random.default_rng(7), RANGES)
    img_b, d_b = gmm(lab, np.random.default_rng(7), RANGES, same_contrast=())
    assert d_a == d_b and np.array_equal(img_a, img_b)
    s = synthesise(lab, AFF, np.random.default_rng(3), clutter_background=False, same_contrast=group,
                   same_contrast_p=1.0)
    assert s.params["gmm"]["1"] == s.params["gmm"]["3"]
