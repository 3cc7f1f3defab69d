"""A case's failures: local repair of only the failed node (and its descendants), the one
retry of a timed-out node, giving up, and halting the case.

``Repair`` is given the ``CaseRun`` (its state, trace and watched refs) and the run's repairer:
it changes node states and the workflow, asks the repairer (the engine's repair protocol,
``engine.repair``; the Reflector implements it) and leaves resubmission to
``Submitter.submit_ready``.
"""
from __future__ import annotations

import time
from typing import Any

from ...contracts.errors import ToolError
from ...contracts.workflow import Node
from .. import repair as rp
from ..binder import node_dependencies
from ..trace import call_hooks
from .state import NodeState

_TIMEOUT_RETRIES = 1  # a timed-out node is re-submitted unchanged this many times


class Repair:
    """Failure handling of one running case.

    ``repairer``: a repairer, a pool of them (``for_case``), None (the registered default pool
    of the run) or False (no repair); resolved on the first failure only."""

    def __init__(self, run: Any, repairer: Any):
        self.run, self.state = run, run.state
        self.given = repairer
        self._resolved: Any = None

    def on_failure(self, node: Node, err: dict[str, Any], attempt: int, *, repairable: bool = True,
                   meta: dict[str, Any] | None = None) -> None:
        run, st = self.run, self.state
        err = dict(err)
        run.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                       message=err["message"], duration_s=(meta or {}).get("duration_s"),
                       data={"traceback": err["context"]["traceback"]} if "traceback" in err.get("context", {})
                       else None)
        call_hooks(run.hooks, "on_node_end", case=st.case.id, node=node.id, status="failed",
                   duration_s=(meta or {}).get("duration_s"), error=err, attempt=attempt)
        self.void_descendants(node.id)
        st.nodes[node.id].status = "failed"
        if not repairable or attempt >= st.ctx.max_attempts_per_node:
            self.give_up(node, err, halted=False)
            return
        repairer = self.repairer()
        if repairer is None:
            err["halt_reason"] = "no reflector available"
            self.give_up(node, err, halted=False)
            return
        failure = rp.build_failure(st, node, err, attempt)
        verdict = rp.ask(repairer, failure, st.wf, st.case, st.contract)
        if rp.is_remote(repairer) and not hasattr(verdict, "node_id"):
            s = st.nodes[node.id]
            s.status = "repairing"
            s.repair_asked = (time.time(), attempt, err)
            run.watch(("repair", node.id, attempt), verdict)
            return
        self._apply_verdict(node, verdict, attempt, err)

    def on_verdict(self, node_id: str, attempt: int, verdict: Any, exc: BaseException | None) -> None:
        s = self.state.nodes[node_id]
        _, _, err = s.repair_asked
        s.repair_asked = None
        if exc is not None:
            verdict = rp.halt_for(node_id, f"reflector failed: {type(exc).__name__}: {str(exc)[:300]}")
        self._apply_verdict(self.state.wf.node(node_id), verdict, attempt, dict(err))

    def _apply_verdict(self, node: Node, verdict: Any, attempt: int, err: dict[str, Any]) -> None:
        if self._resolved:  # llm: the repairer's calls for this verdict, before it takes effect
            for e in rp.repair_events(self._resolved, self.state.case.id, self.state.ctx.reflector_timeout_s):
                self.run.trace.emit(**e)
        if verdict is None or not hasattr(verdict, "inputs"):
            err["halt_reason"] = getattr(verdict, "reason", "no reflector available")
            self.give_up(node, err, halted=verdict is not None)
            return
        self._apply_patch(node, verdict, attempt)

    def repairer(self) -> Any:
        """Resolved on the first failure only: a pool member (an actor) starts when needed."""
        if self._resolved is None:
            given = self.given if self.given is not None else rp.default_repairer(self.state.ctx.run_id)
            self._resolved = rp.repairer_for(given, self.state.case.id) or False
        return self._resolved or None

    def _own(self, node: Node) -> Node:
        """Copy the (possibly shared) workflow before the first patch changes it."""
        st = self.state
        if not st.own_wf:
            st.wf = st.wf.model_copy(deep=True)
            st.own_wf = True
        return st.wf.node(node.id)

    def _apply_patch(self, node: Node, patch: Any, attempt: int) -> None:
        """Patch the failed node in place; it and its descendants are resubmitted by
        ``submit_ready`` as soon as their (possibly rebound) inputs have refs. Finished upstream
        results are kept. An inserted node joins the workflow before it; a skipped optional
        node blocks only its optional dependents (the Reflector refuses a skip that a
        required node depends on)."""
        run, st = self.run, self.state
        node = self._own(node)
        inserted = rp.apply_patch(st.wf, node, patch)
        if getattr(patch, "device", None) and getattr(patch, "action", "retry") != "skip":
            st.nodes[node.id].device = patch.device  # pinned for every later attempt
        st.repairs += 1
        run.trace.emit("repaired", node=node.id, tool=node.tool, attempt=attempt,
                       patch=patch.model_dump(mode="json"), message=getattr(patch, "reason", ""))
        if getattr(patch, "action", "retry") == "skip":
            st.nodes[node.id].status = "skipped"
            run.trace.emit("skipped", node=node.id, tool=node.tool, attempt=attempt,
                           message=getattr(patch, "reason", ""))
            for d in sorted(st.descendants(node.id)):
                if st.status(d) in ("pending", "running"):
                    run.block(d, f"upstream {node.id} was skipped")
            return
        try:
            for new in inserted:
                st.nodes[new.id] = NodeState()
                st.nodes[new.id].deps = node_dependencies(st.wf, new, st.case)
                run.trace.emit("planned", node=new.id, tool=new.tool, attempt=attempt,
                               message=f"inserted before {node.id} by repair")
            st.nodes[node.id].deps = node_dependencies(st.wf, node, st.case)
        except ToolError as e:
            self.give_up(node, e.with_context(node=node.id, tool=node.tool).to_dict(), halted=False)
            return
        st.index_children()
        run.submitter.plan_targets()
        run.ensure_loads()
        st.nodes[node.id].status = "pending"
        run.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1)

    def void_descendants(self, node_id: str) -> None:
        """Submissions chained to a failed node never run: back to pending (resubmitted after a
        patch, blocked after a halt)."""
        for d in self.state.descendants(node_id):
            s = self.state.nodes.get(d)
            if s is not None and s.status == "running":
                self.run.forget(("node", d, s.gen))
                s.status = "pending"
                s.ready_at = None

    def retry_timeout(self, node: Node, err: dict[str, Any], attempt: int,
                      meta: dict[str, Any] | None = None) -> bool:
        """A timed-out node is re-submitted unchanged once: a hang is most often transient (stuck
        I/O, a wedged worker); a second timeout fails it for good (never repaired)."""
        run, st, s = self.run, self.state, self.state.nodes[node.id]
        if s.timeouts >= _TIMEOUT_RETRIES or attempt >= st.ctx.max_attempts_per_node:
            return False
        s.timeouts += 1
        run.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                       message=err["message"], duration_s=(meta or {}).get("duration_s"))
        call_hooks(run.hooks, "on_node_end", case=st.case.id, node=node.id, status="failed",
                   duration_s=(meta or {}).get("duration_s"), error=err, attempt=attempt)
        self.void_descendants(node.id)
        s.cancelled = False
        s.ready_at = None
        s.status = "pending"
        run.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1,
                       message="timed out: re-submitted unchanged")
        return True

    def halt_case(self, where: str, err: dict[str, Any]) -> None:
        """Stop the whole case: nothing not yet run runs (nothing else is written); the error
        is the case's."""
        st = self.state
        for n in st.wf.nodes:
            if st.nodes[n.id].status in ("pending", "running"):
                self.run.block(n.id, f"the case halted: {err['code']} at {where}")
        ctx = err.get("context", {})
        st.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""), "node": where,
                    "tool": None, "file": ctx.get("file"), "context": ctx,
                    "halt_reason": f"{err['code']} halts at once"}
        st.halted = True

    def give_up(self, node: Node, err: dict[str, Any], *, halted: bool) -> None:
        """The node failed for good: block its dependents; a required node fails the case."""
        st, s = self.state, self.state.nodes[node.id]
        if s.status == "running":
            self.run.forget(("node", node.id, s.gen))
        s.status = "failed"
        if node.required and st.error is None:
            ctx = err.get("context", {})
            st.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""),
                        "node": node.id, "tool": node.tool, "file": ctx.get("file"), "context": ctx,
                        "halt_reason": err.get("halt_reason")}
            st.halted = halted
        for d in sorted(st.descendants(node.id), key=st.index):
            if st.status(d) in ("pending", "running"):
                self.run.block(d, f"upstream {node.id} failed ({err['code']})")


__all__ = ["Repair"]
