"""BIDS layout: brain, prostate-like and cine round trips, participants.tsv, real layouts, errors."""
from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from bcer.contracts.artifacts import Cine, Image, Mask
from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets import Phantom, detect_layout
from bcer.datasets.brain import make_brain
from bcer.datasets.geometry import make_affine, random_direction
from bcer.datasets.layouts import bids
from bcer.io import load_sequence, write_nifti


def _prostate_like(case_id: str, seed: int) -> Phantom:
    """T2w on a fine grid, ADC/DWI on a coarser one, labels on both (as the prostate phantom)."""
    rng = np.random.default_rng(seed)
    t2a = make_affine(random_direction(rng), (0.6, 0.6, 3.0), (40, 36, 8), (0, 0, 0))
    dwa = make_affine(random_direction(rng), (2.0, 2.0, 3.0), (14, 12, 8), (0, 0, 0))
    t2 = Image(rng.random((40, 36, 8)).astype(np.float32), t2a)
    adc = Image(rng.random((14, 12, 8)).astype(np.float32) * 2000, dwa)
    dwi = Image(rng.random((14, 12, 8)).astype(np.float32), dwa, {"b_value": 1400})
    zones = Mask(rng.integers(0, 3, (40, 36, 8)).astype(np.int16), t2a, labels={1: "PZ", 2: "TZ"})
    les = Mask((rng.random((14, 12, 8)) > 0.9).astype(np.int16), dwa, labels={1: "lesion"})
    return Phantom(case_id, "prostate", {"T2w": t2, "ADC": adc, "DWI": dwi},
                   labels={"zones": zones, "lesions_adc": les},
                   metadata={"age": 66, "psa": 7.5, "history": "PSA\trising"}, truth={"lesions": [{"side": "L", "category": 4}]})


def _cine_like(case_id: str) -> Phantom:
    a = make_affine(np.eye(3), (1.5, 1.5, 8.0), (20, 18, 6), (0, 0, 0))
    data = np.random.default_rng(1).random((20, 18, 6, 5)).astype(np.float32)
    seg = Mask(np.zeros((20, 18, 6, 5), np.int16), a, labels={1: "RV", 2: "MYO", 3: "LV"})
    return Phantom(case_id, "cardiac", {"CINE": Cine(data, a)}, labels={"seg": seg},
                   metadata={"height": 170.0, "weight": 70.5}, truth={"ED": 0, "ES": 3})


@pytest.fixture(scope="module")
def brain_ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("bids_brain")
    phs = [make_brain("brain-001", seed=31, misalign=True), make_brain("brain-002", seed=32)]
    return root, phs, bids.write(phs, root)


def test_brain_round_trip(brain_ds):
    root, phs, cases = brain_ds
    assert detect_layout(root) == "bids"
    assert [c.id for c in cases] == ["sub-brain001", "sub-brain002"]
    assert (root / "sub-brain001" / "anat" / "sub-brain001_ce-gd_T1w.nii.gz").is_file()
    assert (root / "sub-brain001" / "anat" / "sub-brain001_FLAIR.nii.gz").is_file()
    assert [c.model_dump() for c in bids.read(root)] == [c.model_dump() for c in cases]
    for case, ph in zip(cases, phs):
        assert case.domain == "brain" and set(case.sequences) == {"T1", "T1c", "T2", "FLAIR"}
        assert case.metadata == ph.metadata
        assert case.ground_truth["values"] == json.loads(json.dumps(ph.truth))
        for name, ref in case.sequences.items():
            img = load_sequence(ref)
            assert np.array_equal(img.data, ph.sequences[name].data)
            np.testing.assert_allclose(img.affine, ph.sequences[name].affine, atol=1e-5)
        seg = load_sequence(SequenceRef.model_validate(case.ground_truth["labels"]["seg"]))
        for lab in (1, 2, 4):
            assert seg.volume_ml(lab) == pytest.approx(ph.truth["volumes_ml"][str(lab)], rel=0.01, abs=1e-9)


def test_participants_tsv(brain_ds):
    root, phs, _ = brain_ds
    lines = (root / "participants.tsv").read_text().splitlines()
    assert lines[0].split("\t") == ["participant_id", "age", "sex"]
    assert lines[1].split("\t") == ["sub-brain001", str(phs[0].metadata["age"]), phs[0].metadata["sex"]]


def test_prostate_and_cine_round_trip(tmp_path):
    ph, cine = _prostate_like("pros-7", 3), _cine_like("heart-1")
    cases = bids.write([ph, cine], tmp_path)
    pc, cc = cases
    assert pc.id == "sub-pros7" and pc.domain == "prostate"
    assert set(pc.sequences) == {"T2w", "ADC", "DWI"}
    assert pc.sequences["DWI"].path.endswith("dwi/sub-pros7_acq-highb_dwi.nii.gz")
    assert (tmp_path / "sub-pros7" / "dwi" / "sub-pros7_acq-highb_dwi.bval").read_text().strip() == "1400"
    assert pc.metadata == {"age": 66, "psa": 7.5, "history": "PSA rising"}
    assert (tmp_path / "sub-pros7" / "truth" / "sub-pros7_desc-lesionsadc_dseg.nii.gz").is_file()
    for name, ref in pc.sequences.items():
        img = load_sequence(ref)
        assert np.array_equal(img.data, ph.sequences[name].data)
        np.testing.assert_allclose(img.affine, ph.sequences[name].affine, atol=1e-5)
    zones = load_sequence(SequenceRef.model_validate(pc.ground_truth["labels"]["zones"]))
    assert np.array_equal(zones.data, ph.labels["zones"].data) and zones.labels == {1: "PZ", 2: "TZ"}
    assert pc.ground_truth["values"] == ph.truth
    assert cc.domain == "cardiac" and cc.sequences["CINE"].kind.value == "cine"
    c = load_sequence(cc.sequences["CINE"])
    assert isinstance(c, Cine) and np.array_equal(c.data, cine.sequences["CINE"].data)
    assert cc.metadata == {"height": 170.0, "weight": 70.5}


def test_real_bids_without_sidecar(tmp_path):
    a = np.diag([1.0, 1.0, 1.2, 1.0])
    for sub, ses in (("01", None), ("02", "pre")):
        base = tmp_path / f"sub-{sub}" / (f"ses-{ses}" if ses else "") / "anat"
        stem = f"sub-{sub}" + (f"_ses-{ses}" if ses else "")
        for suffix in ("T1w", "ce-gd_T1w", "T2w", "FLAIR"):
            write_nifti(Image(np.ones((6, 7, 5), np.float32), a), base / f"{stem}_{suffix}.nii.gz")
    dseg = tmp_path / "derivatives" / "manual" / "sub-01" / "anat" / "sub-01_desc-tumor_dseg.nii.gz"
    dseg.parent.mkdir(parents=True)
    nib.save(nib.Nifti1Image(np.zeros((6, 7, 5), np.int16), a), str(dseg))
    (tmp_path / "participants.tsv").write_text("participant_id\tage\tsex\nsub-01\t34\tF\nsub-02\tn/a\tM\n")
    cases = {c.id: c for c in bids.read(tmp_path)}
    assert set(cases) == {"sub-01", "sub-02_ses-pre"}
    one, two = cases["sub-01"], cases["sub-02_ses-pre"]
    assert one.domain == "brain" and set(one.sequences) == {"T1", "T1c", "T2", "FLAIR"}
    assert one.metadata == {"age": 34, "sex": "F"} and two.metadata == {"sex": "M"}
    assert one.ground_truth["labels"]["tumor"]["path"] == str(dseg.resolve())
    assert two.ground_truth is None


def _err(fn) -> ToolError:
    with pytest.raises(ToolError) as e:
        fn()
    return e.value


def test_errors_name_the_file(tmp_path):
    assert _err(lambda: bids.read(tmp_path)).code == ErrorCode.input_missing
    a = np.eye(4)
    anat = tmp_path / "sub-01" / "anat"
    write_nifti(Image(np.ones((6, 7, 5), np.float32), a), anat / "sub-01_T1w.nii.gz")
    write_nifti(Image(np.ones((6, 7, 4), np.float32), a), anat / "sub-01_FLAIR.nii.gz")
    e = _err(lambda: bids.read(tmp_path))
    assert e.code == ErrorCode.shape and e.context["file"].endswith(".nii.gz") and e.context["case"] == "sub-01"
    nib.save(nib.Nifti1Image(np.ones((6, 7), np.float32), a), str(anat / "sub-01_FLAIR.nii.gz"))
    e = _err(lambda: bids.read(tmp_path))
    assert e.code == ErrorCode.shape and e.context["file"].endswith("sub-01_FLAIR.nii.gz")
    write_nifti(Image(np.full((6, 7, 5), np.nan, np.float32), a), anat / "sub-01_FLAIR.nii.gz")
    (case,) = bids.read(tmp_path)  # headers are fine; the values are not
    e = _err(lambda: load_sequence(case.sequences["FLAIR"]))
    assert e.code == ErrorCode.numeric and e.context["file"].endswith("sub-01_FLAIR.nii.gz")
    write_nifti(Image(np.ones((6, 7, 5), np.float32), a), anat / "sub-01_FLAIR.nii.gz")
    f = anat / "sub-01_T1w.nii.gz"
    noise = np.random.default_rng(0).random((6, 7, 5)).astype(np.float32)  # incompressible
    write_nifti(Image(noise, a), f)
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    e = _err(lambda: [load_sequence(r) for c in bids.read(tmp_path) for r in c.sequences.values()])
    assert e.code == ErrorCode.schema and e.context["file"].endswith("sub-01_T1w.nii.gz")


def test_subject_labels():
    assert bids.subject_label("brain-s0-003") == "brains0003"
    assert bids.subject_label("sub-07") == "07"
    assert bids.parse_name("sub-01_ses-a_ce-gd_T1w.nii.gz") == ({"sub": "01", "ses": "a", "ce": "gd"}, "T1w")
    assert bids.parse_name("notes.txt") is None
    assert _err(lambda: bids.subject_label("---")).code == ErrorCode.schema


def test_bval_sidecar_gives_the_dwi_its_b_value(tmp_path):
    cases = bids.write([_prostate_like("pr001", 3)], tmp_path)
    dwi = load_sequence(cases[0].sequences["DWI"])
    assert dwi.meta["b_value"] == 1400.0
    assert "b_value" not in load_sequence(cases[0].sequences["T2w"]).meta
    side = next(tmp_path.rglob("*_dwi.bval"))
    side.write_text("0 1000 2000\n")
    assert load_sequence(cases[0].sequences["DWI"]).meta["b_values"] == [0.0, 1000.0, 2000.0]
    side.write_text("high\n")
    with pytest.raises(ToolError) as e:
        load_sequence(cases[0].sequences["DWI"])
    assert e.value.code is ErrorCode.schema and "bval" in str(e.value)
