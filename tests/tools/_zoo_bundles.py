"""Bundle folders shaped like two MONAI model-zoo bundles, with random (or chosen) weights.

The configs below mirror, key for key and in structure, the published
``configs/inference.json`` and ``configs/metadata.json`` of

* ``brats_mri_segmentation`` v0.5.2 (Project-MONAI/model-zoo, models/brats_mri_segmentation):
  SegResNet, 4 input channels ``channel_def`` T1c/T1/T2/FLAIR, NormalizeIntensityd(nonzero,
  channel_wise), SlidingWindowInferer roi [240, 240, 160] / sw 1 / overlap 0.5, post-processing
  Activationsd(sigmoid) -> Invertd -> AsDiscreted(threshold 0.5) -> Lambdad(TC/WT/ET -> BraTS
  1/2/4) -> SaveImaged, spatial shape "8*n";
* ``prostate_mri_anatomy`` v0.3.4 (models/prostate_mri_anatomy): UNet, 1 channel, Orientationd
  RAS, Spacingd 0.5 mm, ScaleIntensityd, NormalizeIntensityd, roi [96, 96, 96], post-processing
  AsDiscreted(argmax) -> KeepLargestConnectedComponentd([1, 2]) -> Invertd -> SaveImaged,
  classes 1 central gland / 2 peripheral zone.

Only numbers can be scaled down (network widths, roi, pixdim) so tests run in seconds; every
key the bcer bundle reader touches keeps its published form. Nothing is downloaded: weights
are random (``torch.manual_seed``) or set by the test.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

BRATS_NETWORK = {"_target_": "SegResNet", "blocks_down": [1, 2, 2, 4], "blocks_up": [1, 1, 1],
                 "init_filters": 16, "in_channels": 4, "out_channels": 3, "dropout_prob": 0.2}
BRATS_ROI = [240, 240, 160]
PROSTATE_NETWORK = {"_target_": "UNet", "spatial_dims": 3, "in_channels": 1, "out_channels": 3,
                    "channels": [16, 32, 64, 128, 256, 512], "strides": [2, 2, 2, 2, 2], "num_res_units": 4,
                    "norm": "batch", "act": "prelu", "dropout": 0.15}
PROSTATE_ROI = [96, 96, 96]
PROSTATE_PIXDIM = [0.5, 0.5, 0.5]


def brats_inference(network: dict[str, Any] | None = None, roi: list[int] | None = None) -> dict[str, Any]:
    return {
        "imports": ["$import glob", "$import numpy", "$import os"],
        "bundle_root": ".",
        "image_key": "image",
        "ckpt_dir": "$@bundle_root + '/models'",
        "output_dir": "$@bundle_root + '/eval'",
        "output_ext": ".nii.gz",
        "output_dtype": "uint8",
        "output_postfix": "seg",
        "separate_folder": True,
        "load_pretrain": True,
        "data_list_file_path": "$@bundle_root + '/configs/datalist.json'",
        "dataset_dir": "/workspace/data/medical/brats2018challenge",
        "test_datalist": "$monai.data.load_decathlon_datalist(@data_list_file_path, data_list_key='testing', "
                         "base_dir=@dataset_dir)",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "amp": True,
        "network_def": copy.deepcopy(network or BRATS_NETWORK),
        "network": "$@network_def.to(@device)",
        "preprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": "LoadImaged", "keys": "@image_key", "image_only": False},
            {"_target_": "NormalizeIntensityd", "keys": "@image_key", "nonzero": True, "channel_wise": True}]},
        "dataset": {"_target_": "Dataset", "data": "@test_datalist", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": True,
                       "num_workers": 4},
        "inferer": {"_target_": "SlidingWindowInferer", "roi_size": list(roi or BRATS_ROI), "sw_batch_size": 1,
                    "overlap": 0.5},
        "postprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": "Activationsd", "keys": "pred", "sigmoid": True},
            {"_target_": "Invertd", "keys": "pred", "transform": "@preprocessing", "orig_keys": "@image_key",
             "meta_keys": "pred_meta_dict", "nearest_interp": False, "to_tensor": True},
            {"_target_": "AsDiscreted", "keys": "pred", "threshold": 0.5},
            {"_target_": "Lambdad", "keys": "pred",
             "func": "$lambda x: torch.where(x[[2]] > 0, 4, torch.where(x[[0]] > 0, 1, "
                     "torch.where(x[[1]] > 0, 2, 0)))"},
            {"_target_": "SaveImaged", "keys": "pred", "meta_keys": "pred_meta_dict", "output_dir": "@output_dir",
             "output_ext": "@output_ext", "output_dtype": "@output_dtype", "output_postfix": "@output_postfix",
             "separate_folder": "@separate_folder", "resample": False, "squeeze_end_dims": True}]},
        "handlers": [{"_target_": "StatsHandler", "iteration_log": False}],
        "evaluator": {"_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@dataloader",
                      "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
                      "val_handlers": "@handlers", "amp": True},
        "checkpointloader": {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/model.pt'",
                             "load_dict": {"model": "@network"}},
        "initialize": ["$setattr(torch.backends.cudnn, 'benchmark', True)",
                       "$@checkpointloader(@evaluator) if @load_pretrain else None"],
        "run": ["$@evaluator.run()"],
    }


def _image_format(channels: int, shape: list[Any], value_range: list[Any], channel_def: dict[str, str],
                  fmt: str = "magnitude") -> dict[str, Any]:
    return {"type": "image", "format": fmt, "modality": "MR", "num_channels": channels, "spatial_shape": shape,
            "dtype": "float32", "value_range": value_range, "is_patch_data": True, "channel_def": channel_def}


def brats_metadata() -> dict[str, Any]:
    return {
        "schema": "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/"
                  "meta_schema_20220324.json",
        "version": "0.5.2",
        "changelog": {"0.5.2": "use monai 1.4 and update large files"},
        "monai_version": "1.4.0", "pytorch_version": "2.4.0", "numpy_version": "1.24.4",
        "optional_packages_version": {"nibabel": "5.2.1", "pytorch-ignite": "0.4.11"},
        "name": "BraTS MRI segmentation",
        "task": "Multimodal Brain Tumor segmentation",
        "description": "A pre-trained model for volumetric (3D) segmentation of brain tumor subregions from "
                       "multimodal MRIs based on BraTS 2018 data",
        "authors": "MONAI team", "copyright": "Copyright (c) MONAI Consortium",
        "data_type": "nibabel",
        "image_classes": "4 channel data, T1c, T1, T2, FLAIR at 1x1x1 mm",
        "label_classes": "3 channel data, channel 0 for Tumor core, channel 1 for Whole tumor, channel 2 for "
                         "Enhancing tumor",
        "pred_classes": "3 channels data, same as label_classes",
        "intended_use": "This is an example, not to be used for diagnostic purposes",
        "network_data_format": {
            "inputs": {"image": _image_format(4, ["8*n", "8*n", "8*n"], [],
                                              {"0": "T1c", "1": "T1", "2": "T2", "3": "FLAIR"})},
            "outputs": {"pred": _image_format(3, ["8*n", "8*n", "8*n"], [0, 1],
                                              {"0": "Tumor core", "1": "Whole tumor", "2": "Enhancing tumor"},
                                              fmt="segmentation")},
        },
    }


def prostate_inference(network: dict[str, Any] | None = None, roi: list[int] | None = None,
                       pixdim: list[float] | None = None) -> dict[str, Any]:
    return {
        "imports": ["$import pandas as pd", "$import os"],
        "bundle_root": ".",
        "output_dir": "$@bundle_root + '/eval'",
        "dataset_dir": "/workspace/data/prostate158/prostate158_test/",
        "datalist": "$list(@dataset_dir + pd.read_csv(@dataset_dir + 'test.csv').t2)",
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "network_def": copy.deepcopy(network or PROSTATE_NETWORK),
        "network": "$@network_def.to(@device)",
        "preprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": "LoadImaged", "keys": "image"},
            {"_target_": "EnsureChannelFirstd", "keys": "image"},
            {"_target_": "Orientationd", "keys": "image", "axcodes": "RAS"},
            {"_target_": "Spacingd", "keys": "image", "pixdim": list(pixdim or PROSTATE_PIXDIM), "mode": "bilinear"},
            {"_target_": "ScaleIntensityd", "keys": "image", "minv": 0, "maxv": 1},
            {"_target_": "NormalizeIntensityd", "keys": "image"},
            {"_target_": "EnsureTyped", "keys": "image"}]},
        "dataset": {"_target_": "Dataset", "data": "$[{'image': i} for i in @datalist]", "transform": "@preprocessing"},
        "dataloader": {"_target_": "DataLoader", "dataset": "@dataset", "batch_size": 1, "shuffle": False,
                       "num_workers": 4},
        "inferer": {"_target_": "SlidingWindowInferer", "roi_size": list(roi or PROSTATE_ROI), "sw_batch_size": 4,
                    "overlap": 0.5},
        "postprocessing": {"_target_": "Compose", "transforms": [
            {"_target_": "AsDiscreted", "keys": "pred", "argmax": True},
            {"_target_": "KeepLargestConnectedComponentd", "keys": "pred", "applied_labels": [1, 2]},
            {"_target_": "Invertd", "keys": "pred", "transform": "@preprocessing", "orig_keys": "image",
             "meta_key_postfix": "meta_dict", "nearest_interp": False, "to_tensor": True},
            {"_target_": "SaveImaged", "keys": "pred", "resample": False, "meta_keys": "pred_meta_dict",
             "output_dir": "@output_dir"}]},
        "handlers": [
            {"_target_": "CheckpointLoader", "load_path": "$@bundle_root + '/models/model.pt'",
             "map_location": {"_target_": "torch.device", "device": "@device"}, "load_dict": {"model": "@network"}},
            {"_target_": "StatsHandler", "iteration_log": False}],
        "evaluator": {"_target_": "SupervisedEvaluator", "device": "@device", "val_data_loader": "@dataloader",
                      "network": "@network", "inferer": "@inferer", "postprocessing": "@postprocessing",
                      "val_handlers": "@handlers", "amp": True},
        "initialize": ["$setattr(torch.backends.cudnn, 'benchmark', True)"],
        "run": ["$@evaluator.run()"],
    }


def prostate_metadata() -> dict[str, Any]:
    return {
        "schema": "https://github.com/Project-MONAI/MONAI-extra-test-data/releases/download/0.8.1/"
                  "meta_schema_20220324.json",
        "version": "0.3.4",
        "changelog": {"0.3.4": "support monai 1.4"},
        "monai_version": "1.4.0", "pytorch_version": "2.4.0", "numpy_version": "1.24.4",
        "optional_packages_version": {"nibabel": "5.2.1", "itk": "5.4.0", "pytorch-ignite": "0.4.11",
                                      "pandas": "2.2.1"},
        "name": "Prostate MRI anatomy",
        "task": "Segmentation of peripheral zone and central gland in prostate MRI",
        "description": "A pre-trained model for volumetric (3D) segmentation of the prostate from MRI images",
        "authors": "Keno Bressem", "copyright": "Copyright (c) Keno Bressem",
        "data_source": "Prostate158 from 10.5281/zenodo.6481141",
        "data_type": "nifti",
        "image_classes": "single channel data, intensity scaled to [0, 1]",
        "label_classes": "singe channel data, 1 central gland, 2 periheral zone, 0 is everything else",
        "pred_classes": "3 channels OneHot data, channel 1 central gland, channel 2 is peripheral zone, "
                        "channel 0 is background",
        "intended_use": "This is an example, not to be used for diagnostic purposes",
        "network_data_format": {
            "inputs": {"image": _image_format(1, [96, 96, 96], [0, 1], {"0": "image"})},
            "outputs": {"pred": _image_format(3, [96, 96, 96], [], {"0": "background", "1": "central gland",
                                                                   "2": "peripheral zone"}, fmt="labels")},
        },
    }


def write_bundle(root: Path, inference: dict[str, Any], metadata: dict[str, Any],
                 state: dict[str, torch.Tensor] | None = None, seed: int = 0) -> Path:
    """``root/configs/{inference,metadata}.json`` and ``root/models/model.pt``: ``state`` or the
    state dict of ``network_def`` built with random weights (seeded)."""
    from monai.bundle import ConfigParser

    (root / "configs").mkdir(parents=True, exist_ok=True)
    (root / "models").mkdir(exist_ok=True)
    (root / "configs" / "inference.json").write_text(json.dumps(inference, indent=1))
    (root / "configs" / "metadata.json").write_text(json.dumps(metadata, indent=1))
    if state is None:
        torch.manual_seed(seed)
        state = ConfigParser({"net": inference["network_def"]}).get_parsed_content("net").state_dict()
    torch.save(state, root / "models" / "model.pt")
    return root


def small_brats(root: Path, roi: list[int] | None = None, seed: int = 0) -> Path:
    """The brats bundle with a narrow SegResNet (init_filters 8: GroupNorm needs 8 groups) and a small roi."""
    net = dict(BRATS_NETWORK, init_filters=8)
    return write_bundle(root, brats_inference(net, roi or [32, 32, 24]), brats_metadata(), seed=seed)


def small_prostate(root: Path, seed: int = 0) -> Path:
    """The prostate bundle with a narrow 3-level UNet, roi 32 and 1.5 mm spacing."""
    net = dict(PROSTATE_NETWORK, channels=[4, 8, 16], strides=[2, 2], num_res_units=1)
    return write_bundle(root, prostate_inference(net, [32, 32, 32], [1.5, 1.5, 1.5]), prostate_metadata(), seed=seed)
