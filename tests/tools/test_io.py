"""io.* tools: round trips through NIfTI, DICOM, fastMRI and CMRxRecon files, and their error codes."""
from __future__ import annotations

import gzip
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from bcer.contracts.artifacts import Cine, Image, KSpace, Mask
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.io.cmrx import write_cmrx_kspace, write_cmrx_mask
from bcer.io.dicom import write_series
from bcer.io.fastmri import write_fastmri
from bcer.tools.registry import call_tool


def _oblique_affine() -> np.ndarray:
    a = np.eye(4)
    a[:3, :3] = Rotation.from_euler("xyz", [12, -7, 20], degrees=True).as_matrix() @ np.diag([-0.9, 1.1, 3.0])
    a[:3, 3] = [91.25, -120.5, 33.0]
    return a


@pytest.fixture()
def image() -> Image:
    rng = np.random.default_rng(0)
    return Image(rng.normal(100, 30, (12, 10, 6)).astype(np.float32), _oblique_affine())


def _corners_mm(a: np.ndarray, shape) -> np.ndarray:
    n = np.asarray(shape[:3]) - 1
    return vox2world(a, [[0, 0, 0], n, [n[0], 0, n[2]]])


def test_nifti_round_trip_image_mask_cine(tmp_path: Path, image: Image) -> None:
    saved = call_tool("io.save_nifti", {"image": image}, {"path": str(tmp_path / "t1.nii.gz")})["saved"]
    row = saved.rows[0]
    assert row["kind"] == "image" and row["shape"] == [12, 10, 6] and len(row["sha256"]) == 64
    back = call_tool("io.load_nifti", {}, {"path": row["path"]})["image"]
    assert np.array_equal(back.data, image.data)  # float32 stored as float32: bit-exact
    # NIfTI stores the sform in float32: the same voxels within a micrometre.
    np.testing.assert_allclose(_corners_mm(back.affine, back.shape), _corners_mm(image.affine, image.shape), atol=1e-4)
    assert back.orientation == image.orientation and row["orientation"] == image.orientation

    labels = Mask((image.data > 100).astype(np.int16) * 4, image.affine, labels={4: "enhancing"})
    call_tool("io.save_nifti", {"mask": labels}, {"path": str(tmp_path / "seg.nii.gz")})
    m = call_tool("io.load_nifti_mask", {}, {"path": str(tmp_path / "seg.nii.gz"), "labels": {4: "enhancing"}})["mask"]
    assert np.array_equal(m.data, labels.data) and m.labels == {4: "enhancing"}

    cine = Cine(np.stack([image.data, 2 * image.data], axis=-1), image.affine)
    out = call_tool("io.save_nifti", {"cine": cine}, {"path": str(tmp_path / "cine")})["saved"].rows[0]["path"]
    assert out.endswith(".nii.gz")
    c = call_tool("io.load_nifti_cine", {}, {"path": out})["cine"]
    assert np.array_equal(c.data, cine.data) and c.n_frames == 2


def test_dicom_round_trip(tmp_path: Path, image: Image) -> None:
    ints = Image(np.rint(image.data).astype(np.float32), image.affine)
    write_series(ints, tmp_path / "AX_T2", "AX T2")
    back = call_tool("io.load_dicom", {}, {"path": str(tmp_path / "AX_T2")})["image"]
    assert np.array_equal(back.data, ints.data)  # integer data: exact
    np.testing.assert_allclose(_corners_mm(back.affine, back.shape), _corners_mm(ints.affine, ints.shape), atol=1e-3)
    assert back.meta["SeriesDescription"] == "AX T2"


def _kspace(shape=(4, 16, 12, 3), seed: int = 0) -> KSpace:
    rng = np.random.default_rng(seed)
    data = (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)
    mask = np.zeros(shape[2], bool)
    mask[::2] = True
    mask[5:8] = True
    data[:, :, ~mask] = 0
    return KSpace(data, mask, _oblique_affine())


def test_fastmri_round_trip(tmp_path: Path) -> None:
    ks = _kspace()
    write_fastmri(tmp_path / "file1.h5", ks)
    back = call_tool("io.load_fastmri", {}, {"path": str(tmp_path / "file1.h5")})["kspace"]
    assert np.array_equal(back.data, ks.data)
    assert np.array_equal(np.asarray(back.mask, bool), ks.mask)
    np.testing.assert_allclose(back.affine, ks.affine, atol=1e-9)


def test_cmrx_round_trip_with_separate_mask(tmp_path: Path) -> None:
    ks = _kspace((3, 16, 12, 2, 5), seed=1)  # (C, X, Y, Z, T) cine k-space
    write_cmrx_kspace(tmp_path / "cine_sax.mat", ks, variable="kspace_sub04")
    write_cmrx_mask(tmp_path / "cine_sax_mask.mat", ks.mask, nx=16, variable="mask04")
    back = call_tool("io.load_cmrx", {}, {"path": str(tmp_path / "cine_sax.mat"),
                                          "mask_path": str(tmp_path / "cine_sax_mask.mat")})["kspace"]
    assert np.array_equal(back.data, ks.data)
    assert np.array_equal(np.asarray(back.mask, bool), ks.mask)
    np.testing.assert_allclose(back.affine, ks.affine, atol=1e-9)
    assert back.meta["R"] == 4


def test_errors(tmp_path: Path, image: Image) -> None:
    four_d = tmp_path / "4d.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((4, 4, 4, 3), np.float32), np.eye(4)), str(four_d))
    truncated = tmp_path / "bad.nii.gz"
    truncated.write_bytes(gzip.compress(b"\x00" * 400)[:60])
    nan = Image(np.full((3, 3, 3), np.nan, np.float32), np.eye(4))
    cases = [
        ("io.load_nifti", {}, {"path": str(tmp_path / "missing.nii.gz")}, ErrorCode.input_missing),
        ("io.load_nifti", {}, {"path": str(four_d)}, ErrorCode.shape),
        ("io.load_nifti", {}, {"path": str(truncated)}, ErrorCode.schema),
        ("io.load_nifti", {}, {}, ErrorCode.schema),
        ("io.load_nifti", {}, {"path": "x.nii", "file": "y"}, ErrorCode.schema),
        ("io.load_dicom", {}, {"path": str(tmp_path)}, ErrorCode.input_missing),
        ("io.load_fastmri", {}, {"path": str(truncated)}, ErrorCode.schema),
        ("io.load_cmrx", {}, {"path": str(tmp_path / "none.mat")}, ErrorCode.input_missing),
        ("io.save_nifti", {}, {"path": str(tmp_path / "o.nii.gz")}, ErrorCode.input_missing),
        ("io.save_nifti", {"image": image, "mask": Mask(np.zeros((2, 2, 2), np.int16), np.eye(4))},
         {"path": str(tmp_path / "o.nii.gz")}, ErrorCode.schema),
        ("io.save_nifti", {"image": nan}, {"path": str(tmp_path / "o.nii.gz")}, ErrorCode.numeric),
        ("io.save_nifti", {"image": Mask(np.zeros((2, 2, 2), np.int16), np.eye(4))},
         {"path": str(tmp_path / "o.nii.gz")}, ErrorCode.schema),
    ]
    for tool, inputs, params, code in cases:
        with pytest.raises(ToolError) as e:
            call_tool(tool, inputs, params)
        assert e.value.code == code, (tool, params, e.value)
    assert not (tmp_path / "o.nii.gz").exists()


def test_unknown_artifact_kind_in_json_is_a_schema_error():
    from bcer.io import artifact_from_dict

    with pytest.raises(ToolError) as e:
        artifact_from_dict({"kind": "tabel", "rows": []})
    assert e.value.code is ErrorCode.schema and "'tabel'" in e.value.message
