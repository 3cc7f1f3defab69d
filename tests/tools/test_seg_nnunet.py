"""``seg.nnunet`` on an nnU-Net v2 results folder built here with random weights (plans.json,
dataset.json and fold_0/checkpoint_final.pth from nnunetv2's own network classes).

Ground truth is nnU-Net itself: the label map bcer returns must equal, voxel for voxel, what
nnU-Net's own file-based prediction (``predict_from_files``, its reader, resampling and
writer) writes for the same NIfTI, on the same grid; the predictor loads once per process."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("nnunetv2", reason="nnunetv2 is the optional extra bcer[nnunet]")

import nibabel as nib
import torch

from bcer.contracts.artifacts import Image
from bcer.io import write_nifti
from bcer.tools.registry import call_tool
from bcer.tools.seg import nnunet as nn_tool

pytestmark = pytest.mark.timeout(240)
LABELS = {"background": 0, "gland": 1, "lesion": 2}
ARCH = {
    "network_class_name": "dynamic_network_architectures.architectures.unet.PlainConvUNet",
    "arch_kwargs": {"n_stages": 3, "features_per_stage": [4, 8, 16], "conv_op": "torch.nn.modules.conv.Conv3d",
                    "kernel_sizes": [[3, 3, 3]] * 3, "strides": [[1, 1, 1], [2, 2, 2], [2, 2, 2]],
                    "n_conv_per_stage": [1, 1, 1], "n_conv_per_stage_decoder": [1, 1], "conv_bias": True,
                    "norm_op": "torch.nn.modules.instancenorm.InstanceNorm3d",
                    "norm_op_kwargs": {"eps": 1e-5, "affine": True}, "dropout_op": None, "dropout_op_kwargs": None,
                    "nonlin": "torch.nn.LeakyReLU", "nonlin_kwargs": {"inplace": True}},
    "_kw_requires_import": ["conv_op", "norm_op", "dropout_op", "nonlin"],
}


def _plans() -> dict:
    resample = {"is_seg": False, "order": 1, "order_z": 0, "force_separate_z": None}
    return {
        "dataset_name": "Dataset999_Random", "plans_name": "nnUNetPlans",
        "original_median_spacing_after_transp": [3.0, 1.0, 1.0], "original_median_shape_after_transp": [16, 32, 32],
        "image_reader_writer": "SimpleITKIO", "transpose_forward": [0, 1, 2], "transpose_backward": [0, 1, 2],
        "experiment_planner_used": "ExperimentPlanner", "label_manager": "LabelManager",
        "foreground_intensity_properties_per_channel": {"0": {"mean": 100.0, "std": 30.0, "median": 100.0,
                                                              "min": 0.0, "max": 300.0, "percentile_00_5": 1.0,
                                                              "percentile_99_5": 250.0}},
        "configurations": {"3d_fullres": {
            "data_identifier": "nnUNetPlans_3d_fullres", "preprocessor_name": "DefaultPreprocessor",
            "batch_size": 2, "patch_size": [16, 32, 32], "median_image_size_in_voxels": [16, 32, 32],
            "spacing": [3.0, 1.0, 1.0], "normalization_schemes": ["ZScoreNormalization"],
            "use_mask_for_norm": [False], "resampling_fn_data": "resample_data_or_seg_to_shape",
            "resampling_fn_seg": "resample_data_or_seg_to_shape",
            "resampling_fn_data_kwargs": {**resample, "order": 3},
            "resampling_fn_seg_kwargs": {**resample, "is_seg": True},
            "resampling_fn_probabilities": "resample_data_or_seg_to_shape",
            "resampling_fn_probabilities_kwargs": resample, "architecture": ARCH, "batch_dice": True}},
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from nnunetv2.utilities.get_network_from_plans import get_network_from_plans

    root = tmp_path_factory.mktemp("nnunet") / "nnUNetTrainer__nnUNetPlans__3d_fullres"
    (root / "fold_0").mkdir(parents=True)
    dataset = {"channel_names": {"0": "T2"}, "labels": LABELS, "numTraining": 1, "file_ending": ".nii.gz"}
    plans = _plans()
    (root / "dataset.json").write_text(json.dumps(dataset))
    (root / "plans.json").write_text(json.dumps(plans))
    torch.manual_seed(0)
    net = get_network_from_plans(ARCH["network_class_name"], ARCH["arch_kwargs"], ARCH["_kw_requires_import"],
                                 1, len(LABELS), deep_supervision=False)
    with torch.no_grad():  # random weights, a final layer that separates classes by intensity
        net.decoder.seg_layers[-1].weight.mul_(20.0)
    torch.save({"network_weights": net.state_dict(), "trainer_name": "nnUNetTrainer",
                "init_args": {"plans": plans, "configuration": "3d_fullres", "fold": 0, "dataset_json": dataset},
                "inference_allowed_mirroring_axes": (0, 1, 2)}, root / "fold_0" / "checkpoint_final.pth")
    return root


def _image() -> Image:
    rng = np.random.default_rng(0)
    x, y, z = np.meshgrid(np.arange(36), np.arange(30), np.arange(14), indexing="ij")
    data = 100 + 80 * np.exp(-((x - 14) ** 2 + (y - 16) ** 2 + 4 * (z - 6) ** 2) / 60.0) + rng.normal(0, 5, x.shape)
    affine = np.array([[-1.1, 0, 0, 20.0], [0, 0.9, 0.1, -5.0], [0, 0, 3.0, 7.0], [0, 0, 0, 1]])
    return Image(data.astype(np.float32), affine)


def test_nnunet_tool_equals_nnunets_own_file_prediction(model_dir, tmp_path):
    from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor

    image = _image()
    params = {"bundle_dir": str(model_dir), "folds": "0"}
    mask = call_tool("seg.nnunet", {"image": image}, params)["mask"]
    assert mask.data.shape == image.data.shape and np.array_equal(mask.affine, image.affine)
    assert mask.labels == {1: "gland", 2: "lesion"} and mask.meta["method"] == "nnunetv2"
    card = mask.meta["method_card"]
    assert card["kind"] == "network" and card["weights_sha256"] == hashlib.sha256(
        (model_dir / "fold_0" / "checkpoint_final.pth").read_bytes()).hexdigest()

    write_nifti(image, tmp_path / "in" / "case_0000.nii.gz")
    ref = nnUNetPredictor(tile_step_size=0.5, use_mirroring=False, perform_everything_on_device=False,
                          device=torch.device("cpu"), allow_tqdm=False)
    ref.initialize_from_trained_model_folder(str(model_dir), use_folds=(0,))
    ref.predict_from_files(str(tmp_path / "in"), str(tmp_path / "out"), save_probabilities=False, overwrite=True,
                           num_processes_preprocessing=1, num_processes_segmentation_export=1)
    want = np.asarray(nib.load(tmp_path / "out" / "case.nii.gz").dataobj)
    values = set(np.unique(want).tolist())
    assert len(values) >= 2 and values <= {0, 1, 2}  # a label map with structure, not one class everywhere
    assert np.array_equal(mask.data, want)

    hits = nn_tool.cache_info().hits
    again = call_tool("seg.nnunet", {"image": image}, params)["mask"]
    assert nn_tool.cache_info().hits == hits + 1 and np.array_equal(again.data, mask.data)  # loaded once


def test_wrong_channel_count_and_missing_fold_are_typed(model_dir):
    from bcer.contracts.errors import ToolError

    image = _image()
    with pytest.raises(ToolError, match="takes 1 channel") as e:
        call_tool("seg.nnunet", {"image": image, "image_1": image}, {"bundle_dir": str(model_dir), "folds": "0"})
    assert e.value.code.value == "shape"
    with pytest.raises(ToolError, match="folds") as e:
        call_tool("seg.nnunet", {"image": image}, {"bundle_dir": str(model_dir), "folds": "3"})
    assert e.value.code.value == "input_missing"
