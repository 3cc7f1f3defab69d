"""`bcer data inspect` and `bcer cohort` on a flat NIfTI folder (--seq) and an nnU-Net dataset, and a
brain cohort through a model-zoo bundle (--model-dir, --bundle). Ray via the shared session."""
from __future__ import annotations

import json
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from typer.testing import CliRunner

from bcer.cli import main as cli
from bcer.cli.main import app
from bcer.datasets.brain import make_brain
from bcer.io import write_nifti

from tests.tools import _zoo_bundles as Z

runner = CliRunner()
cli.console.width = 200
pytestmark = pytest.mark.timeout(600)
FLAT_NAMES = {"T1": "native", "T1c": "contrast", "T2": "t2", "FLAIR": "dark_fluid"}
SEQ = [f"--seq={s}=*-{n}.nii.gz" for s, n in FLAT_NAMES.items()]


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def _flat(root: Path, n: int) -> Path:
    """BraTS-like phantoms written as <id>-<word>.nii.gz with words the alias table does not know."""
    for i in range(n):
        ph = make_brain(f"b{i}", 10 + i, size="small", grade="HGG")
        for seq, word in FLAT_NAMES.items():
            write_nifti(ph.sequences[seq], root / f"subj{i:02d}-{word}.nii.gz")
    return root


def _nnunet(root: Path) -> Path:
    """An nnU-Net v2 raw dataset with MSD brain channel names (FLAIR, T1w, t1gd, T2w)."""
    ph = make_brain("nn", 21, size="small", grade="LGG")
    names = {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}
    for k, seq in enumerate(("FLAIR", "T1", "T1c", "T2")):
        write_nifti(ph.sequences[seq], root / "imagesTr" / f"BRATS_021_{k:04d}.nii.gz")
    seg = ph.labels["seg"]
    msd = np.select([seg.data == 2, seg.data == 1, seg.data == 4], [1, 2, 3], 0).astype(np.int16)
    (root / "labelsTr").mkdir(parents=True)
    nib.save(nib.Nifti1Image(msd, seg.affine), str(root / "labelsTr" / "BRATS_021.nii.gz"))
    (root / "dataset.json").write_text(json.dumps({
        "channel_names": names, "numTraining": 1, "file_ending": ".nii.gz",
        "labels": {"background": 0, "edema": 1, "non-enhancing tumor": 2, "enhancing tumour": 3}}))
    return root


def test_flat_folder_inspect_and_bundle_cohort(ray_local, tmp_path: Path) -> None:
    data = _flat(tmp_path / "flat", 1)
    code, out = invoke("data", "inspect", data)
    assert code == 2 and "--seq" in out  # endings no sequence word: asks for a mapping
    code, out = invoke("data", "inspect", data, "--json", *SEQ)
    info = json.loads(out)
    assert code == 0 and [c["case"] for c in info] == ["subj00"] and info[0]["layout"] == "flat"
    assert set(info[0]["sequences"]) == {"T1", "T1c", "T2", "FLAIR"} and info[0]["domain"] == "brain"

    models = tmp_path / "models"
    bundle = Z.small_brats(models / "brats_mri_segmentation", roi=[64, 64, 48])
    code, out = invoke("cohort", "--data", data, *SEQ, "--task", "segment_brain", "--out", tmp_path / "out",
                       "--model-dir", models, "--bundle", "seg.brain_tumor=brats_mri_segmentation")
    case_dir = tmp_path / "out" / "subj00"
    row = json.loads((case_dir / "result.json").read_text())
    # Delivered and validated; random weights give nonsense labels, which plausibility checks
    # (where present) may flag: "implausible" is an honest outcome here, a failure is not.
    assert row["status"] in ("succeeded", "implausible") and row.get("sr_delivered", row["sr"]) == 1, row
    assert code == (0 if row["status"] == "succeeded" else 1), out  # the exit code follows the case
    wf = json.loads((case_dir / "workflow.json").read_text())
    seg = next(n for n in wf["nodes"] if n["tool"] == "seg.brain_tumor")
    assert seg["params"]["bundle_dir"] == str(bundle.resolve())
    labels = np.asarray(nib.load(str(case_dir / "seg.nii.gz")).dataobj)
    assert set(np.unique(labels)) <= {0, 1, 2, 4} and labels.any()  # random weights: delivered, not meaningful

    code, out = invoke("cohort", "--data", data, *SEQ, "--task", "segment_brain", "--out", tmp_path / "out2",
                       "--bundle", "seg.brain_tumor=no_such_bundle")
    assert code == 2 and "no_such_bundle" in out


def test_nnunet_dataset_inspect_and_cohort(ray_local, tmp_path: Path) -> None:
    data = _nnunet(tmp_path / "Dataset001_BrainTumour")
    code, out = invoke("data", "inspect", data, "--json")
    info = json.loads(out)
    assert code == 0 and info[0]["layout"] == "nnunet" and info[0]["case"] == "BRATS_021"
    assert set(info[0]["sequences"]) == {"T1", "T1c", "T2", "FLAIR"} and info[0]["ground_truth"]["labels"] == ["seg"]
    code, out = invoke("cohort", "--data", data, "--task", "segment_brain", "--out", tmp_path / "out")
    assert code == 0 and "1/1 cases succeeded" in out, out
