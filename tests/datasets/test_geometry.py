"""Phantom geometry and degradation helpers: exact against analytic ground truth."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Image, Mask
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world, world2vox
from bcer.datasets.degrade import (bias_field, downsample_through_plane, move_image, rician_noise,
                                   rigid_matrix, rigid_params)
from bcer.datasets.geometry import grid_center, make_affine, random_direction, world_coords
from bcer.tools.resample import sample_on_grid

GRAD = np.array([0.7, -1.3, 2.1])


def _linear(world: np.ndarray) -> np.ndarray:
    """A linear function of world position: linear interpolation reproduces it exactly."""
    return (world @ GRAD + 5.0).astype(np.float32)


@pytest.fixture()
def oblique_grid():
    rng = np.random.default_rng(7)
    d = random_direction(rng, oblique_deg=15.0)
    shape = (24, 20, 14)
    return make_affine(d, (2.0, 2.5, 3.0), shape, (10.0, -5.0, 3.0)), shape


def test_world_coords_match_vox2world(oblique_grid):
    a, shape = oblique_grid
    w = world_coords(a, shape)
    assert w.shape == shape + (3,)
    for ijk in [(0, 0, 0), (23, 19, 13), (5, 7, 11)]:
        np.testing.assert_allclose(w[ijk], vox2world(a, ijk), atol=1e-9)


@pytest.mark.parametrize("permute", [False, True])
def test_random_direction_is_orthonormal_and_not_identity(permute):
    rng = np.random.default_rng(3)
    for _ in range(20):
        d = random_direction(rng, oblique_deg=12.0, flips=True, permute=permute)
        np.testing.assert_allclose(d.T @ d, np.eye(3), atol=1e-12)
        assert abs(abs(np.linalg.det(d)) - 1.0) < 1e-12
        assert not np.allclose(d, np.eye(3))
    d = random_direction(rng, oblique_deg=0.0, flips=False)
    np.testing.assert_allclose(d, np.eye(3))


def test_make_affine_centres_grid_and_keeps_spacing(oblique_grid):
    a, shape = oblique_grid
    np.testing.assert_allclose(grid_center(a, shape), [10.0, -5.0, 3.0], atol=1e-9)
    np.testing.assert_allclose(np.linalg.norm(a[:3, :3], axis=0), [2.0, 2.5, 3.0], atol=1e-12)


def test_sample_on_grid_reproduces_linear_field(oblique_grid):
    src_a, src_shape = oblique_grid
    src = _linear(world_coords(src_a, src_shape))
    rng = np.random.default_rng(11)
    dst_a = make_affine(random_direction(rng, 20.0), (1.7, 1.7, 2.2), (12, 10, 8), (10.0, -5.0, 3.0))
    out = sample_on_grid(src, src_a, dst_a, (12, 10, 8), order=1, cval=-1.0)
    truth = _linear(world_coords(dst_a, (12, 10, 8)))
    # every destination voxel of this small grid lies well inside the source grid
    inside = np.all((world2vox(src_a, world_coords(dst_a, (12, 10, 8)).reshape(-1, 3)) > 0)
                    & (world2vox(src_a, world_coords(dst_a, (12, 10, 8)).reshape(-1, 3))
                       < np.array(src_shape) - 1), axis=1)
    assert inside.all()
    np.testing.assert_allclose(out, truth, atol=1e-3)
    # outside the source, cval
    far = make_affine(np.eye(3), (1.0, 1.0, 1.0), (2, 2, 2), (500.0, 0.0, 0.0))
    assert np.all(sample_on_grid(src, src_a, far, (2, 2, 2), cval=-1.0) == -1.0)


def test_sample_on_grid_labels_and_time_axis(oblique_grid):
    a, shape = oblique_grid
    lab = np.zeros(shape, dtype=np.int16)
    lab[5:15, 4:12, 3:9] = 4
    same = sample_on_grid(lab, a, a, shape, order=0)
    assert same.dtype == np.int16 and np.array_equal(same, lab)
    cine = np.stack([lab * t for t in range(3)], axis=-1)
    out = sample_on_grid(cine, a, a, shape, order=0)
    assert out.shape == shape + (3,) and np.array_equal(out[..., 2], lab * 2)


def test_rigid_matrix_rotates_about_centre_and_round_trips():
    c = np.array([10.0, -20.0, 5.0])
    m = rigid_matrix((0.0, 0.0, 90.0), (1.0, 2.0, 3.0), c)
    np.testing.assert_allclose(m[:3, :3] @ c + m[:3, 3], c + [1.0, 2.0, 3.0], atol=1e-12)
    # 90 deg about S maps +x (R) onto +y (A), right-handed
    p = c + [10.0, 0.0, 0.0]
    np.testing.assert_allclose(m[:3, :3] @ p + m[:3, 3], c + [0.0, 10.0, 0.0] + [1.0, 2.0, 3.0], atol=1e-9)
    m2 = rigid_matrix((4.0, -3.0, 6.0), (2.0, -1.0, 0.5), c)
    back = rigid_params(m2, c)
    np.testing.assert_allclose(back["rotation_deg"], [4.0, -3.0, 6.0], atol=1e-9)
    np.testing.assert_allclose(back["translation_mm"], [2.0, -1.0, 0.5], atol=1e-9)


def test_move_image_moves_content_by_matrix(oblique_grid):
    """moved(M @ p) == image(p): for a linear field f, moved(q) = f(M^-1 q)."""
    a, shape = oblique_grid
    w = world_coords(a, shape)
    img = Image(_linear(w), a)
    m = rigid_matrix((3.0, -2.0, 5.0), (2.0, -3.0, 1.5), grid_center(a, shape))
    moved = move_image(img, m)
    assert np.array_equal(moved.affine, a) and moved.shape == img.shape
    inv = np.linalg.inv(m)
    expect = _linear(w @ inv[:3, :3].T + inv[:3, 3])
    core = (slice(4, -4), slice(4, -4), slice(3, -3))
    np.testing.assert_allclose(moved.data[core], expect[core], atol=1e-3)
    # a blob's centroid follows M
    blob = np.exp(-np.sum((w - grid_center(a, shape)) ** 2, axis=-1) / (2 * 4.0 ** 2)).astype(np.float32)
    mb = move_image(Image(blob, a), m).data

    def centroid(x: np.ndarray) -> np.ndarray:
        return (w * x[..., None]).sum(axis=(0, 1, 2)) / x.sum()

    want = m[:3, :3] @ centroid(blob) + m[:3, 3]
    assert np.linalg.norm(centroid(mb) - want) < 0.3
    lab = Mask((blob > 0.5).astype(np.int16), a, labels={1: "blob"})
    ml = move_image(lab, m)
    assert isinstance(ml, Mask) and set(np.unique(ml.data)) <= {0, 1} and ml.labels == {1: "blob"}


def test_downsample_through_plane_keeps_register(oblique_grid):
    a, shape = oblique_grid
    img = Image(_linear(world_coords(a, shape)), a)
    lo = downsample_through_plane(img, 4, axis=2)
    assert lo.shape == (24, 20, 3)
    np.testing.assert_allclose(lo.spacing, (2.0, 2.5, 12.0), atol=1e-9)
    # the mean of a linear field over a slab is its value at the slab centre
    np.testing.assert_allclose(lo.data, _linear(world_coords(lo.affine, lo.shape)), atol=1e-3)
    lo1 = downsample_through_plane(img, 2, axis=0)
    np.testing.assert_allclose(lo1.data, _linear(world_coords(lo1.affine, lo1.shape)), atol=1e-3)
    with pytest.raises(ToolError) as e:
        downsample_through_plane(img, 20, axis=2)
    assert e.value.code == ErrorCode.shape


def test_bias_field_is_smooth_positive_mean_one():
    rng = np.random.default_rng(5)
    f = bias_field((30, 34, 20), rng, strength=0.3)
    assert f.shape == (30, 34, 20) and f.dtype == np.float32
    assert abs(float(f.mean()) - 1.0) < 1e-5 and float(f.min()) > 0.0
    assert 1.1 < float(f.max() / f.min()) < np.exp(0.6) + 1e-3  # peak |log| is the strength
    assert max(float(np.abs(np.diff(f, axis=k)).max()) for k in range(3)) < 0.1  # smooth
    assert np.all(bias_field((4, 4, 4), rng, 0.0) == 1.0)


def test_rician_noise_statistics():
    rng = np.random.default_rng(9)
    z = rician_noise(np.zeros(200_000, np.float32), 2.0, rng)
    assert abs(float(z.mean()) - 2.0 * np.sqrt(np.pi / 2)) < 0.02  # Rayleigh mean
    hi = rician_noise(np.full(200_000, 100.0, np.float32), 2.0, rng)
    assert abs(float(hi.std()) - 2.0) < 0.05 and abs(float(hi.mean()) - 100.02) < 0.05
    with pytest.raises(ToolError) as e:
        rician_noise(np.zeros(3), -1.0, rng)
    assert e.value.code == ErrorCode.value_range


def test_bad_affines_are_value_range_errors():
    from bcer.contracts.geometry import as_affine

    assert np.array_equal(as_affine(np.diag([2.0, 2.0, 3.0, 1.0])), np.diag([2.0, 2.0, 3.0, 1.0]))
    for bad in (np.eye(3), np.full((4, 4), np.nan), np.diag([1.0, 0.0, 1.0, 1.0])):
        with pytest.raises(ToolError) as e:
            as_affine(bad)
        assert e.value.code is ErrorCode.value_range and e.value.context["arg"] == "affine"
