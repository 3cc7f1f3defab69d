"""What runs inside a Ray worker: one node's tool call, and one sequence load.

Both return their results as separate values (Ray ``num_returns``) followed by a small meta
dict, so a consumer receives exactly one field's ObjectRef and the driver learns timings,
worker, device and digests without fetching any array. A ``ToolError`` is returned in the
meta, not raised: it is a verdict for the Reflector, not a system failure for Ray to retry.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time
from typing import Any

from ..contracts.case import SequenceRef
from ..contracts.errors import ErrorCode, ToolError
from ..tools.registry import REGISTRY, call_tool, load_all
from .clock import report_start
from .digest import artifact_digest, file_digest

log = logging.getLogger(__name__)


def _worker_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()[:12]
    except Exception:  # outside a Ray worker (tests calling run_node directly)
        return "local"


def _import_module(module: str, file: str) -> None:
    """Import a tool module by name, else (same machine, module not on sys.path) by file."""
    try:
        importlib.import_module(module)
        return
    except ImportError:
        if not file or not os.path.exists(file) or module == "__main__":  # never re-run a script
            raise
    spec = importlib.util.spec_from_file_location(module, file)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[module] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]


def _ensure_tool(name: str, module: str, file: str = "") -> None:
    """Tools registered outside ``bcer.tools`` (plugins, test modules) are imported by module."""
    load_all()
    if name not in REGISTRY and module:
        try:
            _import_module(module, file)
        except Exception as e:
            raise ToolError(ErrorCode.internal, f"cannot import module {module!r} of tool {name!r}: "
                            f"{type(e).__name__}: {e}", hint="make it importable on every Ray node "
                            "(runtime_env py_modules or an installed package)", tool=name) from e
    if name not in REGISTRY:
        raise ToolError(ErrorCode.internal, f"tool {name!r} is not registered in this worker",
                        hint=f"make module {module!r} importable on every Ray node", tool=name)


def _pluck(value: Any, path: tuple[str, ...]) -> Any:
    """Follow the subfields of ``@node.<id>.<field>.<sub>...`` (attributes, then keys)."""
    for part in path:
        if isinstance(value, dict):
            value = value[part]
        else:
            value = getattr(value, part)
    return value


def _meta(t0: float, device: str, **extra: Any) -> dict[str, Any]:
    t1 = time.time()
    return {"t_start": t0, "t_end": t1, "duration_s": t1 - t0, "worker": _worker_id(),
            "pid": os.getpid(), "device": device, **extra}


def _stamp_origin(artifact: Any, node: str | None, field: str, tool: str) -> None:
    meta = getattr(artifact, "meta", None)
    if isinstance(meta, dict) and node:
        meta["origin"] = {"node": node, "field": field, "tool": tool}


def run_node(spec: dict[str, Any], *values: Any) -> tuple[Any, ...]:
    """Run one node: ``spec`` names the tool, ports, params and outputs; ``values`` are the
    resolved inputs (Ray has already fetched the ObjectRefs), in ``spec["ports"]`` order.

    Returns:
        one value per ``spec["outputs"]`` field, then the meta dict (``ok``, ``error``,
        ``output_digests``, timings, worker, pid, device).
    """
    t0 = time.time()
    report_start(spec)  # the node timeout counts from here, not from submission
    outputs: list[str] = spec["outputs"]
    device = spec.get("device", "cpu")
    try:
        _ensure_tool(spec["tool"], spec.get("module", ""), spec.get("module_file", ""))
        t0 = time.time()  # the run interval is the tool's own, not the worker's first imports
        inputs = {port: _pluck(v, tuple(path)) for (port, path), v in zip(spec["ports"], values)}
        result = call_tool(spec["tool"], inputs, spec["params"], device=device)
        missing = [f for f in outputs if f not in result]
        if missing:
            raise ToolError(ErrorCode.internal, f"{spec['tool']} returned no field {missing[0]!r}",
                            tool=spec["tool"])
        for f in outputs:  # every output names where it came from (report evidence ids, audit)
            _stamp_origin(result[f], spec.get("node"), f, spec["tool"])
        digests = {f: artifact_digest(result[f]) for f in outputs}
    except ToolError as e:
        e.with_context(node=spec.get("node"), case=spec.get("case"), device=device)
        return (*([None] * len(outputs)), _meta(t0, device, ok=False, error=e.to_dict()))
    except (KeyError, AttributeError) as e:  # a subfield path that the value does not have
        err = ToolError(ErrorCode.bad_reference, f"input subfield not found: {e}", tool=spec["tool"],
                        node=spec.get("node"))
        return (*([None] * len(outputs)), _meta(t0, device, ok=False, error=err.to_dict()))
    return (*(result[f] for f in outputs), _meta(t0, device, ok=True, error=None, output_digests=digests))


def load_sequence_task(ref: SequenceRef) -> tuple[Any, dict[str, Any]]:
    """Load one sequence of a case (shared by all its consumers) and digest its file(s)."""
    from ..tools.io import load_sequence

    t0 = time.time()
    try:
        artifact = load_sequence(ref)
        frames = ref.options.get("frames") or []
        digest = (file_digest(ref.path) if os.path.exists(ref.path)
                  else artifact_digest(artifact))
        extra = {f"frame{i}": file_digest(f) for i, f in enumerate(frames)} if frames else {}
    except ToolError as e:
        e.with_context(file=ref.path)
        return None, _meta(t0, "cpu", ok=False, error=e.to_dict())
    except Exception as e:  # a reader crashing on a bad file is still that file's fault
        err = ToolError(ErrorCode.schema, f"cannot read {ref.path}: {type(e).__name__}: {e}", file=ref.path)
        return None, _meta(t0, "cpu", ok=False, error=err.to_dict())
    return artifact, _meta(t0, "cpu", ok=True, error=None, sha256=digest, frames=extra)


__all__ = ["load_sequence_task", "run_node"]
