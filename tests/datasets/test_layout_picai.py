"""PI-CAI layout: .mha studies through SimpleITK, picai_labels lesion masks as lesion truth,
the marksheet, typed errors; one study runs prostate_report and its findings are scored."""
from __future__ import annotations

import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
import SimpleITK as sitk

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.layouts import picai
from bcer.datasets.layouts._inspect import inspect
from bcer.datasets.prostate import make_prostate
from bcer.io import load_sequence


@pytest.fixture(scope="module")
def phantoms():
    return [make_prostate("p0", seed=0, n_lesions=2), make_prostate("p1", seed=4, n_lesions=0)]


@pytest.fixture(scope="module")
def written(phantoms, tmp_path_factory):
    """As a real download holds it: images and picai_labels, no truth sidecar."""
    root = tmp_path_factory.mktemp("picai")
    cases = picai.write(phantoms, root, truth_sidecar=False)
    (root / "picai_labels" / "clinical_information").mkdir(parents=True)
    (root / "picai_labels" / "clinical_information" / "marksheet.csv").write_text(
        "patient_id,study_id,mri_date,patient_age,psa,psad,prostate_volume,histopath_type,lesion_GS,lesion_ISUP,"
        "case_ISUP,case_csPCa\n10000,0000001,2019-01-01,66,7.5,0.15,50,MRBx,4+3,3,3,YES\n")
    again = read_dataset(root, strict=True)
    assert [c.id for c in again] == [c.id for c in cases]
    return root, again


def test_mha_studies_read_with_exact_geometry(written, phantoms) -> None:
    root, cases = written
    assert detect_layout(root) == "picai"
    assert [c.id for c in cases] == ["10000_0000001", "10001_0000002"]
    for case, ph in zip(cases, phantoms):
        assert case.domain == "prostate" and set(case.sequences) == {"T2w", "ADC", "DWI"}
        assert case.sequences["DWI"].path.endswith("_hbv.mha") and case.sequences["T2w"].format == "itk"
        for name in ("T2w", "ADC", "DWI"):
            img, src = load_sequence(case.sequences[name]), ph.sequences[name]
            assert np.array_equal(img.data, src.data)
            np.testing.assert_allclose(img.affine, src.affine, atol=1e-9)


def test_one_patient_folder_is_read_as_picai(written) -> None:
    root, cases = written
    assert detect_layout(root / "10000") == "picai"  # not the catch-all flat layout
    (one,) = read_dataset(root / "10000", strict=True)
    assert one.model_dump() == cases[0].model_dump()  # labels and marksheet found one level up


def test_itk_affine_agrees_with_nibabel_on_the_same_image(tmp_path: Path) -> None:
    """SimpleITK writes one oblique image as .mha and .nii.gz; nibabel reads the NIfTI."""
    img = sitk.GetImageFromArray(np.arange(7 * 9 * 11, dtype=np.float32).reshape(7, 9, 11))
    img.SetSpacing((0.5, 0.7, 3.0))
    img.SetOrigin((10.0, -20.0, 5.0))
    c, s = np.cos(0.3), np.sin(0.3)
    img.SetDirection((c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0))
    sitk.WriteImage(img, str(tmp_path / "x.mha"))
    sitk.WriteImage(img, str(tmp_path / "x.nrrd"))
    sitk.WriteImage(img, str(tmp_path / "x.nii.gz"))
    ref = nib.load(str(tmp_path / "x.nii.gz"))
    from bcer.io.itk import read_header, read_itk

    for ext in ("mha", "nrrd"):
        got = read_itk(tmp_path / f"x.{ext}")
        np.testing.assert_allclose(got.affine, ref.affine, atol=1e-5)
        assert np.array_equal(got.data, np.asarray(ref.dataobj)) and got.data[1, 0, 0] == 1.0  # x fastest
    assert read_header(tmp_path / "x.mha")["shape"] == (11, 9, 7)


def test_lesion_masks_become_the_lesion_truth(written, phantoms) -> None:
    _, (with_lesions, without) = written
    got = sorted(with_lesions.ground_truth["values"]["lesions"], key=lambda r: r["box_voxel"])
    want = sorted(phantoms[0].truth["lesions"], key=lambda r: r["box_voxel"])
    assert len(got) == 2
    for g, w in zip(got, want):
        assert g["box_voxel"] == w["box_voxel"] and g["side"] == w["side"]
        assert g["volume_ml"] == pytest.approx(w["volume_ml"], rel=1e-6)  # NIfTI stores the affine as float32
    assert without.ground_truth["values"]["lesions"] == []  # an empty mask: a negative study
    assert with_lesions.metadata == {"age": 66.0, "psa": 7.5, "psa_density": 0.15, "prostate_volume_ml": 50.0}
    assert with_lesions.ground_truth["values"]["case_csPCa"] == "YES"


def test_human_expert_masks_win_over_ai_masks(written, tmp_path: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(written[0], root)
    ai = root / "picai_labels" / "csPCa_lesion_delineations" / "AI" / "Bosma22a" / "10001_0000002.nii.gz"
    ai.parent.mkdir(parents=True)
    expert = root / "picai_labels" / "csPCa_lesion_delineations" / "human_expert" / "resampled" / "10001_0000002.nii.gz"
    img = nib.load(str(expert))
    data = np.zeros(img.shape, np.int16)
    data[2:4, 2:4, 1:3] = 1
    nib.save(nib.Nifti1Image(data, img.affine), str(ai))
    case = next(c for c in read_dataset(root, strict=True) if c.id == "10001_0000002")
    assert case.ground_truth["labels"]["lesions"]["path"] == str(expert.resolve())
    expert.unlink()  # only the AI mask left: it is used
    case = next(c for c in read_dataset(root, strict=True) if c.id == "10001_0000002")
    assert [r["box_voxel"] for r in case.ground_truth["values"]["lesions"]] == [[[2, 2, 1], [4, 4, 3]]]


def test_errors_name_case_and_file(written, tmp_path: Path) -> None:
    root = tmp_path / "d"
    shutil.copytree(written[0], root)
    (root / "10001" / "10001_0000002_hbv.mha").unlink()
    lab = root / "picai_labels" / "csPCa_lesion_delineations" / "human_expert" / "resampled" / "10000_0000001.nii.gz"
    img = nib.load(str(lab))
    nib.save(nib.Nifti1Image(np.zeros(np.array(img.shape) - 1, np.int16), img.affine), str(lab))
    with pytest.raises(ToolError) as e:
        read_dataset(root, strict=True)
    assert e.value.code == ErrorCode.shape and e.value.context["case"] == "10000_0000001"
    assert e.value.context["file"] == str(lab) and "T2w" in e.value.message
    rows = {r["case"]: r for r in inspect(root)}
    assert rows["10001_0000002"]["issues"] and "_hbv.mha" in rows["10001_0000002"]["issues"][0]
    assert rows["10001_0000002"]["tasks"] == []


def test_inspect_lists_prostate_tasks(written) -> None:
    rows = inspect(written[0])
    assert rows[0]["layout"] == "picai" and rows[0]["ground_truth"]["labels"] == ["lesions"]
    assert {"prostate_report", "register_prostate"} <= set(rows[0]["tasks"]) and "segment_brain" not in rows[0]["tasks"]


def test_prostate_report_runs_on_a_picai_study_and_its_lesions_score(ray_local, written, tmp_path: Path) -> None:
    from bcer.api import run_case
    from bcer.bench.quality import case_quality
    from bcer.contracts import load_contract

    case = written[1][0]
    result = run_case(case, task="prostate_report", out=tmp_path / "out", r4=False)
    assert result.status == "succeeded"
    q = case_quality(case, tmp_path / "out" / case.id, load_contract("prostate_report"))
    # both phantom lesions found on the .mha study and scored against the mask-derived truth
    assert q["lesion_sensitivity"] == 1.0 and q["lesion_side_accuracy"] == 1.0 and q["lesion_box_iou"] > 0.5
    assert q["gland_dice"] is None  # PI-CAI ships no gland mask: not scored, not a false 0
