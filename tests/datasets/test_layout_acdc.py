"""ACDC layout: write phantoms, read them back (arrays, affines, metadata, truth), malformed inputs."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from bcer.contracts.case import SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.datasets.cardiac import make_cardiac
from bcer.datasets.layouts import acdc, detect_layout, read_dataset
from bcer.io import load_sequence


@pytest.fixture(scope="module")
def cohort(tmp_path_factory):
    out = tmp_path_factory.mktemp("acdc")
    phantoms = [make_cardiac("c0", 1, group="NOR"), make_cardiac("patient042", 2, group="MINF")]
    cases = acdc.write(phantoms, out)
    return out, phantoms, cases


def test_written_files_follow_acdc(cohort):
    out, phantoms, cases = cohort
    assert [c.id for c in cases] == ["patient001", "patient042"]
    d = out / "patient001"
    t = phantoms[0].truth
    ed, es = t["ed_frame"] + 1, t["es_frame"] + 1
    for name in ("Info.cfg", "patient001_4d.nii.gz", f"patient001_frame{ed:02d}.nii.gz",
                 f"patient001_frame{ed:02d}_gt.nii.gz", f"patient001_frame{es:02d}_gt.nii.gz"):
        assert (d / name).exists(), name
    info = acdc.read_info(d / "Info.cfg")
    assert info == {"ED": ed, "ES": es, "Group": "NOR", "Height": phantoms[0].metadata["height"],
                    "NbFrame": phantoms[0].sequences["CINE"].n_frames, "Weight": phantoms[0].metadata["weight"]}
    assert detect_layout(out) == "acdc"


def test_round_trip_arrays_affines_metadata(cohort):
    out, phantoms, cases = cohort
    for p, c in zip(phantoms, read_dataset(out)):
        cine = load_sequence(c.sequences["CINE"])
        src = p.sequences["CINE"]
        assert np.array_equal(cine.data, src.data) and np.allclose(cine.affine, src.affine, atol=1e-6)
        assert np.allclose(cine.spacing, src.spacing, atol=1e-6)
        assert c.metadata == {"height": p.metadata["height"], "weight": p.metadata["weight"]}
        assert c.domain == "cardiac" and c.layout == "acdc"
        v = c.ground_truth["values"]
        assert v["group"] == p.truth["group"]
        assert (v["ed_frame"], v["es_frame"]) == (p.truth["ed_frame"], p.truth["es_frame"])
        seg = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["seg"]))
        assert np.array_equal(seg.data, p.labels["seg"].data) and seg.labels == {1: "RV", 2: "MYO", 3: "LV"}
        ed = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["ed"]))
        assert np.array_equal(ed.data, p.labels["seg"].data[..., v["ed_frame"]])


def test_volumes_from_written_masks_match_truth(cohort):
    _, phantoms, cases = cohort
    for p, c in zip(phantoms, cases):
        v = c.ground_truth["values"]
        for key, frame in (("ed", "lv_edv_ml"), ("es", "lv_esv_ml")):
            m = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"][key]))
            assert m.volume_ml(3) == pytest.approx(v[frame], rel=0.01)
        ed = load_sequence(SequenceRef.model_validate(c.ground_truth["labels"]["ed"]))
        assert 1.05 * ed.volume_ml(2) == pytest.approx(v["myo_mass_g"], rel=0.01)
        assert v["lv_ef_pct"] == pytest.approx(p.truth["lv_ef_pct"])


def _copy_case(cohort, tmp_path):
    out = cohort[0]
    dst = tmp_path / "ds"
    shutil.copytree(out / "patient001", dst / "patient001")
    return dst


def test_real_acdc_without_sidecar(cohort, tmp_path):
    """A real ACDC folder: no bcer_truth.json, no 4d_gt; truth comes from Info.cfg and _gt files."""
    dst = _copy_case(cohort, tmp_path)
    (dst / "patient001" / "bcer_truth.json").unlink()
    (dst / "patient001" / "patient001_4d_gt.nii.gz").unlink()
    (c,) = acdc.read(dst)
    assert set(c.ground_truth["labels"]) == {"ed", "es"}
    assert c.ground_truth["values"]["group"] == "NOR" and "lv_edv_ml" not in c.ground_truth["values"]
    assert c.metadata["height"] == cohort[1][0].metadata["height"]


@pytest.mark.parametrize("key", acdc.REQUIRED_KEYS)
def test_missing_info_key_is_schema_error(cohort, tmp_path, key):
    dst = _copy_case(cohort, tmp_path)
    cfg = dst / "patient001" / "Info.cfg"
    cfg.write_text("\n".join(l for l in cfg.read_text().splitlines() if not l.startswith(key + ":")))
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code is ErrorCode.schema
    assert e.value.context["file"].endswith("Info.cfg") and e.value.context["key"] == key


def test_malformed_inputs(cohort, tmp_path):
    dst = _copy_case(cohort, tmp_path)
    d = dst / "patient001"
    cfg = d / "Info.cfg"
    good = cfg.read_text()
    cfg.write_text(good.replace("NbFrame: ", "NbFrame: 3"))  # 10 -> 310 frames: disagrees with the 4d file
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code in (ErrorCode.shape, ErrorCode.value_range)
    cfg.write_text(good.replace("Height: ", "Height: tall"))
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code is ErrorCode.schema and e.value.context["key"] == "Height"
    cfg.write_text(good)
    four_d = d / "patient001_4d.nii.gz"
    four_d.write_bytes(four_d.read_bytes()[:200])  # truncated gzip
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code is ErrorCode.schema and "patient001_4d" in e.value.context["file"]
    cfg.unlink()
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code is ErrorCode.input_missing
    with pytest.raises(ToolError) as e:
        acdc.read(tmp_path / "empty")
    assert e.value.code is ErrorCode.input_missing


def test_mismatched_label_grid_is_shape_error(cohort, tmp_path):
    import nibabel as nib

    dst = _copy_case(cohort, tmp_path)
    d = dst / "patient001"
    gt = sorted(d.glob("patient001_frame*_gt.nii.gz"))[0]
    img = nib.load(str(gt))
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj)[:-2], img.affine), str(gt))
    with pytest.raises(ToolError) as e:
        acdc.read(dst)
    assert e.value.code is ErrorCode.shape and e.value.context["case"] == "patient001"


def test_nan_volume_is_numeric_error_on_load(cohort, tmp_path):
    import nibabel as nib

    dst = _copy_case(cohort, tmp_path)
    f = dst / "patient001" / "patient001_4d.nii.gz"
    img = nib.load(str(f))
    data = np.asarray(img.dataobj).copy()
    data[0, 0, 0, 0] = np.nan
    nib.save(nib.Nifti1Image(data, img.affine), str(f))
    (c,) = acdc.read(dst)  # lazy: headers are fine
    with pytest.raises(ToolError) as e:
        load_sequence(c.sequences["CINE"])
    assert e.value.code is ErrorCode.numeric


def test_info_round_trip_without_group(tmp_path):
    p = acdc.write_info(tmp_path / "Info.cfg", 1, 9, None, 170.0, 25, 70.5)
    assert acdc.read_info(p) == {"ED": 1, "ES": 9, "Height": 170.0, "NbFrame": 25, "Weight": 70.5}
    p.write_text("ED: 30\nES: 9\nHeight: 170\nNbFrame: 25\nWeight: 70\n")
    with pytest.raises(ToolError) as e:
        acdc.read_info(p)
    assert e.value.code is ErrorCode.value_range and e.value.context["key"] == "ED"
