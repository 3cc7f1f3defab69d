"""Tools built to be wrong (registered on import, in the driver and in Ray workers).

Each wraps the real tool of its step and corrupts the answer the way a broken or
out-of-distribution tool does, while the files it produces stay well formed: the
contract's validators accept them, so only plausibility can tell. Used by
``test_plausibility_engine.py`` through the real engine.
"""
from __future__ import annotations

import numpy as np

from bcer.contracts import Cine, Finding, Findings, Image, KSpace, Mask, Table, Transform
from bcer.contracts.geometry import vox2world
from bcer.tools.cardiac import EdEsParams, ed_es
from bcer.tools.detect.prostate_lesions import LesionParams, prostate_lesions
from bcer.tools.quant import CardiacFunctionParams, cardiac_function
from bcer.tools.recon.sense import SenseParams, sense
from bcer.tools.registry import tool
from bcer.tools.seg.brain_tumor import BrainTumorParams, BrainTumorSeg, brain_tumor
from bcer.tools.seg.cardiac import CardiacParams, cardiac
from bcer.tools.seg.prostate import ProstateParams, ProstateSeg

CPU = {"num_cpus": 1, "memory_mb": 512}


@tool("xwrong.seg_pelvis", milestone="segmentation", resources=CPU)
def seg_pelvis(t2w: Image, params: ProstateParams, adc: Image | None = None, device: str = "cpu") -> ProstateSeg:
    """A "gland" that is every voxel with signal: the whole pelvis in the field of view."""
    data = np.asarray(t2w.data)
    body = (data > 0.1 * np.percentile(data, 99)).astype(np.int16)
    return ProstateSeg(Mask(body, t2w.affine, {}, labels={1: "gland"}), Mask(body, t2w.affine, {}, labels={1: "PZ"}))


@tool("xwrong.lesions_outside", milestone="detection", resources=CPU, output="findings")
def lesions_outside(adc: Image, dwi: Image, gland: Mask, params: LesionParams, zones: Mask | None = None,
                    transform: Transform | None = None, t2w: Image | None = None) -> Findings:
    """The real detector's lesions plus one in the corner of the image, far from the gland."""
    found = prostate_lesions(adc, dwi, gland, params, zones, transform, t2w)
    z = gland.shape[2] // 2
    lo, hi = (1, 1, z), (7, 7, z + 2)
    world = (tuple(vox2world(gland.affine, np.array([lo]))[0]), tuple(vox2world(gland.affine, np.array([hi]))[0]))
    extra = Finding("lesion_far", "lesion", (lo, hi), world, volume_ml=0.3, side="R", zone="PZ",
                    attributes={"adc": 700.0, "size_mm": 9.0, "t2_ratio": 0.5})
    return Findings(list(found.items) + [extra], found.affine, dict(found.meta))


@tool("xwrong.seg_cardiac_small_cavity", milestone="segmentation", resources=CPU, output="labels")
def seg_cardiac_small_cavity(cine: Cine, params: CardiacParams, device: str = "cpu") -> Mask:
    """The real cardiac labels with the LV cavity drawn two voxels too small in-plane and its
    rim given to the myocardium: volumes and EF stay physiological, the wall holds blood."""
    from scipy import ndimage

    m = cardiac(cine, params, device)
    lab = np.asarray(m.data).copy()
    lv = lab == 3
    core = np.stack([ndimage.binary_erosion(lv[..., t], np.ones((3, 3, 1), bool), iterations=2)
                     for t in range(lab.shape[3])], axis=-1)
    lab[lv & ~core] = 2
    return Mask(lab, m.affine, dict(m.meta), labels=dict(m.labels))


@tool("xwrong.seg_cardiac_lost_frame", milestone="segmentation", resources=CPU, output="labels")
def seg_cardiac_lost_frame(cine: Cine, params: CardiacParams, device: str = "cpu") -> Mask:
    """The real cardiac labels with the LV removed from one mid-cycle frame (the frame of median
    LV volume, so neither ED nor ES): the function table is unchanged, the label cine is not."""
    m = cardiac(cine, params, device)
    lab = np.asarray(m.data).copy()
    counts = np.count_nonzero(lab == 3, axis=(0, 1, 2))
    t = int(np.argsort(counts)[counts.size // 2])
    lab[..., t][lab[..., t] == 3] = 0
    return Mask(lab, m.affine, dict(m.meta, lost_frame=t), labels=dict(m.labels))


@tool("xwrong.function_ef120", milestone="quantification", resources=CPU, output="function")
def function_ef120(labels: Mask, params: CardiacFunctionParams, phases: Table | None = None) -> Table:
    """The real cardiac function table with the LV ejection fraction replaced by 120 %."""
    t = cardiac_function(labels, params, phases)
    return Table([dict(t.rows[0], lv_ef_pct=120.0)], dict(t.units), t.name, dict(t.meta))


@tool("xwrong.ed_es_swapped", milestone="phase_detection", resources=CPU, output="phases")
def ed_es_swapped(labels: Mask, params: EdEsParams, cine: Cine | None = None) -> Table:
    """The real ED/ES table with the two frames swapped (ED volume < ES volume downstream)."""
    t = ed_es(labels, params, cine)
    r = dict(t.rows[0])
    r["ed_frame"], r["es_frame"] = r["es_frame"], r["ed_frame"]
    r["lv_volume_ed_ml"], r["lv_volume_es_ml"] = r["lv_volume_es_ml"], r["lv_volume_ed_ml"]
    return Table([r], dict(t.units), t.name, dict(t.meta))


@tool("xwrong.recon_encoded_matrix", milestone="reconstruction", resources=CPU, output="image")
def recon_encoded_matrix(kspace: KSpace, params: SenseParams, device: str = "cpu") -> Image:
    """The real reconstruction on a 2x-oversampled readout matrix (zero-padded; same affine, so
    the contract's affine validator still passes)."""
    img = sense(kspace, params, device)
    data = np.asarray(img.data)
    pad = [(data.shape[0] // 2, data.shape[0] - data.shape[0] // 2)] + [(0, 0)] * (data.ndim - 1)
    return Image(np.pad(data, pad), img.affine, dict(img.meta))


@tool("xwrong.tumour_outside", milestone="segmentation", resources=CPU)
def tumour_outside(t1: Image, t1c: Image, t2: Image, flair: Image, params: BrainTumorParams,
                   device: str = "cpu") -> BrainTumorSeg:
    """As many tumour voxels as the real segmentation finds, placed in the background nearest
    the image corner (outside the brain), with nested BraTS labels."""
    real = brain_tumor(t1, t1c, t2, flair, params, device)
    n = int(np.count_nonzero(real.labels.data))
    bg = np.argwhere(np.asarray(t1.data) == 0)
    pick = bg[np.argsort((bg ** 2).sum(axis=1), kind="stable")[:n]]
    lab = np.zeros(real.labels.shape, np.int16)
    lab[tuple(pick.T)] = 2
    lab[tuple(pick[: n // 2].T)] = 4
    lab[tuple(pick[: n // 10].T)] = 1

    def mk(m: np.ndarray, names: dict[int, str]) -> Mask:
        return Mask(m.astype(np.int16), real.labels.affine, {}, labels=names)

    return BrainTumorSeg(mk(lab, dict(real.labels.labels)), mk(lab > 0, {1: "WT"}),
                         mk(np.isin(lab, (1, 4)), {1: "TC"}), mk(lab == 4, {1: "ET"}))
