"""Degraded inputs (Denoise, SuperRes): known degradations with clean truth to measure against."""
from __future__ import annotations

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.datasets.brain import make_brain
from bcer.datasets.degraded import make_denoise_case, make_superres_case, nrmse, psnr


@pytest.fixture(scope="module")
def noisy():
    return make_denoise_case("dn-1", seed=4, size="small", domain="brain", sigma_frac=0.05)


@pytest.fixture(scope="module")
def thick():
    return make_superres_case("sr-1", seed=4, size="small", domain="brain", factor=4)


def test_denoise_reference_is_the_clean_phantom(noisy):
    clean = make_brain("dn-1", seed=4, size="small")
    for name, ref in noisy.references.items():
        assert np.array_equal(ref.data, clean.sequences[name].data)
        assert np.allclose(ref.affine, noisy.sequences[name].affine)
        assert not np.array_equal(noisy.sequences[name].data, ref.data)


def test_denoise_noise_level_is_as_stated(noisy):
    info = noisy.truth["denoise"]
    for name, ref in noisy.references.items():
        sigma = info["sigma"][name]
        bright = ref.data > 0.5 * ref.data.max()  # high SNR: Rician ~ Gaussian there
        resid = noisy.sequences[name].data[bright] - ref.data[bright]
        assert float(resid.std()) == pytest.approx(sigma, rel=0.1)
        assert info["nrmse"][name] == pytest.approx(nrmse(noisy.sequences[name].data, ref.data))
        assert info["psnr"][name] == pytest.approx(psnr(noisy.sequences[name].data, ref.data))
        assert 0.02 < info["nrmse"][name] < 0.5
    # twice the noise fraction, twice the sigma, on the same clean anatomy
    louder = make_denoise_case("dn-1", seed=4, size="small", domain="brain", sigma_frac=0.10)
    assert louder.truth["denoise"]["sigma"]["T1"] == pytest.approx(2 * info["sigma"]["T1"], rel=1e-6)
    assert np.array_equal(louder.references["T1"].data, noisy.references["T1"].data)


def test_superres_geometry_and_truth(thick):
    info = thick.truth["superres"]
    assert info["factor"] == 4 and info["axis"] == 2
    for name, lo in thick.sequences.items():
        hi = thick.references[name]
        assert lo.shape[:2] == hi.shape[:2] and lo.shape[2] * 4 == hi.shape[2]
        np.testing.assert_allclose(lo.spacing[2], 4 * hi.spacing[2], rtol=1e-9)
        np.testing.assert_allclose(thick.metadata["target_spacing"][name], hi.spacing)
        assert thick.metadata["target_shape"][name] == list(hi.shape)
        # every low-res voxel is the mean of its 4 high-res voxels, and sits at their centre
        slabs = hi.data.reshape(hi.shape[:2] + (lo.shape[2], 4)).mean(axis=-1)
        np.testing.assert_allclose(lo.data, slabs, rtol=1e-5, atol=1e-3)
        centre_hi = vox2world(hi.affine, [[3, 5, 4 * 2 + k] for k in range(4)]).mean(axis=0)
        np.testing.assert_allclose(vox2world(lo.affine, [3, 5, 2]), centre_hi, atol=1e-9)
        assert info["input_nrmse"][name] > 0.05
    assert thick.labels == {} and info["labels_dropped"] == ["brain", "seg"]


def test_degraded_cases_round_trip_through_brats(noisy, thick, tmp_path):
    from bcer.contracts.case import SequenceRef
    from bcer.datasets.layouts import brats
    from bcer.io import load_sequence

    for ph in (noisy, thick):
        (case,) = brats.write([ph], tmp_path / ph.case_id)
        for name, ref in case.ground_truth["references"].items():
            back = load_sequence(SequenceRef.model_validate(ref))
            assert np.array_equal(back.data, ph.references[name].data)
            np.testing.assert_allclose(back.affine, ph.references[name].affine, atol=1e-5)
        assert load_sequence(case.sequences["T2"]).shape == ph.sequences["T2"].shape


def test_other_domains_when_available():
    from bcer.datasets.generators import get_generator

    try:
        get_generator("prostate")
    except ToolError:
        pytest.skip("prostate generator not available")
    ph = make_denoise_case("dn-p", seed=2, size="small", domain="prostate", sigma_frac=0.04)
    assert set(ph.references) >= {"T2w", "ADC", "DWI"}
    for name in ph.references:
        assert ph.truth["denoise"]["sigma"][name] > 0


@pytest.mark.parametrize("fn,kw", [(make_denoise_case, {"sigma_frac": 0.0}),
                                   (make_denoise_case, {"domain": "knee"}),
                                   (make_superres_case, {"factor": 1})])
def test_bad_arguments_are_typed(fn, kw):
    with pytest.raises(ToolError) as e:
        fn("bad", 0, "small", **kw)
    assert e.value.code == ErrorCode.value_range
