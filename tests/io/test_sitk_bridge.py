"""numpy/RAS <-> SimpleITK/LPS conversion: exact round trips and the same anatomical points."""
from __future__ import annotations

import numpy as np
import pytest
import SimpleITK as sitk
from scipy.spatial.transform import Rotation

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.io.sitk_bridge import (from_sitk, geometry_from_affine, ras_to_transform, reference_grid,
                              to_sitk, transform_to_ras)


def _affine(kind: str) -> np.ndarray:
    a = np.eye(4)
    if kind == "plain":
        a[:3, :3] = np.diag([1.0, 1.5, 3.0])
    elif kind == "flipped":  # LPS-stored data (typical of DICOM-derived NIfTI)
        a[:3, :3] = np.diag([-0.9, -1.1, 2.5])
    elif kind == "oblique":
        r = Rotation.from_euler("xyz", [17, -9, 31], degrees=True).as_matrix()
        a[:3, :3] = r @ np.diag([0.8, 1.2, 3.3])
    elif kind == "permuted_oblique":  # sagittal-like axis order plus obliquity and a flip
        r = Rotation.from_euler("zyx", [5, 12, -20], degrees=True).as_matrix()
        a[:3, :3] = r @ np.array([[0, 0, -2.0], [1.1, 0, 0], [0, -0.9, 0]])
    a[:3, 3] = [-40.5, 22.25, 13.0]
    return a


KINDS = ["plain", "flipped", "oblique", "permuted_oblique"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int16])
def test_round_trip_is_exact(kind: str, dtype) -> None:
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(7, 5, 4)) * 100).astype(dtype)
    a = _affine(kind)
    back, a2 = from_sitk(to_sitk(data, a))
    assert back.dtype == data.dtype and back.shape == data.shape
    assert np.array_equal(back, data)
    np.testing.assert_allclose(a2, a, atol=1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_itk_points_are_the_same_anatomy(kind: str) -> None:
    a = _affine(kind)
    img = to_sitk(np.zeros((7, 5, 4), np.float32), a)
    for ijk in [(0, 0, 0), (6, 4, 3), (3, 1, 2)]:
        lps = np.asarray(img.TransformIndexToPhysicalPoint(ijk))
        ras = vox2world(a, ijk)
        np.testing.assert_allclose(lps, ras * [-1, -1, 1], atol=1e-9)
    assert reference_grid((7, 5, 4), a).GetSize() == (7, 5, 4)
    assert geometry_from_affine(a)[1] == pytest.approx(tuple(np.linalg.norm(a[:3, :3], axis=0)))


def test_transform_round_trip_and_centred_euler() -> None:
    m = np.eye(4)
    m[:3, :3] = Rotation.from_euler("xyz", [8, -3, 5], degrees=True).as_matrix()
    m[:3, 3] = [8.0, -2.0, 1.5]
    np.testing.assert_allclose(transform_to_ras(ras_to_transform(m)), m, atol=1e-12)
    # A centred Euler transform (what registration returns) maps points the same way.
    e = sitk.Euler3DTransform((10.0, -5.0, 3.0), 0.1, -0.05, 0.2, (1.0, 2.0, 3.0))
    ras = transform_to_ras(e)
    p_lps = np.array([12.0, 7.0, -4.0])
    q_lps = np.asarray(e.TransformPoint(p_lps.tolist()))
    p_ras = p_lps * [-1, -1, 1]
    np.testing.assert_allclose((ras @ np.append(p_ras, 1))[:3], q_lps * [-1, -1, 1], atol=1e-9)
    # Composite: the last added transform is applied first.
    comp = sitk.CompositeTransform([e, sitk.TranslationTransform(3, (1.0, 0.0, -2.0))])
    expect = np.asarray(comp.TransformPoint(p_lps.tolist())) * [-1, -1, 1]
    np.testing.assert_allclose((transform_to_ras(comp) @ np.append(p_ras, 1))[:3], expect, atol=1e-9)


def test_resample_with_ras_translation_moves_content_in_ras() -> None:
    # fixed->moving translation of +6 mm along R: resampled(x) = moving(x + 6 mm R).
    a = _affine("flipped")
    a[:3, :3] = np.diag([-2.0, 2.0, 2.0])
    data = np.zeros((20, 10, 10), np.float32)
    data[8, 5, 5] = 1.0
    m = np.eye(4)
    m[0, 3] = 6.0
    out = sitk.Resample(to_sitk(data, a), to_sitk(data, a), ras_to_transform(m), sitk.sitkNearestNeighbor, 0.0)
    res, _ = from_sitk(out)
    # moving peak at world R = -40.5 - 16 = -56.5; resampled peak where x + 6 = -56.5 -> x = -62.5 -> i = 11
    assert np.argwhere(res == 1.0).tolist() == [[11, 5, 5]]


def test_bad_inputs_raise() -> None:
    with pytest.raises(ToolError) as e:
        to_sitk(np.zeros((4, 4)), np.eye(4))
    assert e.value.code is ErrorCode.shape
    with pytest.raises(ToolError) as e:
        ras_to_transform(np.full((4, 4), np.nan))
    assert e.value.code is ErrorCode.value_range
