"""Local MONAI bundles: load once per worker process, run sliding-window inference.

A bundle folder follows the MONAI bundle layout::

    <bundle>/configs/inference.json   # "network_def" (a monai.bundle config), optional
    <bundle>/configs/metadata.json    # "network_data_format", optional "bcer" section
    <bundle>/models/model.pt          # state dict for network_def
    <bundle>/models/model.ts          # or a TorchScript module (no network_def needed)

bcer reads these keys from ``metadata.json`` (all optional)::

    network_data_format.inputs.image.num_channels      input channels (default 1)
    network_data_format.inputs.image.spatial_shape     default roi size
    network_data_format.outputs.pred.channel_def       {"0": "background", "1": "RV", ...}
    bcer.spatial_dims        2 (slice-wise over Z) or 3 (default: from network_def or 3)
    bcer.normalize           "zscore" (per channel over non-zero voxels, default) | "none"
    bcer.output              "argmax" (softmax classes, default) | "sigmoid_brats" (TC/WT/ET)
    bcer.label_values        label value written for each output channel (default 0..n-1)
    bcer.pixdim              voxel size (mm) the network was trained at, per spatial axis;
                             inputs on another grid are resampled to it and labels back

The network is cached per process by ``(folder, newest mtime, device)`` so a worker loads
it once and reuses it across calls; touching the files invalidates the entry.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ...contracts.errors import ErrorCode, ToolError, did_you_mean
from .._gpu import torch_device

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "bundles"
_CONFIG_NAMES = ("inference.json", "metadata.json")
_MODEL_NAMES = ("model.pt", "model.ts")


@dataclass(frozen=True)
class Bundle:
    """A loaded bundle: the network (eval mode, on its device) and how to call it."""

    path: str
    network: Any  # torch.nn.Module or torch.jit.ScriptModule
    device: str
    spatial_dims: int
    in_channels: int
    roi_size: tuple[int, ...]
    normalize: str
    output: str
    label_values: tuple[int, ...]
    channel_names: dict[int, str] = field(default_factory=dict)
    pixdim: tuple[float, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ToolError(ErrorCode.schema, f"bundle config {path} is not valid JSON: {e}",
                        hint="fix or regenerate the bundle's configs", file=str(path)) from None
    if not isinstance(data, dict):
        raise ToolError(ErrorCode.schema, f"bundle config {path} must hold a JSON object",
                        file=str(path))
    return data


def _bundle_files(bundle_dir: str | Path) -> tuple[Path, list[Path], Path]:
    """(folder, existing config files, model file); typed errors name what is missing."""
    root = Path(bundle_dir).expanduser()
    if not root.is_dir():
        raise ToolError(ErrorCode.input_missing, f"bundle folder {root} does not exist",
                        hint="pass bundle_dir=<folder with configs/ and models/>", file=str(root),
                        arg="bundle_dir")
    configs = [root / "configs" / n for n in _CONFIG_NAMES if (root / "configs" / n).is_file()]
    if not configs:
        raise ToolError(ErrorCode.input_missing, f"bundle {root} has neither configs/inference.json "
                        "nor configs/metadata.json", file=str(root / "configs" / "inference.json"),
                        arg="bundle_dir")
    models = [root / "models" / n for n in _MODEL_NAMES if (root / "models" / n).is_file()]
    if not models:
        raise ToolError(ErrorCode.input_missing, f"bundle {root} has no models/model.pt or "
                        "models/model.ts", file=str(root / "models" / "model.pt"), arg="bundle_dir")
    return root.resolve(), configs, models[0]


def shipped_bundle(name: str = "cardiac_unet2d") -> Path:
    """Folder of a bundle shipped with bcer (``bcer/assets/bundles/<name>``)."""
    names = sorted(p.name for p in SHIPPED_DIR.iterdir() if p.is_dir()) if SHIPPED_DIR.is_dir() else []
    if name not in names:
        raise ToolError(ErrorCode.input_missing, f"no shipped bundle {name!r}", hint=did_you_mean(name, names),
                        file=str(SHIPPED_DIR / name), arg="bundle_dir")
    return SHIPPED_DIR / name


def load_bundle(bundle_dir: str | Path, device: str = "cpu") -> Bundle:
    """The bundle in ``bundle_dir`` with its network on ``device``, loaded once per process.

    Raises:
        ToolError: ``input_missing`` when the folder, config or model file is absent;
            ``schema`` when a config or the weights do not fit (naming the file).
    """
    root, configs, model = _bundle_files(bundle_dir)
    mtime = max(p.stat().st_mtime_ns for p in [*configs, model])
    return _load_cached(str(root), mtime, device)


def cache_info() -> Any:
    """``functools`` cache statistics of the per-process network cache (hits, misses)."""
    return _load_cached.cache_info()


def clear_cache() -> None:
    _load_cached.cache_clear()


@lru_cache(maxsize=8)
def _load_cached(root: str, mtime_ns: int, device: str) -> Bundle:
    del mtime_ns  # part of the cache key only: edited files give a new entry
    folder, configs, model_path = _bundle_files(root)
    cfg: dict[str, Any] = {}
    for p in configs:
        cfg[p.name] = _read_json(p)
    meta = cfg.get("metadata.json", {})
    inference = cfg.get("inference.json", {})
    net_def = inference.get("network_def", meta.get("network_def"))
    tdev = torch_device(device)
    network = _load_network(folder, model_path, net_def, tdev)
    return _describe(str(folder), network, device, net_def, meta)


def _load_network(folder: Path, model_path: Path, net_def: Any, tdev: Any) -> Any:
    import torch

    if model_path.suffix == ".ts":
        try:
            net = torch.jit.load(str(model_path), map_location=tdev)
        except Exception as e:
            raise ToolError(ErrorCode.schema, f"cannot load TorchScript {model_path}: {e}",
                            file=str(model_path)) from None
        return net.eval()
    if not isinstance(net_def, dict):
        raise ToolError(ErrorCode.schema, f"bundle {folder} has models/model.pt but no "
                        "'network_def' in configs/inference.json",
                        hint="add network_def or ship models/model.ts",
                        file=str(folder / "configs" / "inference.json"))
    from monai.bundle import ConfigParser

    try:
        net = ConfigParser({"network_def": net_def}).get_parsed_content("network_def")
    except Exception as e:
        raise ToolError(ErrorCode.schema, f"network_def of bundle {folder} does not build: {e}",
                        file=str(folder / "configs" / "inference.json")) from None
    try:
        state = torch.load(str(model_path), map_location=tdev, weights_only=True)
        if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
            state = state["model"]  # MONAI checkpoints sometimes nest the weights
        net.load_state_dict(state)
    except Exception as e:
        raise ToolError(ErrorCode.schema, f"weights {model_path} do not fit network_def: {e}",
                        file=str(model_path)) from None
    log.info("loaded bundle network from %s onto %s", folder, tdev)
    return net.to(tdev).eval()


def _describe(folder: str, network: Any, device: str, net_def: Any, meta: dict[str, Any]) -> Bundle:
    fmt = meta.get("network_data_format", {})
    inp = fmt.get("inputs", {}).get("image", {})
    out = fmt.get("outputs", {}).get("pred", {})
    opts = meta.get("bcer", {})
    nd = net_def if isinstance(net_def, dict) else {}
    spatial_dims = int(opts.get("spatial_dims", nd.get("spatial_dims", 3)))
    in_channels = int(inp.get("num_channels", nd.get("in_channels", 1)))
    channel_def = {int(k): str(v) for k, v in out.get("channel_def", {}).items()}
    n_out = int(out.get("num_channels", nd.get("out_channels", max(channel_def, default=1) + 1)))
    roi = tuple(int(s) for s in inp.get("spatial_shape", [])) or (96,) * spatial_dims
    values = tuple(int(v) for v in opts.get("label_values", range(n_out)))
    output = str(opts.get("output", "argmax"))
    pixdim = tuple(float(v) for v in opts["pixdim"]) if opts.get("pixdim") else None
    if (output not in ("argmax", "sigmoid_brats") or len(values) != n_out or len(roi) != spatial_dims
            or (pixdim is not None and len(pixdim) != spatial_dims)):
        raise ToolError(ErrorCode.schema, f"bundle {folder}: inconsistent metadata (output={output!r}, "
                        f"{len(values)} label values for {n_out} channels, roi {roi} for "
                        f"{spatial_dims}-D)", file=str(Path(folder) / "configs" / "metadata.json"))
    return Bundle(path=folder, network=network, device=device, spatial_dims=spatial_dims,
                  in_channels=in_channels, roi_size=roi, normalize=str(opts.get("normalize", "zscore")),
                  output=output, label_values=values, channel_names=channel_def, pixdim=pixdim,
                  meta=meta)


def _normalize(x: np.ndarray, how: str) -> np.ndarray:
    """Per-channel z-score over non-zero voxels (MONAI NormalizeIntensity(nonzero=True))."""
    x = np.array(x, dtype=np.float32)  # copy: inputs may be read-only object-store arrays
    if how == "none":
        return x
    for c in range(x.shape[0]):
        ch = x[c]
        fg = ch[ch != 0]
        if fg.size:
            ch[...] = np.where(ch != 0, (ch - fg.mean()) / max(float(fg.std()), 1e-6), 0.0)
    return x


def _to_labels(logits: Any, bundle: Bundle) -> np.ndarray:
    """Network output (N, C, *spatial) to integer labels (N, *spatial)."""
    import torch

    if bundle.output == "sigmoid_brats":  # MONAI BraTS bundles: channels TC, WT, ET
        tc, wt, et = (torch.sigmoid(logits[:, i]) > 0.5 for i in range(3))
        lab = torch.zeros_like(tc, dtype=torch.int16)
        lab[wt] = 2
        lab[tc] = 1
        lab[et] = 4
        return lab.cpu().numpy()
    idx = torch.argmax(logits, dim=1).cpu().numpy()
    return np.asarray(bundle.label_values, dtype=np.int16)[idx]


def _zoom_shape(shape: tuple[int, ...], spacing: tuple[float, ...] | None,
                pixdim: tuple[float, ...] | None) -> tuple[int, ...]:
    """Spatial shape of the input on the bundle's training grid (unchanged within 5%)."""
    if pixdim is None or spacing is None:
        return shape
    new = [max(1, int(round(n * s / p))) for n, s, p in zip(shape, spacing, pixdim)]
    new += list(shape[len(new):])
    return tuple(n if abs(m - n) <= 0.05 * n else m for n, m in zip(shape, new))


def infer(bundle: Bundle, channels: np.ndarray, spacing: tuple[float, ...] | None = None,
          roi_size: int | None = None, sw_batch_size: int = 4, overlap: float = 0.25) -> np.ndarray:
    """Label map (X, Y, Z) for a (C, X, Y, Z) stack of co-registered input channels.

    2-D bundles run slice-wise: the Z slices form the batch of
    ``monai.inferers.sliding_window_inference``; 3-D bundles see the whole volume. When the
    bundle states its training ``pixdim`` and ``spacing`` (mm per axis) differs, the input is
    resampled (linear) to that voxel size and the labels come back (nearest) to the input grid.
    """
    import torch
    from monai.inferers import sliding_window_inference
    from skimage.transform import resize

    if channels.ndim != 4 or channels.shape[0] != bundle.in_channels:
        raise ToolError(ErrorCode.shape, f"bundle {bundle.path} expects {bundle.in_channels} input "
                        f"channel(s) of 3-D volumes, got array {channels.shape}", arg="bundle_dir")
    shape = tuple(channels.shape[1:])
    work = _zoom_shape(shape, spacing, bundle.pixdim)
    x = _normalize(channels, bundle.normalize)
    if work != shape:
        x = np.stack([resize(c, work, order=1, preserve_range=True, anti_aliasing=False) for c in x])
        x = x.astype(np.float32)
    x = np.moveaxis(x, 3, 0) if bundle.spatial_dims == 2 else x[None]  # 2-D: (Z, C, X, Y)
    roi = (int(roi_size),) * bundle.spatial_dims if roi_size else bundle.roi_size
    tdev = torch_device(bundle.device)
    with torch.no_grad():
        logits = sliding_window_inference(torch.from_numpy(np.ascontiguousarray(x)).to(tdev), roi,
                                          sw_batch_size, bundle.network, overlap=overlap,
                                          mode="gaussian")
    lab = _to_labels(logits, bundle)
    lab = np.moveaxis(lab, 0, 2) if bundle.spatial_dims == 2 else lab[0]
    if work != shape:
        lab = resize(lab, shape, order=0, preserve_range=True, anti_aliasing=False).astype(np.int16)
    return lab


def run_bundle(bundle_dir: str, channels: np.ndarray, spacing: tuple[float, ...] | None = None,
               device: str = "cpu", roi_size: int | None = None, sw_batch_size: int = 4,
               overlap: float = 0.25) -> tuple[np.ndarray, dict[str, Any]]:
    """Load (cached) and run a bundle; returns labels and audit meta for the output Mask."""
    bundle = load_bundle(bundle_dir, device)
    labels = infer(bundle, channels, spacing, roi_size, sw_batch_size, overlap)
    meta = {"method": "monai_bundle", "bundle": bundle.path,
            "bundle_name": bundle.meta.get("name", Path(bundle.path).name),
            "bundle_version": bundle.meta.get("version", ""), "roi_size": roi_size or list(bundle.roi_size),
            "sw_batch_size": sw_batch_size, "overlap": overlap, "device": device}
    return labels, meta
