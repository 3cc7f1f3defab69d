"""The executor's side of local repair: the repairer protocols, describing a failure, applying a Patch.

A repairer (the Reflector, ``bcer.agents.repair.reflector``, implements it) decides; the engine only
builds the ``Failure`` (what failed, what is bindable now, what was bound) and applies the
verdict to the running workflow. The engine never imports ``actors``: the API, CLI and bench
build the run's repairer pool and hand it in; for direct engine use (``run_case_workflow``
without one) ``set_default_repairer`` lets the actors package register how to build it.
A repairer that cannot be reached, crashes or times out is a Halt, never a crash.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Protocol, runtime_checkable

from ..contracts.case import Case
from ..contracts.errors import ErrorCode
from ..contracts.repair import Failure, Halt, Patch
from ..contracts.task import TaskContract
from ..contracts.workflow import Node, Workflow
from ..tools.registry import get_tool
from .tokens import Token, is_token, parse_token

log = logging.getLogger(__name__)


@runtime_checkable
class Repairer(Protocol):
    """Answers a failed node with a Patch or a Halt (in process, or a Ray actor handle whose
    ``repair.remote`` returns the same)."""

    def repair(self, failure: Failure, workflow: Workflow, case: Case,
               contract: TaskContract | None = None) -> Patch | Halt: ...


@runtime_checkable
class RepairerPool(Protocol):
    """The repairers of one run; a case always goes to the same one (its budget lives there)."""

    def for_case(self, case_id: str) -> Repairer: ...


_DEFAULT: Callable[[str], RepairerPool] | None = None


def set_default_repairer(factory: Callable[[str], RepairerPool] | None) -> None:
    """Register ``factory(run_id) -> RepairerPool`` for runs that were handed no repairer."""
    global _DEFAULT
    _DEFAULT = factory


def default_repairer(run_id: str) -> RepairerPool | None:
    """The registered default pool for ``run_id``, or None (failures are then not repaired)."""
    if _DEFAULT is None:
        log.warning("no repairer registered (import bcer.agents.repair.reflector or pass one): failures are not repaired")
        return None
    try:
        return _DEFAULT(run_id)
    except Exception:  # a user's repairer factory may raise anything: run unrepaired
        log.exception("cannot build the default repairer: failures are not repaired")
        return None


def repairer_for(given: Any, case_id: str) -> Any:
    """The repairer of one case: a pool's member, or the given repairer itself."""
    if given is None or given is False:
        return None
    if hasattr(given, "for_case"):
        return given.for_case(case_id)
    return given


def is_remote(repairer: Any) -> bool:
    return hasattr(getattr(repairer, "repair", None), "remote")


def available_artifacts(state: Any, failed: str) -> dict[str, str]:
    """token -> ArtifactKind value of everything bindable now: the case's sequences and the
    outputs of nodes that succeeded or are running (their ObjectRefs exist), except the
    failed node and what depends on it (binding those would make a cycle)."""
    avail = {str(Token.seq(k)): ref.kind.value for k, ref in state.case.sequences.items()}
    below = state.descendants(failed) | {failed}
    for n in state.wf.nodes:
        if n.id in below or state.status(n.id) not in ("succeeded", "running"):
            continue
        spec = get_tool(n.tool).spec
        for f in n.outputs:
            port = spec.output(f)
            if port is not None:
                avail[str(Token.node(n.id, f))] = port.kind.value
    return avail


def bound_kinds(state: Any, node: Node) -> dict[str, str]:
    """port -> ArtifactKind value of what the node's tokens actually bound."""
    from .binder import sequence_key

    kinds: dict[str, str] = {}
    for port, raw in node.inputs.items():
        try:
            tok = parse_token(raw)
            if tok.scope == "seq":
                key = sequence_key(state.case, tok.name)
                if key is not None:
                    kinds[port] = state.case.sequences[key].kind.value
            elif tok.scope == "node":
                out = get_tool(state.wf.node(tok.name).tool).spec.output(tok.field or "")
                if out is not None:
                    kinds[port] = out.kind.value
        except Exception:  # an unbindable token has no kind; the reflector sees it missing
            continue
    return kinds


def build_failure(state: Any, node: Node, err: dict[str, Any], attempt: int) -> Failure:
    """The ``Failure`` a repairer is asked about, from a running case's state (``case.state.CaseState``)."""
    return Failure(case_id=state.case.id, node=node.model_copy(deep=True), error=err, attempt=attempt,
                   available=available_artifacts(state, node.id), bound_kinds=bound_kinds(state, node),
                   has_gpu=float(state.cluster.get("GPU", 0)) > 0)


def ask(repairer: Any, failure: Failure, workflow: Workflow, case: Case, contract: TaskContract | None) -> Any:
    """A verdict (Patch or Halt) from an in-process repairer, or the ObjectRef of an actor's
    answer (the caller waits for it in its event loop, so one slow repair blocks no other case)."""
    try:
        if is_remote(repairer):
            return repairer.repair.remote(failure, workflow, case, contract)
        return repairer.repair(failure, workflow, case, contract)
    except Exception as e:  # a crashing repairer halts this node, not the driver
        log.exception("repairer failed on %s/%s", case.id, failure.node.id)
        return halt_for(failure.node.id, f"reflector failed: {type(e).__name__}: {e}")


def repair_events(repairer: Any, case_id: str, timeout_s: float) -> list[dict[str, Any]]:
    """The repairer's pending events of a case (tier-2 ``llm_call``s), for the case's trace;
    a repairer without ``drain_events`` has none. Read right after a verdict, so the trace
    shows each LLM call between the failure and the repair it led to."""
    drain = getattr(repairer, "drain_events", None)
    if drain is None:
        return []
    try:
        if hasattr(drain, "remote"):
            import ray

            return list(ray.get(drain.remote(case_id), timeout=timeout_s))
        return list(drain(case_id))
    except Exception:  # the audit detail is lost, the verdict stands
        log.exception("cannot read the repairer's events of case %s", case_id)
        return []


def halt_for(node_id: str, reason: str) -> Halt:
    return Halt(node_id=node_id, code=ErrorCode.internal.value, reason=reason)


def apply_patch(workflow: Workflow, node: Node, patch: Any) -> list[Node]:
    """Apply a (validated) Patch in place to the running workflow; returns the inserted nodes.

    A Patch carries the node's COMPLETE new inputs and params; a device it names is pinned by
    the caller (``case.repair``: the node's state).
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
    return inserted


def _incoming(node: Node) -> list[tuple[str, str]]:
    """Edges into ``node`` from its ``@node`` bindings and its explicit ``after``."""
    ups = {parse_token(t).name for t in node.inputs.values() if is_token(t) and parse_token(t).scope == "node"}
    return sorted((u, node.id) for u in ups | set(node.after))


__all__ = ["Repairer", "RepairerPool", "apply_patch", "ask", "available_artifacts", "bound_kinds",
           "build_failure", "default_repairer", "halt_for", "is_remote", "repair_events", "repairer_for",
           "set_default_repairer"]
