"""DICOM SEG and SR writers on DICOM files that bcer did not write: pydicom's own test files
(``MR_small.dcm``, one MR slice; ``MR2_UNCI.dcm`` from pydicom-data, another vendor's MR;
``eCT_Supplemental.dcm``, an enhanced multi-frame image with per-frame functional groups; the
enhanced MR ``emri_small.dcm`` carries no plane geometry at all, so no SEG can be placed on it).

The mask is built on a RAS affine derived here from the source's geometry by the textbook
formula, independently of the writer's sampling, and must come back from highdicom frame by
frame, pixel for pixel."""
from __future__ import annotations

import numpy as np
import pytest
from pydicom.data import get_testdata_file

from bcer.contracts.errors import ToolError
from bcer.io.dicom_seg import frame_geometry, read_source_series, write_seg
from bcer.io.dicom_sr import Group, Item, read_measurements, write_sr


def affine_of(geometry) -> np.ndarray:
    """RAS affine of voxel (column, row, frame) from the first two frames' geometry."""
    pos, row_dir, col_dir, (dr, dc), _, _ = geometry[0]
    step = geometry[1][0] - pos if len(geometry) > 1 else np.cross(row_dir, col_dir)
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1], lps[:3, 2], lps[:3, 3] = row_dir * dc, col_dir * dr, step, pos
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


def disc_mask(rows: int, cols: int, frames: int) -> np.ndarray:
    """Labels by (column, row, frame): 1 a disc on every frame, 2 a square on the middle frames."""
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    disc = ((r - rows / 2) ** 2 + (c - cols / 3) ** 2 < (rows / 5) ** 2)
    data = np.zeros((cols, rows, frames), np.int16)
    data[..., :] = disc.T[..., None]
    data[40:50, 10:20, frames // 2: frames // 2 + 2] = 2
    return data


@pytest.mark.parametrize("name", ["MR_small.dcm", "MR2_UNCI.dcm", "eCT_Supplemental.dcm"])
def test_seg_over_a_foreign_series_round_trips_through_highdicom(tmp_path, name):
    import highdicom as hd

    sources = read_source_series(get_testdata_file(name))
    geometry = frame_geometry(sources)
    rows, cols = geometry[0][4], geometry[0][5]
    data = disc_mask(rows, cols, len(geometry))
    _, numbers = write_seg(data, affine_of(geometry), {1: "gland", 2: "lesion"}, sources, tmp_path / "s.dcm")
    assert numbers == {1: 1, 2: 2}
    seg = hd.seg.segread(tmp_path / "s.dcm")
    src = sources[0]
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == src.SeriesInstanceUID
    assert seg.FrameOfReferenceUID == src.FrameOfReferenceUID
    for number, value in ((1, 1), (2, 2)):
        if len(sources) == 1 and len(geometry) > 1:  # one enhanced image: frames by frame number
            got = seg.get_pixels_by_source_frame(source_sop_instance_uid=src.SOPInstanceUID,
                                                 source_frame_numbers=list(range(1, len(geometry) + 1)),
                                                 segment_numbers=[number])[..., 0]
        else:
            got = seg.get_pixels_by_source_instance(source_sop_instance_uids=[d.SOPInstanceUID for d in sources],
                                                    segment_numbers=[number])[..., 0]
        want = np.moveaxis(data == value, (0, 1, 2), (2, 1, 0))  # (column, row, frame) -> (frame, row, column)
        assert got.shape == want.shape and np.array_equal(got.astype(bool), want)
    assert [s.SegmentLabel for s in seg.SegmentSequence] == ["gland", "lesion"]


def test_sr_values_and_segment_reference_read_back(tmp_path):
    sources = read_source_series(get_testdata_file("MR_small.dcm"))
    geometry = frame_geometry(sources)
    data = disc_mask(geometry[0][4], geometry[0][5], 1)
    seg, numbers = write_seg(data, affine_of(geometry), {1: "gland", 2: "lesion"}, sources, tmp_path / "s.dcm")
    groups = [Group("gland", [Item("volume_ml", 31.25, "mL")], segment=numbers[1], seg=seg),
              Group("lesion_1", [Item("adc", 812.5, "um2/s"), Item("size_mm", 11.0, "mm")], finding="lesion"),
              Group("pirads", [Item("pirads_category", 4, "category")], qualitative={"pirads": "PI-RADS 4"})]
    write_sr(groups, sources, tmp_path / "sr.dcm")
    assert read_measurements(tmp_path / "sr.dcm") == {
        "gland": {"Volume": 31.25}, "lesion_1": {"Apparent Diffusion Coefficient": 812.5, "Diameter": 11.0},
        "pirads": {"pirads_category": 4.0}}
    import highdicom as hd

    sr = hd.sr.srread(tmp_path / "sr.dcm")
    (vol,) = sr.content.get_volumetric_roi_measurement_groups()
    assert vol.referenced_segment.referenced_sop_instance_uid == seg.SOPInstanceUID
    assert sr.CurrentRequestedProcedureEvidenceSequence[0].StudyInstanceUID == sources[0].StudyInstanceUID


def test_empty_overlap_is_a_typed_error(tmp_path):
    sources = read_source_series(get_testdata_file("MR_small.dcm"))
    far = np.eye(4)
    far[:3, 3] = 1e4  # the mask lies 10 m away from the slice
    with pytest.raises(ToolError, match="empty on the source series") as e:
        write_seg(np.ones((4, 4, 4), np.int16), far, {1: "gland"}, sources, tmp_path / "s.dcm")
    assert e.value.code.value == "value_range"


def test_source_without_plane_geometry_is_a_typed_error():
    sources = read_source_series(get_testdata_file("emri_small.dcm"))
    with pytest.raises(ToolError, match="no plane position") as e:
        frame_geometry(sources)
    assert e.value.code.value == "schema"
