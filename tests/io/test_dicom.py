"""DICOM series reader/writer: pydicom's shipped MR files, geometry round trips, bad files."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
import SimpleITK as sitk
from pydicom.data import get_testdata_file

from bcer.contracts.artifacts import Image, Mask
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.io import load_sequence
from bcer.io.dicom import list_series, read_series, write_series

# The MR files pydicom ships in its wheel (the rest of its test data needs a download).
SHIPPED_MR = ["MR_small.dcm", "MR_small_implicit.dcm", "MR_small_bigendian.dcm", "MR_small_expb.dcm",
              "MR_small_RLE.dcm", "MR_small_padded.dcm", "MR_small_jp2klossless.dcm"]


def _shipped(name: str) -> Path:
    path = Path(get_testdata_file("MR_small.dcm")).parent / name
    assert path.exists(), f"pydicom no longer ships {name}"
    return path


def _decodes(path: Path) -> bool:
    try:
        pydicom.dcmread(str(path)).pixel_array
        return True
    except Exception:
        return False


@pytest.mark.parametrize("name", SHIPPED_MR)
def test_reads_pydicom_mr_files_with_right_shape_spacing_and_origin(name):
    path = _shipped(name)
    if not _decodes(path):
        pytest.skip(f"no pixel decoder installed for {name}")
    img = read_series(path)
    assert img.shape == (64, 64, 1)
    np.testing.assert_allclose(img.spacing, (0.3125, 0.3125, 0.8), atol=1e-6)
    # IPP (-83.9063, -91.2, 6.6406) LPS with identity IOP -> RAS origin, axes toward L and P
    np.testing.assert_allclose(img.affine[:3, 3], (83.9063, 91.2, 6.6406), atol=1e-4)
    assert img.orientation == "LPS"
    raw = pydicom.dcmread(str(path)).pixel_array.astype(np.float32)
    np.testing.assert_array_equal(img.data[:, :, 0], raw.T)  # X = columns, Y = rows


def test_geometry_agrees_with_simpleitk_on_shipped_file():
    path = _shipped("MR_small.dcm")
    ours, ref = read_series(path), sitk.ReadImage(str(path))
    lps = np.diag([-1.0, -1.0, 1.0])
    np.testing.assert_allclose(ours.affine[:3, 3], lps @ np.array(ref.GetOrigin()), atol=1e-4)
    np.testing.assert_allclose(ours.spacing[:2], ref.GetSpacing()[:2], atol=1e-6)
    np.testing.assert_array_equal(ours.data[:, :, 0], sitk.GetArrayFromImage(ref)[0].T.astype(np.float32))


def test_truncated_pixel_data_is_a_schema_error_naming_the_file():
    path = _shipped("MR_truncated.dcm")
    with pytest.raises(ToolError) as e:
        read_series(path)
    assert e.value.code is ErrorCode.schema
    assert e.value.context["file"].endswith("MR_truncated.dcm")
    assert "MR_truncated.dcm" in str(e.value)


def test_truncated_header_is_a_schema_error(tmp_path):
    src = _shipped("MR_small.dcm").read_bytes()
    bad = tmp_path / "series" / "IM_0001.dcm"
    bad.parent.mkdir()
    bad.write_bytes(src[:1000])  # cut inside the header: geometry and pixels gone
    with pytest.raises(ToolError) as e:
        read_series(bad.parent)
    assert e.value.code is ErrorCode.schema and e.value.context["file"] == str(bad)


def test_missing_folder_and_non_dicom_folder_are_input_missing(tmp_path):
    with pytest.raises(ToolError) as e:
        read_series(tmp_path / "nope")
    assert e.value.code is ErrorCode.input_missing
    (tmp_path / "notes.dat").write_text("not dicom")
    with pytest.raises(ToolError) as e:
        read_series(tmp_path)
    assert e.value.code is ErrorCode.input_missing


def _oblique_affine(flip: bool) -> np.ndarray:
    from scipy.spatial.transform import Rotation

    r = Rotation.from_euler("xyz", [12.0, -7.0, 20.0], degrees=True).as_matrix()
    d = r @ np.diag([-1.0, 1.0 if flip else -1.0, 1.0])  # right-handed unless ``flip``
    a = np.eye(4)
    a[:3, :3] = d @ np.diag([0.7, 0.9, 3.3])
    a[:3, 3] = [12.5, -40.25, 7.125]
    return a


@pytest.mark.parametrize("flip", [False, True])
def test_float_round_trip_keeps_affine_and_values_within_rescale_step(tmp_path, flip):
    rng = np.random.default_rng(3)
    data = rng.normal(500.0, 150.0, size=(24, 18, 7)).astype(np.float32)
    img = Image(data, _oblique_affine(flip))
    paths = write_series(img, tmp_path / "s", "AX_T2")
    assert [p.name for p in paths[:2]] == ["IM_0001.dcm", "IM_0002.dcm"] and len(paths) == 7
    back = read_series(tmp_path / "s")
    assert back.shape == data.shape
    np.testing.assert_allclose(back.affine, img.affine, atol=1e-6)
    ds = pydicom.dcmread(str(paths[0]))
    slope = float(ds.RescaleSlope)
    assert ds.SOPClassUID == "1.2.840.10008.5.1.4.1.1.4" and slope != 1.0
    assert np.max(np.abs(back.data - data)) <= slope * 0.5 + 1e-3
    assert back.meta["SeriesDescription"] == "AX_T2"


@pytest.mark.parametrize("flip", [False, True])
def test_written_geometry_agrees_with_simpleitk_series_reader(tmp_path, flip):
    img = Image(np.arange(10 * 8 * 5, dtype=np.float32).reshape(10, 8, 5), _oblique_affine(flip))
    write_series(img, tmp_path / "s", "T1")
    reader = sitk.ImageSeriesReader()
    reader.SetFileNames(reader.GetGDCMSeriesFileNames(str(tmp_path / "s")))
    ref = reader.Execute()
    arr = sitk.GetArrayFromImage(ref).transpose(2, 1, 0)
    lps = np.diag([-1.0, -1.0, 1.0])
    sitk_affine = np.eye(4)
    sitk_affine[:3, :3] = lps @ np.array(ref.GetDirection()).reshape(3, 3) @ np.diag(ref.GetSpacing())
    sitk_affine[:3, 3] = lps @ np.array(ref.GetOrigin())
    if flip:  # ITK always stacks along the normal: same world grid, slices in reverse order
        arr = arr[:, :, ::-1]
        sitk_affine = sitk_affine @ np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, -1, 4], [0, 0, 0, 1.0]])
    np.testing.assert_allclose(sitk_affine, img.affine, atol=1e-5)
    np.testing.assert_allclose(arr, img.data, atol=1e-2)


def test_integer_masks_round_trip_exactly_and_via_sequence_ref(tmp_path):
    labels = np.zeros((9, 11, 4), dtype=np.int16)
    labels[2:5, 3:9, 1:3] = 2
    labels[6, 6, 3] = 1
    write_series(Mask(labels, _oblique_affine(True)), tmp_path / "m", "labels")
    back = load_sequence(SequenceRef(path=str(tmp_path / "m"), format="dicom"))
    np.testing.assert_array_equal(back.data, labels.astype(np.float32))


def test_slices_sorted_by_position_not_file_name(tmp_path):
    rng = np.random.default_rng(0)
    img = Image(rng.uniform(0, 100, (12, 10, 6)).astype(np.float32), _oblique_affine(False))
    paths = write_series(img, tmp_path / "s", "AX_T2")
    for i, p in enumerate(paths):  # scramble names so directory order is not slice order
        p.rename(p.with_name(f"x{(i * 7) % 11:02d}_{i}.dcm"))
    back = read_series(tmp_path / "s")
    np.testing.assert_allclose(back.affine, img.affine, atol=1e-6)
    assert np.max(np.abs(back.data - img.data)) < 0.01


def test_missing_middle_slice_is_rejected_as_uneven_spacing(tmp_path):
    img = Image(np.ones((6, 6, 5), np.float32), _oblique_affine(False))
    paths = write_series(img, tmp_path / "s", "AX_T2")
    paths[2].unlink()
    with pytest.raises(ToolError) as e:
        read_series(tmp_path / "s")
    assert e.value.code is ErrorCode.schema and "not uniform" in e.value.message and "IM_0004" in e.value.message


def test_two_series_in_one_folder_need_a_series_uid(tmp_path):
    a = Image(np.full((5, 4, 3), 10.0, np.float32), _oblique_affine(False))
    b = Image(np.full((6, 5, 2), 20.0, np.float32), np.diag([1.0, 1.0, 2.0, 1.0]))
    write_series(a, tmp_path / "mix" / "a", "AX_T2", series_number=1)
    write_series(b, tmp_path / "mix" / "b", "AX_DIFFUSION_ADC", series_number=2)
    for p in (tmp_path / "mix" / "b").iterdir():  # put all files in one folder
        shutil.move(str(p), tmp_path / "mix" / "a" / f"b_{p.name}")
    series = list_series(tmp_path / "mix")
    assert [(s["SeriesDescription"], s["n_files"]) for s in series] == [("AX_T2", 3), ("AX_DIFFUSION_ADC", 2)]
    with pytest.raises(ToolError) as e:
        read_series(tmp_path / "mix")
    assert e.value.code is ErrorCode.schema
    adc = read_series(tmp_path / "mix", series_uid=series[1]["SeriesInstanceUID"])
    assert adc.shape == (6, 5, 2) and float(adc.data.mean()) == 20.0


def test_writer_rejects_non_volumes_and_nan(tmp_path):
    with pytest.raises(ToolError) as e:
        write_series(Image(np.ones((4, 4), np.float32), np.eye(4)), tmp_path / "x", "bad")
    assert e.value.code is ErrorCode.shape
    data = np.ones((4, 4, 2), np.float32)
    data[1, 1, 1] = np.nan
    with pytest.raises(ToolError) as e:
        write_series(Image(data, np.eye(4)), tmp_path / "y", "bad")
    assert e.value.code is ErrorCode.numeric


def test_dwi_b_value_round_trips_through_dicom(tmp_path):
    img = Image(np.ones((6, 5, 3), np.float32), _oblique_affine(False))
    write_series(img, tmp_path / "dwi", "calc_bval", extra={"DiffusionBValue": 2000})
    assert read_series(tmp_path / "dwi").meta["b_value"] == 2000.0
    write_series(img, tmp_path / "t2", "AX_T2")
    assert "b_value" not in read_series(tmp_path / "t2").meta


# ---- files we did not write: pydicom-data's enhanced MR and compressed variants ----------------
def _testdata(name: str) -> Path:
    path = get_testdata_file(name)  # pydicom-data (dev extra) carries the full set offline
    assert path is not None, f"{name} not found: install the dev extra (pydicom-data)"
    return Path(path)


@pytest.mark.parametrize("name", ["MR_small_RLE.dcm", "MR_small_jpeg_ls_lossless.dcm", "MR_small_jp2klossless.dcm"])
def test_lossless_compressed_files_decode_to_the_uncompressed_values(name):
    got, want = read_series(_testdata(name)), read_series(_testdata("MR_small.dcm"))
    assert got.shape == want.shape and np.array_equal(got.data, want.data)
    np.testing.assert_allclose(got.affine, want.affine, atol=1e-9)
    assert got.meta["transfer_syntax"] != want.meta["transfer_syntax"]


def _with_frame_geometry(src: Path, out: Path) -> Path:
    """emri_small* as shipped carry no functional groups: give each frame a plane position
    (2.5 mm apart along an oblique normal) and shared orientation, spacing and rescale, keeping
    the third-party pixel data (and its compression) as it is."""
    from pydicom.dataset import Dataset
    from pydicom.sequence import Sequence

    ds = pydicom.dcmread(str(src))
    iop = [0.0, 0.8, 0.6, 0.0, 0.6, -0.8]  # an oblique sagittal plane: normal (-1, 0, 0)
    shared = Dataset()
    ori, meas, pvt = Dataset(), Dataset(), Dataset()
    ori.ImageOrientationPatient = iop
    meas.PixelSpacing, meas.SliceThickness = [0.9, 0.8], 2.5
    pvt.RescaleSlope, pvt.RescaleIntercept, pvt.RescaleType = 2, -10, "US"
    shared.PlaneOrientationSequence = Sequence([ori])
    shared.PixelMeasuresSequence = Sequence([meas])
    shared.PixelValueTransformationSequence = Sequence([pvt])
    ds.SharedFunctionalGroupsSequence = Sequence([shared])
    normal = np.cross(iop[:3], iop[3:])
    frames = []
    for k in range(int(ds.NumberOfFrames)):
        pos, item = Dataset(), Dataset()
        pos.ImagePositionPatient = [float(v) for v in np.array([-30.0, 12.0, 4.0]) + 2.5 * k * normal]
        item.PlanePositionSequence = Sequence([pos])
        frames.append(item)
    ds.PerFrameFunctionalGroupsSequence = Sequence(frames[::-1])  # frames stored top to bottom
    ds.save_as(str(out))
    return out


@pytest.mark.parametrize("name", ["emri_small_jpeg_2k_lossless.dcm", "emri_small_RLE.dcm",
                                  "emri_small_jpeg_ls_lossless.dcm", "emri_small_big_endian.dcm"])
def test_enhanced_mr_frames_read_with_their_geometry_and_decoded_lossless(tmp_path, name):
    plain = read_series(_with_frame_geometry(_testdata("emri_small.dcm"), tmp_path / "plain.dcm"))
    raw = pydicom.dcmread(str(_testdata("emri_small.dcm"))).pixel_array.astype(np.float64)  # (frames, rows, cols)
    assert plain.shape == (64, 64, 10) and plain.meta["n_files"] == 1
    # frames stored top to bottom are stacked along the normal; rescale 2x - 10 applied per frame
    np.testing.assert_array_equal(plain.data, (2 * raw - 10).transpose(2, 1, 0)[:, :, ::-1])
    np.testing.assert_allclose(plain.spacing, (0.8, 0.9, 2.5), atol=1e-9)
    np.testing.assert_allclose(plain.affine[:3, 3], np.diag([-1, -1, 1]) @ [-30.0, 12.0, 4.0], atol=1e-9)
    got = read_series(_with_frame_geometry(_testdata(name), tmp_path / name))
    assert np.array_equal(got.data, plain.data) and np.allclose(got.affine, plain.affine)


def test_enhanced_mr_without_plane_geometry_is_a_schema_error_naming_the_file():
    with pytest.raises(ToolError) as e:
        read_series(_testdata("emri_small.dcm"))
    assert e.value.code is ErrorCode.schema and e.value.context["file"].endswith("emri_small.dcm")
    assert "PerFrameFunctionalGroupsSequence" in e.value.message


def test_highdicom_legacy_converted_enhanced_mr_reads_like_its_source_series(tmp_path):
    """highdicom (not us) turns our classic series into one multi-frame object."""
    from highdicom.legacy import LegacyConvertedEnhancedMRImage
    from pydicom.uid import generate_uid

    data = np.random.default_rng(2).integers(0, 3000, (20, 16, 6)).astype(np.float32)
    paths = write_series(Image(data, _oblique_affine(False)), tmp_path / "classic", "t2_tse_tra")
    sources = [pydicom.dcmread(str(p)) for p in paths]
    enh = LegacyConvertedEnhancedMRImage(sources, series_instance_uid=generate_uid(), series_number=9,
                                         sop_instance_uid=generate_uid(), instance_number=1)
    enh.save_as(str(tmp_path / "enhanced.dcm"))
    got = read_series(tmp_path / "enhanced.dcm")
    assert np.array_equal(got.data, data) and got.meta["n_slices"] == 6
    np.testing.assert_allclose(got.affine, _oblique_affine(False), atol=1e-6)


# ---- series we write and recompress ourselves ---------------------------------------------------
@pytest.mark.parametrize("syntax", ["RLELossless", "JPEG2000Lossless"])
def test_recompressed_series_decodes_to_the_original_values(tmp_path, syntax):
    import pydicom.uid

    data = np.random.default_rng(5).integers(0, 4000, (40, 32, 5)).astype(np.float32)
    paths = write_series(Image(data, _oblique_affine(True)), tmp_path / "s", "AX_T2")
    for p in paths:
        ds = pydicom.dcmread(str(p))
        ds.BitsStored, ds.HighBit = 12, 11  # 12-bit, as scanners store MR
        ds.compress(getattr(pydicom.uid, syntax))
        ds.save_as(str(p))
    assert pydicom.dcmread(str(paths[0])).file_meta.TransferSyntaxUID == getattr(pydicom.uid, syntax)
    back = read_series(tmp_path / "s")
    assert np.array_equal(back.data, data)
    np.testing.assert_allclose(back.affine, _oblique_affine(True), atol=1e-6)


def test_a_missing_slice_names_its_neighbours_and_the_count_expected(tmp_path):
    paths = write_series(Image(np.ones((6, 6, 5), np.float32), _oblique_affine(False)), tmp_path / "s", "AX_T2")
    paths[2].unlink()
    with pytest.raises(ToolError) as e:
        read_series(tmp_path / "s")
    msg = e.value.message
    assert e.value.code is ErrorCode.schema and "IM_0002.dcm and IM_0004.dcm" in msg
    assert "1 slice(s) missing: expected 5 slices" in msg and "found 4" in msg
    assert e.value.context["file"].endswith("IM_0004.dcm")


def test_a_duplicated_slice_is_an_error_not_a_longer_volume(tmp_path):
    paths = write_series(Image(np.ones((6, 6, 4), np.float32), _oblique_affine(False)), tmp_path / "s", "AX_T2")
    shutil.copy(paths[1], tmp_path / "s" / "IM_0002_copy.dcm")
    with pytest.raises(ToolError) as e:
        read_series(tmp_path / "s")
    assert e.value.code is ErrorCode.schema and "share one slice position" in e.value.message
    assert "the same instance twice" in e.value.message and "IM_0002" in e.value.context["file"]
