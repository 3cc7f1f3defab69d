"""DICOM layout: phantom cohorts written as series per sequence and read back exactly."""
from __future__ import annotations

import numpy as np
import pydicom
import pytest

from bcer.contracts.artifacts import Cine, Image
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.layouts import dicom as layout
from bcer.datasets.phantom import Phantom
from bcer.datasets.prostate import make_prostate
from bcer.io import load_sequence
from bcer.io.dicom import write_series


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("dicom_cohort")
    phantoms = [make_prostate("PC-001", 2, n_lesions=2), make_prostate("PC-002", 5, n_lesions=1)]
    cases = layout.write(phantoms, out)
    return out, phantoms, cases


def test_written_tree_and_detection(written):
    out, phantoms, cases = written
    assert detect_layout(out) == "dicom"
    d = out / "PC-001"
    assert sorted(p.name for p in d.iterdir()) == [
        "AX_DIFFUSION_ADC", "AX_DIFFUSION_CALC_BVAL", "AX_T2", "bcer_truth.json", "labels"]
    t2_files = sorted((d / "AX_T2").iterdir())
    assert t2_files[0].name == "IM_0001.dcm" and len(t2_files) == phantoms[0].sequences["T2w"].shape[2]
    ds = pydicom.dcmread(str(d / "AX_DIFFUSION_CALC_BVAL" / "IM_0001.dcm"))
    assert ds.SeriesDescription == "AX_DIFFUSION_CALC_BVAL" and ds.Modality == "MR"
    assert float(ds.DiffusionBValue) == 1400.0 and ds.PatientSex == "M"
    studies = {pydicom.dcmread(str(next((d / s).iterdir())), stop_before_pixels=True).StudyInstanceUID
               for s in ("AX_T2", "AX_DIFFUSION_ADC", "AX_DIFFUSION_CALC_BVAL")}
    assert len(studies) == 1  # one study per case


def test_read_maps_series_to_canonical_names_lazily(written):
    out, phantoms, cases = written
    again = read_dataset(out)
    assert [c.id for c in again] == [c.id for c in cases] == ["PC-001", "PC-002"]
    for case, ph in zip(again, phantoms):
        assert case.layout == "dicom" and case.domain == "prostate"
        assert set(case.sequences) == {"T2w", "ADC", "DWI"}
        assert all(ref.format == "dicom" and ref.options["series_uid"] for ref in case.sequences.values())
        assert case.metadata["age"] == ph.metadata["age"] and case.metadata["psa_ng_ml"] == ph.metadata["psa_ng_ml"]


def test_round_trip_arrays_affines_and_truth(written):
    out, phantoms, cases = written
    for case, ph in zip(cases, phantoms):
        for name, art in ph.sequences.items():
            back = load_sequence(case.sequences[name])
            assert back.shape == art.shape
            np.testing.assert_allclose(back.affine, art.affine, atol=1e-6)
            np.testing.assert_allclose(back.spacing, art.spacing, atol=1e-6)
            step = (float(art.data.max()) - float(art.data.min())) / 65535
            assert np.max(np.abs(back.data - art.data)) <= 0.5 * step + 1e-3
        values = case.ground_truth["values"]
        assert values["n_lesions"] == ph.truth["n_lesions"]
        assert values["lesions"][0]["box_voxel"] == ph.truth["lesions"][0]["box_voxel"]
        np.testing.assert_allclose(values["misalignment"]["matrix"], ph.truth["misalignment"]["matrix"])


def test_label_volumes_and_boxes_from_written_masks_match_truth(written):
    out, phantoms, cases = written
    for case, ph in zip(cases, phantoms):
        values = case.ground_truth["values"]
        gland, zones = layout.load_label(case, "gland"), layout.load_label(case, "zones")
        lesions, lesions_adc = layout.load_label(case, "lesions"), layout.load_label(case, "lesions_adc")
        np.testing.assert_allclose(gland.affine, ph.sequences["T2w"].affine, atol=1e-6)
        np.testing.assert_allclose(lesions_adc.affine, ph.sequences["ADC"].affine, atol=1e-6)
        assert gland.volume_ml(1) == pytest.approx(values["gland_volume_ml"], rel=0.01)
        assert zones.volume_ml(1) == pytest.approx(values["pz_volume_ml"], rel=0.01)
        assert zones.volume_ml(2) == pytest.approx(values["tz_volume_ml"], rel=0.01)
        assert zones.labels == {1: "PZ", 2: "TZ"}
        for les in values["lesions"]:
            m = lesions.data == les["label"]
            assert lesions.volume_ml(les["label"]) == pytest.approx(les["volume_ml"], rel=0.01)
            assert lesions_adc.volume_ml(les["label"]) == pytest.approx(les["volume_ml_adc"], rel=0.01)
            idx = np.argwhere(m)
            assert les["box_voxel"] == [idx.min(0).tolist(), (idx.max(0) + 1).tolist()]
            x = (idx @ lesions.affine[:3, :3].T + lesions.affine[:3, 3])[:, 0].mean()
            assert les["side"] == ("R" if x > 0 else "L")


def test_unknown_series_kept_under_sanitised_description_and_headers_give_metadata(tmp_path):
    img = Image(np.arange(4 * 5 * 3, dtype=np.float32).reshape(4, 5, 3), np.diag([0.8, 0.8, 4.0, 1.0]))
    write_series(img, tmp_path / "subj01" / "s1", "AX_T2", series_number=1,
                 extra={"PatientAge": "063Y", "PatientSex": "M"})
    write_series(img, tmp_path / "subj01" / "s2", "Localizer (3-plane)", series_number=2)
    write_series(img, tmp_path / "subj01" / "s3", "", protocol_name="t2_tse_tra", series_number=3)
    (case,) = layout.read(tmp_path)
    assert case.id == "subj01" and case.ground_truth is None
    assert set(case.sequences) == {"T2w", "Localizer_3_plane", "T2w_3"}
    assert case.metadata == {"age": 63.0, "sex": "M"}
    back = load_sequence(case.sequences["Localizer_3_plane"])
    np.testing.assert_allclose(back.affine, img.affine, atol=1e-9)
    np.testing.assert_allclose(back.data, img.data, atol=1e-3)


def test_series_mixed_in_one_folder_load_by_uid(tmp_path):
    a = Image(np.full((5, 4, 3), 7.0, np.float32), np.diag([1.0, 1.0, 3.0, 1.0]))
    b = Image(np.full((3, 3, 2), 9.0, np.float32), np.diag([2.0, 2.0, 3.0, 1.0]))
    write_series(a, tmp_path / "c1" / "all", "AX_T2", series_number=1)
    paths = write_series(b, tmp_path / "c1" / "tmp", "AX_DIFFUSION_ADC", series_number=2)
    for p in paths:
        p.rename(tmp_path / "c1" / "all" / f"adc_{p.name}")
    (case,) = layout.read(tmp_path)
    assert load_sequence(case.sequences["T2w"]).shape == (5, 4, 3)
    assert float(load_sequence(case.sequences["ADC"]).data.mean()) == 9.0


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(ToolError) as e:
        layout.read(tmp_path / "missing")
    assert e.value.code is ErrorCode.input_missing
    (tmp_path / "empty_case").mkdir()
    with pytest.raises(ToolError) as e:
        layout.read(tmp_path)
    assert e.value.code is ErrorCode.input_missing
    cine = Phantom("cine1", "cardiac", {"CINE": Cine(np.zeros((4, 4, 2, 3), np.float32), np.eye(4))})
    with pytest.raises(ToolError) as e:
        layout.write([cine], tmp_path / "out")
    assert e.value.code is ErrorCode.schema and e.value.context["case"] == "cine1"
    with pytest.raises(ToolError) as e:
        layout.load_label(_case_without_truth(tmp_path), "gland")
    assert e.value.code is ErrorCode.input_missing


def _case_without_truth(tmp_path):
    write_series(Image(np.ones((3, 3, 2), np.float32), np.eye(4)), tmp_path / "real" / "c" / "s", "AX_T2")
    return layout.read(tmp_path / "real")[0]


def test_truncated_file_in_a_case_is_a_schema_error(written, tmp_path):
    out, phantoms, cases = written
    ref = SequenceRef.model_validate(cases[0].sequences["ADC"].model_dump())
    src = sorted((out / "PC-001" / "AX_DIFFUSION_ADC").iterdir())
    dst = tmp_path / "adc"
    dst.mkdir()
    for p in src:
        (dst / p.name).write_bytes(p.read_bytes())
    raw = (dst / src[3].name).read_bytes()
    (dst / src[3].name).write_bytes(raw[: len(raw) - 500])  # pixel data cut short
    ref.path = str(dst)
    with pytest.raises(ToolError) as e:
        load_sequence(ref)
    assert e.value.code is ErrorCode.schema and e.value.context["file"].endswith(src[3].name)


def test_single_case_exported_straight_into_root(tmp_path):
    img = Image(np.ones((3, 4, 2), np.float32), np.diag([1.0, 1.0, 5.0, 1.0]))
    write_series(img, tmp_path / "case9", "AX_DIFFUSION_CALC_BVAL")
    assert layout.detect(tmp_path / "case9") and layout.detect(tmp_path)  # as one case, or a folder of cases
    (case,) = layout.read(tmp_path / "case9")
    assert case.id == "case9" and set(case.sequences) == {"DWI"}
