"""seg.cardiac's wall-edge check on drawn rings: a thick wall drawn thin has its outer border on
flat muscle; the border beside the RV is not read. Its effect on phantom hearts is tested with
the tool in ``test_seg_cardiac.py``."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.tools.seg.cardiac_checks import epicardial_edge, wall_edge_problem


def _ring_cine(wall: int) -> tuple[np.ndarray, np.ndarray]:
    """A toy cine (2 slices, 3 frames): bright blood (radius 8) inside a dark muscle ring 10
    pixels thick on a mid-grey background, and labels whose wall is ``wall`` pixels thick."""
    i, j = np.mgrid[:48, :48]
    d = np.hypot(i - 24, j - 24)
    img = np.where(d < 8, 1.0, np.where(d < 18, 0.2, 0.6))
    lab = np.where(d < 8, 3, np.where(d < 8 + wall, 2, 0)).astype(np.int16)
    return (np.repeat(np.repeat(img[..., None, None], 2, 2), 3, 3),
            np.repeat(np.repeat(lab[..., None, None], 2, 2), 3, 3))


def test_an_outer_border_on_flat_muscle_gives_way() -> None:
    img, right = _ring_cine(10)
    _, thin = _ring_cine(4)  # the outer border halfway through the muscle: no image edge there
    assert epicardial_edge(img, thin) < 0.1 * epicardial_edge(img, right)
    assert "runs through the muscle" in wall_edge_problem(img, thin, right, 0.5)
    assert wall_edge_problem(img, right, thin, 0.5) is None  # the network's border is on the edge
    assert wall_edge_problem(img, right, right, 0.5) is None
    assert wall_edge_problem(img, thin, right, 0.0) is None  # switched off
    empty = np.zeros_like(thin)
    assert np.isnan(epicardial_edge(img, empty)) and wall_edge_problem(img, empty, right, 0.5) is None


def test_the_border_next_to_the_rv_is_not_read() -> None:
    """The septum's far side meets RV blood, an edge for any wall: only the free wall counts.
    With RV all around the heart there is no free wall, so no reading and no verdict; with RV
    on one side the reading is the free wall's alone."""
    img, lab = _ring_cine(4)
    ringed = np.where(lab == 0, 1, lab).astype(np.int16)
    assert np.isnan(epicardial_edge(img, ringed))
    assert wall_edge_problem(img, ringed, _ring_cine(10)[1], 0.5) is None
    # RV blood against most of a thin wall's outer border: a strong edge there, flat muscle on
    # the free wall; read with the RV labelled, the border is the free wall's (no edge)
    i, j = np.mgrid[:48, :48]
    beside = ((j >= 20) & (np.hypot(i - 24, j - 24) >= 12))[..., None, None] & (lab == 0)
    img_rv = np.where(beside, 1.0, img)
    with_rv = np.where(beside, 1, lab).astype(np.int16)
    right = _ring_cine(10)[1]
    assert epicardial_edge(img_rv, with_rv) < 0.1 * epicardial_edge(img, right)
    assert epicardial_edge(img_rv, lab) > 0.5 * epicardial_edge(img, right)  # unlabelled RV: read as an edge
