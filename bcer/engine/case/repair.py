"""A case's failures: local repair of only the failed node (and its descendants), the one
retry of a timed-out node, giving up, and halting the case.

``CaseRepair`` is the failure half of ``case.run.CaseRun`` (which mixes it in): it reads and
changes the run's node states, trace and workflow, asks the run's repairer (the engine's
repair protocol, ``engine.repair``; the Reflector implements it) and leaves resubmission to
``CaseRun._submit_ready``.
"""
from __future__ import annotations

import time
from typing import Any

from ...contracts.errors import ToolError
from ...contracts.workflow import Node
from .. import repair as rp
from ..binder import node_dependencies
from ..trace import call_hooks

_TIMEOUT_RETRIES = 1  # a timed-out node is re-submitted unchanged this many times


class CaseRepair:
    """Failure handling of a ``CaseRun`` (attributes and the helpers it uses are CaseRun's)."""

    def _on_failure(self, node: Node, err: dict[str, Any], attempt: int, *, repairable: bool = True,
                    meta: dict[str, Any] | None = None) -> None:
        err = dict(err)
        self.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                        message=err["message"], duration_s=(meta or {}).get("duration_s"),
                        data={"traceback": err["context"]["traceback"]} if "traceback" in err.get("context", {})
                        else None)
        call_hooks(self.hooks, "on_node_end", case=self.case.id, node=node.id, status="failed",
                   duration_s=(meta or {}).get("duration_s"), error=err, attempt=attempt)
        self._void_descendants(node.id)
        self.status[node.id] = "failed"
        if not repairable or attempt >= self.ctx.max_attempts_per_node:
            self._give_up(node, err, halted=False)
            return
        repairer = self._repairer()
        if repairer is None:
            err["halt_reason"] = "no reflector available"
            self._give_up(node, err, halted=False)
            return
        failure = rp.build_failure(self, node, err, attempt)
        verdict = rp.ask(repairer, failure, self.wf, self.case, self.contract)
        if rp.is_remote(repairer) and not hasattr(verdict, "node_id"):
            self.status[node.id] = "repairing"
            self.repair_asked[node.id] = (time.time(), attempt, err)
            self._watch(("repair", node.id, attempt), verdict)
            return
        self._apply_verdict(node, verdict, attempt, err)

    def _on_verdict(self, node_id: str, attempt: int, verdict: Any, exc: BaseException | None) -> None:
        _, _, err = self.repair_asked.pop(node_id)
        if exc is not None:
            verdict = rp.halt_for(node_id, f"reflector failed: {type(exc).__name__}: {str(exc)[:300]}")
        self._apply_verdict(self.wf.node(node_id), verdict, attempt, dict(err))

    def _apply_verdict(self, node: Node, verdict: Any, attempt: int, err: dict[str, Any]) -> None:
        if self._resolved_repairer:  # llm: the repairer's calls for this verdict, before it takes effect
            for e in rp.repair_events(self._resolved_repairer, self.case.id, self.ctx.reflector_timeout_s):
                self.trace.emit(**e)
        if verdict is None or not hasattr(verdict, "inputs"):
            err["halt_reason"] = getattr(verdict, "reason", "no reflector available")
            self._give_up(node, err, halted=verdict is not None)
            return
        self._apply_patch(node, verdict, attempt)

    def _repairer(self) -> Any:
        """Resolved on the first failure only: a pool member (an actor) starts when needed."""
        if self._resolved_repairer is None:
            given = self.repairer if self.repairer is not None else rp.default_repairer(self.ctx.run_id)
            self._resolved_repairer = rp.repairer_for(given, self.case.id) or False
        return self._resolved_repairer or None

    def _own(self, node: Node) -> Node:
        """Copy the (possibly shared) workflow before the first patch changes it."""
        if not self._own_wf:
            self.wf = self.wf.model_copy(deep=True)
            self._own_wf = True
        return self.wf.node(node.id)

    def _apply_patch(self, node: Node, patch: Any, attempt: int) -> None:
        """Patch the failed node in place; it and its descendants are resubmitted by
        ``_submit_ready`` as soon as their (possibly rebound) inputs have refs. Finished upstream
        results are kept. An inserted node joins the workflow before it; a skipped optional
        node blocks only its optional dependents (the Reflector refuses a skip that a
        required node depends on)."""
        node = self._own(node)
        inserted = rp.apply_patch(self.wf, node, patch, self.device_override)
        self.repairs += 1
        self.trace.emit("repaired", node=node.id, tool=node.tool, attempt=attempt,
                        patch=patch.model_dump(mode="json"), message=getattr(patch, "reason", ""))
        if getattr(patch, "action", "retry") == "skip":
            self.status[node.id] = "skipped"
            self.trace.emit("skipped", node=node.id, tool=node.tool, attempt=attempt,
                            message=getattr(patch, "reason", ""))
            for d in sorted(self.descendants(node.id)):
                if self.status.get(d) in ("pending", "running"):
                    self._block(d, f"upstream {node.id} was skipped")
            return
        try:
            for new in inserted:
                self.status[new.id] = "pending"
                self.deps[new.id] = node_dependencies(self.wf, new, self.case)
                self.trace.emit("planned", node=new.id, tool=new.tool, attempt=attempt,
                                message=f"inserted before {node.id} by repair")
            self.deps[node.id] = node_dependencies(self.wf, node, self.case)
        except ToolError as e:
            self._give_up(node, e.with_context(node=node.id, tool=node.tool).to_dict(), halted=False)
            return
        self._index_children()
        self._plan_targets()
        self._ensure_loads()
        self.status[node.id] = "pending"
        self.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1)

    def _void_descendants(self, node_id: str) -> None:
        """Submissions chained to a failed node never run: back to pending (resubmitted after a
        patch, blocked after a halt)."""
        for d in self.descendants(node_id):
            if self.status.get(d) == "running":
                self._forget(("node", d, self.gen.get(d)))
                self.status[d] = "pending"
                self.ready_at.pop(d, None)

    def _retry_timeout(self, node: Node, err: dict[str, Any], attempt: int,
                       meta: dict[str, Any] | None = None) -> bool:
        """A timed-out node is re-submitted unchanged once: a hang is most often transient (stuck
        I/O, a wedged worker); a second timeout fails it for good (never repaired)."""
        if self.timeouts.get(node.id, 0) >= _TIMEOUT_RETRIES or attempt >= self.ctx.max_attempts_per_node:
            return False
        self.timeouts[node.id] = self.timeouts.get(node.id, 0) + 1
        self.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                        message=err["message"], duration_s=(meta or {}).get("duration_s"))
        call_hooks(self.hooks, "on_node_end", case=self.case.id, node=node.id, status="failed",
                   duration_s=(meta or {}).get("duration_s"), error=err, attempt=attempt)
        self._void_descendants(node.id)
        self.cancelled.discard(node.id)
        self.ready_at.pop(node.id, None)
        self.status[node.id] = "pending"
        self.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1,
                        message="timed out: re-submitted unchanged")
        return True

    def _halt_case(self, where: str, err: dict[str, Any]) -> None:
        """Stop the whole case: nothing not yet run runs (nothing else is written); the error
        is the case's."""
        for n in self.wf.nodes:
            if self.status[n.id] in ("pending", "running"):
                self._block(n.id, f"the case halted: {err['code']} at {where}")
        ctx = err.get("context", {})
        self.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""), "node": where,
                      "tool": None, "file": ctx.get("file"), "context": ctx,
                      "halt_reason": f"{err['code']} halts at once"}
        self.halted = True

    def _give_up(self, node: Node, err: dict[str, Any], *, halted: bool) -> None:
        """The node failed for good: block its dependents; a required node fails the case."""
        if self.status.get(node.id) == "running":
            self._forget(("node", node.id, self.gen.get(node.id)))
        self.status[node.id] = "failed"
        if node.required and self.error is None:
            ctx = err.get("context", {})
            self.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""),
                          "node": node.id, "tool": node.tool, "file": ctx.get("file"), "context": ctx,
                          "halt_reason": err.get("halt_reason")}
            self.halted = halted
        for d in sorted(self.descendants(node.id), key=self._index):
            if self.status.get(d) in ("pending", "running"):
                self._block(d, f"upstream {node.id} failed ({err['code']})")


__all__ = ["CaseRepair"]
