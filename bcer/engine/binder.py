"""Binding one node for submission: runtime values, case metadata, resources and device.

Pure functions over the workflow, the case and the cluster's resources (no Ray calls), so
every decision the executor makes before ``.remote()`` is testable on its own.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..contracts.case import Case, SequenceRef
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.workflow import Node, Workflow
from .placement import Placement, place  # re-exported: placement is decided in engine.placement
from .tokens import RUNTIME_KEYS, is_token, parse_token

log = logging.getLogger(__name__)


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
    return case.sequence_key(name)


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
