"""Overlay strips: the slices through a mask's extent, or every slice a lesion box touches."""
from __future__ import annotations

import numpy as np

from bcer.pages import overlay as ov


def test_strip_covers_the_mask_and_every_box_slice():
    base = ov.canonical(ov.Volume(np.ones((50, 50, 20)), np.diag([1.0, 1.0, 3.0, 1.0])))
    mask = ov.Volume(np.zeros((50, 50, 20), np.int16), base.affine)
    mask.data[20:30, 20:30, 4:15] = 1
    assert ov.strip_slices(base, [mask]) == [4, 6, 9, 12, 14]  # first to last mask slice, 5 evenly spaced
    box = [[10.0, 20.0, 30.0], [20.0, 28.0, 36.0]]  # z 30-36 mm on 3-mm slices: 10, 11, 12
    assert ov.strip_slices(base, [mask], [box]) == [10, 11, 12]
    tall = [[10.0, 20.0, 0.0], [20.0, 28.0, 57.0]]  # every slice: subsampled to STRIP_MAX, ends kept
    ks = ov.strip_slices(base, [], [tall])
    assert len(ks) == ov.STRIP_MAX and ks[0] == 0 and ks[-1] == 19
    assert ov.strip_slices(base, []) == [10]  # nothing to show: the middle slice
    one = ov.render_slice(base, 4, [mask], size=144)
    strip = ov.render_strip(base, [4, 9, 14], [mask], size=240, gap=3)
    assert strip.size == (3 * one.width + 6, one.height)
    red = np.asarray(strip)[..., 0] > 200
    assert red[:, : one.width].any() and red[:, -one.width:].any()  # the mask drawn on the first and last tile
