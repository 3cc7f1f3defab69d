"""Local MONAI bundles: load once per worker process, run them as their configs say.

A bundle folder follows the MONAI bundle layout::

    <bundle>/configs/inference.json   # (or .yaml) network_def, preprocessing, inferer, postprocessing
    <bundle>/configs/metadata.json    # network_data_format: channel names, spatial shapes
    <bundle>/models/model.pt          # state dict for network_def
    <bundle>/models/model.ts          # or a TorchScript module

Two kinds of bundle run here:

* **Model-zoo bundles** (inference.json states ``preprocessing``, ``inferer`` or
  ``postprocessing``) run unchanged through :mod:`.bundle_config`: MONAI's own transforms,
  inferer and post-processing built by ``monai.bundle.ConfigParser``. Input channels are
  taken in the order ``inputs.image.channel_def`` names them, and the values the
  post-processing writes are mapped to the tool's labels by the names in
  ``outputs.pred.channel_def`` (:mod:`.bundle_labels`). ``metadata.json`` may add
  ``bcer.label_map`` (``{"bundle value": tool value}``) where names do not tell.
* **bcer's own minimal bundles** (``network_def`` only, e.g. the shipped ``cardiac_unet2d``)
  keep their ``bcer`` metadata section::

    bcer.spatial_dims        2 (slice-wise over Z) or 3 (default: from network_def or 3)
    bcer.normalize           "zscore" (per channel over non-zero voxels, default) | "none"
    bcer.output              "argmax" (softmax classes, default) | "sigmoid_brats" (TC/WT/ET)
    bcer.label_values        label value written for each output channel (default 0..n-1)
    bcer.pixdim              voxel size (mm) the network was trained at, per spatial axis
    bcer.members             further weight files of the same network_def under models/
                             (e.g. ["member_1.pt"]): an ensemble whose softmax is averaged,
                             as nnU-Net averages its folds (argmax output only)

The loaded bundle (network and pipeline) is cached per process by ``(folder, newest mtime,
device)``: a Ray worker loads it once and reuses it across calls; touching the files
invalidates the entry. ``sw_batch_size``/``roi_size``/``overlap`` left as None take the
bundle's inferer settings; a roi is moved up to the sizes the metadata's spatial shape
allows (``"8*n"``: multiples of 8).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ...contracts.errors import ErrorCode, ToolError, did_you_mean
from .._gpu import torch_device
from ..methods import network_card
from .bundle_config import (AxisRule, BundleConfig, Pipeline, build_network, build_pipeline, fit_roi,
                            read_config, shape_rules)
from .bundle_labels import Channel, LabelTarget, channels_to_labels, order_channels, probe_values, value_map

log = logging.getLogger(__name__)

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "assets" / "bundles"
_CONFIG_NAMES = ("inference.json", "inference.yaml", "inference.yml", "metadata.json")
_MODEL_NAMES = ("model.pt", "model.ts")
DEFAULT_ROI = 96


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
    channel_names: dict[int, str] = field(default_factory=dict)  # output classes
    pixdim: tuple[float, ...] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    input_names: dict[int, str] = field(default_factory=dict)
    pipeline: Pipeline | None = None  # None: bcer's own minimal bundle
    shape_rules: tuple[AxisRule, ...] = ()
    sw_batch_size: int = 4
    overlap: float | tuple[float, ...] = 0.25
    label_map: dict[int, int] | None = None  # metadata bcer.label_map
    memo: dict[str, Any] = field(default_factory=dict, compare=False)  # probe results
    members: tuple[Any, ...] = ()  # further networks of an ensemble (metadata bcer.members)

    @property
    def kind(self) -> str:
        return "monai_bundle_config" if self.pipeline is not None else "bcer_minimal"

    @property
    def networks(self) -> tuple[Any, ...]:
        """Every network of the bundle: the main one, then the ensemble's other members."""
        return (self.network, *self.members)


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


def check_bundle_dir(bundle_dir: str | Path) -> Path:
    """The resolved bundle folder when it has configs and a model (nothing is loaded).

    Raises:
        ToolError: ``input_missing`` naming the missing folder or file.
    """
    from .nnunet import is_nnunet_dir

    if is_nnunet_dir(Path(bundle_dir).expanduser()):  # an nnU-Net v2 results folder (``seg.nnunet``)
        return Path(bundle_dir).expanduser().resolve()
    return _bundle_files(bundle_dir)[0]


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
    weights = [p for p in (root / "models").iterdir() if p.is_file()]  # ensemble members included
    mtime = max(p.stat().st_mtime_ns for p in [*configs, model, *weights])
    return _load_cached(str(root), mtime, device)


def cache_info() -> Any:
    """``functools`` cache statistics of the per-process network cache (hits, misses)."""
    return _load_cached.cache_info()


def clear_cache() -> None:
    _load_cached.cache_clear()


@lru_cache(maxsize=8)
def _load_cached(root: str, mtime_ns: int, device: str) -> Bundle:
    del mtime_ns  # part of the cache key only: edited files give a new entry
    folder, _, model_path = _bundle_files(root)
    cfg = read_config(folder)
    network = build_network(cfg, model_path, torch_device(device))
    pipeline = build_pipeline(cfg) if cfg.is_monai_pipeline else None
    bundle = _describe(cfg, network, device, pipeline)
    members = _member_files(cfg, bundle)
    if not members:
        return bundle
    nets = tuple(build_network(cfg, path, torch_device(device)) for path in members)
    return dataclasses.replace(bundle, members=nets)


def _member_files(cfg: BundleConfig, bundle: Bundle) -> list[Path]:
    """The weight files ``bcer.members`` names (an ensemble of one network_def); typed errors
    for a missing file or an ensemble bcer cannot average."""
    names = bundle.meta.get("bcer", {}).get("members") or []
    where = str(cfg.root / "configs" / "metadata.json")
    if not isinstance(names, list) or not all(isinstance(n, str) and n == Path(n).name for n in names):
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root}: bcer.members must be a list of file names in "
                        f"models/ (no folders), got {names!r}", file=where)
    if names and (bundle.pipeline is not None or bundle.output != "argmax"):
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root}: bcer.members needs a minimal bundle with argmax "
                        "output (softmax probabilities are averaged)", file=where)
    paths = [cfg.root / "models" / n for n in names]
    for path in paths:
        if not path.is_file():
            raise ToolError(ErrorCode.input_missing, f"bundle {cfg.root}: ensemble member {path.name} is missing",
                            file=str(path), arg="bundle_dir")
    return paths


# keys of a bundle's ``bcer`` options that belong to its trained weights, not to its network
# definition: a retrained network built from this bundle's configs must not inherit them
WEIGHTS_OWN_KEYS = ("members", "low_confidence_threshold", "low_confidence_chosen_on")


def ensemble_forward(networks: Sequence[Any]) -> Any:
    """One network, or a callable that averages the softmax of several (same classes): what
    a sliding window runs. The arg-max of averaged probabilities is the ensemble's answer."""
    import torch

    if len(networks) == 1:
        return networks[0]

    def forward(x: Any) -> Any:
        return torch.stack([torch.softmax(net(x), dim=1) for net in networks]).mean(dim=0)

    return forward


def _spatial_dims(cfg: BundleConfig, opts: dict[str, Any], pipeline: Pipeline | None) -> int:
    nd = cfg.inference.get("network_def") or cfg.meta.get("network_def") or {}
    if "spatial_dims" in opts:
        return int(opts["spatial_dims"])
    if isinstance(nd, dict) and isinstance(nd.get("spatial_dims"), int):
        return int(nd["spatial_dims"])
    roi = getattr(getattr(pipeline, "inferer", None), "roi_size", None)
    if roi is not None and len(roi) in (2, 3):
        return len(roi)
    shape = cfg.data_format("inputs", "image").get("spatial_shape") or []
    return len(shape) if len(shape) in (2, 3) else 3


def _describe(cfg: BundleConfig, network: Any, device: str, pipeline: Pipeline | None) -> Bundle:
    meta, folder = cfg.meta, str(cfg.root)
    inp, out = cfg.data_format("inputs", "image"), cfg.data_format("outputs", "pred")
    opts = dict(meta.get("bcer", {}))
    nd = cfg.inference.get("network_def") if isinstance(cfg.inference.get("network_def"), dict) else {}
    dims = _spatial_dims(cfg, opts, pipeline)
    rules = tuple(shape_rules(cfg))
    where = str(cfg.root / "configs" / "metadata.json")
    try:
        in_channels = int(inp.get("num_channels", nd.get("in_channels", 1)))
        out_names = cfg.channel_names("outputs")
        n_out = int(out.get("num_channels", nd.get("out_channels", max(out_names, default=0) + 1)))
        values = tuple(int(v) for v in opts.get("label_values", range(n_out)))
        label_map = ({int(k): int(v) for k, v in opts["label_map"].items()} if opts.get("label_map") else None)
    except (TypeError, ValueError, AttributeError) as e:
        raise ToolError(ErrorCode.schema, f"bundle {folder}: unreadable channel counts or label values: {e}",
                        file=where) from None
    # the trained patch size where the metadata states one, else 96 moved to an accepted size
    default_roi = tuple(int(r.spec) if isinstance(r.spec, int) else r.fit(DEFAULT_ROI) for r in rules) \
        or (DEFAULT_ROI,) * dims
    inferer = getattr(pipeline, "inferer", None)
    roi = tuple(int(r) for r in getattr(inferer, "roi_size", None) or default_roi)
    output = str(opts.get("output", "argmax"))
    pixdim = tuple(float(v) for v in opts["pixdim"]) if opts.get("pixdim") else None
    if (output not in ("argmax", "sigmoid_brats") or len(values) != n_out or len(roi) != dims
            or (pixdim is not None and len(pixdim) != dims)):
        raise ToolError(ErrorCode.schema, f"bundle {folder}: inconsistent metadata (output={output!r}, "
                        f"{len(values)} label values for {n_out} channels, roi {roi} for "
                        f"{dims}-D)", file=where)
    return Bundle(path=folder, network=network, device=device, spatial_dims=dims, in_channels=in_channels,
                  roi_size=roi, normalize=str(opts.get("normalize", "zscore")), output=output,
                  label_values=values, channel_names=out_names, pixdim=pixdim, meta=meta,
                  input_names=cfg.channel_names("inputs"), pipeline=pipeline, shape_rules=rules,
                  sw_batch_size=int(getattr(inferer, "sw_batch_size", 4) or 4),
                  overlap=getattr(inferer, "overlap", 0.25), label_map=label_map)


# ---- bcer's own minimal bundles ----------------------------------------------------------
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


def _window(bundle: Bundle, roi_size: int | None, sw_batch_size: int | None,
            overlap: float | None) -> tuple[tuple[int, ...], int, Any]:
    roi = (int(roi_size),) * bundle.spatial_dims if roi_size else bundle.roi_size
    roi = fit_roi(roi, bundle.shape_rules)
    ov = bundle.overlap if overlap is None else float(overlap)
    return roi, int(sw_batch_size or bundle.sw_batch_size), ov


def _infer_minimal(bundle: Bundle, channels: np.ndarray, spacing: tuple[float, ...] | None,
                   roi: tuple[int, ...], sw: int, overlap: float) -> np.ndarray:
    """bcer's minimal bundles: z-score, optional resampling to ``pixdim``, 2-D bundles over
    the Z slices as one batch, labels by ``bcer.output`` and ``bcer.label_values``."""
    import torch
    from monai.inferers import sliding_window_inference
    from skimage.transform import resize

    shape = tuple(channels.shape[1:])
    work = _zoom_shape(shape, spacing, bundle.pixdim)
    x = _normalize(channels, bundle.normalize)
    if work != shape:
        x = np.stack([resize(c, work, order=1, preserve_range=True, anti_aliasing=False) for c in x])
        x = x.astype(np.float32)
    x = np.moveaxis(x, 3, 0) if bundle.spatial_dims == 2 else x[None]  # 2-D: (Z, C, X, Y)
    with torch.no_grad():
        logits = sliding_window_inference(torch.from_numpy(np.ascontiguousarray(x)).to(torch_device(bundle.device)),
                                          roi, sw, ensemble_forward(bundle.networks), overlap=overlap,
                                          mode="gaussian")
    lab = _to_labels(logits, bundle)
    lab = np.moveaxis(lab, 0, 2) if bundle.spatial_dims == 2 else lab[0]
    if work != shape:
        lab = resize(lab, shape, order=0, preserve_range=True, anti_aliasing=False).astype(np.int16)
    return lab


# ---- model-zoo bundles ---------------------------------------------------------------------
def _inferer(bundle: Bundle, roi: tuple[int, ...], sw: int, overlap: float) -> Any:
    """The bundle's inferer with bcer's window settings (its blending mode kept); a 2-D
    network slides over the third axis of the volume."""
    from monai.inferers import SliceInferer, SlidingWindowInferer

    base = bundle.pipeline.inferer if bundle.pipeline else None
    if base is not None and not isinstance(base, SlidingWindowInferer):
        return base
    kw = ({k: getattr(base, k) for k in ("mode", "sigma_scale", "padding_mode", "cval") if hasattr(base, k)}
          if base is not None else {})
    if bundle.spatial_dims == 2:
        return SliceInferer(spatial_dim=getattr(base, "spatial_dim", 2), roi_size=roi, sw_batch_size=sw,
                            overlap=overlap, **kw)
    return SlidingWindowInferer(roi_size=roi, sw_batch_size=sw, overlap=overlap, **kw)


def _first_output(out: Any) -> Any:
    if isinstance(out, dict):
        return out.get("pred", next(iter(out.values())))
    if isinstance(out, (list, tuple)):
        return out[0]
    return out


def _lenient(compose: Any) -> Any:
    """Transforms for keys bcer does not hand over (a ``label`` key) skip them instead of failing."""
    from monai.transforms import MapTransform, allow_missing_keys_mode

    if any(isinstance(t, MapTransform) for t in compose.flatten().transforms):
        return allow_missing_keys_mode(compose)
    return contextlib.nullcontext()


def _infer_pipeline(bundle: Bundle, channels: np.ndarray, affine: np.ndarray, roi: tuple[int, ...], sw: int,
                    overlap: float) -> tuple[np.ndarray, int]:
    """Pre-processing, inferer and post-processing as the bundle configures them: the output
    (C', X, Y, Z) on the input grid and the number of channels the network gave (inverted with nearest neighbour when the bundle's
    post-processing does not invert its spatial pre-processing itself)."""
    import torch
    from monai.data import MetaTensor
    from monai.transforms import Invertd

    pipe = bundle.pipeline
    assert pipe is not None
    key = pipe.image_key
    img = MetaTensor(torch.from_numpy(np.ascontiguousarray(channels)),
                     affine=torch.as_tensor(np.asarray(affine, np.float64)))
    data: dict[str, Any] = {key: img}
    with warnings.catch_warnings():
        # Invertd over a pre-processing without spatial steps is a no-op MONAI warns about
        warnings.filterwarnings("ignore", message="inverse has been called but no invertible")
        with _lenient(pipe.pre):
            data = pipe.pre(data)
        inferer = _inferer(bundle, roi, sw, overlap)
        with torch.no_grad():
            logits = _first_output(inferer(data[key][None].to(torch_device(bundle.device)), bundle.network))
        n_logits = int(logits.shape[1])
        data["pred"] = logits[0].detach().to("cpu")
        with _lenient(pipe.post):
            data = pipe.post(data)
        moved = getattr(data[key], "applied_operations", None)
        if not pipe.has_invert and moved:
            data = Invertd(keys="pred", transform=pipe.pre, orig_keys=key, nearest_interp=True)(data)
    pred = data["pred"]
    pred = np.asarray(pred.detach().cpu().numpy() if hasattr(pred, "detach") else pred)
    if pred.ndim == channels.ndim - 1:
        pred = pred[None]
    if tuple(pred.shape[1:]) != tuple(channels.shape[1:]):
        raise ToolError(ErrorCode.shape, f"bundle {bundle.path}: post-processing returned {pred.shape[1:]} for "
                        f"an input of {channels.shape[1:]}", hint="the bundle's postprocessing should invert "
                        "its spatial preprocessing (Invertd)", arg="bundle_dir")
    return pred, n_logits


def _value_table(bundle: Bundle, n_channels: int) -> dict[int, tuple[int, ...]]:
    key = f"probe:{n_channels}"
    if key not in bundle.memo:
        try:
            bundle.memo[key] = probe_values(bundle.pipeline.value_steps, n_channels)
        except Exception as e:  # a bundle's post-processing runs user code
            raise ToolError(ErrorCode.schema, f"bundle {bundle.path}: post-processing fails on a {n_channels}-"
                            f"channel probe: {type(e).__name__}: {e}", arg="bundle_dir") from None
    return bundle.memo[key]


def _tool_labels(pred: np.ndarray, bundle: Bundle, n_logits: int,
                 targets: Sequence[LabelTarget] | None) -> tuple[np.ndarray, dict[int, int] | str]:
    """The bundle's output in the tool's label values, and the mapping used."""
    table = None
    if pred.shape[0] > 1 and not bundle.pipeline.discrete:  # scores and no labelling step: argmax
        pred = np.argmax(pred, axis=0)[None]
        table = {k: (k,) for k in range(n_logits)}
    if pred.shape[0] > 1:  # one-hot or overlapping binary regions, named by channel_def
        if targets is None or not bundle.channel_names:
            return np.argmax(pred, axis=0).astype(np.int16), "argmax over output channels"
        return channels_to_labels(pred, bundle.channel_names, targets, bundle.path), "channel names"
    values = np.rint(pred[0]).astype(np.int64)
    if bundle.label_map is not None:
        mapping = dict(bundle.label_map)
    elif targets is None or not bundle.channel_names:
        return values.astype(np.int16), "identity (no output channel names or no tool labels)"
    else:
        mapping = value_map(table or _value_table(bundle, n_logits), bundle.channel_names, targets, bundle.path)
    found = np.unique(values)
    unknown = [int(v) for v in found if int(v) not in mapping]
    if unknown:
        raise ToolError(ErrorCode.value_range, f"bundle {bundle.path} wrote label values {unknown} its "
                        f"post-processing does not produce from any class (known: {sorted(mapping)})",
                        arg="bundle_dir")
    out = np.zeros(values.shape, np.int16)
    for v in found:
        out[values == v] = mapping[int(v)]
    return out, mapping


def _run_torch(fn: Any, bundle: Bundle, roi: tuple[int, ...]) -> Any:
    """Run inference; out-of-memory and shape failures of the network become typed errors."""
    try:
        return fn()
    except ToolError:
        raise
    except (RuntimeError, MemoryError) as e:
        text = str(e)
        if isinstance(e, MemoryError) or "out of memory" in text.lower():
            raise ToolError(ErrorCode.resource, f"bundle {bundle.path} ran out of memory with roi {list(roi)}",
                            hint="lower roi_size or sw_batch_size", arg="roi_size", device=bundle.device) from None
        raise ToolError(ErrorCode.shape, f"bundle {bundle.path} failed on windows of {list(roi)}: {text[:300]}",
                        hint="choose a roi_size the network accepts (see metadata spatial_shape)",
                        arg="roi_size") from None


def run_bundle(bundle_dir: str, channels: np.ndarray | Sequence[Channel], spacing: tuple[float, ...] | None = None,
               device: str = "cpu", roi_size: int | None = None, sw_batch_size: int | None = None,
               overlap: float | None = None, *, affine: np.ndarray | None = None,
               targets: Sequence[LabelTarget] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
    """Load (cached) and run a bundle; returns labels on the input grid and audit meta.

    Args:
        bundle_dir: the bundle folder.
        channels: a (C, X, Y, Z) stack already in the bundle's order, or the tool's
            :class:`Channel` list, ordered here by the bundle's input ``channel_def``.
        spacing: voxel size (mm) of the input, for bcer's minimal bundles' ``pixdim``.
        device: "cpu" or "cuda".
        roi_size, sw_batch_size, overlap: sliding-window overrides (None: the bundle's).
        affine: voxel-to-world (RAS) matrix of the input; model-zoo pre-processing
            (orientation, spacing) uses it. Default: diagonal from ``spacing``.
        targets: the tool's labels, to map the bundle's classes by name (None: the values
            the bundle writes are kept).

    Raises:
        ToolError: see :func:`load_bundle`; ``shape`` for the wrong number of channels or
            windows the network rejects; ``input_missing`` for a channel the tool lacks;
            ``schema`` for output classes that mean none of ``targets``; ``resource`` on
            out-of-memory.
    """
    hits = cache_info().hits
    bundle = load_bundle(bundle_dir, device)
    cached = cache_info().hits > hits
    if isinstance(channels, np.ndarray):
        stack, used = channels, None
    else:
        order = order_channels(bundle.input_names, bundle.in_channels, list(channels), bundle.path)
        stack, used = np.stack([c.array() for c in order]), [c.sequence for c in order]
    if stack.ndim != 4 or stack.shape[0] != bundle.in_channels:
        raise ToolError(ErrorCode.shape, f"bundle {bundle.path} expects {bundle.in_channels} input "
                        f"channel(s) of 3-D volumes, got array {stack.shape}", arg="bundle_dir")
    roi, sw, ov = _window(bundle, roi_size, sw_batch_size, overlap)
    if bundle.pipeline is None:
        labels = _run_torch(lambda: _infer_minimal(bundle, stack, spacing, roi, sw, ov), bundle, roi)
        mapping: Any = dict(zip(range(len(bundle.label_values)), bundle.label_values))
    else:
        aff = np.diag([*(spacing or (1.0, 1.0, 1.0))[:3], 1.0]) if affine is None else np.asarray(affine)
        pred, n_logits = _run_torch(lambda: _infer_pipeline(bundle, stack.astype(np.float32), aff, roi, sw, ov),
                                    bundle, roi)
        labels, mapping = _tool_labels(pred, bundle, n_logits, targets)
    meta = {"method": "monai_bundle", "bundle": bundle.path, "bundle_kind": bundle.kind,
            "bundle_name": bundle.meta.get("name", Path(bundle.path).name),
            "bundle_version": bundle.meta.get("version", ""), "roi_size": list(roi), "sw_batch_size": sw,
            "overlap": ov, "device": device, "bundle_cache": "hit" if cached else "load",
            "channels": used or [bundle.input_names.get(i, f"channel {i}") for i in range(bundle.in_channels)],
            "label_map": {str(k): v for k, v in mapping.items()} if isinstance(mapping, dict) else mapping}
    if bundle.members:
        meta["ensemble_members"] = len(bundle.networks)
    # a flag threshold belongs to the model it was chosen for: the tool applies it to its score
    if (own := bundle.meta.get("bcer", {}).get("low_confidence_threshold")) is not None:
        meta["low_confidence_threshold"] = float(own)
    if bundle.pipeline is not None and bundle.pipeline.notes:
        meta["bundle_notes"] = list(bundle.pipeline.notes)
    meta["method_card"] = network_card(bundle.path).model_dump(exclude_defaults=True)  # weights digest, training data
    return labels.astype(np.int16), meta


__all__ = ["WEIGHTS_OWN_KEYS", "Bundle", "Channel", "cache_info", "check_bundle_dir", "clear_cache",
           "ensemble_forward", "load_bundle", "run_bundle", "shipped_bundle"]
