"""BraTS 2023+ layout: detection, t1n/t1c/t2w/t2f names, the 2023 label table scored against
bcer's predictions, four --seq flags on its tree, typed errors naming case and file."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from bcer.bench.quality import case_quality
from bcer.contracts import load_contract
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import detect_layout, read_dataset
from bcer.datasets.brain import make_brain
from bcer.datasets.layouts import brats, brats2023, flat
from bcer.io import load_sequence

A = np.diag([-1.2, -1.2, 1.5, 1.0])
SEQ_KEYS = ("t1n", "t1c", "t2w", "t2f")


def _seg() -> np.ndarray:
    """A 2023-labelled tumour: 2 SNFH shell, 1 NETC core, 3 ET rim (known voxel counts)."""
    seg = np.zeros((16, 16, 12), np.int16)
    seg[2:14, 2:14, 2:10] = 2
    seg[5:11, 5:11, 4:8] = 3
    seg[7:9, 7:9, 5:7] = 1
    return seg


def _real_case(root: Path, cid: str, shape=(16, 16, 12), seg: np.ndarray | None = None) -> Path:
    d = root / cid
    d.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i, key in enumerate(SEQ_KEYS):
        nib.save(nib.Nifti1Image((rng.random(shape) + 10 * i).astype(np.float32), A), str(d / f"{cid}-{key}.nii.gz"))
    nib.save(nib.Nifti1Image(_seg() if seg is None else seg, A), str(d / f"{cid}-seg.nii.gz"))
    return d


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("brats23")
    for cid in ("BraTS-GLI-00001-000", "BraTS-MEN-00004-000", "BraTS-PED-00010-000", "BraTS-SSA-00002-000"):
        _real_case(root, cid)
    return root


def test_detects_and_maps_the_2023_sequence_names(real: Path) -> None:
    assert detect_layout(real) == "brats2023"
    cases = read_dataset(real, strict=True)
    assert [c.id for c in cases] == ["BraTS-GLI-00001-000", "BraTS-MEN-00004-000", "BraTS-PED-00010-000",
                                     "BraTS-SSA-00002-000"]
    c = cases[0]
    assert c.domain == "brain" and c.layout == "brats2023" and set(c.sequences) == {"T1", "T1c", "T2", "FLAIR"}
    # t2w is the brain T2 here (not the prostate T2w); t2f is FLAIR: check by the written values
    for name, i in (("T1", 0), ("T1c", 1), ("T2", 2), ("FLAIR", 3)):
        assert float(np.floor(np.median(load_sequence(c.sequences[name]).data))) == 10.0 * i
    seg = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["seg"]))
    assert seg.labels[3] == "enhancing" and seg.labels[1] == "necrotic_core"
    assert int(np.count_nonzero(seg.data == 3)) == 6 * 6 * 4 - 2 * 2 * 2


def test_region_values_read_either_convention() -> None:
    assert brats2023.region_values(brats2023.SEG_LABELS, "et") == (3,)
    assert brats2023.region_values(brats2023.SEG_LABELS, "wt") == (1, 2, 3)  # 4 (resection cavity) is no tumour
    assert brats2023.region_values(brats.SEG_LABELS, "et") == (4,)
    assert brats2023.region_values(brats.SEG_LABELS, "tc") == (1, 4)
    msd = {1: "edema", 2: "non-enhancing tumor", 3: "enhancing tumour"}  # MSD Task01 dataset.json
    assert [brats2023.region_values(msd, r) for r in ("wt", "tc", "et")] == [(1, 2, 3), (2, 3), (3,)]
    words = {1: "NETC", 2: "SNFH", 3: "ET", 4: "RC resection cavity"}
    assert [brats2023.region_values(words, r) for r in ("wt", "tc", "et")] == [(1, 2, 3), (1, 3), (3,)]


def _scored(case, tmp: Path, prediction: np.ndarray) -> dict:
    """Quality of a segment_brain deliverable (bcer's labels 1/2/4) against the case's truth."""
    contract = load_contract("segment_brain")
    tmp.mkdir(parents=True, exist_ok=True)
    nib.save(nib.Nifti1Image(prediction.astype(np.int16), A), str(tmp / "seg.nii.gz"))
    return case_quality(case, tmp, contract)


def test_scoring_maps_et_3_to_bcer_4_and_counts_a_partial_miss(real: Path, tmp_path: Path) -> None:
    case = read_dataset(real, strict=True)[0]
    truth = _seg()
    perfect = np.where(truth == 3, 4, truth)  # bcer writes ET as 4
    q = _scored(case, tmp_path / "perfect", perfect)
    assert q["dice_wt"] == 1.0 and q["dice_tc"] == 1.0 and q["dice_et"] == 1.0
    half = perfect.copy()
    half[5:8, 5:11, 4:8][half[5:8, 5:11, 4:8] == 4] = 2  # half the ET rim called oedema
    et_true = int(np.count_nonzero(truth == 3))
    et_kept = int(np.count_nonzero(half == 4))
    q = _scored(case, tmp_path / "half", half)
    assert q["dice_et"] == pytest.approx(2 * et_kept / (et_kept + et_true), abs=1e-4)
    assert q["dice_wt"] == 1.0


def test_brats_2021_folder_and_its_label_4_truth_still_score(tmp_path: Path) -> None:
    d = tmp_path / "BraTS2021_00001"
    d.mkdir()
    seg = np.where(_seg() == 3, 4, _seg()).astype(np.int16)
    for key in ("t1", "t1ce", "t2", "flair"):
        nib.save(nib.Nifti1Image(np.ones((16, 16, 12), np.float32), A), str(d / f"BraTS2021_00001_{key}.nii.gz"))
    nib.save(nib.Nifti1Image(seg, A), str(d / "BraTS2021_00001_seg.nii.gz"))
    assert detect_layout(tmp_path) == "brats"
    (case,) = read_dataset(tmp_path, strict=True)
    q = _scored(case, tmp_path / "out", seg)
    assert q["dice_et"] == 1.0 and q["dice_tc"] == 1.0


def test_phantom_round_trip_writes_2023_values(tmp_path: Path) -> None:
    ph = make_brain("case-1", seed=21, grade="HGG")
    (case,) = brats2023.write([ph], tmp_path)
    assert case.id == "BraTS-GLI-00000-000" and detect_layout(tmp_path) == "brats2023"
    raw = np.asarray(nib.load(str(tmp_path / case.id / f"{case.id}-seg.nii.gz")).dataobj)
    assert set(np.unique(raw)) <= {0, 1, 2, 3} and np.array_equal(raw == 3, np.asarray(ph.labels["seg"].data) == 4)
    seg = load_sequence(SequenceRef.model_validate(case.ground_truth["labels"]["seg"]))
    assert seg.volume_ml(3) == pytest.approx(ph.truth["volumes_ml"]["4"], rel=1e-6)
    assert np.array_equal(load_sequence(case.sequences["FLAIR"]).data, ph.sequences["FLAIR"].data)


def test_four_seq_flags_on_the_2023_tree_give_one_id_and_read_the_seg(real: Path) -> None:
    seq = flat.parse_mapping([f"{n}=*/*-{k}.nii.gz" for n, k in zip(("T1", "T1c", "T2w", "FLAIR"), SEQ_KEYS)])
    cases = read_dataset(real, layout="flat", seq=seq, strict=True)
    assert [c.id for c in cases][:2] == ["BraTS-GLI-00001-000", "BraTS-MEN-00004-000"]  # not doubled
    c = cases[0]
    assert set(c.sequences) == {"T1", "T1c", "T2", "FLAIR"} and c.domain == "brain"  # t2w -> brain T2
    seg = c.ground_truth["labels"]["seg"]
    assert seg["path"].endswith("BraTS-GLI-00001-000-seg.nii.gz") and seg["options"]["labels"]["3"] == "enhancing"


def test_grid_mismatch_names_case_and_both_files(tmp_path: Path) -> None:
    d = _real_case(tmp_path, "BraTS-MET-00003-000")
    nib.save(nib.Nifti1Image(np.zeros((16, 16, 11), np.int16), A), str(d / "BraTS-MET-00003-000-seg.nii.gz"))
    with pytest.raises(ToolError) as e:
        read_dataset(tmp_path, strict=True)
    err = e.value
    assert err.code == ErrorCode.shape and err.context["case"] == "BraTS-MET-00003-000"
    assert err.context["file"].endswith("-seg.nii.gz") and "(16, 16, 12)" in err.message
    # a cohort keeps the case as a rejected row with that error
    (row,) = read_dataset(tmp_path)
    assert row.issues and row.issues[0]["code"] == "shape"
    assert json.loads(json.dumps(row.issues))[0]["context"]["case"] == "BraTS-MET-00003-000"
