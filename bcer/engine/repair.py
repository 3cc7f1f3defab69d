"""The executor's side of local repair: describe a failure to the Reflector, apply its Patch.

The Reflector (``bcer.actors.reflector``) decides; the executor only builds the ``Failure``
(what failed, what is bindable now, what was bound) and applies the verdict to the running
node. A Reflector that cannot be reached or that crashes is a Halt, never a crash.
"""
from __future__ import annotations

import logging
import zlib
from typing import Any

from ..contracts.errors import ErrorCode
from ..contracts.workflow import Node, Workflow
from ..tools.registry import get_tool
from .tokens import parse_token

log = logging.getLogger(__name__)


def available_artifacts(run: Any) -> dict[str, str]:
    """token -> ArtifactKind value of everything bindable now (sequences and finished outputs)."""
    avail = {f"@seq.{k}": ref.kind.value for k, ref in run.case.sequences.items()}
    for n in run.wf.nodes:
        if run.status.get(n.id) != "succeeded":
            continue
        spec = get_tool(n.tool).spec
        for f in n.outputs:
            port = spec.output(f)
            if port is not None:
                avail[f"@node.{n.id}.{f}"] = port.kind.value
    return avail


def bound_kinds(run: Any, node: Node) -> dict[str, str]:
    """port -> ArtifactKind value of what the node's tokens actually bound."""
    from .binder import sequence_key

    kinds: dict[str, str] = {}
    for port, raw in node.inputs.items():
        try:
            tok = parse_token(raw)
            if tok.scope == "seq":
                key = sequence_key(run.case, tok.name)
                if key is not None:
                    kinds[port] = run.case.sequences[key].kind.value
            elif tok.scope == "node":
                out = get_tool(run.wf.node(tok.name).tool).spec.output(tok.field or "")
                if out is not None:
                    kinds[port] = out.kind.value
        except Exception:  # an unbindable token has no kind; the reflector sees it missing
            continue
    return kinds


REFLECTOR_POOL = 2


def _registry_for_actor(run: Any) -> dict[str, Any] | None:
    """None when every tool of the workflow ships with bcer (the actor loads those itself);
    else a snapshot of the registry, so unpickling it imports the plugin tools' modules in
    the actor (they must be importable by name there, e.g. from the working directory)."""
    from ..tools.registry import REGISTRY, load_all

    load_all()
    if all(get_tool(n.tool).fn.__module__.startswith("bcer.") for n in run.wf.nodes):
        return None
    return dict(REGISTRY)


def _reflector(run: Any) -> Any:
    """The given reflector, else a member of this run's named actor pool (get-or-create), so
    cases of one run share a few actors and a later run starts with fresh budgets."""
    if run.reflector is None:
        try:
            from ..actors.reflector import reflector_actor

            slot = zlib.crc32(run.case.id.encode()) % REFLECTOR_POOL
            run.reflector = reflector_actor(name=f"bcer-reflector-{run.ctx.run_id}-{slot}",
                                            registry=_registry_for_actor(run))
        except Exception:
            log.exception("no reflector available: failures of case %s are not repaired", run.case.id)
            run.reflector = False
    return run.reflector or None


def ask_reflector(run: Any, node: Node, err: dict[str, Any], attempt: int) -> Any:
    """The Reflector's verdict (a Patch or a Halt) for this failure; None without a reflector."""
    from ..actors.reflector import Failure, Halt

    refl = _reflector(run)
    if refl is None:
        return None
    failure = Failure(case_id=run.case.id, node=node.model_copy(deep=True), error=err, attempt=attempt,
                      available=available_artifacts(run), bound_kinds=bound_kinds(run, node),
                      has_gpu=float(run.cluster.get("GPU", 0)) > 0)
    try:
        if hasattr(getattr(refl, "repair", None), "remote"):
            import ray

            ref = refl.repair.remote(failure, run.wf, run.case, run.contract)
            verdict = ray.get(ref, timeout=run.ctx.reflector_timeout_s)
        else:
            verdict = refl.repair(failure, run.wf, run.case, run.contract)
    except Exception as e:  # an unreachable or crashing reflector halts this node, not the driver
        log.exception("reflector failed on %s/%s", run.case.id, node.id)
        return Halt(node_id=node.id, code=ErrorCode.internal.value,
                    reason=f"reflector failed: {type(e).__name__}: {e}")
    _trace_repair_events(run, refl)
    return verdict


def _trace_repair_events(run: Any, refl: Any) -> None:
    """llm: the Reflector's pending events of this case (tier-2 ``llm_call``s) into its trace."""
    drain = getattr(refl, "drain_events", None)
    if drain is None:
        return
    try:
        if hasattr(drain, "remote"):
            import ray

            events = ray.get(drain.remote(run.case.id), timeout=run.ctx.reflector_timeout_s)
        else:
            events = drain(run.case.id)
    except Exception:  # the audit detail is lost, the repair verdict stands
        log.exception("cannot read the reflector's events of case %s", run.case.id)
        return
    for e in events:
        run.trace.emit(**e)


def apply_patch(workflow: Workflow, node: Node, patch: Any, device_override: dict[str, str]) -> list[Node]:
    """Apply a (validated) Patch in place to the running workflow; returns the inserted nodes.

    A Patch carries the node's COMPLETE new inputs and params; a device it names is pinned.
    ``action="insert"`` adds ``patch.insert`` just before the failed node (node order stays
    topological) with its edges; the failed node's incoming edges are recomputed from its new
    bindings. ``action="skip"`` changes nothing here: the executor records the skip.
    """
    inserted: list[Node] = []
    if getattr(patch, "action", "retry") == "skip":
        return inserted
    if getattr(patch, "action", "retry") == "insert" and patch.insert is not None:
        new = patch.insert.model_copy(deep=True)
        workflow.nodes.insert(workflow.nodes.index(node), new)
        workflow.edges = sorted(set(workflow.edges) | set(_incoming(new)))
        inserted.append(new)
    node.inputs = dict(patch.inputs)
    node.params = dict(patch.params)
    workflow.edges = sorted({e for e in workflow.edges if e[1] != node.id} | set(_incoming(node)))
    if getattr(patch, "device", None):
        device_override[node.id] = patch.device
    return inserted


def _incoming(node: Node) -> list[tuple[str, str]]:
    """Edges into ``node`` from its ``@node`` bindings and its explicit ``after``."""
    ups = {parse_token(t).name for t in node.inputs.values() if isinstance(t, str) and t.startswith("@node.")}
    return sorted((u, node.id) for u in ups | set(node.after))


__all__ = ["apply_patch", "ask_reflector", "available_artifacts", "bound_kinds"]
