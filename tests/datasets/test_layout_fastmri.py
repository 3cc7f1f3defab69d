"""fastMRI layout and .h5 io: round trip, real-file conventions, malformed files."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from bcer.contracts.artifacts import KSpace
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import spacing
from bcer.datasets.kspace import ifft2c, make_kspace_case, rss
from bcer.datasets.layouts import detect_layout, fastmri, read_dataset
from bcer.metrics import nrmse
from bcer.io import load_sequence
from bcer.io.fastmri import ismrmrd_xml, read_fastmri, read_fastmri_reference, write_fastmri


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    out = tmp_path_factory.mktemp("fastmri")
    phantoms = [make_kspace_case("cmr_01", 1, "small", domain="cardiac", frames="ed", R=4),
                make_kspace_case("cmr_02", 2, "small", domain="cardiac", frames="ed", R=8, pattern="random")]
    return out, phantoms, fastmri.write(phantoms, out)


def test_file_follows_fastmri_conventions(cohort):
    out, phantoms, _ = cohort
    ks = phantoms[0].sequences["KSPACE"]
    with h5py.File(out / "cmr_01.h5", "r") as f:
        c, x, y, z = ks.data.shape
        assert f["kspace"].shape == (z, c, x, y) and f["kspace"].dtype == np.complex64
        assert f["reconstruction_rss"].shape == (z, x, y) and f["reconstruction_rss"].dtype == np.float32
        for key in ("acquisition", "max", "norm", "patient_id"):
            assert key in f.attrs
        assert f.attrs["max"] == pytest.approx(float(phantoms[0].references["KSPACE"].data.max()))
        assert f["mask"].shape == (y,) and f.attrs["acceleration"] == 4 and f.attrs["num_low_frequency"] == 24
        xml = f["ismrmrd_header"][()].decode()
        assert f"<x>{x}</x><y>{y}</y>" in xml
    assert detect_layout(out) == "fastmri"


def test_round_trip(cohort):
    out, phantoms, cases = cohort
    assert [c.id for c in cases] == ["cmr_01", "cmr_02"]
    for p, c in zip(phantoms, read_dataset(out)):
        ks, src = load_sequence(c.sequences["KSPACE"]), p.sequences["KSPACE"]
        assert isinstance(ks, KSpace)
        assert np.array_equal(ks.data, src.data) and np.array_equal(ks.mask, src.mask)
        assert np.array_equal(ks.affine, src.affine) and ks.meta["R"] == src.meta["R"]
        ref = load_sequence(SequenceRef.model_validate(c.ground_truth["references"]["KSPACE"]))
        assert np.array_equal(ref.data, p.references["KSPACE"].data)
        assert np.array_equal(ref.affine, p.references["KSPACE"].affine)
        assert {k: c.metadata[k] for k in p.metadata} == p.metadata
        assert c.ground_truth["values"]["kspace"]["R"] == src.meta["R"] and c.domain == "cardiac"
        seg = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["seg"]))
        assert np.array_equal(seg.data, p.labels["seg"].data)


def test_reference_is_the_fully_sampled_image(cohort):
    out, phantoms, cases = cohort
    ks = load_sequence(cases[0].sequences["KSPACE"])
    ref = load_sequence(SequenceRef.model_validate(cases[0].ground_truth["references"]["KSPACE"]))
    # zero-filled RSS of the undersampled data is close to, but not, the reference
    zf = rss(ifft2c(ks.data, (1, 2)))
    err = nrmse(zf, ref.data)
    assert 0.01 < err < 0.6


def _real_style_file(path, with_mask: bool):
    """A file shaped like a real fastMRI one: no bcer attributes, single slice group."""
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((3, 4, 32, 24)) + 1j * rng.standard_normal((3, 4, 32, 24))).astype(np.complex64)
    lines = np.zeros(24, bool)
    lines[[0, 4, 8, 10, 11, 12, 13, 16, 20]] = True
    k[..., ~lines] = 0
    with h5py.File(path, "w") as f:
        f.create_dataset("kspace", data=k)
        f.create_dataset("ismrmrd_header", data=ismrmrd_xml((32, 24, 3), (2.0, 2.5, 5.0), (16, 16), (2.0, 2.5, 5.0)))
        f.create_dataset("reconstruction_rss", data=np.ones((3, 16, 16), np.float32))
        if with_mask:
            f.create_dataset("mask", data=lines)
        f.attrs.update(acquisition="CORPD_FBK", max=1.0, norm=16.0, patient_id="abc")
    return k, lines


@pytest.mark.parametrize("with_mask", [True, False])
def test_reads_real_style_file(tmp_path, with_mask):
    k, lines = _real_style_file(tmp_path / "file1000001.h5", with_mask)
    (c,) = fastmri.read(tmp_path)
    assert c.id == "file1000001" and c.metadata == {"acquisition": "CORPD_FBK", "patient_id": "abc",
                                                    "recon_matrix": [16, 16], "encoded_matrix": [32, 24]}
    assert c.domain == "knee"  # from the acquisition code: no bcer sidecar says so
    ks = read_fastmri(tmp_path / "file1000001.h5")
    assert ks.data.shape == (4, 32, 24, 3) and np.array_equal(ks.data, k.transpose(1, 2, 3, 0))
    assert np.array_equal(ks.mask, lines)
    assert spacing(ks.affine) == pytest.approx((2.0, 2.5, 5.0))
    assert ks.meta["recon_matrix"] == [16, 16] and ks.recon_crop == (8, 4, 16, 16)
    ref = read_fastmri_reference(tmp_path / "file1000001.h5")
    assert ref.shape == (16, 16, 3)
    np.testing.assert_allclose(ref.affine, ks.recon_affine)  # the reference is the k-space grid's centre crop


def test_malformed_files(tmp_path):
    with h5py.File(tmp_path / "nok.h5", "w") as f:
        f.create_dataset("reconstruction_rss", data=np.ones((2, 4, 4), np.float32))
    with pytest.raises(ToolError) as e:
        fastmri.read(tmp_path)
    assert e.value.code is ErrorCode.schema and e.value.context["file"].endswith("nok.h5")
    assert "kspace" in e.value.message
    (tmp_path / "nok.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(ToolError) as e:
        read_fastmri(tmp_path / "nok.h5")
    assert e.value.code is ErrorCode.schema
    with h5py.File(tmp_path / "real.h5", "w") as f:
        f.create_dataset("kspace", data=np.ones((2, 4, 4), np.float32))  # not complex
    with pytest.raises(ToolError) as e:
        read_fastmri(tmp_path / "real.h5")
    assert e.value.code is ErrorCode.schema
    k = np.ones((2, 2, 4, 6), np.complex64)
    k[0, 0, 0, 0] = np.nan
    with h5py.File(tmp_path / "nan.h5", "w") as f:
        f.create_dataset("kspace", data=k)
    with pytest.raises(ToolError) as e:
        read_fastmri(tmp_path / "nan.h5")
    assert e.value.code is ErrorCode.numeric
    with h5py.File(tmp_path / "mask.h5", "w") as f:
        f.create_dataset("kspace", data=np.ones((2, 2, 4, 6), np.complex64))
        f.create_dataset("mask", data=np.ones(5, bool))
    with pytest.raises(ToolError) as e:
        read_fastmri(tmp_path / "mask.h5")
    assert e.value.code is ErrorCode.shape
    with pytest.raises(ToolError) as e:
        read_fastmri(tmp_path / "missing.h5")
    assert e.value.code is ErrorCode.input_missing


def test_cine_kspace_is_rejected_with_a_hint(tmp_path):
    p = make_kspace_case("cine", 3, "small", R=4)
    with pytest.raises(ToolError) as e:
        fastmri.write([p], tmp_path)
    assert e.value.code is ErrorCode.shape and "cmrx" in e.value.hint and e.value.context["case"] == "cine"
    with pytest.raises(ToolError):
        write_fastmri(tmp_path / "x.h5", p.sequences["KSPACE"])


def test_prostate_t2w_kspace_round_trip(tmp_path):
    """fastMRI-prostate style: axial T2w k-space with its fully sampled reference image."""
    p = make_kspace_case("pro_01", 4, "small", domain="prostate", R=4)
    (c,) = fastmri.write([p], tmp_path)
    ks, src = load_sequence(c.sequences["KSPACE"]), p.sequences["KSPACE"]
    assert np.array_equal(ks.data, src.data) and np.array_equal(ks.affine, src.affine)
    ref = load_sequence(SequenceRef.model_validate(c.ground_truth["references"]["KSPACE"]))
    assert np.array_equal(ref.data, p.references["KSPACE"].data) and c.domain == "prostate"
    assert spacing(ref.affine) == pytest.approx(p.references["KSPACE"].spacing)
    with h5py.File(tmp_path / "pro_01.h5", "r") as f:
        assert f.attrs["acquisition"] == "AXT2"
