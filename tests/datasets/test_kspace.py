"""k-space forward model: FFT convention, coil maps, sampling masks, k-space cases."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.artifacts import Cine, Image, KSpace
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.kspace import (acs_slice, coil_maps, fft2c, ifft2c, make_kspace, make_kspace_case,
                                  rss, undersample_mask)
from bcer.metrics import nrmse


def test_fft_convention_is_centred_and_unitary():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 24)) + 1j * rng.standard_normal((32, 24))
    k = fft2c(x, (0, 1))
    assert np.linalg.norm(k) == pytest.approx(np.linalg.norm(x), rel=1e-12)  # norm="ortho"
    assert np.allclose(ifft2c(k, (0, 1)), x)
    const = np.ones((32, 24))
    kc = fft2c(const, (0, 1))
    assert np.unravel_index(np.argmax(np.abs(kc)), kc.shape) == (16, 12)  # DC at (X//2, Y//2)
    assert abs(kc[16, 12]) == pytest.approx(np.sqrt(32 * 24))
    # exactly the documented numpy expression
    ref = np.fft.fftshift(np.fft.fftn(np.fft.ifftshift(x), norm="ortho"))
    assert np.allclose(k, ref)


def test_coil_maps_smooth_and_rss_one():
    maps = coil_maps((48, 40), 8, np.random.default_rng(1))
    assert maps.shape == (8, 48, 40) and maps.dtype == np.complex64
    assert np.allclose(rss(maps), 1.0, atol=1e-5)
    mag = np.abs(maps)
    assert (mag.max(axis=(1, 2)) / mag.min(axis=(1, 2))).min() > 5  # each coil sees one region best
    peaks = {np.unravel_index(np.argmax(c), c.shape) for c in mag}
    assert len(peaks) == 8  # ... and each a different one (a ring array)
    assert np.abs(np.diff(mag, axis=1)).max() < 0.1  # smooth: no jumps between neighbouring pixels
    assert np.abs(np.diff(mag, axis=2)).max() < 0.1
    with pytest.raises(ToolError) as e:
        coil_maps((8, 8), 0, np.random.default_rng(0))
    assert e.value.code is ErrorCode.value_range


@pytest.mark.parametrize("ny,R", [(56, 4), (128, 4), (128, 8), (193, 8)])
@pytest.mark.parametrize("pattern", ["regular", "random"])
def test_masks_have_24_centre_lines_and_rate_R(ny, R, pattern):
    m = undersample_mask(ny, R, 24, np.random.default_rng(3), pattern)
    assert m.dtype == bool and m.shape == (ny,)
    acs = acs_slice(ny, 24)
    assert m[acs].all() and acs.stop - acs.start == 24 and acs.start <= ny // 2 < acs.stop
    outer = np.ones(ny, bool)
    outer[acs] = False
    n_outer = int(outer.sum())
    got = int(m[outer].sum())
    assert abs(got - n_outer / R) <= 1
    if pattern == "regular":  # exactly the lattice through the centre line, nothing else
        lines = np.flatnonzero(m & outer)
        lattice = np.flatnonzero(outer & ((np.arange(ny) - ny // 2) % R == 0))
        assert np.array_equal(lines, lattice)


def test_mask_errors():
    for kw in ({"R": 0}, {"n_acs": 80}, {"pattern": "spiral"}):
        args = {"ny": 64, "R": 4, "n_acs": 24, "rng": np.random.default_rng(0)} | kw
        with pytest.raises(ToolError) as e:
            undersample_mask(**args)
        assert e.value.code is ErrorCode.value_range
    with pytest.raises(ToolError):
        undersample_mask(64, 4, 24, None, "random")


def test_fully_sampled_kspace_reproduces_image():
    rng = np.random.default_rng(2)
    img = Image(rng.random((40, 36, 3)).astype(np.float32), np.diag([1.4, 1.4, 8.0, 1.0]))
    ks, maps = make_kspace(img, n_coils=8, R=1, rng=rng)
    assert isinstance(ks, KSpace) and ks.data.shape == (8, 40, 36, 3) and ks.data.dtype == np.complex64
    assert ks.mask.all() and ks.acceleration == 1.0 and np.array_equal(ks.affine, img.affine)
    recon = rss(ifft2c(ks.data, (1, 2)))
    assert nrmse(recon, img.data) < 1e-3
    coil0 = ifft2c(ks.data[0], (0, 1))
    assert nrmse(coil0, maps[0][..., None] * img.data) < 1e-3


def test_undersampled_noisy_cine_kspace():
    rng = np.random.default_rng(4)
    gx, gy = np.meshgrid(np.linspace(-1, 1, 32), np.linspace(-1, 1, 48), indexing="ij")
    blob = np.exp(-(gx ** 2 + gy ** 2) / 0.2)  # smooth: its spectrum vanishes at the k-space edge
    cine = Cine(np.broadcast_to(blob[..., None, None], (32, 48, 2, 5)).astype(np.float32), np.eye(4))
    ks, _ = make_kspace(cine, n_coils=4, R=4, noise=0.01, rng=rng)
    assert ks.data.shape == (4, 32, 48, 2, 5)
    assert np.all(ks.data[:, :, ~ks.mask] == 0) and np.all(np.abs(ks.data[:, :, ks.mask]) > 0)
    assert ks.meta["noise_sigma"] == pytest.approx(0.01 * cine.data.max())
    assert ks.acceleration == pytest.approx(48 / ks.mask.sum())
    # noise level measured in the far corners of k-space (signal there is tiny)
    corner = ks.data[:, :4][:, :, ks.mask]
    assert np.std(corner.real) == pytest.approx(ks.meta["noise_sigma"], rel=0.25)


def test_make_kspace_errors():
    with pytest.raises(ToolError) as e:
        make_kspace(Image(np.zeros((4, 4)), np.eye(4)))
    assert e.value.code is ErrorCode.shape
    bad = np.ones((8, 30, 2), np.float32)
    bad[0, 0, 0] = np.nan
    with pytest.raises(ToolError) as e:
        make_kspace(Image(bad, np.eye(4)))
    assert e.value.code is ErrorCode.numeric
    with pytest.raises(ToolError) as e:
        make_kspace(Image(np.ones((8, 30, 2), np.float32), np.eye(4)), noise=-1)
    assert e.value.code is ErrorCode.value_range


@pytest.mark.parametrize("R", [4, 8])
def test_cardiac_kspace_case(R):
    ph = make_kspace_case("k1", 3, "small", domain="cardiac", R=R, noise=0.0)
    ks, ref = ph.sequences["KSPACE"], ph.references["KSPACE"]
    assert set(ph.sequences) == {"KSPACE"} and isinstance(ref, Cine)
    assert ks.data.shape == (8,) + ref.shape and ks.mask.shape == (ref.shape[1],)
    assert int(ks.mask[acs_slice(ref.shape[1], 24)].sum()) == 24
    assert ph.truth["kspace"]["R"] == R and ph.truth["ed_frame"] >= 0 and "seg" in ph.labels
    full = ks.data.copy()
    # the fully sampled truth is exactly what generated the acquired lines
    ks_full, _ = make_kspace(ref, 8, 1, 24, 0.0, np.random.default_rng([3, 0x4B53]))
    assert np.allclose(full[:, :, ks.mask], ks_full.data[:, :, ks.mask], atol=1e-5)
    zf = rss(ifft2c(full, (1, 2)))
    err = nrmse(zf, ref.data)
    assert 0.02 < err < 0.6  # undersampling costs something, R=8 more than R=4
    assert ref.data.max() == pytest.approx(1.0)


def test_cardiac_ed_frame_case_and_bad_domain():
    ph = make_kspace_case("k2", 1, "small", domain="cardiac", frames="ed", R=4)
    assert ph.sequences["KSPACE"].data.ndim == 4 and isinstance(ph.references["KSPACE"], Image)
    with pytest.raises(ToolError) as e:
        make_kspace_case("k3", 1, domain="knee")
    assert e.value.code is ErrorCode.value_range
