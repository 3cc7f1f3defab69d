"""Telling a left atrium from the left ventricle in a short-axis label cine.

Above the mitral plane the left atrium is blood, round, and joined to the LV through the
base, so both the classical cavity search and a per-slice network can take it for the LV.
Two rules of the cardiac cycle tell them apart, whichever method drew the LV:

* the atrium fills while the ventricle empties (:func:`atrium_slices`);
* the ventricle is one run of slices that tapers to the apex, so blood beyond an empty slice
  is not ventricle (:func:`detached_slices`): the base has left that slice in systole.
"""
from __future__ import annotations

import numpy as np


def atrium_slices(area: np.ndarray, max_corr: float = -0.3) -> list[int]:
    """End slices of the LV stack whose "LV" fills while the rest of the LV empties.

    ``area``: LV area (any unit) per slice and frame, (Z, T). Per slice, the area over the
    frames is correlated with the summed area of all other slices; from each end of the stack
    inwards, slices are peeled while that correlation is below ``max_corr``. A ventricular
    slice follows the ventricle (+1), and an apical or basal one that the base plane leaves in
    systole still shrinks with it. Fewer than 4 frames: no verdict (empty).
    """
    area = np.asarray(area, float)
    if area.shape[1] < 4:
        return []
    total = area.sum(axis=0)
    present = np.flatnonzero(area.max(axis=1) > 0)
    drop: set[int] = set()
    for order in (present, present[::-1]):
        for k in order:
            rest = total - area[k]
            if area[k].std() == 0 or rest.std() == 0 or np.corrcoef(area[k], rest)[0, 1] >= max_corr:
                break
            drop.add(int(k))
    return sorted(drop)


def detached_slices(lv: np.ndarray, top: int, gap: float = 0.1) -> list[int]:
    """Slices of one frame's LV (X, Y, Z) beyond a gap in the stack (cleared in place).

    The LV is one run of slices. Walking from slice ``top`` (largest LV area over the whole
    cycle: one frame's largest can be the atrium) towards either end, a slice under ``gap`` x
    the largest area of the frame's run so far after which the area grows again is a gap: the
    apex only tapers, so what lies beyond is not ventricle but an atrium above a base that
    has moved out of the slice in systole (blood, round, next to the LV in the frames
    where the base slice is empty, so neither the cavity search nor the anti-phase test
    of :func:`atrium_slices` rejects it in every frame).
    """
    area = lv.sum(axis=(0, 1)).astype(float)
    if area[top] == 0:
        return []
    drop: list[int] = []
    for step in (1, -1):
        k, ref = top + step, area[top]
        while 0 <= k < area.size and 0 <= k + step < area.size:
            ref = max(ref, area[k])
            if area[k] < gap * ref and area[k + step] > area[k]:
                beyond = range(k + step, area.size) if step > 0 else range(0, k + step + 1)
                drop += [j for j in beyond if area[j] > 0]
                break
            k += step
    lv[:, :, drop] = False
    return sorted(drop)


def atrium_in_cycle(lv: np.ndarray) -> tuple[np.ndarray, list[int], dict[int, list[int]]]:
    """Where an LV cine (X, Y, Z, T, boolean) is atrium, by both rules: a (Z, T) boolean of the
    slices and frames to clear, the atrium slices and, per frame, the slices beyond a gap.
    ``top`` of :func:`detached_slices` is the largest slice over the cycle once the atrium
    slices are left out. ``lv`` is not changed."""
    area = lv.sum(axis=(0, 1)).astype(float)  # (Z, T)
    atrium = atrium_slices(area)
    gone = np.zeros(area.shape, bool)
    gone[atrium, :] = True
    top = int(np.argmax(np.where(gone, 0.0, area).sum(axis=1)))
    detached: dict[int, list[int]] = {}
    for t in range(lv.shape[3]):
        if d := detached_slices(lv[..., t] & ~gone[None, None, :, t], top):
            detached[t] = d
            gone[d, t] = True
    return gone, atrium, detached


__all__ = ["atrium_in_cycle", "atrium_slices", "detached_slices"]
