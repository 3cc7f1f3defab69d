"""register.*: recover a known 8 deg / 8 mm misalignment to <= 1 mm over the organ; apply is exact at identity."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage

from bcer.contracts.artifacts import Image, Mask, Transform
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.degrade import move_image, rigid_matrix
from bcer.datasets.geometry import grid_center, world_coords
from bcer.tools.registry import call_tool


def _mean_error_mm(true: np.ndarray, est: np.ndarray, mask: Mask) -> float:
    """Mean distance between where the true and estimated transforms send the organ's voxels."""
    pts = world_coords(mask.affine, mask.shape)[np.asarray(mask.data) > 0]
    ph = np.c_[pts, np.ones(len(pts))]
    return float(np.linalg.norm((ph @ est.T - ph @ true.T)[:, :3], axis=1).mean())


@pytest.fixture(scope="module")
def brain() -> tuple[Image, Mask]:
    from nilearn import datasets

    t = datasets.load_mni152_template(resolution=2)
    data = np.asarray(t.dataobj, dtype=np.float32)[::2, ::2, ::2]
    affine = np.array(t.affine, dtype=np.float64)
    affine[:3, :3] *= 2.0
    organ = ndimage.binary_erosion(data > 0.2 * data.max(), iterations=1)
    return Image(data, affine), Mask(organ.astype(np.int16), affine, labels={1: "brain"})


@pytest.mark.parametrize("tool", ["register.rigid", "register.affine"])
def test_recovers_known_misalignment_brain(brain, tool: str) -> None:
    fixed, organ = brain
    truth = rigid_matrix((8.0, -5.0, 4.0), (8.0, -6.0, 5.0), grid_center(fixed.affine, fixed.shape))
    moving = move_image(fixed, truth)
    assert _mean_error_mm(truth, np.eye(4), organ) > 8.0  # the misalignment is real
    out = call_tool(tool, {"fixed": fixed, "moving": moving}, {})
    tr, res = out["transform"], out["resampled"]
    assert isinstance(tr, Transform) and tr.type == tool.split(".")[1]
    assert _mean_error_mm(truth, tr.matrix, organ) <= 1.0
    np.testing.assert_allclose(res.affine, fixed.affine)
    assert tr.meta["iterations"] > 0 and np.isfinite(tr.meta["metric"])
    inside = np.asarray(ndimage.binary_erosion(organ.data > 0, iterations=3))
    before = np.abs(moving.data - fixed.data)[inside].mean()
    after = np.abs(res.data - fixed.data)[inside].mean()
    assert after < 0.5 * before


def test_cross_contrast_with_mask(brain) -> None:
    fixed, organ = brain
    # A contrast-inverted moving image (ADC-like vs T2w-like): only MI-type metrics cope.
    inv = np.where(organ.data > 0, fixed.data.max() - fixed.data, 0.0).astype(np.float32)
    truth = rigid_matrix((-8.0, 0.0, 8.0), (0.0, 8.0, 0.0), grid_center(fixed.affine, fixed.shape))
    moving = move_image(Image(inv, fixed.affine), truth)
    dil = Mask(ndimage.binary_dilation(organ.data > 0, iterations=3).astype(np.int16), fixed.affine)
    out = call_tool("register.rigid", {"fixed": fixed, "moving": moving, "mask": dil}, {"seed": 1})
    assert _mean_error_mm(truth, out["transform"].matrix, organ) <= 1.0


def test_apply_identity_is_exact_and_apply_mask_keeps_labels(brain) -> None:
    fixed, organ = brain
    out = call_tool("register.apply", {"moving": fixed, "transform": Transform.identity(), "fixed": fixed})["image"]
    assert np.array_equal(out.data, fixed.data)
    labels = Mask(np.where(organ.data > 0, 1 + (np.arange(fixed.shape[0])[:, None, None] > 25), 0).astype(np.int16),
                  fixed.affine, labels={1: "left", 2: "right"})
    same = call_tool("register.apply_mask", {"mask": labels, "transform": Transform.identity(), "fixed": fixed})["mask"]
    assert np.array_equal(same.data, labels.data) and same.labels == labels.labels
    # A pure 4 mm shift along the first array axis (an axis-aligned 2 mm grid): integer voxel move.
    shift = np.eye(4)
    shift[:3, 3] = fixed.affine[:3, 0] * 2  # fixed point -> moving point two voxels further along i
    moved = call_tool("register.apply_mask", {"mask": labels, "transform": Transform(shift), "fixed": fixed})["mask"]
    assert np.array_equal(moved.data[:-2], labels.data[2:])
    assert set(np.unique(moved.data)) <= {0, 1, 2}
    img = call_tool("register.apply", {"moving": fixed, "transform": Transform(shift), "fixed": fixed},
                    {"interpolator": "linear"})["image"]
    np.testing.assert_allclose(img.data[:-2], fixed.data[2:], atol=1e-3)


def test_errors(brain) -> None:
    fixed, organ = brain
    flat = Image(np.zeros((10, 10), np.float32), np.eye(4))
    nan = Image(np.where(organ.data > 0, np.nan, 0).astype(np.float32), fixed.affine)
    off_grid = Mask(np.ones((5, 5, 5), np.int16), np.eye(4))
    empty = Mask(np.zeros(fixed.shape, np.int16), fixed.affine)
    cases = [
        ("register.rigid", {"fixed": fixed, "moving": flat}, {}, ErrorCode.shape),
        ("register.rigid", {"fixed": nan, "moving": fixed}, {}, ErrorCode.numeric),
        ("register.rigid", {"fixed": fixed, "moving": organ}, {}, ErrorCode.schema),
        ("register.rigid", {"fixed": fixed}, {}, ErrorCode.input_missing),
        ("register.rigid", {"fixed": fixed, "moving": fixed, "mask": off_grid}, {}, ErrorCode.shape),
        ("register.rigid", {"fixed": fixed, "moving": fixed, "mask": empty}, {}, ErrorCode.value_range),
        ("register.affine", {"fixed": fixed, "moving": fixed}, {"histogram_bins": 2}, ErrorCode.value_range),
        ("register.affine", {"fixed": fixed, "moving": fixed}, {"shrink_factors": [0]}, ErrorCode.value_range),
        ("register.affine", {"fixed": fixed, "moving": fixed},
         {"shrink_factors": [2, 1], "smoothing_sigmas_mm": [1.0]}, ErrorCode.value_range),
        ("register.apply", {"moving": fixed, "transform": Transform(np.zeros((4, 4))), "fixed": fixed}, {},
         ErrorCode.value_range),
        ("register.apply", {"moving": fixed, "transform": fixed, "fixed": fixed}, {}, ErrorCode.schema),
    ]
    for tool, inputs, params, code in cases:
        with pytest.raises(ToolError) as e:
            call_tool(tool, inputs, params)
        assert e.value.code == code, (tool, params, e.value)
