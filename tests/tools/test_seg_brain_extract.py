"""``seg.brain_extract`` (deepbet's pretrained networks, shipped in its wheel) on a bcer brain
phantom: the mask must match the phantom's own brain mask (ground truth by construction) and
its card must name the weights. A measurement on a synthetic phantom, not on real scans."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("deepbet", reason="deepbet is the optional extra bcer[pretrained]")

from bcer.datasets.synth import synth_cohort
from bcer.io import read_nifti
from bcer.tools.registry import call_tool

pytestmark = pytest.mark.timeout(240)


def test_deepbet_brain_mask_matches_the_phantom_brain(tmp_path):
    import torch
    from deepbet.utils import DATA_PATH

    torch.set_num_threads(1)
    (case,) = synth_cohort("brain", 1, tmp_path / "in", layout="brats", seed=0, size="small")
    t1 = read_nifti(case.sequences["T1"].path)
    truth = read_nifti(next(Path(case.root).glob("*_brainmask.nii.gz")), "mask").data > 0
    mask = call_tool("seg.brain_extract", {"t1": t1}, {})["mask"]
    pred = mask.data == 1
    assert mask.data.shape == t1.data.shape and np.array_equal(mask.affine, t1.affine)
    dice = 2 * np.count_nonzero(pred & truth) / (np.count_nonzero(pred) + np.count_nonzero(truth))
    assert dice > 0.95  # measured 0.978 on this phantom
    assert mask.meta["brain_ml"] == pytest.approx(np.count_nonzero(pred) * t1.voxel_volume_ml, rel=1e-3)
    card = mask.meta["method_card"]
    assert card["name"] == "deepbet" and card["kind"] == "network" and "MIT" in card["summary"]
    assert card["weights_sha256"] == hashlib.sha256(Path(DATA_PATH, "models", "model.pt").read_bytes()).hexdigest()
