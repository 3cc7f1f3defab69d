"""What runs inside a Ray worker: one node (or a fused chain of nodes), and one sequence load.

A node task returns one value per output field (Ray ``num_returns``) followed by a small meta
dict, so a consumer receives exactly one field's ObjectRef and the driver learns timings,
worker, device, digests, cache use, written files and measurements without fetching any
array. A ``ToolError`` is returned in the meta, not raised: it is a verdict for the
Reflector, not a system failure for Ray to retry.

The whole DAG of a case is submitted at once: a node task also receives the meta of every
upstream it depends on (after its input values). When one of them did not succeed, the node
does not run and says so (``not_run``); the driver repairs the failed upstream and
resubmits it with its descendants. The worker that produced a deliverable writes it
(sandbox-checked, atomic temp + rename) and digests it; the driver only records events.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterable, Iterator

from ..contracts.artifacts import kind_of
from ..contracts.case import SequenceRef
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.spec import ToolSpec
from ..tools.methods import flags_of
from ..tools.registry import REGISTRY, call_tool, get_tool, load_all
from .cache import CorruptEntry, NodeCache, folder_digest, node_key, subfield_digest
from .clock import report_start
from .digest import artifact_digest, canonical_json, file_digest, params_digest

log = logging.getLogger(__name__)
_TRACEBACK_CHARS = 4000


class _NodeTimeout(BaseException):
    """Raised into a running tool by SIGALRM. A BaseException, so the ``except Exception`` of
    ``call_tool`` (and of tools) cannot turn a timeout into an ``internal`` error."""


_WORKER_ID: str | None = None


def _worker_id() -> str:
    """The Ray node this worker process runs on (fixed for the process: looked up once)."""
    global _WORKER_ID
    if _WORKER_ID is None:
        try:
            import ray

            if not ray.is_initialized():  # outside Ray (run in process): never start a cluster here
                return "local"
            _WORKER_ID = ray.get_runtime_context().get_node_id()[:12]
        except Exception:  # no Ray runtime context (any error): a local run
            return "local"
    return _WORKER_ID


def gpu_where() -> dict[str, Any]:
    """``node_id`` and ``gpu_ids`` (Ray's GPU instance ids, also in CUDA_VISIBLE_DEVICES) when this
    task or actor holds GPUs; empty otherwise. The (node, gpu) pair is what shows that GPU-tagged
    nodes spread over every GPU of the cluster."""
    try:
        import ray

        if not ray.is_initialized():
            return {}
        ids = ray.get_gpu_ids()
        if not ids:
            return {}
        return {"node_id": ray.get_runtime_context().get_node_id(), "gpu_ids": [str(i) for i in ids]}
    except Exception:  # outside a worker or an older Ray: the placement is simply not recorded
        return {}


def import_tool_module(module: str, file: str) -> None:
    """Import a tool module by name, else (same machine, module not on sys.path) by file.

    A module already imported under that name from another file whose content differs from
    ``file`` (the one the driver registered) is kept, with a warning: a long-lived worker keeps
    the first copy it imported (a user's ``my_tools`` from an earlier folder), and its tools,
    not the driver's, run here. Same content elsewhere (a runtime_env copy) is silent."""
    try:
        mod = importlib.import_module(module)
        _warn_if_stale(mod, module, file)
        return
    except ImportError:
        if not file or not os.path.exists(file) or module == "__main__":  # never re-run a script
            raise
    spec = importlib.util.spec_from_file_location(module, file)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[module] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]


def _warn_if_stale(mod: Any, module: str, file: str) -> None:
    here = getattr(mod, "__file__", None)
    if not file or not here or not os.path.exists(file) or os.path.realpath(here) == os.path.realpath(file):
        return
    try:
        same = Path(here).read_bytes() == Path(file).read_bytes()
    except OSError:
        return
    if not same:
        log.warning("module %r was imported here from %s, which differs from %s that the driver "
                    "registered its tools from: this worker runs the first copy (restart Ray, or give "
                    "the new module another name)", module, here, file)


def _ensure_tool(name: str, module: str, file: str = "") -> None:
    """Import only the tool's own module (a worker running light tools never pays for the
    imports of heavy ones); the whole of ``bcer.tools`` only when that does not register it."""
    if name in REGISTRY:
        return
    if module:
        try:
            import_tool_module(module, file)
        except Exception as e:  # a user's tool module may raise anything on import
            raise ToolError(ErrorCode.internal, f"cannot import module {module!r} of tool {name!r}: "
                            f"{type(e).__name__}: {e}", hint="make it importable on every Ray node "
                            "(runtime_env py_modules or an installed package)", tool=name) from e
    if name not in REGISTRY:
        load_all()
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
            "pid": os.getpid(), "device": device, **gpu_where(), **extra}


def _stamp_origin(artifact: Any, node: str | None, field: str, tool: str) -> None:
    meta = getattr(artifact, "meta", None)
    if isinstance(meta, dict) and node:
        meta["origin"] = {"node": node, "field": field, "tool": tool}


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Interrupt the enclosed call after ``seconds`` (SIGALRM; main thread only, as Ray runs
    tasks). Code stuck inside a C call is stopped by the driver's backstop instead."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise _NodeTimeout()

    previous = signal.signal(signal.SIGALRM, _raise)
    # a worker runs many tasks: one whose C code blocked SIGALRM and never unblocked it would
    # otherwise leave every later node in this process without its limit (the alarm stays
    # pending until the call returns by itself)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGALRM})
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _input_digests(spec: dict[str, Any], deps: tuple[dict[str, Any], ...]) -> dict[str, str | None]:
    """port -> content digest of what it received (from the upstream metas: no rehashing)."""
    out: dict[str, str | None] = {}
    for (port, path), (dep, field) in zip(spec["ports"], spec["port_deps"]):
        meta = deps[dep]
        digest = meta.get("content_digest") if field is None else meta.get("output_digests", {}).get(field)
        out[port] = subfield_digest(digest, tuple(path))
    return out


def _key_inputs(spec: dict[str, Any], deps: tuple[dict[str, Any], ...]) -> dict[str, str | None]:
    """What a node's cache key reads besides tool, version, params and device: its inputs'
    digests and, for a node with a ``bundle_dir``, the folder's :func:`folder_digest` (under
    ``@bundle_dir``, a name no port can have), so retrained weights are a cache miss."""
    inputs = _input_digests(spec, deps)
    if bundle := spec["params"].get("bundle_dir"):
        inputs["@bundle_dir"] = folder_digest(bundle)
    return inputs


def _framework_imports(tool: str, device: str = "cpu") -> None:
    """Import the frameworks a run of a tool needs (torch, cupy, monai) before its time limit is armed.

    A SIGALRM that lands inside ``import torch`` leaves half-registered torch modules in the
    worker, and every later torch tool in that process fails ("Only a single TORCH_LIBRARY can
    be used..."): measured in the controller ablation, where first imports on a loaded machine
    met 60-s limits. Importing outside the limit makes the import uninterruptible and keeps
    it out of the tool's measured time. The modules are the tool's ``frameworks`` (torch by
    default for a GPU path) and, for a GPU run, its ``gpu_frameworks`` (the recon tools' cupy,
    denoise.nlm's torch: their CPU paths are numpy and scikit-image, and a CPU run never pays
    for them); tools without a GPU path never pay for any.

    A tool that runs MONAI bundles (its params take a ``bundle_dir``) also gets ``monai``
    (~9 s on an idle core): an interrupted ``import monai`` left the worker unable to build
    any bundle network ("Cannot locate class or function path: 'monai.networks.nets.unet.UNet'"),
    so ``seg.cardiac`` fell back to its classical method in that worker for the rest of the
    cardiac ablation and delivered other numbers than the clean run (measured at load 13-26).
    """
    try:
        reg = get_tool(tool)  # imports the tool's module (outside the limit too)
    except ToolError:
        return  # an unknown tool: call_tool raises its typed error under the limit
    for name in frameworks_for(reg.spec, reg.params_model.model_fields, device):
        if name not in sys.modules and importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def frameworks_for(spec: ToolSpec, params: Iterable[str] = (), device: str = "cpu") -> list[str]:
    """The modules :func:`_framework_imports` imports for a run of a tool on ``device``: its
    ``frameworks`` (torch when undeclared, for a GPU path with no ``gpu_frameworks``), its
    ``gpu_frameworks`` on a GPU, and monai when its ``params`` take a ``bundle_dir``."""
    wanted = spec.frameworks
    if wanted is None:
        wanted = ["torch"] if spec.gpu != "none" and not spec.gpu_frameworks else []
    wanted = [*wanted, *(spec.gpu_frameworks if device != "cpu" else [])]
    if "bundle_dir" in params:
        wanted.append("monai")
    return list(dict.fromkeys(wanted))


def _run_tool(spec: dict[str, Any], values: tuple[Any, ...], device: str) -> dict[str, Any]:
    inputs = {port: _pluck(v, tuple(path)) for (port, path), v in zip(spec["ports"], values)}
    _framework_imports(spec["tool"], device)
    with time_limit(spec.get("timeout_s")):
        result = call_tool(spec["tool"], inputs, spec["params"], device=device)
    missing = [f for f in spec["outputs"] if f not in result]
    if missing:
        raise ToolError(ErrorCode.internal, f"{spec['tool']} returned no field {missing[0]!r}", tool=spec["tool"])
    return {f: result[f] for f in spec["outputs"]}


def _cached_or_run(spec: dict[str, Any], values: tuple[Any, ...], deps: tuple[dict[str, Any], ...],
                   device: str) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """(outputs, output digests, cache info): from the cache when an entry exists, else run."""
    cache_dir = spec.get("cache_dir")
    if not cache_dir:
        outputs = _run_tool(spec, values, device)
        return outputs, {f: artifact_digest(v) for f, v in outputs.items()}, {}
    cache = NodeCache(cache_dir)
    inputs = _key_inputs(spec, deps)
    key = node_key(spec["tool"], spec["version"], spec["params"], inputs, device)
    info: dict[str, Any] = {"key": key, "input_digests": inputs}
    try:
        hit = cache.get(key)
    except CorruptEntry as e:
        log.warning("cache entry %s of %s is corrupt (%s): recomputing", key[:12], spec["node"], e)
        cache.discard(key)
        info["replaced_corrupt"] = str(e)
        hit = None
    if hit is not None:
        outputs, manifest = hit
        info.update(hit=True, stored_by={k: manifest.get(k) for k in ("run", "case", "node", "stored")},
                    tool_duration_s=manifest.get("duration_s"))
        return outputs, dict(manifest["output_digests"]), info
    t0 = time.time()
    outputs = _run_tool(spec, values, device)
    digests = {f: artifact_digest(v) for f, v in outputs.items()}
    try:
        cache.put(key, outputs, {"tool": spec["tool"], "version": spec["version"], "params": spec["params"],
                                 "device": device, "input_digests": inputs, "output_digests": digests,
                                 "run": spec.get("run"), "case": spec["case"], "node": spec["node"],
                                 "duration_s": time.time() - t0})
        info["stored"] = True
    except Exception as e:  # a full or read-only cache, an unpicklable output: never fails the node
        log.warning("cannot store cache entry of %s: %s", spec["node"], e)
        info["store_error"] = f"{type(e).__name__}: {e}"
    return outputs, digests, info


def _write_deliverables(spec: dict[str, Any], outputs: dict[str, Any],
                        digests: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write this node's deliverables (and intermediates) where the driver said; digest them."""
    from . import outputs as out
    from .sandbox import Sandbox

    if not spec.get("writes") and not spec.get("intermediates"):
        return {}, {}
    box = Sandbox(spec["input_root"], spec["output_dir"], spec.get("read_roots", ()))
    written: dict[str, Any] = {}
    measurements: dict[str, Any] = {}
    for w in spec.get("writes", ()):
        art = outputs[w["field"]]
        name = w["file"] if Path(w["file"]).suffix else out.default_file(w["file"], kind_of(art))
        files = out.write_artifact(art, box.check_write(Path(spec["output_dir"]) / name),
                                   companions=spec.get("companions", True))
        records = out.measurement_records(w["name"], art)
        written[w["name"]] = {"node": spec["node"], "field": w["field"], "files": [str(f) for f in files],
                              "file_digests": {f.name: file_digest(f) for f in files},
                              "artifact_digest": digests.get(w["field"]), "records": records}
        measurements.update(out.wide_measurements(records))
    if spec.get("intermediates"):
        for f, art in outputs.items():
            target = Path(spec["output_dir"]) / "intermediates" / out.default_file(f"{spec['node']}_{f}", kind_of(art))
            out.write_artifact(art, box.check_write(target))
    return written, measurements


def _failure(t0: float, device: str, err: ToolError, phase: str) -> dict[str, Any]:
    return _meta(t0, device, ok=False, phase=phase, error=err.to_dict())


def execute_node(spec: dict[str, Any], values: tuple[Any, ...],
                 deps: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Run one node in this process: ``(outputs or None, meta)``. Never raises."""
    t0 = time.time()
    device = spec.get("device", "cpu")
    upstream = next((i for i, d in enumerate(deps) if not d.get("ok")), None)
    if upstream is not None:  # an upstream failed: this submission is void, the driver resubmits
        return None, {"ok": False, "not_run": True, "upstream": spec["deps"][upstream], "t_start": t0,
                      "t_end": t0, "duration_s": 0.0, "device": device}
    report_start(spec)  # with a node clock, the node's time limit counts from here, not from submission
    args = params_digest(spec.get("inputs", {}), spec["params"])  # the trace's args_digest
    outputs, meta = _execute(spec, values, deps, device)
    meta["args_digest"] = args
    return outputs, meta


def _execute(spec: dict[str, Any], values: tuple[Any, ...], deps: tuple[dict[str, Any], ...],
             device: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    t0 = time.time()
    phase = "run"
    try:
        _ensure_tool(spec["tool"], spec.get("module", ""), spec.get("module_file", ""))
        t0 = time.time()  # the run interval is the tool's own, not the worker's first imports
        outputs, digests, cache = _cached_or_run(spec, values, deps, device)
        run_s = time.time() - t0  # the tool's (or cache's) own time, without the writes below
        for f, art in outputs.items():  # every output names where it came from (report evidence ids, audit)
            _stamp_origin(art, spec.get("node"), f, spec["tool"])
        method = _stamp_method(spec, values, outputs)
        phase = "write"
        written, measurements = _write_deliverables(spec, outputs, digests)
    except _NodeTimeout:
        err = ToolError(ErrorCode.timeout, f"{spec['tool']} ran past its time limit of {spec.get('timeout_s')} s",
                        hint="raise the tool's Resources.timeout_s or --node-timeout", tool=spec["tool"])
        return None, _failure(t0, device, err.with_context(node=spec.get("node"), case=spec.get("case")), phase)
    except ToolError as e:
        e.with_context(node=spec.get("node"), case=spec.get("case"), device=device)
        return None, _failure(t0, device, e, phase)
    except (KeyError, AttributeError) as e:  # a subfield path that the value does not have
        err = ToolError(ErrorCode.bad_reference, f"input subfield not found: {e}", tool=spec["tool"],
                        node=spec.get("node"))
        return None, _failure(t0, device, err, phase)
    except Exception as e:  # engine code in the worker (writes, cache): still a typed verdict
        err = ToolError(ErrorCode.internal, f"{type(e).__name__} in the worker running {spec['tool']}: {e}",
                        tool=spec["tool"], node=spec.get("node"),
                        traceback=traceback.format_exc()[-_TRACEBACK_CHARS:])
        return None, _failure(t0, device, err, phase)
    return outputs, _meta(t0, device, ok=True, error=None, output_digests=digests, cache=cache,
                          written=written, measurements=measurements, run_s=run_s, method_card=method,
                          flags=flags_of(outputs))


def _stamp_method(spec: dict[str, Any], values: tuple[Any, ...], outputs: dict[str, Any]) -> dict[str, Any]:
    """The node's method card (provenance), and ``meta["lineage"]`` on its outputs (reports)."""
    from ..tools.methods import card_of, reads_of, stamp_lineage

    inputs = {port: _pluck(v, tuple(path)) for (port, path), v in zip(spec["ports"], values)}
    card = card_of(get_tool(spec["tool"]).spec.method, spec["tool"], spec["version"], outputs)
    stamp_lineage(outputs, inputs, spec.get("node"), spec["tool"], spec["version"], card,
                  reads_of(spec["ports"], spec.get("sources", [])), spec.get("case"))
    return card


def run_node(spec: dict[str, Any], *args: Any) -> tuple[Any, ...]:
    """Ray entry point of one node: ``args`` = input values (in ``spec["ports"]`` order, Ray has
    resolved the ObjectRefs) then the metas of the node's dependencies (``spec["deps"]``).

    Returns:
        one value per ``spec["outputs"]`` field, then the meta dict.
    """
    n = len(spec["ports"])
    outputs, meta = execute_node(spec, args[:n], args[n:])
    values = [None] * len(spec["outputs"]) if outputs is None else [outputs[f] for f in spec["outputs"]]
    return (*values, meta)


def load_sequence_task(ref: SequenceRef) -> tuple[Any, dict[str, Any]]:
    """Load one sequence of a case (shared by all its consumers) and digest its file(s)."""
    from ..io import load_sequence

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
    # what a consumer's cache key sees: the bytes AND how they were read (format, options)
    content = hashlib.sha256(canonical_json({"sha256": digest, "frames": extra, "format": ref.format,
                                             "options": ref.options, "kind": ref.kind.value})).hexdigest()
    return artifact, _meta(t0, "cpu", ok=True, error=None, sha256=digest, frames=extra, content_digest=content)


__all__ = ["execute_node", "gpu_where", "load_sequence_task", "run_node", "time_limit"]
