"""BraTS 2018 layout: round trip, exact truth from written masks, real-layout reading, errors."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.contracts.artifacts import Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.geometry import vox2world
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.brain import make_brain
from bcer.datasets.layouts import brats
from bcer.datasets.layouts._common import TRUTH_FILE
from bcer.io import load_sequence, write_nifti


@pytest.fixture(scope="module")
def phantoms():
    return [make_brain("case-1", seed=21, grade="HGG", side="right"),
            make_brain("case-2", seed=22, grade="LGG", side="left", noise=0.03, misalign=True)]


@pytest.fixture(scope="module")
def written(phantoms, tmp_path_factory):
    root = tmp_path_factory.mktemp("brats")
    return root, brats.write(phantoms, root)


def test_file_names_are_brats_2018(written):
    root, cases = written
    assert [c.id for c in cases] == ["Brats18_case-1", "Brats18_case-2"]
    for c in cases:
        for key in ("t1", "t1ce", "t2", "flair", "seg"):
            assert (root / c.id / f"{c.id}_{key}.nii.gz").is_file()
    assert detect_layout(root) == "brats"


def test_round_trip_arrays_affines_metadata(written, phantoms):
    root, cases = written
    again = read_dataset(root)
    assert [c.model_dump() for c in again] == [c.model_dump() for c in cases]
    for case, ph in zip(cases, phantoms):
        assert case.domain == "brain" and case.layout == "brats"
        assert set(case.sequences) == {"T1", "T1c", "T2", "FLAIR"}
        assert case.metadata == ph.metadata
        for name, ref in case.sequences.items():
            img = load_sequence(ref)
            src = ph.sequences[name]
            assert img.data.dtype == np.float32 and np.array_equal(img.data, src.data)
            np.testing.assert_allclose(img.affine, src.affine, atol=1e-5)
            np.testing.assert_allclose(img.spacing, src.spacing, rtol=1e-6)
            assert img.orientation == src.orientation
        assert case.ground_truth["values"] == json.loads(json.dumps(ph.truth))


def test_label_volumes_from_written_masks_match_truth(written):
    _, cases = written
    for case in cases:
        from bcer.contracts.case import SequenceRef

        seg = load_sequence(SequenceRef.model_validate(case.ground_truth["labels"]["seg"]))
        values = case.ground_truth["values"]
        assert seg.labels == {1: "necrotic_core", 2: "oedema", 4: "enhancing"}
        for lab in (1, 2, 4):
            assert seg.volume_ml(lab) == pytest.approx(values["volumes_ml"][str(lab)], rel=0.01, abs=1e-9)
        assert np.count_nonzero(seg.data) * seg.voxel_volume_ml == pytest.approx(values["WT_ml"], rel=0.01)
        cx = vox2world(seg.affine, np.argwhere(seg.data > 0)).mean(axis=0)[0]
        assert np.sign(cx) == (1 if values["side"] == "right" else -1)


def test_references_only_written_when_degraded(written, phantoms):
    root, cases = written
    clean_case, noisy_case = cases
    refs = clean_case.ground_truth["references"]
    assert refs["T1"]["path"] == clean_case.sequences["T1"].path  # no duplicate file
    noisy_refs = noisy_case.ground_truth["references"]
    assert noisy_refs["T1"]["path"] != noisy_case.sequences["T1"].path
    from bcer.contracts.case import SequenceRef

    ref = load_sequence(SequenceRef.model_validate(noisy_refs["FLAIR"]))
    assert np.array_equal(ref.data, phantoms[1].references["FLAIR"].data)
    assert noisy_case.ground_truth["values"]["misalignment"]["contrast"] in ("T1", "T2", "FLAIR")


def _real_case(folder: Path, cid: str, shape=(12, 14, 10), seg_shape=None) -> None:
    a = np.diag([-1.0, -1.0, 1.0, 1.0])
    rng = np.random.default_rng(0)
    for key in ("t1", "t1ce", "t2", "flair"):
        write_nifti(Image(rng.random(shape).astype(np.float32), a), folder / cid / f"{cid}_{key}.nii.gz")
    seg = np.zeros(seg_shape or shape, np.int16)
    seg[3:6, 3:6, 3:6] = 4
    nib.save(nib.Nifti1Image(seg, a), str(folder / cid / f"{cid}_seg.nii.gz"))


def test_reads_real_layout_with_grade_folders_and_survival(tmp_path):
    _real_case(tmp_path / "HGG", "Brats18_2013_2_1")
    _real_case(tmp_path / "LGG", "Brats18_TCIA09_141_1")
    (tmp_path / "survival_data.csv").write_text(
        "BraTS18ID,Age,Survival,ResectionStatus\nBrats18_2013_2_1,60.463,289,GTR\n")
    assert detect_layout(tmp_path) == "brats"
    cases = {c.id: c for c in brats.read(tmp_path)}
    hgg, lgg = cases["Brats18_2013_2_1"], cases["Brats18_TCIA09_141_1"]
    assert hgg.ground_truth["values"] == {"grade": "HGG"}
    assert lgg.ground_truth["values"] == {"grade": "LGG"}
    assert hgg.metadata == {"age": 60.463, "survival_days": 289.0, "resection_status": "GTR"}
    seg = hgg.ground_truth["labels"]["seg"]
    assert seg["kind"] == "mask" and seg["options"]["labels"]["4"] == "enhancing"
    assert hgg.sequences["T1c"].path.endswith("_t1ce.nii.gz")
    # pointed at one case folder, the reader still finds grade and survival row
    (single,) = brats.read(tmp_path / "HGG" / "Brats18_2013_2_1")
    assert single.model_dump() == hgg.model_dump()


def _err(fn) -> ToolError:
    with pytest.raises(ToolError) as e:
        fn()
    return e.value


def _load_all(root: Path) -> None:
    for case in brats.read(root):
        for ref in case.sequences.values():
            load_sequence(ref)


def test_truncated_gzip_is_a_schema_error_naming_the_file(written, tmp_path):
    root = tmp_path / "d"
    shutil.copytree(written[0] / "Brats18_case-1", root / "Brats18_case-1")
    f = root / "Brats18_case-1" / "Brats18_case-1_t2.nii.gz"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    e = _err(lambda: _load_all(root))
    assert e.code == ErrorCode.schema and e.context["file"].endswith("_t2.nii.gz")


def test_nan_volume_is_a_numeric_error(tmp_path):
    _real_case(tmp_path, "Brats18_nan")
    f = tmp_path / "Brats18_nan" / "Brats18_nan_flair.nii.gz"
    write_nifti(Image(np.full((12, 14, 10), np.nan, np.float32), np.eye(4)), f)
    e = _err(lambda: _load_all(tmp_path))
    assert e.code == ErrorCode.numeric and e.context["file"].endswith("_flair.nii.gz")


def test_2d_file_is_a_shape_error(tmp_path):
    _real_case(tmp_path, "Brats18_flat")
    f = tmp_path / "Brats18_flat" / "Brats18_flat_t1.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((12, 14), np.float32), np.eye(4)), str(f))
    e = _err(lambda: brats.read(tmp_path))
    assert e.code == ErrorCode.shape and e.context["file"].endswith("_t1.nii.gz")


def test_mismatched_shapes_in_one_case_are_a_shape_error(tmp_path):
    _real_case(tmp_path, "Brats18_mix", seg_shape=(12, 14, 9))
    e = _err(lambda: brats.read(tmp_path))
    assert e.code == ErrorCode.shape and e.context["file"].endswith("_seg.nii.gz")
    assert e.context["case"] == "Brats18_mix"


def test_missing_and_malformed(tmp_path, written):
    assert _err(lambda: brats.read(tmp_path)).code == ErrorCode.input_missing
    root = tmp_path / "d"
    shutil.copytree(written[0] / "Brats18_case-1", root / "Brats18_case-1")
    (root / "Brats18_case-1" / TRUTH_FILE).write_text("{not json")
    e = _err(lambda: brats.read(root))
    assert e.code == ErrorCode.schema and e.context["file"].endswith(TRUTH_FILE)
