"""bias.n4: white-matter coefficient of variation down >= 30 % on a biased brain phantom."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Image, Mask
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.brain import SCALE, TISSUE_INTENSITY, make_brain
from bcer.tools.registry import call_tool


@pytest.fixture(scope="module")
def case():
    ph = make_brain("bias01", seed=3, size="small", bias=0.3, noise=0.02)
    t1, clean = ph.sequences["T1"], ph.references["T1"]
    # White matter: voxels whose clean T1 is (almost) pure WM, outside the tumour.
    wm_level = TISSUE_INTENSITY["T1"][3] * SCALE
    wm = (clean.data >= 0.94 * wm_level) & (ph.labels["seg"].data == 0)
    assert wm.sum() > 1000
    return ph, t1, wm


def _cv(x: np.ndarray, m: np.ndarray) -> float:
    return float(x[m].std() / x[m].mean())


def test_n4_reduces_white_matter_cv(case) -> None:
    ph, t1, wm = case
    out = call_tool("bias.n4", {"image": t1}, {"iterations": 20})["image"]
    before, after = _cv(t1.data, wm), _cv(out.data, wm)
    assert before > 0.05  # the bias is real
    assert after <= 0.7 * before, (before, after)
    np.testing.assert_array_equal(out.affine, t1.affine)
    assert out.shape == t1.shape and out.data.dtype == np.float32
    # Intensities stay in the input's units (field normalised to geometric mean 1 in the mask).
    assert out.data[wm].mean() == pytest.approx(t1.data[wm].mean(), rel=0.15)
    meta = out.meta["bias_correction"]
    assert meta["mask"] == "otsu" and meta["field_min"] < 1.0 < meta["field_max"]


def test_n4_with_given_mask(case) -> None:
    ph, t1, wm = case
    out = call_tool("bias.n4", {"image": t1, "mask": ph.labels["brain"]}, {"iterations": 20, "shrink_factor": 3})
    assert _cv(out["image"].data, wm) <= 0.7 * _cv(t1.data, wm)
    assert out["image"].meta["bias_correction"]["mask"] == "given"


def test_errors(case) -> None:
    ph, t1, _ = case
    off = Mask(np.ones((4, 4, 4), np.int16), np.eye(4))
    empty = Mask(np.zeros(t1.shape, np.int16), t1.affine)
    cases = [
        ({"image": Image(np.ones((5, 5), np.float32), np.eye(4))}, {}, ErrorCode.shape),
        ({"image": Image(np.full((4, 4, 4), np.inf, np.float32), np.eye(4))}, {}, ErrorCode.numeric),
        ({"image": Image(np.zeros((4, 4, 4), np.float32), np.eye(4))}, {}, ErrorCode.value_range),
        ({"image": ph.labels["brain"]}, {}, ErrorCode.schema),
        ({"image": t1, "mask": off}, {}, ErrorCode.shape),
        ({"image": t1, "mask": empty}, {}, ErrorCode.value_range),
        ({"image": t1}, {"shrink_factor": 0}, ErrorCode.value_range),
        ({"image": t1}, {"iterations": 10_000}, ErrorCode.value_range),
        ({"image": t1}, {"shrink": 2}, ErrorCode.schema),
    ]
    for inputs, params, code in cases:
        with pytest.raises(ToolError) as e:
            call_tool("bias.n4", inputs, params)
        assert e.value.code == code, (params, e.value)
