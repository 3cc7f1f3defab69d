"""CMRxRecon layout and v7.3 .mat io: round trip, MATLAB conventions, real-style folders, bad files."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from bcer.contracts.artifacts import Cine, KSpace
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.kspace import make_kspace, make_kspace_case
from bcer.datasets.layouts import cmrx, detect_layout, read_dataset
from bcer.metrics import nrmse
from bcer.io import load_sequence
from bcer.io.cmrx import read_cmrx_kspace, read_cmrx_mask, write_cmrx_kspace, write_cmrx_mask


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmrx")
    phantoms = [make_kspace_case("a", 1, "small", R=4), make_kspace_case("P007", 2, "small", R=8)]
    return out, phantoms, cmrx.write(phantoms, out)


def test_files_follow_cmrxrecon(cohort):
    out, phantoms, cases = cohort
    assert [c.id for c in cases] == ["P001_acc04", "P007_acc08"]
    d = out / "MultiCoil" / "Cine" / "TrainingSet" / "AccFactor04" / "P001"
    ks = phantoms[0].sequences["KSPACE"]
    c, x, y, z, t = ks.data.shape
    with h5py.File(d / "cine_sax.mat", "r") as f:
        v = f["kspace_sub04"]
        assert v.shape == (t, z, c, y, x)  # MATLAB (kx, ky, sc, sz, t), reversed by HDF5
        assert v.dtype.names == ("real", "imag") and v.attrs["MATLAB_class"] == b"single"
    with h5py.File(d / "cine_sax_mask.mat", "r") as f:
        assert f["mask04"].shape == (y, x) and f["mask04"].attrs["MATLAB_class"] == b"logical"
    assert (d / "cine_sax.mat").read_bytes()[:19] == b"MATLAB 7.3 MAT-file"
    assert detect_layout(out) == "cmrx"


def test_round_trip(cohort):
    out, phantoms, _ = cohort
    for p, c in zip(phantoms, read_dataset(out)):
        ks, src = load_sequence(c.sequences["KSPACE"]), p.sequences["KSPACE"]
        assert isinstance(ks, KSpace) and ks.data.dtype == np.complex64
        assert np.array_equal(ks.data, src.data) and np.array_equal(ks.mask, src.mask)
        assert np.array_equal(ks.affine, src.affine) and ks.meta["R"] == src.meta["R"]
        ref = load_sequence(SequenceRef.model_validate(c.ground_truth["references"]["KSPACE"]))
        assert isinstance(ref, Cine) and np.array_equal(ref.data, p.references["KSPACE"].data)
        assert np.allclose(ref.affine, src.affine, atol=1e-6)
        seg = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["seg"]))
        assert np.array_equal(seg.data, p.labels["seg"].data)
        assert c.metadata == p.metadata and c.domain == "cardiac"
        assert c.ground_truth["values"]["lv_ef_pct"] == pytest.approx(p.truth["lv_ef_pct"])


def test_real_style_full_and_undersampled(tmp_path):
    """FullSample + AccFactor04 of one patient, no bcer files: the reference is RSS of the full data."""
    rng = np.random.default_rng(5)
    img = Cine(rng.random((24, 20, 2, 3)).astype(np.float32), np.eye(4))
    full, _ = make_kspace(img, n_coils=4, R=1, n_acs=8, rng=rng)
    base = tmp_path / "MultiCoil" / "Cine" / "TrainingSet"
    write_cmrx_kspace(base / "FullSample" / "P001" / "cine_sax.mat", full, "kspace_full")
    sub = KSpace(full.data.copy(), np.zeros(20, bool), full.affine)
    sub.mask[::4] = True
    sub.mask[8:12] = True
    sub.data[:, :, ~sub.mask] = 0
    write_cmrx_kspace(base / "AccFactor04" / "P001" / "cine_sax.mat", sub, "kspace_sub04")
    write_cmrx_mask(base / "AccFactor04" / "P001" / "cine_sax_mask.mat", sub.mask, 24, "mask04")
    for f in base.rglob("cine_sax.mat"):  # real files have no geometry
        with h5py.File(f, "a") as h:
            del h["bcer_affine"]
    (c,) = cmrx.read(tmp_path)
    assert c.id == "P001_acc04" and c.ground_truth["values"]["acceleration"] == 4
    ks = load_sequence(c.sequences["KSPACE"])
    assert np.array_equal(ks.mask, sub.mask) and ks.meta["geometry_known"] is False
    ref = load_sequence(SequenceRef.model_validate(c.ground_truth["references"]["KSPACE"]))
    assert ref.shape == img.shape
    assert nrmse(ref.data, img.data) < 1e-3


def test_two_dimensional_mask_kept_when_it_varies_along_readout(tmp_path):
    m = np.zeros((6, 10), bool)
    m[:, ::2] = True
    m[0, 1] = True
    write_cmrx_mask(tmp_path / "m.mat", m, 6, "mask10")
    back = read_cmrx_mask(tmp_path / "m.mat")
    assert back.shape == (6, 10) and np.array_equal(back, m)
    write_cmrx_mask(tmp_path / "v.mat", m[1], 6, "mask10")
    assert np.array_equal(read_cmrx_mask(tmp_path / "v.mat"), m[1])


def test_malformed_files(tmp_path):
    (tmp_path / "old.mat").write_bytes(b"MATLAB 5.0 MAT-file" + b"\0" * 200)
    with pytest.raises(ToolError) as e:
        read_cmrx_kspace(tmp_path / "old.mat")
    assert e.value.code is ErrorCode.schema and e.value.context["file"].endswith("old.mat")
    with h5py.File(tmp_path / "nok.mat", "w") as f:
        f.create_dataset("img", data=np.ones((2, 3, 4, 5)))
    with pytest.raises(ToolError) as e:
        read_cmrx_kspace(tmp_path / "nok.mat")
    assert e.value.code is ErrorCode.schema and "img" in e.value.hint
    with h5py.File(tmp_path / "real.mat", "w") as f:
        f.create_dataset("kspace_full", data=np.ones((2, 3, 4, 5), np.float32))
    with pytest.raises(ToolError) as e:
        read_cmrx_kspace(tmp_path / "real.mat")
    assert e.value.code is ErrorCode.schema
    ks = KSpace(np.ones((2, 6, 8, 1), np.complex64), np.ones(8, bool), np.eye(4))
    write_cmrx_kspace(tmp_path / "k.mat", ks, "kspace_sub04")
    write_cmrx_mask(tmp_path / "m.mat", np.ones(7, bool), 6, "mask04")
    with pytest.raises(ToolError) as e:
        read_cmrx_kspace(tmp_path / "k.mat", mask_path=tmp_path / "m.mat")
    assert e.value.code is ErrorCode.shape
    ks.data[0, 0, 0, 0] = np.nan
    write_cmrx_kspace(tmp_path / "n.mat", ks, "kspace_sub04")
    with pytest.raises(ToolError) as e:
        read_cmrx_kspace(tmp_path / "n.mat")
    assert e.value.code is ErrorCode.numeric
    with pytest.raises(ToolError) as e:
        cmrx.read(tmp_path / "nothing")
    assert e.value.code is ErrorCode.input_missing


def test_label_on_other_grid_is_shape_error(cohort, tmp_path):
    import shutil

    import nibabel as nib

    out = cohort[0]
    shutil.copytree(out, tmp_path / "ds")
    seg = next((tmp_path / "ds").rglob("cine_sax_seg.nii.gz"))
    img = nib.load(str(seg))
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[:, :-1], img.affine), str(seg))
    with pytest.raises(ToolError) as e:
        cmrx.read(tmp_path / "ds")
    assert e.value.code is ErrorCode.shape and "case" in e.value.context
