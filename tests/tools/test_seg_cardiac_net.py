"""seg.cardiac's network path: the input channels, tidying a per-slice network's labels into
one heart over the cycle, the checks that send ``method="auto"`` to the classical method,
and that fallback itself (typed errors where the caller asked for a network)."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.cardiac import make_cardiac
from bcer.tools.registry import call_tool
from bcer.tools.seg import bundle as B
from bcer.tools.seg.cardiac_checks import network_problem
from bcer.tools.seg.cardiac_net import network_input, tidy_labels


def test_network_input_channels() -> None:
    rng = np.random.default_rng(0)
    cine = rng.random((6, 5, 3, 4)).astype(np.float32)
    x = network_input(cine, 2)
    assert x.shape == (2, 6, 5, 12)
    # slice index z * T + t: frame t of slice z, and that slice's std over the cycle
    np.testing.assert_array_equal(x[0, :, :, 2 * 4 + 3], cine[:, :, 2, 3])
    np.testing.assert_allclose(x[1, :, :, 2 * 4 + 3], cine[:, :, 2].std(axis=-1), rtol=1e-6)
    assert network_input(cine, 1).shape == (1, 6, 5, 12)


def _heart(n_frames: int = 6) -> np.ndarray:
    """A toy label cine: LV disc in slices 1-3, a myocardial ring, an RV crescent beside it."""
    lab = np.zeros((40, 40, 5, n_frames), np.int16)
    i, j = np.mgrid[:40, :40]
    for t in range(n_frames):
        r = 6 + (t % 3)
        d = np.hypot(i - 20, j - 20)
        for k in (1, 2, 3):
            lab[..., k, t][d < r + 3] = 2
            lab[..., k, t][d < r] = 3
            lab[..., k, t][(np.hypot(i - 20, j - 32) < 5) & (d >= r + 3)] = 1
    return lab


def test_tidy_labels_keeps_one_heart() -> None:
    clean = _heart()
    noisy = clean.copy()
    noisy[2:5, 2:5, 2, 4] = 3  # a round bright vessel taken for LV in one frame
    noisy[35:38, 2:4, 1, 1] = 2  # a myocardium island far from the heart
    noisy[2:4, 35:38, 3, 2] = 1  # an RV speck far from the heart
    noisy[20, 20, 2, 3] = 0  # a hole in the cavity
    out, info = tidy_labels(noisy)
    np.testing.assert_array_equal(out, clean)
    assert info["removed_voxels"] == {"lv": 9, "myo": 6, "rv": 6}
    np.testing.assert_array_equal(tidy_labels(clean)[0], clean)  # a clean heart is left alone


def test_network_problem_names_what_is_wrong() -> None:
    lab = _heart()
    assert network_problem(lab) is None
    gone = lab.copy()
    gone[..., 2][gone[..., 2] == 3] = 0
    assert "no LV in frame(s) [2]" in network_problem(gone)
    still = np.repeat(lab[..., :1], 6, axis=3)
    assert "EF 0.0" in network_problem(still)
    flat = lab.copy()
    flat[..., 1:4, :][flat[..., 1:4, :] == 3] = 0
    flat[..., 2, :][lab[..., 2, :] == 3] = 3
    assert "fewer than two slices" in network_problem(flat)
    no_rv = lab.copy()
    no_rv[..., 4][no_rv[..., 4] == 1] = 0  # the network lost the RV at one frame: RV EF ~100 %
    assert "no RV in frame(s) [4]" in network_problem(no_rv)
    tiny_rv = lab.copy()
    tiny_rv[..., 4][tiny_rv[..., 4] == 1] = 0
    tiny_rv[30:34, 30:33, 2, 4] = 1  # 12 voxels left at frame 4: RV EF over 90 %
    assert "RV volume curve implausible" in network_problem(tiny_rv)


def test_auto_falls_back_to_classical_when_the_network_is_missing(monkeypatch, tmp_path) -> None:
    ph = make_cardiac("fb", 0, size="small", group="NOR")
    monkeypatch.setattr(B, "shipped_bundle", lambda name="cardiac_unet2d": tmp_path / "absent")
    out = call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]})["labels"]
    assert out.meta["method"] == "classical_cine"
    assert out.meta["fallback"]["from"] == "network" and "input_missing" in out.meta["fallback"]["reason"]
    with pytest.raises(ToolError) as e:  # asked for a network: no silent substitute
        call_tool("seg.cardiac", {"cine": ph.sequences["CINE"]}, {"method": "network"})
    assert e.value.code == ErrorCode.input_missing


def test_merge_hybrid_takes_the_classical_lv_and_the_network_walls() -> None:
    """LV from the classical labels, MYO/RV from the network; the network's extra LV rim joins
    the myocardium; a slice where the network sees no LV (an atrium) loses the classical LV."""
    from bcer.tools.seg.cardiac import merge_hybrid

    truth = _heart()
    classical = truth.copy()
    classical[classical == 2] = 0  # the classical walls are poor; its cavity is right
    network = truth.copy()
    rim = (network == 3) & (np.roll(network, 1, axis=0) == 2)
    network[np.roll(rim, -1, axis=0) & (network == 2)] = 3  # the network's cavity one voxel too wide
    assert (network == 3).sum() > (truth == 3).sum()
    atrium = np.zeros_like(truth, bool)
    atrium[15:25, 15:25, 4, :] = True  # classical LV above the base that the network does not call LV
    classical[atrium] = 3
    out = merge_hybrid(classical, network)
    np.testing.assert_array_equal(out == 3, truth == 3)
    np.testing.assert_array_equal(out == 1, truth == 1)
    assert ((out == 2) == (truth == 2)).all()
    assert not (out[atrium] == 3).any()


@pytest.mark.parametrize("axes,flips", [([1, 0, 2], []), ([0, 1, 2], [0, 1])])
def test_network_labels_do_not_depend_on_the_voxel_order(axes: list[int], flips: list[int]) -> None:
    """The same cine stored transposed or flipped in-plane gets the same network labels (mapped
    back to the first grid): the network runs on a canonical in-plane orientation. Before, the
    2-D network gave another myocardium and the ablation's space_mismatch cine another LV mass."""
    from bcer.contracts.artifacts import Cine
    from bcer.tools.seg.cardiac import CardiacParams, _network
    from tests.tools.test_cardiac import _regrid

    ph = make_cardiac("eq", 3, size="small", group="HCM")
    cine = ph.sequences["CINE"]
    data = np.asarray(cine.data, np.float32)
    moved, maff = _regrid(data, cine.affine, axes, flips)
    assert not np.array_equal(moved, data)
    p, bundle = CardiacParams(), str(B.shipped_bundle())
    ref, _ = _network(cine, data, p, "cpu", bundle)
    got, meta = _network(Cine(moved, maff, dict(cine.meta)), moved, p, "cpu", bundle)
    back = got
    for a in flips:  # undo the regrid: flips, then the transpose
        back = np.flip(back, axis=a)
    back = np.transpose(back, list(np.argsort(axes)) + [3])
    agree = float((back == ref).mean())
    assert agree >= 0.999, agree
    truth = np.asarray(ph.labels["seg"].data)
    assert (ref[truth == 2] == 2).mean() > 0.6  # and the labels are the heart's (myocardium vs truth)
