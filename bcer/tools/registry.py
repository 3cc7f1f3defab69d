"""The one tool registry. ``@tool`` derives a ToolSpec from a plain typed function.

A tool is ``def f(<input ports: artifact types>, params: <pydantic model>, device: str = "cpu")
-> <artifact type | NamedTuple of artifact types>``. Input ports are the parameters annotated
with artifact classes (``X | None`` makes a port optional); ``params`` carries literal
arguments with defaults and bounds; ``device`` is injected at run time ("cpu" or "cuda") for
tools with a GPU path. A missing return annotation is a registration error, so the spec
and the code cannot drift apart.
"""
from __future__ import annotations

import functools
import inspect
import logging
import threading
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel, ValidationError

from ..contracts.artifacts import ARTIFACT_TYPES, ArtifactKind, kind_of
from ..contracts.errors import ErrorCode, ToolError, did_you_mean
from ..contracts.spec import Port, Resources, ToolSpec

log = logging.getLogger(__name__)
_ARTIFACT_CLASSES = {cls: kind for kind, cls in ARTIFACT_TYPES.items()}
_RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal",
                 "too_short", "too_long", "literal_error", "enum", "finite_number"}


class NoParams(BaseModel):
    model_config = {"extra": "forbid"}


@dataclass(frozen=True)
class RegisteredTool:
    spec: ToolSpec
    fn: Callable[..., Any]
    params_model: type[BaseModel]
    multi_output: bool

    @property
    def name(self) -> str:
        return self.spec.name


REGISTRY: dict[str, RegisteredTool] = {}


def _artifact_kind(annotation: Any) -> tuple[ArtifactKind | None, bool]:
    """(kind, required) of an annotation that names an artifact class, else (None, True)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        kind, _ = _artifact_kind(inner[0]) if len(inner) == 1 else (None, True)
        return kind, False
    return _ARTIFACT_CLASSES.get(annotation), True


def _output_ports(fn: Callable, hints: dict[str, Any], output: str | None) -> tuple[list[Port], bool]:
    ret = hints.get("return", inspect.Signature.empty)
    if ret is inspect.Signature.empty or ret is None:
        raise TypeError(f"tool {fn.__qualname__} needs a return annotation (artifact or NamedTuple)")
    if isinstance(ret, type) and issubclass(ret, tuple) and hasattr(ret, "_fields"):
        fields = typing.get_type_hints(ret)
        ports = []
        for f in ret._fields:
            kind, _ = _artifact_kind(fields[f])
            if kind is None:
                raise TypeError(f"output {ret.__name__}.{f} of {fn.__qualname__} is not an artifact type")
            ports.append(Port(name=f, kind=kind))
        return ports, True
    kind, _ = _artifact_kind(ret)
    if kind is None:
        raise TypeError(f"return annotation of {fn.__qualname__} is not an artifact type: {ret}")
    return [Port(name=output or kind.value, kind=kind)], False


def tool(name: str, *, version: str = "1.0", milestone: str | None = None,
         resources: Resources | dict | None = None, gpu: str = "none",
         output: str | None = None, frameworks: tuple[str, ...] | None = None,
         gpu_frameworks: tuple[str, ...] = (), method: Any = None) -> Callable[[Callable], Callable]:
    """Register a function as a bcer tool.

    Args:
        name: ``domain.verb`` (e.g. ``register.rigid``).
        version: bumped when results change (part of provenance and cache keys).
        milestone: the contract milestone this tool satisfies.
        resources: Ray resources for one call.
        gpu: "none", "optional" (has a GPU path, falls back to CPU) or "required".
        output: name of the single output port (default: the artifact kind).
        frameworks: heavy modules the tool imports on every device, imported before its time
            limit is armed (default: torch for a tool with a GPU path and no ``gpu_frameworks``).
        gpu_frameworks: those its GPU path alone imports (imported only for a GPU run).
        method: its method card (:class:`bcer.tools.methods.MethodCard` or a dict; default: a
            computation named by the tool and version); provenance and reports name it.
    """

    def deco(fn: Callable) -> Callable:
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        inputs, params_model = [], NoParams
        for pname, p in sig.parameters.items():
            ann = hints.get(pname)
            if pname == "device":
                continue
            if pname == "params":
                if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
                    raise TypeError(f"{fn.__qualname__}: 'params' must be a pydantic model")
                params_model = ann
                continue
            kind, required = _artifact_kind(ann)
            if kind is None:
                raise TypeError(f"{fn.__qualname__}: parameter {pname!r} is neither an artifact "
                                f"port nor 'params'/'device' (annotation {ann})")
            required = required and p.default is inspect.Parameter.empty
            inputs.append(Port(name=pname, kind=kind, required=required))
        outputs, multi = _output_ports(fn, hints, output)
        doc = inspect.getdoc(fn) or ""
        res = resources if isinstance(resources, Resources) else Resources(**(resources or {}))
        spec = ToolSpec(name=name, version=version, description=doc.split("\n\n")[0],
                        inputs=inputs, outputs=outputs, params_schema=params_model.model_json_schema(),
                        resources=res, milestone=milestone, gpu=gpu,
                        frameworks=None if frameworks is None else list(frameworks),
                        gpu_frameworks=list(gpu_frameworks),
                        method=_method(method, name, version, doc.split("\n\n")[0]))
        if name in REGISTRY and REGISTRY[name].fn.__qualname__ != fn.__qualname__:
            raise ToolError(ErrorCode.schema, f"tool {name!r} registered twice, by {REGISTRY[name].fn.__qualname__} "
                            f"and {fn.__qualname__}", hint="give one of the two tools another name", tool=name)
        REGISTRY[name] = RegisteredTool(spec, fn, params_model, multi)
        fn.spec = spec  # type: ignore[attr-defined]
        return fn

    return deco


def _method(method: Any, name: str, version: str, summary: str) -> dict[str, Any]:
    """The tool's method card as a dict: the one given, else a computation named by the tool."""
    from .methods import default_card

    if method is None:
        method = default_card(name, version, " ".join(summary.split()))
    return method.model_dump(exclude_defaults=True) if isinstance(method, BaseModel) else dict(method)


def get_tool(name: str) -> RegisteredTool:
    reg = REGISTRY.get(name)
    if reg is not None:  # a Ray worker running one tool never imports every other tool module
        return reg
    load_all()
    try:
        return REGISTRY[name]
    except KeyError:
        raise ToolError(ErrorCode.bad_reference, f"unknown tool {name!r}",
                        hint=did_you_mean(name, REGISTRY), tool=name) from None


def list_tools() -> list[ToolSpec]:
    load_all()
    return [REGISTRY[k].spec for k in sorted(REGISTRY)]


def validate_params(name: str, values: dict[str, Any]) -> BaseModel:
    """Build the params model of ``name``; pydantic errors become typed ToolErrors."""
    reg = get_tool(name)
    unknown = sorted(set(values) - set(reg.params_model.model_fields))
    if unknown:
        raise ToolError(ErrorCode.schema, f"{name} has no param {unknown[0]!r}",
                        hint=did_you_mean(unknown[0], reg.params_model.model_fields), tool=name, arg=unknown[0])
    try:
        return reg.params_model.model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err.get("loc", ())) or "?"
        code = ErrorCode.value_range if err.get("type") in _RANGE_ERRORS else ErrorCode.schema
        valid = did_you_mean(field, reg.params_model.model_fields) if err.get("type") == "extra_forbidden" else ""
        raise ToolError(code, f"param {field!r} of {name}: {err.get('msg')} (got {err.get('input')!r})",
                        hint=valid, tool=name, arg=field) from None


def _check_input(name: str, port: Port, value: Any) -> None:
    if value is None:
        if port.required:
            raise ToolError(ErrorCode.input_missing, f"input {port.name!r} of {name} is missing",
                            tool=name, arg=port.name)
        return
    if kind_of(value) != port.kind:
        raise ToolError(ErrorCode.schema, f"input {port.name!r} of {name} expects {port.kind.value}, "
                        f"got {kind_of(value).value}", tool=name, arg=port.name)


@functools.lru_cache(maxsize=None)
def _parameter_names(fn: Callable[..., Any]) -> frozenset[str]:
    """A tool function's parameter names (``inspect.signature`` once per function, not per call)."""
    return frozenset(inspect.signature(fn).parameters)


def call_tool(name: str, inputs: dict[str, Any], params: dict[str, Any] | BaseModel | None = None,
              device: str = "cpu") -> dict[str, Any]:
    """Run a tool in this process and return ``{output field: artifact}``.

    Raises:
        ToolError: typed; unexpected exceptions become ``internal`` (``numeric`` for
            floating-point errors, ``resource`` for out-of-memory).
    """
    reg = get_tool(name)
    unknown = set(inputs) - {p.name for p in reg.spec.inputs}
    if unknown:
        raise ToolError(ErrorCode.schema, f"{name} has no input {sorted(unknown)[0]!r}",
                        hint=did_you_mean(sorted(unknown)[0], [p.name for p in reg.spec.inputs]), tool=name)
    for port in reg.spec.inputs:
        _check_input(name, port, inputs.get(port.name))
    p = params if isinstance(params, BaseModel) else validate_params(name, params or {})
    kwargs = {k: v for k, v in inputs.items() if v is not None}
    takes = _parameter_names(reg.fn)
    if "params" in takes:
        kwargs["params"] = p
    if "device" in takes:
        kwargs["device"] = device
    try:
        result = reg.fn(**kwargs)
    except ToolError as e:
        raise e.with_context(tool=name)
    except MemoryError as e:
        raise ToolError(ErrorCode.resource, f"out of memory in {name}: {e}", tool=name) from e
    except FloatingPointError as e:
        raise ToolError(ErrorCode.numeric, f"floating-point error in {name}: {e}", tool=name) from e
    except Exception as e:  # a tool may raise anything: typed here, once
        if type(e).__name__ == "OutOfMemoryError":  # torch.cuda / cupy OOM, by type not text
            raise ToolError(ErrorCode.resource, f"GPU out of memory in {name}: {e}", tool=name) from e
        raise ToolError(ErrorCode.internal, f"{name} failed: {type(e).__name__}: {e}", tool=name) from e
    if reg.multi_output:
        return dict(result._asdict())
    return {reg.spec.outputs[0].name: result}


_LOADED = False
_LOAD_LOCK = threading.RLock()


def load_all() -> None:
    """Import every module of ``bcer.tools`` so their ``@tool`` decorators run (no edit point
    to keep in sync when a tool module is added). Thread-safe: a planner in another thread
    never sees a half-filled registry."""
    global _LOADED
    if _LOADED:
        return
    with _LOAD_LOCK:
        if _LOADED:
            return
        import importlib
        import pkgutil

        from .. import tools as pkg

        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if m.name.rsplit(".", 1)[-1].startswith("_"):
                continue
            importlib.import_module(m.name)
        _LOADED = True
