"""bcer.metrics: one meaning per metric, checked against hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

from bcer import metrics
from bcer.contracts.errors import ErrorCode, ToolError


def test_dice_values_and_empty_convention():
    a = np.zeros((4, 4, 4), bool)
    a[:2] = True
    b = np.zeros_like(a)
    b[1:3] = True
    assert metrics.dice(a, b) == pytest.approx(0.5)
    assert metrics.dice(a, a) == 1.0
    assert metrics.dice(np.zeros(5), np.zeros(5)) == 1.0  # both empty: perfect agreement
    assert metrics.dice(a, np.zeros_like(a)) == 0.0
    with pytest.raises(ToolError) as e:
        metrics.dice(a, a[:2])
    assert e.value.code is ErrorCode.shape


def test_box_iou_and_volume():
    assert metrics.box_iou([[0, 0, 0], [2, 2, 2]], [[1, 0, 0], [3, 2, 2]]) == pytest.approx(4 / 12)
    assert metrics.box_iou([[0, 0, 0], [1, 1, 1]], [[5, 5, 5], [6, 6, 6]]) == 0.0
    assert metrics.box_iou([[0, 0, 0], [0, 0, 0]], [[0, 0, 0], [0, 0, 0]]) == 0.0  # empty boxes
    assert metrics.box_volume([[1, 1, 1], [3, 4, 5]]) == 24.0
    assert metrics.box_volume([[3, 0, 0], [1, 2, 2]]) == 0.0  # inverted


def test_nrmse_psnr_and_scaled():
    rng = np.random.default_rng(0)
    ref = rng.random((8, 8, 8)) + 1.0
    assert metrics.nrmse(ref, ref) == 0.0
    assert metrics.nrmse(ref * 1.1, ref) == pytest.approx(0.1)
    assert metrics.psnr(ref, ref) == float("inf")
    noisy = ref + 0.01
    assert metrics.psnr(noisy, ref) == pytest.approx(10 * np.log10(ref.max() ** 2 / 1e-4))
    # the reconstruction metric ignores a global gain, the plain one does not
    assert metrics.nrmse_scaled(3.0 * ref, ref) == pytest.approx(0.0, abs=1e-12)
    assert metrics.nrmse(3.0 * ref, ref) == pytest.approx(2.0)
    # complex data compare as complex: a 90-degree phase error is an error of |ref| * sqrt(2)
    cref = ref * np.exp(1j * rng.random(ref.shape))
    assert metrics.nrmse(cref, cref) == 0.0
    assert metrics.nrmse(1j * cref, cref) == pytest.approx(np.sqrt(2.0))
    assert metrics.nrmse(cref * 1.1, cref) == pytest.approx(0.1)


def test_frame_match_exact_tie_and_tolerance():
    curve = [100.0, 120.0, 120.0, 119.5, 60.0]  # frames 1 and 2 tie exactly; 3 is 0.42 % of max below
    assert metrics.frame_match(1, 1, curve)
    assert metrics.frame_match(2, 1, curve)  # an exact tie in the truth's count
    assert not metrics.frame_match(3, 1, curve)  # 0.5 mL apart: not a tie
    assert metrics.frame_match(3, 1, curve, tolerance=0.005)  # within 0.5 % of the maximum (0.6 mL)
    assert not metrics.frame_match(0, 1, curve, tolerance=0.005)


def test_wilson_interval_known_values():
    from bcer.metrics import wilson_interval

    lo, hi = wilson_interval(11, 14)  # 0.786: the published Wilson bounds are 0.524 and 0.924
    assert abs(lo - 0.5241) < 1e-3 and abs(hi - 0.9243) < 1e-3
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(10, 10)
    assert hi == pytest.approx(1.0) and 0.72 < lo < 0.73  # 10/10 still leaves room below 0.9
    with pytest.raises(ToolError) as e:
        wilson_interval(5, 4)
    assert e.value.code is ErrorCode.value_range
