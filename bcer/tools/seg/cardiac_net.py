"""``seg.cardiac``'s network path: what the 2-D network sees, and how its labels are tidied.

The shipped ``cardiac_unet2d`` bundle (0.2, ``scripts/train_bundle.py``) takes two channels
per short-axis slice of one frame: the frame itself and the slice's temporal standard
deviation over the cycle. The second channel says where things move (the ventricles'
borders), which a single frame cannot: a round bright vessel or a blood-filled atrium looks
like an LV cavity in one frame. A bundle with one input channel gets the frame only. Frames
become extra slices: an (X, Y, Z, T) cine is fed as (X, Y, Z*T) channels, slice index
``z * T + t``, so one 2-D batch covers the whole cine.

A per-slice network knows nothing of the other slices and frames; :func:`tidy_labels`
makes its answer one heart over the cycle (one LV without the atrium, the myocardium and RV
that touch it).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import ndimage as ndi

from .bundle_labels import Channel
from .cardiac_atrium import atrium_in_cycle

# channel_def names: not sequence names, so bcer's bundle runner feeds the tool's channels in
# the tool's order (a bundle naming its one channel "cine" still gets the frame, by name)
INPUT_NAMES = ("cine frame", "temporal std")
_CONN3 = ndi.generate_binary_structure(3, 1)


def frames(data: np.ndarray) -> np.ndarray:
    """(X, Y, Z*T) float32: every frame of every slice as a 2-D slice."""
    cine = np.asarray(data, np.float32)
    x, y, z, t = cine.shape
    return cine.reshape(x, y, z * t)


def temporal_std(data: np.ndarray) -> np.ndarray:
    """(X, Y, Z*T) float32: each voxel's standard deviation over the frames, per frame."""
    cine = np.asarray(data, np.float32)
    return np.repeat(cine.std(axis=3), cine.shape[3], axis=2)


def channels(data: np.ndarray) -> list[Channel]:
    """The tool's offer to a bundle, in order (computed only when the bundle takes them)."""
    return [Channel("CINE", "cine", lambda: frames(data)), Channel(INPUT_NAMES[1], "cine", lambda: temporal_std(data))]


def network_input(data: np.ndarray, n_channels: int) -> np.ndarray:
    """(C, X, Y, Z*T) input of a 2-D cardiac bundle, as the tool builds it (training uses this)."""
    return np.stack([c.array() for c in channels(data)[:n_channels]])


def _keep_touching(mask: np.ndarray, anchor: np.ndarray, min_size: int) -> np.ndarray:
    """Components of ``mask`` (3-D, one frame) that touch ``anchor`` or hold ``min_size`` voxels."""
    lab, n = ndi.label(mask, _CONN3)
    if n == 0:
        return mask
    near = ndi.binary_dilation(anchor, np.ones((3, 3, 3), bool))
    touching = np.unique(lab[near & mask])
    sizes = np.bincount(lab.ravel())
    keep = np.zeros(n + 1, bool)
    keep[touching] = True
    keep[np.flatnonzero(sizes >= min_size)] = True
    keep[0] = False
    return keep[lab]


def tidy_labels(labels: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
    """One LV per frame, consistent over the cycle, without the atrium; MYO and RV only where
    they touch the heart.

    Per frame, the LV's 3-D components are weighed against the voxels most frames call LV
    (the consensus core, from each frame's largest component): components that overlap the
    core are kept, the others (a vessel or an atrium the network took for LV in one frame)
    are dropped; with no overlap the frame keeps its largest. LV holes are filled per slice.
    An atrium joined to the LV through the base survives that; the cycle tells it apart
    (:mod:`.cardiac_atrium`): end slices whose "LV" fills while the ventricle empties, and a
    frame's slices beyond a gap in its LV stack, lose their LV and the myocardium the network
    drew around it (a per-slice network rings the atrium too). Myocardium must touch the LV,
    and RV the myocardium or LV, unless a piece is large (a quarter of that frame's LV).
    Returns the labels, counts of voxels removed and the slices taken for atrium.
    """
    out = np.array(labels, np.int16, copy=True)
    n_t = out.shape[3]
    core = _lv_core(out)
    removed = {"lv": 0, "myo": 0, "rv": 0}
    for t in range(n_t):
        removed["lv"] += _one_lv(out[..., t], core)
    atrium = _drop_atrium(out, removed)
    for t in range(n_t):
        frame = out[..., t]
        lv = frame == 3
        big = max(1, int(0.25 * lv.sum()))
        myo = frame == 2
        keep = _keep_touching(myo, lv, big)
        removed["myo"] += int((myo & ~keep).sum())
        frame[myo & ~keep] = 0
        rv = frame == 1
        keep = _keep_touching(rv, lv | (frame == 2), big)
        removed["rv"] += int((rv & ~keep).sum())
        frame[rv & ~keep] = 0
    return out, {"removed_voxels": removed, "core_voxels": int(core.sum()), **atrium}


def _lv_core(out: np.ndarray) -> np.ndarray:
    """Voxels that at least half the frames' largest LV components hold."""
    largest = []
    for t in range(out.shape[3]):
        lab, n = ndi.label(out[..., t] == 3, _CONN3)
        if n == 0:
            largest.append(np.zeros(out.shape[:3], bool))
            continue
        sizes = np.bincount(lab.ravel())
        sizes[0] = 0
        largest.append(lab == int(np.argmax(sizes)))
    return np.sum(largest, axis=0) >= 0.5 * out.shape[3]


def _one_lv(frame: np.ndarray, core: np.ndarray) -> int:
    """Keep the LV components of one frame that overlap the core (in place), fill their
    holes per slice; returns the voxels removed."""
    lv = frame == 3
    lab, n = ndi.label(lv, _CONN3)
    removed = 0
    if n > 1:
        hits = np.unique(lab[core & lv])
        keep_ids = hits[hits > 0] if hits.size and hits.max() > 0 else [int(np.argmax(np.bincount(lab.ravel())[1:])) + 1]
        keep = np.isin(lab, keep_ids)
        removed = int((lv & ~keep).sum())
        frame[lv & ~keep] = 0
        lv = keep
    filled = np.stack([ndi.binary_fill_holes(lv[..., k]) for k in range(lv.shape[2])], axis=-1)
    frame[filled & ~lv & (frame != 1)] = 3
    return removed


def _drop_atrium(out: np.ndarray, removed: dict[str, int]) -> dict[str, Any]:
    """Clear the LV and MYO of atrium slices (:func:`.cardiac_atrium.atrium_in_cycle`) in place."""
    gone, atrium, detached = atrium_in_cycle(out == 3)
    for code, name in ((3, "lv"), (2, "myo")):
        hit = gone[None, None] & (out == code)
        removed[name] += int(hit.sum())
        out[hit] = 0
    return {"atrium_slices": atrium, "detached_slices": detached}


def inplane_ornt(affine: np.ndarray) -> np.ndarray:
    """nibabel orientation that puts the two in-plane axes in a fixed world order and sense
    (the slice axis stays): a 2-D network is not equivariant to transposes and flips, so the
    same cine in another voxel order gave another myocardium (the ablation's space_mismatch
    fault moved LV mass by up to 7 %)."""
    cols = [affine[:3, 0], affine[:3, 1]]
    dom = [int(np.argmax(np.abs(c))) for c in cols]
    swap = dom[1] < dom[0] or (dom[1] == dom[0] and abs(cols[1][dom[1]]) > abs(cols[0][dom[0]]))
    target = (1, 0) if swap else (0, 1)
    return np.array([[target[i], -1.0 if cols[i][dom[i]] < 0 else 1.0] for i in range(2)] + [[2, 1.0]])


def inverse_ornt(ornt: np.ndarray) -> np.ndarray:
    """The nibabel orientation that undoes ``ornt``."""
    inv = np.zeros_like(ornt)
    for i, (j, sign) in enumerate(ornt):
        inv[int(j)] = [i, sign]
    return inv
