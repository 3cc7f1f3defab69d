"""Binding one node for submission: runtime values, case metadata, resources and device.

Pure functions over the workflow, the case and the cluster's resources (no Ray calls), so
every decision the executor makes before ``.remote()`` is testable on its own.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contracts.case import Case, SequenceRef
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.workflow import Node, Workflow
from .tokens import RUNTIME_KEYS, is_token, normalise_seq, parse_token

log = logging.getLogger(__name__)
_MB = 1024 * 1024


@dataclass(frozen=True)
class Placement:
    """How a node runs: Ray resource options and the device handed to the tool.

    ``fallback`` is the reason a GPU-capable tool runs on CPU (None when it does not).
    """

    num_cpus: float
    num_gpus: float
    memory: int | None
    device: str
    fallback: str | None = None


def place(node: Node, cluster: dict[str, float], device_policy: str = "auto",
          device_override: str | None = None) -> Placement:
    """Choose resources and device for ``node`` on a cluster with ``cluster`` resources.

    A request larger than the whole cluster would stay pending forever, so CPU and memory
    are capped at the cluster's totals; GPU tags decide between the GPU path, the CPU path
    (``fallback``) and a fast ``resource`` error.

    Raises:
        ToolError: ``resource`` for a ``gpu="required"`` tool when no GPU can be used.
    """
    res, gpus = node.resources, float(cluster.get("GPU", 0.0))
    cpus = min(float(res.num_cpus), float(cluster.get("CPU", res.num_cpus)) or res.num_cpus)
    memory = res.memory_mb * _MB if res.memory_mb else None
    if memory and cluster.get("memory"):
        memory = int(min(memory, cluster["memory"]))
    want_gpu = float(res.num_gpus) or 1.0
    use_gpu = gpus >= min(want_gpu, 1.0) and device_policy == "auto" and device_override != "cpu"
    if node.gpu == "required":
        if not use_gpu:
            why = "no GPU in the cluster" if gpus == 0 else f"device policy {device_policy!r}"
            raise ToolError(ErrorCode.resource, f"{node.tool} needs a GPU and has no CPU path ({why})",
                            hint="run on a cluster with a GPU or plan a CPU tool", node=node.id, tool=node.tool)
        return Placement(cpus, want_gpu, memory, "cuda")
    if node.gpu == "optional":
        if use_gpu:
            return Placement(cpus, want_gpu, memory, "cuda")
        why = ("no GPU in the cluster" if gpus == 0 else
               "patched to CPU" if device_override == "cpu" else f"device policy {device_policy!r}")
        return Placement(cpus, 0.0, memory, "cpu", fallback=why)
    return Placement(cpus, 0.0, memory, "cpu")


def runtime_values(output_dir: Path, device: str, seed: int, run_id: str) -> dict[str, Any]:
    values = {"output_dir": str(output_dir), "device": device, "seed": seed, "run_id": run_id}
    assert set(values) == set(RUNTIME_KEYS), "runtime keys out of sync with tokens.RUNTIME_KEYS"
    return values


def _case_value(case: Case, key: str, where: str) -> Any:
    if key in case.metadata:
        return case.metadata[key]
    if key in ("id", "domain"):
        return getattr(case, key)
    raise ToolError(ErrorCode.bad_reference, f"@case.{key} is not in the metadata of case {case.id}",
                    hint=f"valid: {sorted(case.metadata)}", arg=where)


def resolve_params(value: Any, case: Case, runtime: dict[str, Any], where: str = "") -> Any:
    """Replace ``@case.*``/``@runtime.*`` tokens (at any depth) by their values.

    Raises:
        ToolError: ``bad_reference`` for a malformed token, an unknown key, or an
            artifact token (``@seq``/``@node``) used as a param.
    """
    if isinstance(value, dict):
        return {k: resolve_params(v, case, runtime, f"{where}.{k}" if where else k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(resolve_params(v, case, runtime, where) for v in value)
    if not is_token(value):
        return value
    tok = parse_token(value)
    if tok.scope == "case":
        return _case_value(case, tok.name, where)
    if tok.scope == "runtime":
        if tok.name not in runtime:
            raise ToolError(ErrorCode.bad_reference, f"unknown runtime key {tok.name!r}",
                            hint=f"valid: {sorted(runtime)}", arg=where)
        return runtime[tok.name]
    raise ToolError(ErrorCode.bad_reference, f"param {where!r} holds artifact reference {value!r}",
                    hint="artifacts bind to input ports; params take literals, @case.* or @runtime.*", arg=where)


def sequence_key(case: Case, name: str) -> str | None:
    """The key of ``case.sequences`` that a ``@seq.<name>`` token means (through the alias table)."""
    if name in case.sequences:
        return name
    want = normalise_seq(name) or name
    return next((k for k in case.sequences if (normalise_seq(k) or k) == want), None)


def resolved_ref(case: Case, key: str) -> SequenceRef:
    """The SequenceRef with its path made absolute against the case root."""
    ref = case.sequences[key]
    path = Path(ref.path)
    if not path.is_absolute():
        ref = ref.model_copy(update={"path": str(case.root_path / path)})
    return ref


def node_dependencies(workflow: Workflow, node: Node, case: Case) -> tuple[set[str], set[str]]:
    """(upstream node ids, sequence keys) that ``node`` waits for.

    Raises:
        ToolError: ``bad_reference`` for an input token naming no node or sequence.
    """
    ids = {n.id for n in workflow.nodes}
    nodes = {u for u, v in workflow.edges if v == node.id} | set(node.after)
    seqs: set[str] = set()
    for port, raw in node.inputs.items():
        tok = parse_token(raw)
        if tok.scope == "node" and tok.name in ids and tok.field:
            nodes.add(tok.name)
        elif tok.scope == "seq" and sequence_key(case, tok.name):
            seqs.add(sequence_key(case, tok.name))  # type: ignore[arg-type]
        else:
            raise ToolError(ErrorCode.bad_reference, f"input {port!r} of node {node.id} binds to nothing: {raw}",
                            node=node.id, tool=node.tool, arg=port)
    return nodes & ids, seqs


__all__ = ["Placement", "node_dependencies", "place", "resolve_params", "resolved_ref", "runtime_values",
           "sequence_key"]
