"""Reading a MONAI bundle's configs with ``monai.bundle.ConfigParser``.

What bcer takes from ``configs/inference.json`` (or ``.yaml``) as published in the MONAI
model zoo, unchanged:

* ``network_def``: the network, built by the parser;
* ``preprocessing``: its array transforms (normalisation, orientation, spacing, cropping...)
  run on the channel-first image bcer hands over, with the image's affine. Only the file
  transforms are left out (``LoadImage[d]``, ``EnsureChannelFirst[d]``, ``SaveImage[d]``):
  bcer has already loaded and stacked the channels;
* ``inferer``: roi size, sw batch size, overlap, blending mode; a 2-D network runs
  slice by slice over the third axis (``monai.inferers.SliceInferer``);
* ``postprocessing``: activation, threshold, argmax, the bundle's label lambda,
  connected-component filters and ``Invertd`` back to the input grid. One change: an
  ``Invertd`` that comes after a discretising step inverts with nearest neighbour, since
  interpolating label values invents labels between classes.

And from ``configs/metadata.json``: ``network_data_format`` (channel names, spatial shapes,
including symbolic ones such as ``"8*n"``: any multiple of 8).
"""
from __future__ import annotations

import ast
import json
import logging
import operator
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ...contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)

INFERENCE_NAMES = ("inference.json", "inference.yaml", "inference.yml")
METADATA_NAME = "metadata.json"
# Transforms that read or write files (bcer does that itself) and would fail on arrays.
FILE_TRANSFORMS = frozenset({"LoadImage", "LoadImaged", "SaveImage", "SaveImaged", "EnsureChannelFirst",
                             "EnsureChannelFirstd", "AddChannel", "AddChanneld"})
# Post-transforms that move or filter voxels rather than map values; the label probe skips them.
SPATIAL_POST = frozenset({"Invertd", "Invert", "KeepLargestConnectedComponent", "KeepLargestConnectedComponentd",
                          "FillHoles", "FillHolesd", "RemoveSmallObjects", "RemoveSmallObjectsd",
                          "SaveImage", "SaveImaged", "CopyItemsd", "DeleteItemsd"})
DISCRETISING = frozenset({"AsDiscrete", "AsDiscreted"})
_MAX_SIZE = 2048


def _read_file(path: Path) -> dict[str, Any]:
    from monai.bundle import ConfigParser

    try:
        data = ConfigParser.load_config_file(str(path))
    except Exception as e:  # json/yaml errors have no common base
        raise ToolError(ErrorCode.schema, f"bundle config {path} does not parse: {type(e).__name__}: {e}",
                        hint="fix or regenerate the bundle's configs", file=str(path)) from None
    if not isinstance(data, dict):
        raise ToolError(ErrorCode.schema, f"bundle config {path} must hold a mapping", file=str(path))
    return dict(data)


@dataclass
class BundleConfig:
    """The parsed configs of one bundle folder."""

    root: Path
    inference: dict[str, Any]
    meta: dict[str, Any]
    inference_file: Path

    @property
    def is_monai_pipeline(self) -> bool:
        """True when inference.json states its own pre/post-processing or inferer (a real
        model-zoo bundle); bcer's own minimal bundles state only ``network_def``."""
        return any(k in self.inference for k in ("preprocessing", "postprocessing", "inferer"))

    def data_format(self, port: str, name: str) -> dict[str, Any]:
        section = self.meta.get("network_data_format", {}).get(port, {})
        return dict(section.get(name) or (next(iter(section.values()), {}) if section else {}))

    def channel_names(self, port: str) -> dict[int, str]:
        fmt = self.data_format(port, "image" if port == "inputs" else "pred")
        try:
            return {int(k): str(v) for k, v in (fmt.get("channel_def") or {}).items()}
        except (TypeError, ValueError):
            raise ToolError(ErrorCode.schema, f"bundle {self.root}: {port} channel_def keys must be "
                            "channel numbers", file=str(self.root / "configs" / METADATA_NAME)) from None

    def parser(self) -> Any:
        """A fresh ConfigParser over inference + metadata (``_meta_``), for one build."""
        from monai.bundle import ConfigParser

        p = ConfigParser(json.loads(json.dumps(self.inference)))
        with warnings.catch_warnings():  # published metadata still uses MONAI's old key names
            warnings.filterwarnings("ignore", message="Detected deprecated name")
            p.read_meta(json.loads(json.dumps(self.meta)))
        return p


def read_config(root: Path) -> BundleConfig:
    """The bundle's inference config (first of .json/.yaml/.yml) and metadata (either may be
    absent, not both)."""
    cdir = root / "configs"
    inf = next((cdir / n for n in INFERENCE_NAMES if (cdir / n).is_file()), cdir / INFERENCE_NAMES[0])
    meta = cdir / METADATA_NAME
    return BundleConfig(root=root, inference=_read_file(inf) if inf.is_file() else {},
                        meta=_read_file(meta) if meta.is_file() else {}, inference_file=inf)


# ---- symbolic shapes -------------------------------------------------------------------
_OPS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub,
                                               ast.Mult: operator.mul, ast.Pow: operator.pow,
                                               ast.FloorDiv: operator.floordiv}


def _eval(node: ast.AST, env: dict[str, int]) -> int:
    """Integer arithmetic over ``n`` and ``p`` only (the metadata schema's variables)."""
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Pow) and (right > 16 or abs(left) > _MAX_SIZE):
            return _MAX_SIZE + 1
        return _OPS[type(node.op)](left, right)
    raise ValueError(f"unsupported element {ast.dump(node)[:40]}")  # internal: axis_rule makes it a schema ToolError


@dataclass(frozen=True)
class AxisRule:
    """Sizes a network accepts along one axis: ``sizes`` (sorted) or any size (``None``).
    A plain integer in the metadata is the trained patch size, a hint, not a constraint."""

    spec: str | int
    sizes: tuple[int, ...] | None = None

    def fit(self, want: int) -> int:
        """The smallest accepted size >= ``want`` (the largest when none is)."""
        if self.sizes is None:
            return int(want)
        return next((s for s in self.sizes if s >= want), self.sizes[-1])


def axis_rule(spec: Any, where: str) -> AxisRule:
    """Parse one ``spatial_shape`` entry: 96, "*", "8*n", "16*n", "2**p", "32*n+16"...

    Raises:
        ToolError: ``schema`` naming the entry when it is not such an expression.
    """
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip() in ("*", "")):
        return AxisRule(spec)
    try:
        tree = ast.parse(str(spec).replace(" ", ""), mode="eval")
        sizes = {_eval(tree, {"n": n, "p": p}) for n in range(1, 257) for p in range(1, 12)}
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        raise ToolError(ErrorCode.schema, f"spatial_shape entry {spec!r} in {where} is not an expression of "
                        f"n and p ({e})", hint='use e.g. 96, "*" or "8*n"', file=where) from None
    ok = tuple(sorted(s for s in sizes if 0 < s <= _MAX_SIZE))
    if not ok:
        raise ToolError(ErrorCode.schema, f"spatial_shape entry {spec!r} in {where} allows no size", file=where)
    return AxisRule(str(spec), ok)


def shape_rules(cfg: BundleConfig) -> list[AxisRule]:
    where = str(cfg.root / "configs" / METADATA_NAME)
    shape = cfg.data_format("inputs", "image").get("spatial_shape") or []
    if not isinstance(shape, (list, tuple)):
        raise ToolError(ErrorCode.schema, f"spatial_shape in {where} must be a list", file=where)
    return [axis_rule(s, where) for s in shape]


def fit_roi(roi: Sequence[int], rules: Sequence[AxisRule]) -> tuple[int, ...]:
    """``roi`` moved up to sizes the network accepts (axes without a rule, and MONAI's
    non-positive "whole axis" sizes, keep theirs)."""
    return tuple(rules[i].fit(int(r)) if i < len(rules) and int(r) > 0 else int(r) for i, r in enumerate(roi))


# ---- network ---------------------------------------------------------------------------
def build_network(cfg: BundleConfig, model_path: Path, tdev: Any) -> Any:
    """``network_def`` built by ConfigParser with the weights of ``models/model.pt``
    (a plain state dict or MONAI's ``{"model": state}``), or ``models/model.ts``."""
    import torch

    if model_path.suffix == ".ts":
        try:
            net = torch.jit.load(str(model_path), map_location=tdev)
        except Exception as e:  # torch.jit raises many types on a bad file
            raise ToolError(ErrorCode.schema, f"cannot load TorchScript {model_path}: {e}",
                            file=str(model_path)) from None
        return net.eval()
    if "network_def" not in cfg.inference and "network_def" not in cfg.meta:
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root} has models/model.pt but no 'network_def' in "
                        f"{cfg.inference_file.name}", hint="add network_def or ship models/model.ts",
                        file=str(cfg.inference_file))
    parser = cfg.parser()
    if "network_def" not in cfg.inference:
        parser["network_def"] = cfg.meta["network_def"]
    try:
        net = parser.get_parsed_content("network_def", instantiate=True)
    except Exception as e:  # a bundle's network_def runs user code
        raise ToolError(ErrorCode.schema, f"network_def of bundle {cfg.root} does not build: {e}",
                        file=str(cfg.inference_file)) from None
    try:
        state = torch.load(str(model_path), map_location=tdev, weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("model"), dict):
            state = state["model"]  # MONAI CheckpointSaver nests the weights
        net.load_state_dict(state)
    except Exception as e:  # torch.load / load_state_dict raise many types
        raise ToolError(ErrorCode.schema, f"weights {model_path} do not fit network_def: {e}",
                        file=str(model_path)) from None
    log.info("loaded bundle network from %s onto %s", cfg.root, tdev)
    return net.to(tdev).eval()


# ---- pre/post-processing and inferer ----------------------------------------------------
def _name(item: Any) -> str:
    target = item.get("_target_", "") if isinstance(item, dict) else ""
    return str(target).lstrip("$").split(".")[-1]


def _transforms(section: Any) -> list[Any] | None:
    if isinstance(section, dict) and isinstance(section.get("transforms"), list):
        return list(section["transforms"])
    if isinstance(section, list):
        return list(section)
    return None


@dataclass
class Pipeline:
    """What runs around the network: pre-processing, inferer, post-processing (each a MONAI
    object built by ConfigParser), the post-steps that only map values (for the label probe),
    the image key, and what bcer changed (for provenance)."""

    image_key: str
    pre: Any
    inferer: Any
    post: Any
    value_steps: Any
    has_invert: bool
    discrete: bool = True  # the post-processing makes labels (AsDiscrete, a label lambda...)
    notes: list[str] = field(default_factory=list)


def _kept(cfg: BundleConfig, parser: Any, key: str, notes: list[str]) -> list[Any]:
    items = _transforms(parser.get(key)) if parser.get(key) is not None else []
    if items is None:
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root}: {key} is neither a Compose nor a list of "
                        "transforms", file=str(cfg.inference_file))
    kept = [t for t in items if _name(t) not in FILE_TRANSFORMS]
    dropped = [_name(t) for t in items if _name(t) in FILE_TRANSFORMS]
    if dropped:
        notes.append(f"{key}: file transforms {dropped} left out (bcer loads and writes files)")
    return kept


def _nearest_after_discrete(post: list[Any], notes: list[str]) -> list[Any]:
    out, discrete = [], False
    for t in post:
        if isinstance(t, dict) and _name(t) in ("Invertd", "Invert") and discrete and not t.get("nearest_interp"):
            t = dict(t, nearest_interp=True)
            notes.append("postprocessing: Invertd after a discretising step inverts with nearest neighbour")
        discrete |= _name(t) in DISCRETISING
        out.append(t)
    return out


def _image_key(parser: Any) -> str:
    for key in ("image_key", "input_key"):
        if parser.get(key) is not None:
            val = parser.get_parsed_content(key)
            if isinstance(val, str):
                return val
    return "image"


def _set_compose(parser: Any, key: str, items: list[Any]) -> None:
    parser[key] = {"_target_": "Compose", "transforms": items}


def build_pipeline(cfg: BundleConfig) -> Pipeline:
    """Pre-processing, inferer and post-processing of a model-zoo bundle, built by ConfigParser.

    Raises:
        ToolError: ``schema`` naming the config file when a section does not build.
    """
    from monai.inferers import SlidingWindowInferer

    parser = cfg.parser()
    notes: list[str] = []
    pre = _kept(cfg, parser, "preprocessing", notes)
    post = _nearest_after_discrete(_kept(cfg, parser, "postprocessing", notes), notes)
    values = [t for t in post if _name(t) not in SPATIAL_POST]
    # Every item is set before anything is parsed: setting resets the parser's cache, and
    # Invertd must hold the very Compose object that ran (MONAI matches transforms by id).
    for k, items in (("preprocessing", pre), ("postprocessing", post), ("_bcer_value_steps", values)):
        _set_compose(parser, k, items)
    try:
        key = _image_key(parser)
        pre_c = parser.get_parsed_content("preprocessing", instantiate=True)
        post_c = parser.get_parsed_content("postprocessing", instantiate=True)
        value_c = parser.get_parsed_content("_bcer_value_steps", instantiate=True)
        inferer = (parser.get_parsed_content("inferer", instantiate=True) if parser.get("inferer") is not None
                   else None)
    except ToolError:
        raise
    except Exception as e:  # a bundle's transforms run user code
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root}: pre/post-processing or inferer does not build: "
                        f"{type(e).__name__}: {e}", file=str(cfg.inference_file)) from None
    if inferer is not None and not callable(inferer):
        raise ToolError(ErrorCode.schema, f"bundle {cfg.root}: inferer is not callable", file=str(cfg.inference_file))
    if inferer is None:
        notes.append("no inferer in the config: sliding window over the metadata's spatial shape")
    elif not isinstance(inferer, SlidingWindowInferer):
        notes.append(f"inferer {type(inferer).__name__} runs as configured (roi_size/overlap overrides ignored)")
    discrete = any(_name(t) in DISCRETISING | {"Lambdad", "Lambda"} for t in post)
    if not discrete:
        notes.append("postprocessing makes no labels: argmax over the network's channels")
    return Pipeline(image_key=key, pre=pre_c, inferer=inferer, post=post_c, value_steps=value_c,
                    has_invert=any(_name(t) in ("Invertd", "Invert") for t in post), discrete=discrete,
                    notes=notes)


__all__ = ["AxisRule", "BundleConfig", "Pipeline", "axis_rule", "build_network", "build_pipeline",
           "fit_roi", "read_config", "shape_rules"]
