"""recon.* tools against ground truth: NRMSE thresholds, cine variants, error paths, and
the xp (array-module) core exercised through a numpy-backed stand-in for cupy."""
from __future__ import annotations

import types

import numpy as np
import pytest

from bcer.contracts.artifacts import Cine, Image, KSpace
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.tools import call_tool
from bcer.tools.recon._coils import analyse_mask, as_slices
from bcer.tools.recon._metrics import nrmse
from bcer.tools.recon.grappa import GrappaParams, grappa_core
from bcer.tools.recon.sense import SenseParams, sense_core
from bcer.tools.recon._fft import fft2c


def kspace_case(R: int, frames: int | None = None, n: int = 64, coils: int = 8,
                slices: int = 2) -> tuple[KSpace, np.ndarray]:
    """Local stand-in: Shepp-Logan objects, smooth complex coil maps, every R-th line + 24 ACS."""
    from skimage.data import shepp_logan_phantom
    from skimage.transform import resize

    img = resize(shepp_logan_phantom(), (n, n), anti_aliasing=True)
    x, y = np.meshgrid(np.linspace(-1, 1, n), np.linspace(-1, 1, n), indexing="ij")
    ang = 2 * np.pi * np.arange(coils) / coils
    maps = np.exp(-((x - 1.3 * np.cos(ang)[:, None, None]) ** 2 + (y - 1.3 * np.sin(ang)[:, None, None]) ** 2) / 1.5
                  + 1j * (ang[:, None, None] + 0.5 * x))
    maps /= np.sqrt((np.abs(maps) ** 2).sum(0))
    truth = np.stack([img * (1 + 0.1 * z) for z in range(slices)], -1)
    if frames:
        truth = np.stack([truth * (1 + 0.05 * t) for t in range(frames)], -1)
    coil = maps.reshape(maps.shape + (1,) * (truth.ndim - 2)) * truth[None]
    k = np.moveaxis(fft2c(np.moveaxis(coil, (1, 2), (-2, -1)), np), (-2, -1), (1, 2))
    rng = np.random.default_rng(0)
    k = k + 2e-3 * (rng.standard_normal(k.shape) + 1j * rng.standard_normal(k.shape))
    mask = np.zeros(n, bool)
    mask[::R] = True
    mask[n // 2 - 12:n // 2 + 12] = True
    k = k * mask.reshape((1, 1, n) + (1,) * (k.ndim - 3))
    return KSpace(k.astype(np.complex64), mask, np.diag([1.5, 1.5, 5.0, 1.0])), truth


@pytest.fixture(scope="module")
def r4() -> tuple[KSpace, np.ndarray, float]:
    ks, truth = kspace_case(R=4)
    zf = call_tool("recon.zero_filled", {"kspace": ks})["image"]
    return ks, truth, nrmse(zf.data, truth)


def test_zero_filled_fully_sampled_matches_truth() -> None:
    ks, truth = kspace_case(R=1)
    img = call_tool("recon.zero_filled", {"kspace": ks})["image"]
    assert isinstance(img, Image) and img.data.shape == truth.shape
    assert np.array_equal(img.affine, ks.affine)
    assert nrmse(img.data, truth) < 0.02


def test_zero_filled_is_aliased_at_r4(r4) -> None:
    _, _, zf_err = r4
    assert zf_err > 0.1  # otherwise the "half of zero-filled" thresholds below mean nothing


@pytest.mark.parametrize("tool", ["recon.grappa", "recon.sense"])
def test_r4_halves_zero_filled_error(r4, tool: str) -> None:
    ks, truth, zf_err = r4
    img = call_tool(tool, {"kspace": ks})["image"]
    err = nrmse(img.data, truth)
    assert err <= 0.5 * zf_err, (tool, err, zf_err)
    assert np.array_equal(img.affine, ks.affine)
    assert img.meta["acceleration"] >= 1.5 and img.meta["n_coils"] == ks.n_coils


def test_sense_espirit_maps(r4) -> None:
    ks, truth, zf_err = r4
    small = KSpace(ks.data[..., :1], ks.mask, ks.affine)
    img = call_tool("recon.sense", {"kspace": small}, {"maps": "espirit"})["image"]
    assert img.meta["maps"] == "espirit"
    assert nrmse(img.data, truth[..., :1]) <= 0.5 * zf_err


@pytest.mark.parametrize("tool", ["recon.zero_filled_cine", "recon.grappa_cine", "recon.sense_cine"])
def test_cine_variants(tool: str) -> None:
    ks, truth = kspace_case(R=4, frames=3)
    cine = call_tool(tool, {"kspace": ks})["cine"]
    assert isinstance(cine, Cine) and cine.data.shape == truth.shape
    zf = call_tool("recon.zero_filled_cine", {"kspace": ks})["cine"]
    zf_err = nrmse(zf.data, truth)
    err = nrmse(cine.data, truth)
    assert (err <= 0.5 * zf_err) if "zero" not in tool else (err == pytest.approx(zf_err))
    # frame by frame = volume tool on that frame (shared core)
    frame = KSpace(ks.data[..., 1], ks.mask, ks.affine)
    vol_tool = tool.removesuffix("_cine")
    vol = call_tool(vol_tool, {"kspace": frame})["image"]
    np.testing.assert_allclose(cine.data[..., 1], vol.data, rtol=1e-4, atol=1e-5 * vol.data.max())


@pytest.mark.parametrize("tool,cine", [("recon.grappa", True), ("recon.sense_cine", False),
                                       ("recon.zero_filled", True)])
def test_wrong_dimensionality_names_the_right_variant(tool: str, cine: bool) -> None:
    ks, _ = kspace_case(R=4, frames=2 if cine else None)
    with pytest.raises(ToolError) as e:
        call_tool(tool, {"kspace": ks})
    assert e.value.code == ErrorCode.shape
    right = tool + "_cine" if cine else tool.removesuffix("_cine")
    assert right in e.value.hint


def test_wrong_kind_is_schema_error() -> None:
    img = Image(np.zeros((8, 8, 2), np.float32), np.eye(4))
    with pytest.raises(ToolError) as e:
        call_tool("recon.grappa", {"kspace": img})
    assert e.value.code == ErrorCode.schema


def test_nan_kspace_is_numeric(r4) -> None:
    ks = r4[0]
    bad = ks.data.copy()
    bad[0, 3, 5, 0] = np.nan
    for tool in ("recon.zero_filled", "recon.grappa", "recon.sense"):
        with pytest.raises(ToolError) as e:
            call_tool(tool, {"kspace": KSpace(bad, ks.mask, ks.affine)})
        assert e.value.code == ErrorCode.numeric


def test_mask_length_mismatch_is_shape(r4) -> None:
    ks = r4[0]
    for tool in ("recon.zero_filled", "recon.grappa", "recon.sense"):
        with pytest.raises(ToolError) as e:
            call_tool(tool, {"kspace": KSpace(ks.data, ks.mask[:-3], ks.affine)})
        assert e.value.code == ErrorCode.shape and e.value.context["arg"] == "kspace.mask"


@pytest.mark.parametrize("tool,params", [("recon.grappa", {"kernel_x": 4}),
                                         ("recon.grappa", {"kernel_y": 9}),
                                         ("recon.grappa", {"lam": -1.0}),
                                         ("recon.sense", {"iterations": 0}),
                                         ("recon.sense", {"maps": "magic"})])
def test_bad_params_are_value_range(r4, tool: str, params: dict) -> None:
    with pytest.raises(ToolError) as e:
        call_tool(tool, {"kspace": r4[0]}, params)
    assert e.value.code == ErrorCode.value_range


def test_grappa_rejects_patterns_it_cannot_calibrate(r4) -> None:
    r8, _ = kspace_case(R=8)
    with pytest.raises(ToolError) as e:  # R=8, kernel_y=4 needs 8*3+1 = 25 ACS lines, has 24
        call_tool("recon.grappa", {"kspace": r8}, {"kernel_y": 4})
    assert e.value.code == ErrorCode.value_range and "kernel_y" in e.value.hint
    ks = r4[0]
    irregular = ks.mask.copy()
    irregular[np.flatnonzero(irregular)[0]] = False
    irregular[1] = True
    with pytest.raises(ToolError) as e:
        call_tool("recon.grappa", {"kspace": KSpace(ks.data, irregular, ks.affine)})
    assert e.value.code == ErrorCode.value_range and "recon.sense" in e.value.hint


class _CountingXp(types.ModuleType):
    """A numpy-backed stand-in for cupy: forwards to numpy and records what the core used,
    proving the GPU code path (written against ``xp``) runs end to end."""

    def __init__(self) -> None:
        super().__init__("counting_xp")
        self.used: set[str] = set()
        self.fft = types.SimpleNamespace(**{n: getattr(np.fft, n) for n in
                                            ("fft2", "ifft2", "fftshift", "ifftshift")})
        self.linalg = np.linalg

    def __getattr__(self, name: str):
        self.used.add(name)
        return getattr(np, name)


@pytest.mark.parametrize("core,params,tool", [(grappa_core, GrappaParams(), "recon.grappa"),
                                              (sense_core, SenseParams(), "recon.sense")])
def test_xp_core_path_matches_tool(r4, core, params, tool: str) -> None:
    ks = r4[0]
    xp = _CountingXp()
    sampling = analyse_mask(ks.mask, ks.data.shape[1:3])
    batch = xp.asarray(as_slices(ks.data), dtype=xp.complex64)
    images, _ = core(batch, sampling, params, xp)
    expected = call_tool(tool, {"kspace": ks})["image"].data
    np.testing.assert_allclose(np.moveaxis(images, 0, -1), expected, rtol=1e-5, atol=1e-6 * expected.max())
    assert {"asarray", "sqrt", "sum"} <= xp.used


def test_nrmse_metric() -> None:
    truth = np.zeros((10, 10, 1))
    truth[2:8, 2:8] = 1.0
    assert nrmse(3.0 * truth, truth) == pytest.approx(0.0, abs=1e-12)  # global gain is free
    noisy = truth.copy()
    noisy[2, 2] = 0.0  # one of 36 object voxels wrong
    assert 0.1 < nrmse(noisy, truth) < 0.2
