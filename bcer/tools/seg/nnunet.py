"""``seg.nnunet``: a trained nnU-Net v2 results folder as a segmenter, through nnU-Net's own
predictor (``nnunetv2.inference.predict_from_raw_data.nnUNetPredictor``).

The folder is what ``nnUNetv2_train`` leaves (``nnUNet_results/<Dataset>/<Trainer>__<Plans>__<config>/``)::

    dataset.json   channel_names, labels     plans.json   the plans (reader/writer, configurations)
    fold_0/checkpoint_final.pth ...           one or more folds (or fold_all)

Images go in and the segmentation comes out through the plans' own reader/writer
(``image_reader_writer``, usually SimpleITKIO), as nnU-Net itself reads files, so the axis
order and spacing the network was trained on are kept; the label map comes back on the input
grid with the names ``dataset.json`` gives. The predictor is loaded once per worker process
(cached by folder, newest file time, device, folds and checkpoint) and reused across cases, the
way MONAI bundles are (``seg.bundle``); with ``--bundle seg.nnunet=DIR --model-actors`` one Ray
actor per GPU keeps it loaded. nnunetv2 is an optional extra (``pip install bcer[nnunet]``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ...contracts.artifacts import Image, Mask
from ...contracts.errors import ErrorCode, ToolError
from ..methods import MethodCard
from ..registry import tool

log = logging.getLogger(__name__)

__all__ = ["NnUNetParams", "is_nnunet_dir", "load_predictor", "nnunet", "predict"]


class NnUNetParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bundle_dir: str = Field(description="nnU-Net v2 results folder (dataset.json, plans.json, fold_X/)")
    folds: str = Field("auto", description="comma-separated folds, 'all', or 'auto' (every fold present)")
    checkpoint: str = Field("checkpoint_final.pth", description="checkpoint file name in each fold folder")
    step_size: float = Field(0.5, ge=0.1, le=1.0, description="sliding-window step (fraction of the patch)")
    mirroring: bool = Field(False, description="test-time mirroring (slower, what nnU-Net does by default)")


def is_nnunet_dir(folder: str | Path) -> bool:
    """True when ``folder`` looks like an nnU-Net v2 results folder."""
    root = Path(folder)
    return (root / "dataset.json").is_file() and (root / "plans.json").is_file() and any(root.glob("fold_*/*.pth"))


def _folds(root: Path, folds: str, checkpoint: str) -> tuple[str, ...]:
    if folds == "auto":
        found = sorted(p.parent.name[5:] for p in root.glob(f"fold_*/{checkpoint}"))
    else:
        found = [f.strip() for f in folds.split(",") if f.strip()]
    missing = [f for f in found if not (root / f"fold_{f}" / checkpoint).is_file()]
    if not found or missing:
        raise ToolError(ErrorCode.input_missing, f"nnU-Net folder {root} has no {checkpoint} for folds "
                        f"{missing or folds}", hint="train the folds or pass folds=<those present>",
                        file=str(root), arg="bundle_dir")
    return tuple(found)


def _check(root: Path) -> None:
    if not is_nnunet_dir(root):
        raise ToolError(ErrorCode.input_missing, f"{root} is not an nnU-Net v2 results folder "
                        "(dataset.json, plans.json, fold_X/checkpoint_final.pth)", file=str(root), arg="bundle_dir")


def load_predictor(bundle_dir: str | Path, device: str = "cpu", folds: str = "auto",
                   checkpoint: str = "checkpoint_final.pth", step_size: float = 0.5, mirroring: bool = False) -> Any:
    """The initialised ``nnUNetPredictor`` of a results folder, loaded once per process."""
    root = Path(bundle_dir).expanduser().resolve()
    _check(root)
    chosen = _folds(root, folds, checkpoint)
    mtime = max(p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file())
    return _load_cached(str(root), mtime, device, chosen, checkpoint, float(step_size), bool(mirroring))


@lru_cache(maxsize=4)
def _load_cached(root: str, mtime_ns: int, device: str, folds: tuple[str, ...], checkpoint: str,
                 step_size: float, mirroring: bool) -> Any:
    import torch

    try:
        from nnunetv2.inference.predict_from_raw_data import nnUNetPredictor
    except ImportError as e:
        raise ToolError(ErrorCode.resource, "seg.nnunet needs nnunetv2", hint="pip install 'bcer[nnunet]'",
                        arg="bundle_dir") from e
    predictor = nnUNetPredictor(tile_step_size=step_size, use_gaussian=True, use_mirroring=mirroring,
                                perform_everything_on_device=device != "cpu", device=torch.device(device),
                                verbose=False, verbose_preprocessing=False, allow_tqdm=False)
    predictor.initialize_from_trained_model_folder(root, use_folds=tuple(f if f == "all" else int(f) for f in folds),
                                                   checkpoint_name=checkpoint)
    log.info("nnU-Net %s loaded on %s (folds %s)", root, device, ",".join(folds))
    return predictor


def cache_info() -> Any:
    """Hits and misses of the per-process predictor cache."""
    return _load_cached.cache_info()


def _labels(dataset: dict[str, Any]) -> dict[int, str]:
    out = {}
    for name, value in dataset.get("labels", {}).items():
        if isinstance(value, int) and value != 0:
            out[value] = name
    return out


def predict(predictor: Any, images: list[Image]) -> Mask:
    """Run ``predictor`` on co-registered ``images`` (in dataset.json's channel order)."""
    from ...io import read_nifti, write_nifti

    rw = predictor.plans_manager.image_reader_writer_class()
    n_in = len(predictor.dataset_json.get("channel_names", predictor.dataset_json.get("modality", {})))
    if len(images) != n_in:
        raise ToolError(ErrorCode.shape, f"the nnU-Net model takes {n_in} channel(s), got {len(images)}",
                        hint=f"channels: {predictor.dataset_json.get('channel_names')}", arg="image")
    with tempfile.TemporaryDirectory(prefix="bcer_nnunet_") as tmp:
        paths = [str(write_nifti(im, Path(tmp) / f"case_{i:04d}.nii.gz")) for i, im in enumerate(images)]
        data, props = rw.read_images(paths)  # nnU-Net's own reader: the axis order it was trained on
        seg = predictor.predict_single_npy_array(data, props)
        rw.write_seg(np.asarray(seg), str(Path(tmp) / "seg.nii.gz"), props)
        mask = read_nifti(Path(tmp) / "seg.nii.gz", "mask", _labels(predictor.dataset_json))
    mask.affine = np.asarray(images[0].affine, dtype=np.float64).copy()  # the input's affine, bit for bit
    return mask


@tool("seg.nnunet", version="1.0", milestone="segmentation", resources={"num_cpus": 1, "memory_mb": 4096},
      gpu="optional", frameworks=("torch", "nnunetv2"))
def nnunet(image: Image, params: NnUNetParams, image_1: Image | None = None, image_2: Image | None = None,
           image_3: Image | None = None, device: str = "cpu") -> Mask:
    """Segment with a trained nnU-Net v2 model (its own predictor, loaded once per worker).

    Args:
        image: channel 0 of dataset.json's ``channel_names``; ``image_1``.. the next channels,
            all on one voxel grid.
        params: ``bundle_dir`` (the results folder), ``folds``, ``checkpoint``, ``step_size``.
        device: "cpu" or "cuda".

    Returns:
        The label map on the input grid, labels named as in dataset.json.
    """
    images = [im for im in (image, image_1, image_2, image_3) if im is not None]
    shapes = {tuple(np.shape(im.data)) for im in images}
    if len(shapes) > 1:
        raise ToolError(ErrorCode.shape, f"nnU-Net channels differ in shape: {sorted(shapes)}",
                        hint="resample the channels onto one grid first", arg="image_1")
    predictor = load_predictor(params.bundle_dir, device, params.folds, params.checkpoint, params.step_size,
                               params.mirroring)
    mask = predict(predictor, images)
    mask.meta.update({"method": "nnunetv2", "model": str(Path(params.bundle_dir).resolve()),
                      "folds": params.folds, "checkpoint": params.checkpoint,
                      "method_card": _card(Path(params.bundle_dir), params).model_dump(exclude_defaults=True)})
    return mask


def _card(root: Path, params: NnUNetParams) -> MethodCard:
    """The model's card: dataset name, folds, and the sha256 of the first fold's checkpoint."""
    root = root.expanduser().resolve()
    folds = _folds(root, params.folds, params.checkpoint)
    digest = hashlib.sha256((root / f"fold_{folds[0]}" / params.checkpoint).read_bytes()).hexdigest()
    dataset = json.loads((root / "dataset.json").read_text()).get("name") or root.parent.name
    return MethodCard(name=f"nnU-Net v2 {root.name}", version=f"folds {','.join(folds)}", kind="network",
                      summary=f"nnU-Net v2 model of {dataset} ({root})", bundle=str(root), weights_sha256=digest,
                      trained_on="not stated by the results folder")
