"""The state machine of one running case: submit ready nodes, wait, record, repair, write.

Used by ``executor.run_case_workflow``; one CaseRun per case, driven from one thread.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..contracts.artifacts import ArtifactKind, kind_of
from ..contracts.case import Case
from ..contracts.errors import ErrorCode, ToolError
from ..contracts.task import TaskContract
from ..contracts.workflow import Deliverable, Node, Workflow
from ..tools.registry import get_tool, validate_params
from . import outputs as out
from .binder import node_dependencies, place, resolve_params, resolved_ref, runtime_values
from .digest import params_digest
from .tokens import parse_token
from .trace import TraceWriter, call_hooks

log = logging.getLogger(__name__)
_POLL_S = 1.0
_NO_REPAIR = {ErrorCode.worker_lost.value, ErrorCode.timeout.value}
_HALT_CASE = {ErrorCode.sandbox.value, ErrorCode.input_missing.value}
_TIMEOUT_RETRIES = 1


class CaseRun:
    """One case in flight. ``execute()`` returns its CaseOutcome."""

    def __init__(self, workflow: Workflow, case: Case, ctx: Any, contract: TaskContract | None,
                 reflector: Any, hooks: list, trace: TraceWriter):
        import ray

        from .sandbox import Sandbox

        self.wf, self.case, self.ctx, self.contract = workflow.model_copy(deep=True), case, ctx, contract
        self.hooks, self.trace, self.reflector = hooks, trace, reflector
        assets = Path(__file__).resolve().parents[1] / "assets"  # shipped bundles are read-only inputs
        self.sandbox = Sandbox(case.root, ctx.output_dir, read_roots=(assets, *getattr(ctx, "read_roots", ())))
        self.cluster = dict(ray.cluster_resources())  # read once per case (GPU fallback decisions)
        self.status: dict[str, str] = {n.id: "pending" for n in self.wf.nodes}
        self.refs: dict[str, dict[str, Any]] = {}         # node -> field -> ObjectRef
        self.seq_refs: dict[str, Any] = {}                # sequence key -> ObjectRef
        self.seq_meta: dict[str, dict[str, Any]] = {}
        self.inflight: dict[Any, tuple[str, str, int, float]] = {}  # meta ref -> (kind, key, attempt, t)
        self.attempts: dict[str, int] = {}
        self.device_override: dict[str, str] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.written: dict[str, dict[str, Any]] = {}
        self.measurements: dict[str, Any] = {}
        self.milestones: list[str] = []
        self.error: dict[str, Any] | None = None
        self.halted = False
        self.repairs = 0
        self.timeouts: dict[str, int] = {}
        self.clock: Any = None  # the node clock actor, when nodes have a timeout
        self.deps: dict[str, tuple[set[str], set[str]]] = {}

    # ---- the loop -------------------------------------------------------------------------
    def execute(self):
        from .executor import CaseOutcome

        self.trace.emit("case_started", message=f"{len(self.wf.nodes)} nodes")
        call_hooks(self.hooks, "on_case_start", case=self.case.id, workflow=self.wf, run_id=self.ctx.run_id)
        out.write_workflow(self.ctx.output_dir, self.wf)
        self._plan_dependencies()
        self._submit_ready()
        while self.inflight:
            self._wait_once()
            self._submit_ready()
        for n in self.wf.nodes:
            if self.status[n.id] == "pending":
                self._block(n.id, "its inputs never became available")
        return self._finish(CaseOutcome)

    def _wait_once(self) -> None:
        import ray

        done, _ = ray.wait(list(self.inflight), num_returns=1, timeout=_POLL_S)
        if not done:
            self._check_timeouts()
            return
        for ref in done:
            kind, key, attempt, _t = self.inflight.pop(ref)
            if kind == "seq":
                self._on_seq_done(key, ref)
            else:
                self._on_node_done(self.wf.node(key), ref, attempt)

    def _check_timeouts(self) -> None:
        import ray

        limit = self.ctx.node_timeout_s
        if not limit:
            return
        nodes = {ref: f"{self.case.id}:{key}:{attempt}" for ref, (kind, key, attempt, _) in self.inflight.items()
                 if kind == "node"}
        if not nodes:
            return
        try:  # how long each has really run (a node still queued for a worker is not hung)
            running = ray.get(self._clock().running_for.remote(list(nodes.values())), timeout=30)
        except Exception as e:  # no clock answer: time from submission (and get a new clock)
            log.warning("node clock unavailable (%s); timing nodes from submission", type(e).__name__)
            running = {k: time.time() - self.inflight[r][3] for r, k in nodes.items()}
            from .clock import node_clock

            self.clock = node_clock(fresh=True)
        for ref, key in nodes.items():
            if (running.get(key) or 0.0) > limit:
                ray.cancel(ref, force=True)  # result then raises TaskCancelledError -> timeout

    def _clock(self):
        if self.clock is None:
            from .clock import node_clock

            self.clock = node_clock()
        return self.clock

    # ---- dependencies and submission -------------------------------------------------------
    def _plan_dependencies(self) -> None:
        for n in self.wf.nodes:
            try:
                self.deps[n.id] = node_dependencies(self.wf, n, self.case)
            except ToolError as e:
                self._on_failure(n, e.with_context(node=n.id, tool=n.tool).to_dict(), 1)
        self._ensure_loads()

    def _ensure_loads(self) -> None:
        """One load task per sequence any node needs (also after a patch rebinds a port)."""
        for key in sorted({s for _, seqs in self.deps.values() for s in seqs}):
            if key not in self.seq_refs and key not in self.seq_meta:
                self._load_sequence(key)

    def _load_sequence(self, key: str) -> None:
        ref = resolved_ref(self.case, key)
        try:
            self.sandbox.check_read(ref.path)
            if not os.path.exists(ref.path):  # checked here, before any node runs (a halt leaves nothing)
                raise ToolError(ErrorCode.input_missing, f"sequence {key} of case {self.case.id} is listed but "
                                f"{ref.path} does not exist", hint="restore the file or drop the sequence")
        except ToolError as e:
            self.seq_meta[key] = {"ok": False, "error": e.with_context(file=ref.path).to_dict()}
            self._on_seq_failed(key)
            return
        from .executor import _remote_loader

        art, meta = _remote_loader().options(name=f"{self.case.id}:seq:{key}",
                                            num_cpus=self.ctx.loader_num_cpus).remote(ref)
        self.seq_refs[key] = art
        self.inflight[meta] = ("seq", key, 1, time.time())

    def _ready(self, node_id: str) -> bool:
        if self.status[node_id] != "pending" or node_id not in self.deps:
            return False
        nodes, seqs = self.deps[node_id]
        return (all(self.status.get(u) == "succeeded" for u in nodes)
                and all(self.seq_meta.get(s, {}).get("ok") for s in seqs))

    def _submit_ready(self) -> None:
        # repeat: a node that fails at submission and is patched becomes ready again at once
        progressed = True
        while progressed:
            progressed = False
            for n in self.wf.nodes:
                if self._ready(n.id):
                    self._submit(n)
                    progressed = True

    def _submit(self, node: Node) -> None:
        from .executor import _remote_node

        attempt = self.attempts[node.id] = self.attempts.get(node.id, 0) + 1
        self.status[node.id] = "running"
        try:
            where = place(node, self.cluster, self.ctx.device_policy, self.device_override.get(node.id))
        except ToolError as e:  # no GPU for a GPU-only tool: fail now, never pend forever
            self._on_failure(node, e.to_dict(), attempt, repairable=False)
            return
        try:
            runtime = runtime_values(self.ctx.output_dir, where.device, self.ctx.seed, self.ctx.run_id)
            params = resolve_params(node.params, self.case, runtime)
            validate_params(node.tool, params)
            reg = get_tool(node.tool)
            params = self.sandbox.check_args(params, reg.params_model)  # path params come back resolved
            ports, args = self._bind(node)
            fn = reg.fn
            module, module_file = fn.__module__, getattr(sys.modules.get(fn.__module__), "__file__", "") or ""
        except ToolError as e:
            self._on_failure(node, e.with_context(node=node.id, tool=node.tool).to_dict(), attempt)
            return
        if where.fallback:
            self.trace.emit("fallback", node=node.id, tool=node.tool, attempt=attempt,
                            message=f"{node.tool} runs its CPU path: {where.fallback}")
        opts = dict(num_cpus=where.num_cpus, num_gpus=where.num_gpus, name=f"{self.case.id}:{node.id}:{node.tool}",
                    num_returns=len(node.outputs) + 1, max_retries=self.ctx.task_max_retries,
                    retry_exceptions=False)
        if where.memory:
            opts["memory"] = where.memory
        spec = {"tool": node.tool, "module": module, "node": node.id, "case": self.case.id, "ports": ports,
                "module_file": module_file,
                "params": params, "device": where.device, "outputs": list(node.outputs)}
        if self.ctx.node_timeout_s:
            spec.update(clock=self._clock(), clock_key=f"{self.case.id}:{node.id}:{attempt}")
        refs = _remote_node().options(**opts).remote(spec, *args)
        self.refs[node.id] = dict(zip(node.outputs, refs[:-1]))
        self.inflight[refs[-1]] = ("node", node.id, attempt, time.time())
        self.records[node.id] = {"tool": node.tool, "version": node.version, "params": params,
                                 "inputs": dict(node.inputs), "device": where.device, "attempt": attempt}
        self.trace.emit("started", node=node.id, tool=node.tool, attempt=attempt,
                        args_digest=params_digest(node.inputs, params))
        call_hooks(self.hooks, "on_node_start", case=self.case.id, node=node.id, attempt=attempt, tool=node.tool)

    def _bind(self, node: Node) -> tuple[list[tuple[str, tuple[str, ...]]], list[Any]]:
        """(port, subfield path) pairs and the ObjectRefs passed as top-level args (Ray resolves those)."""
        ports, args = [], []
        _, seqs = self.deps[node.id]
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                from .binder import sequence_key

                ports.append((port, ()))
                args.append(self.seq_refs[sequence_key(self.case, tok.name)])
            else:
                if tok.field not in self.refs.get(tok.name, {}):
                    raise ToolError(ErrorCode.bad_reference, f"node {tok.name} has no output {tok.field!r}",
                                    hint=f"valid: {sorted(self.refs.get(tok.name, {}))}", arg=port)
                ports.append((port, tuple(tok.path[1:])))
                args.append(self.refs[tok.name][tok.field])
        return ports, args

    # ---- results ---------------------------------------------------------------------------
    def _on_seq_done(self, key: str, ref: Any) -> None:
        import ray

        try:
            meta = ray.get(ref)
        except Exception as e:
            from .executor import error_from_ray

            meta = {"ok": False, "error": error_from_ray(e)}
        self.seq_meta[key] = meta
        if not meta.get("ok"):
            self._on_seq_failed(key)

    def _on_seq_failed(self, key: str) -> None:
        err = dict(self.seq_meta[key]["error"])
        err["context"] = dict(err.get("context", {}), sequence=key)
        self.trace.emit("failed", node=f"seq.{key}", tool="io.load_sequence", error_code=err["code"],
                        message=err["message"])
        if err["code"] in _HALT_CASE:  # a case reading outside its root or missing data halts whole
            self._halt_case(f"seq.{key}", err)
            return
        for n in self.wf.nodes:
            if key in self.deps.get(n.id, (set(), set()))[1] and self.status[n.id] == "pending":
                self._give_up(n, err, halted=False)

    def _on_node_done(self, node: Node, ref: Any, attempt: int) -> None:
        import ray

        try:
            meta = ray.get(ref)
        except Exception as e:  # Ray gave up (worker lost after retries, OOM-killed, cancelled)
            from .executor import error_from_ray

            err = error_from_ray(e)
            if err["code"] == ErrorCode.timeout.value and self._retry_timeout(node, err, attempt):
                return
            self._on_failure(node, err, attempt, repairable=err["code"] not in _NO_REPAIR)
            return
        if not meta.get("ok"):
            self._on_failure(node, meta["error"], attempt, meta=meta)
            return
        self._on_success(node, meta, attempt)

    def _on_success(self, node: Node, meta: dict[str, Any], attempt: int) -> None:
        self.status[node.id] = "succeeded"
        rec = self.records[node.id]
        rec.update(output_digests=meta["output_digests"], duration_s=round(meta["duration_s"], 4),
                   worker=f"{meta['worker']}:{meta['pid']}", input_digests=self._input_digests(node))
        self.trace.emit("succeeded", time=meta["t_end"], node=node.id, tool=node.tool, attempt=attempt,
                        duration_s=meta["duration_s"], worker=rec["worker"],
                        message=f"device={meta['device']}")
        call_hooks(self.hooks, "on_node_end", case=self.case.id, node=node.id, status="succeeded",
                   duration_s=meta["duration_s"], error=None, attempt=attempt)
        if node.milestone and node.milestone not in self.milestones:
            self.milestones.append(node.milestone)
        try:
            self._write_outputs(node)
        except ToolError as e:
            self._give_up(node, e.with_context(node=node.id, tool=node.tool).to_dict(), halted=False)
        except OSError as e:
            err = ToolError(ErrorCode.internal, f"cannot write outputs of {node.id}: {e}", node=node.id)
            self._give_up(node, err.to_dict(), halted=False)

    def _input_digests(self, node: Node) -> dict[str, str | None]:
        from .binder import sequence_key

        digests: dict[str, str | None] = {}
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                digests[port] = self.seq_meta.get(sequence_key(self.case, tok.name) or "", {}).get("sha256")
            else:
                digests[port] = self.records.get(tok.name, {}).get("output_digests", {}).get(tok.field)
        return digests

    # ---- failures and repair ---------------------------------------------------------------
    def _on_failure(self, node: Node, err: dict[str, Any], attempt: int, *, repairable: bool = True,
                    meta: dict[str, Any] | None = None) -> None:
        err = dict(err)
        self.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                        message=err["message"], duration_s=(meta or {}).get("duration_s"))
        call_hooks(self.hooks, "on_node_end", case=self.case.id, node=node.id, status="failed",
                   duration_s=(meta or {}).get("duration_s"), error=err, attempt=attempt)
        if not repairable or attempt >= self.ctx.max_attempts_per_node:
            self._give_up(node, err, halted=False)
            return
        from .repair import ask_reflector

        verdict = ask_reflector(self, node, err, attempt)
        if verdict is None or not hasattr(verdict, "inputs"):
            reason = getattr(verdict, "reason", "no reflector available")
            err["halt_reason"] = reason
            self._give_up(node, err, halted=verdict is not None)
            return
        self._apply_patch(node, verdict, attempt)

    def _apply_patch(self, node: Node, patch: Any, attempt: int) -> None:
        """Patch the running node in place; it is resubmitted by ``_submit_ready`` as soon as
        its (possibly rebound) inputs exist. Finished upstream results are kept. An inserted
        node joins the workflow before it; a skipped optional node blocks only its optional
        dependents (the Reflector refuses a skip that a required node depends on)."""
        from .repair import apply_patch

        inserted = apply_patch(self.wf, node, patch, self.device_override)
        self.repairs += 1
        self.trace.emit("repaired", node=node.id, tool=node.tool, attempt=attempt,
                        patch=patch.model_dump(mode="json"), message=getattr(patch, "reason", ""))
        if getattr(patch, "action", "retry") == "skip":
            self.status[node.id] = "skipped"
            self.trace.emit("skipped", node=node.id, tool=node.tool, attempt=attempt,
                            message=getattr(patch, "reason", ""))
            for d in sorted(self.wf.downstream(node.id)):
                if self.status.get(d) == "pending":
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
        self._ensure_loads()
        self.status[node.id] = "pending"
        self.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1)

    def _retry_timeout(self, node: Node, err: dict[str, Any], attempt: int) -> bool:
        """A timed-out node (cancelled) is re-submitted unchanged once: a hang is most often
        transient (stuck I/O, a wedged worker); a second timeout fails it for good."""
        if self.timeouts.get(node.id, 0) >= _TIMEOUT_RETRIES or attempt >= self.ctx.max_attempts_per_node:
            return False
        self.timeouts[node.id] = self.timeouts.get(node.id, 0) + 1
        self.trace.emit("failed", node=node.id, tool=node.tool, attempt=attempt, error_code=err["code"],
                        message=err["message"])
        self.trace.emit("retried", node=node.id, tool=node.tool, attempt=attempt + 1,
                        message="timed out: re-submitted unchanged")
        self.status[node.id] = "pending"
        return True

    def _halt_case(self, where: str, err: dict[str, Any]) -> None:
        """Stop the case: no pending node runs (nothing else is written); the error is the case's."""
        for n in self.wf.nodes:
            if self.status[n.id] == "pending":
                self._block(n.id, f"the case halted: {err['code']} at {where}")
        ctx = err.get("context", {})
        self.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""), "node": where,
                      "tool": None, "file": ctx.get("file"), "context": ctx, "halt_reason": f"{err['code']} halts at once"}
        self.halted = True

    def _give_up(self, node: Node, err: dict[str, Any], *, halted: bool) -> None:
        """The node failed for good: block its dependents; a required node fails the case."""
        self.status[node.id] = "failed"
        if node.required and self.error is None:
            ctx = err.get("context", {})
            self.error = {"code": err["code"], "message": err["message"], "hint": err.get("hint", ""),
                          "node": node.id, "tool": node.tool, "file": ctx.get("file"), "context": ctx,
                          "halt_reason": err.get("halt_reason")}
            self.halted = halted
        for d in sorted(self.wf.downstream(node.id)):
            if self.status.get(d) == "pending":
                self._block(d, f"upstream {node.id} failed ({err['code']})")

    def _block(self, node_id: str, why: str) -> None:
        n = self.wf.node(node_id)
        self.status[node_id] = "blocked"
        self.trace.emit("blocked", node=node_id, tool=n.tool, message=why)
        if n.required and self.error is None:
            self.error = {"code": ErrorCode.input_missing.value, "message": f"{node_id} blocked: {why}",
                          "node": node_id, "tool": n.tool}

    # ---- writing ---------------------------------------------------------------------------
    def _targets(self) -> list[Deliverable]:
        """Deliverables of the workflow; without any, the outputs of its sink nodes."""
        if self.wf.deliverables or self.contract is not None:
            return list(self.wf.deliverables)
        g = self.wf.to_networkx()
        return [Deliverable(name=f"{n.id}.{f}" if len(n.outputs) > 1 else n.id, node=n.id, field=f,
                            file=f"{n.id}_{f}" if len(n.outputs) > 1 else n.id)
                for n in self.wf.nodes if g.out_degree(n.id) == 0 for f in n.outputs]

    def _write_outputs(self, node: Node) -> None:
        import ray

        for d in self._targets():
            if d.node != node.id:
                continue
            art = ray.get(self.refs[node.id][d.field])
            if kind_of(art) == ArtifactKind.report:  # R4 review seam (engine/review.py)
                from .review import review_in_run

                art = review_in_run(self, node, art)
            name = d.file if Path(d.file).suffix else out.default_file(d.file, kind_of(art))
            files = out.write_artifact(art, self.sandbox.check_write(self.ctx.output_dir / name))
            self.written[d.name] = {"node": node.id, "field": d.field, "files": [str(f) for f in files],
                                    "artifact_digest": self.records[node.id]["output_digests"].get(d.field)}
            self.measurements.update(out.measurements_of(d.name, art))
            self.trace.emit("deliverable", node=node.id, tool=node.tool, message=str(files[0].name))
        if self.ctx.write_intermediates:
            for f, ref in self.refs[node.id].items():
                art = ray.get(ref)
                target = self.ctx.output_dir / "intermediates" / out.default_file(f"{node.id}_{f}", kind_of(art))
                out.write_artifact(art, self.sandbox.check_write(target))

    def deliverable_paths(self) -> dict[str, Path]:
        return {k: Path(v["files"][0]) for k, v in self.written.items()}

    def _finish(self, outcome_cls: type):
        from .finish import finish_case

        if self.clock is not None:
            self.clock.forget.remote(f"{self.case.id}:")
        return finish_case(self, outcome_cls)
