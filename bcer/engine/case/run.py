"""The state machine of one running case: submit the whole DAG, record results, repair, finish.

All nodes of a case are handed to Ray at once, chained by ObjectRefs (each node also gets its
upstreams' metas), so Ray pipelines them without a driver round trip per step. Results
arrive through the driver's event loop (``engine.loop``), one case or ten thousand:

- a node that succeeded is recorded (its worker already wrote and digested its deliverables);
- a node whose upstream failed did not run (``not_run``): its submission is void;
- a node that failed is described to the repairer (async for an actor); a Patch is applied
  in place and ONLY that node and its not-yet-run descendants are resubmitted, chained to
  the ObjectRefs of the finished upstream results, which are kept; a Halt gives up.

The state is one typed record (``case.state``); submission (``case.submit.Submitter``) and
failure handling (``case.repair.Repair``) are collaborators given this run, not mixins.
A submission carries a generation number: results of an older submission are ignored.

Trace semantics: ``started`` carries the worker's own start time and is written when the
node's result arrives (the driver does not see a task start); ``succeeded`` carries the
worker's end time (``time``) and run time (``duration_s``), so the interval in which a node
really ran is ``[time - duration_s, time]``.
"""
from __future__ import annotations

import logging
import os
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from ...contracts.case import Case
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.task import TaskContract
from ...contracts.workflow import Node, Workflow
from .. import repair as rp
from ..binder import node_dependencies, resolved_ref, sequence_key
from ..context import CaseOutcome, RunContext, error_from_ray
from ..fusion import on_fused_result, submit_fused
from ..outputs import case_records
from ..placement import loader_options
from ..segments import check_segment_deadlines, in_segment, observe, on_segment_result
from ..tokens import parse_token
from ..trace import TraceWriter, call_hooks
from .repair import Repair
from .state import CaseState
from .submit import Submitter

log = logging.getLogger(__name__)
_SEQ_GET_TIMEOUT_S = 30.0  # a sequence already loaded is in shared memory: milliseconds, unless lost
_NO_REPAIR = {ErrorCode.worker_lost.value, ErrorCode.timeout.value}
_HALT_CASE = {ErrorCode.sandbox.value, ErrorCode.input_missing.value}  # an input problem halts the whole case
_BACKSTOP_GRACE_S = 10.0  # beyond a node's limit before the driver kills a task stuck in C code


class CaseRun:
    """One case in flight, driven by an event loop (``watch``/``forget`` register refs).

    ``repairer``: a repairer, a pool of them (``for_case``), None (the registered default pool
    of the run) or False (no repair). ``on_done(run)`` is called once, when the case has
    finished (``run.outcome`` set).
    """

    def __init__(self, workflow: Workflow, case: Case, ctx: RunContext, contract: TaskContract | None,
                 repairer: Any, hooks: list, trace: TraceWriter, loop: Any, cluster: dict[str, float],
                 on_done: Callable[["CaseRun"], None] | None = None):
        from ..sandbox import Sandbox

        # the compiled workflow may be shared by many cases: copied only when a patch changes it
        wf = workflow if workflow.case_id == case.id else workflow.model_copy(update={"case_id": case.id})
        self.state = CaseState(wf, case, ctx, contract, cluster)
        self.hooks, self.trace, self.loop, self.on_done = hooks, trace, loop, on_done
        assets = Path(__file__).resolve().parents[2] / "assets"  # shipped bundles are read-only inputs
        self.read_roots = (str(assets), *map(str, getattr(ctx, "read_roots", ())))
        self.sandbox = Sandbox(case.root, ctx.output_dir, read_roots=self.read_roots)
        self.open: dict[tuple, Any] = {}   # outstanding tag -> ref
        self.clock: Any = None             # the node clock actor (with ``node_timeout_s``)
        self.outcome: CaseOutcome | None = None
        self.sketch: Any = None            # the plan the case was compiled from (kept for its audit)
        self.submitter = Submitter(self)
        self.repair = Repair(self, repairer)

    # the case's fixed facts, read everywhere
    @property
    def case(self) -> Case:
        return self.state.case

    @property
    def ctx(self) -> RunContext:
        return self.state.ctx

    @property
    def wf(self) -> Workflow:
        return self.state.wf

    @property
    def finished(self) -> bool:
        return self.state.finished

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, announce: bool = True, fuse: bool = False, segments: bool = True) -> None:
        """Submit the whole DAG (and one load per sequence), or all of it as one fused task
        when ``fuse`` and the DAG is small and CPU-only (see ``engine.fusion``). With
        ``segments`` each linear chain of CPU nodes runs as one task (``engine.segments``);
        without, every node is its own task."""
        self.state.segment_chains = segments
        if announce:
            self.trace.emit("case_started", message=f"{len(self.wf.nodes)} nodes")
        call_hooks(self.hooks, "on_case_start", case=self.case.id, workflow=self.wf, run_id=self.ctx.run_id)
        self._plan_dependencies()
        self.submitter.plan_targets()
        if not (fuse and submit_fused(self)):
            self.ensure_loads()
            self.submitter.submit_ready()
        self.maybe_done()

    def order(self, tag: tuple) -> int:
        """Dispatch order within one batch of results: loads, then nodes upstream first."""
        if tag[0] == "seq":
            return -1
        if tag[0] in ("node", "seg"):
            return self.state.index(tag[1])
        return 1 << 20

    def dispatch(self, tag: tuple, value: Any, exc: BaseException | None) -> None:
        """A watched ref is ready: route it, resubmit what became ready, finish when done."""
        if self.finished or self.open.get(tag) is None:
            return
        self.open.pop(tag)
        if tag[0] == "seq":
            self._on_seq_result(tag[1], value, exc)
        elif tag[0] == "node":
            self.on_node_result(tag[1], tag[2], value, exc)
        elif tag[0] == "repair":
            self.repair.on_verdict(tag[1], tag[2], value, exc)
        elif tag[0] == "seg":
            on_segment_result(self, tag, value, exc)
        elif tag[0] == "fused":
            on_fused_result(self, value, exc)
        elif tag[0] == "review":
            self._on_reviewed(tag[1], tag[2], value, exc)
        self.submitter.submit_ready()
        self.maybe_done()

    def crash(self, exc: BaseException) -> None:
        """Any exception in this case's handling: the case fails with ``internal``, the rest go on."""
        if self.finished:
            return
        st = self.state
        tb = "".join(traceback.format_exception(exc))[-4000:]
        log.error("case %s crashed in the engine: %s", self.case.id, tb)
        self._forget_all()
        err = {"code": ErrorCode.internal.value, "message": f"engine crashed: {type(exc).__name__}: {exc}",
               "node": None, "tool": None, "hint": "", "context": {}}
        st.error = st.error or err
        self.outcome = CaseOutcome(self.case.id, "failed", err, node_status=st.node_status(),
                                   deliverables=st.deliverable_paths(), repairs=st.repairs,
                                   measurements=dict(st.measurements), workflow=self.wf,
                                   measurement_rows=case_records(st.written),
                                   sr=0 if st.contract is not None else None,
                                   tcr=0.0 if st.contract is not None else None)
        self.trace.emit("case_finished", error_code=err["code"], message=err["message"], data={"traceback": tb})
        self._done()

    def check_deadlines(self, now: float) -> None:
        """Backstop for node time limits (a tool stuck in C code ignores the worker's alarm) and
        the repairer's answer time."""
        import ray

        st = self.state
        if st.fused is not None and ("fused",) in self.open and not st.fused["cancelled"]:
            limit = st.fused["limit"]
            if limit and now - st.fused["t"] > limit + max(_BACKSTOP_GRACE_S, limit) and self.ran_past(
                    {"fused": st.fused.get("clock_key")}, limit).get("fused", True):
                st.fused["cancelled"] = True
                log.warning("case %s: fused task past its %s s limit, cancelling it", self.case.id, limit)
                ray.cancel(self.open[("fused",)], force=True)  # -> the case reruns unfused
        if st.segments:
            check_segment_deadlines(self, now, _BACKSTOP_GRACE_S)
        late: dict[str, float] = {}
        for node_id, s in list(st.nodes.items()):
            if s.ready_at is None or s.status != "running" or s.cancelled:
                continue
            if st.segments and in_segment(self, node_id):
                continue  # its segment's backstop covers it
            limit = st.timeout_of(self.wf.node(node_id))
            if limit and now - s.ready_at > limit + max(_BACKSTOP_GRACE_S, limit):
                late[node_id] = limit
        if late:
            ran = self.ran_past({n: self._clock_key(n) for n in late}, late)
            for node_id, limit in late.items():
                if not ran.get(node_id, True):
                    continue  # still queued for a worker (or within its limit): not hung
                s = st.nodes[node_id]
                s.cancelled = True
                log.warning("case %s node %s: past its %s s limit, cancelling the task", self.case.id, node_id, limit)
                # its result then raises -> timeout (an actor's call cannot be force-cancelled)
                ray.cancel(s.meta_ref, force=not s.served)
        for node_id, s in list(st.nodes.items()):
            if s.repair_asked is None:
                continue
            _t_ask, attempt, _err = s.repair_asked
            if now - _t_ask > self.ctx.reflector_timeout_s:
                self.forget(("repair", node_id, attempt))
                halt = rp.halt_for(node_id, f"reflector gave no answer within {self.ctx.reflector_timeout_s} s")
                self.repair.on_verdict(node_id, attempt, halt, None)
                self.submitter.submit_ready()
                self.maybe_done()

    # ---- node clock (run time, not queue time) -------------------------------------------------
    def _clock_key(self, node_id: str, gen: int | None = None) -> str | None:
        if self.clock is None:
            return None
        s = self.state.nodes.get(node_id)
        return f"{self.case.id}:{node_id}:{(s.gen if s else 0) if gen is None else gen}"

    def clock_fields(self, node_id: str, gen: int) -> dict[str, Any]:
        """What a node task needs to report its start to the clock: with ``node_timeout_s`` a
        node's limit counts from when it starts running, not from when it was submitted (with
        many cases in flight a node may wait in Ray's queue longer than any sensible limit)."""
        if not self.ctx.node_timeout_s:
            return {}
        if self.clock is None:
            from ..clock import node_clock

            self.clock = node_clock()
        return {"clock": self.clock, "clock_key": self._clock_key(node_id, gen)}

    def ran_past(self, keys: dict[str, str | None], limits: dict[str, float] | float) -> dict[str, bool]:
        """For the backstop: which of ``keys`` (name -> clock key) have RUN past their limit plus the
        grace. Without a clock (or for a key it lacks) the time since inputs were ready decides
        (True). A node the clock has not seen start is still queued (False)."""
        asked = {name: key for name, key in keys.items() if key is not None}
        if self.clock is None or not asked:
            return {}
        import ray

        try:
            running = ray.get(self.clock.running_for.remote(list(asked.values())), timeout=10)
        except Exception as e:  # no clock answer: fall back on the time since ready, get a new clock
            log.warning("node clock unavailable (%s); timing nodes from when they were ready", type(e).__name__)
            from ..clock import node_clock

            self.clock = node_clock(fresh=True)
            return {}
        out = {}
        for name, key in asked.items():
            limit = limits if isinstance(limits, (int, float)) else limits[name]
            out[name] = (running.get(key) or 0.0) > limit + _BACKSTOP_GRACE_S
        return out

    # ---- dependencies and loads ----------------------------------------------------------------
    def _plan_dependencies(self) -> None:
        for n in self.wf.nodes:
            s = self.state.nodes[n.id]
            try:
                s.deps = node_dependencies(self.wf, n, self.case)
            except ToolError as e:
                s.attempts += 1
                self.repair.on_failure(n, e.with_context(node=n.id, tool=n.tool).to_dict(), s.attempts)
        self.state.index_children()

    def ensure_loads(self) -> None:
        """One load task per sequence any node needs (also after a patch rebinds a port)."""
        for key in self.state.needed_sequences():
            if self.state.halted:
                return
            seq = self.state.seqs.get(key)
            if seq is None or (seq.ref is None and seq.meta is None):
                self._load_sequence(key)

    def _load_sequence(self, key: str) -> None:
        from ..remote import remote_loader, submit

        ref = resolved_ref(self.case, key)
        seq = self.state.seq(key)
        try:
            self.sandbox.check_read(ref.path)
            if not os.path.exists(ref.path):  # checked before any node runs: a halt leaves nothing half-made
                raise ToolError(ErrorCode.input_missing, f"sequence {key} of case {self.case.id} is listed but "
                                f"{ref.path} does not exist", hint="restore the file or drop the sequence")
        except ToolError as e:
            seq.meta = {"ok": False, "error": e.with_context(file=ref.path).to_dict()}
            self.on_seq_failed(key)
            return
        opts = loader_options(self.case.id, key, self.ctx.loader_num_cpus, self.ctx.task_max_retries)
        art, meta = submit(remote_loader(), opts, ref)
        seq.ref, seq.meta_ref = (art, ()), meta
        self.watch(("seq", key), meta)

    # ---- results ------------------------------------------------------------------------------
    def _on_seq_result(self, key: str, meta: Any, exc: BaseException | None) -> None:
        if exc is not None:
            meta = {"ok": False, "error": error_from_ray(exc)}
        self.state.seq(key).meta = meta
        if not meta.get("ok"):
            self.on_seq_failed(key)
            return
        for n in self.state.consumers(key):
            s = self.state.nodes[n]
            if s.status == "running" and self.state.inputs_ready(n) and s.ready_at is None:
                s.ready_at = time.time()

    def on_seq_failed(self, key: str) -> None:
        err = dict(self.state.seq_meta(key)["error"])
        err["context"] = dict(err.get("context", {}), sequence=key)
        self.trace.emit("failed", node=f"seq.{key}", tool="io.load_sequence", error_code=err["code"],
                        message=err["message"])
        if err["code"] in _HALT_CASE:  # reading outside the case or a missing input halts the whole case
            self.repair.halt_case(f"seq.{key}", err)
            return
        for n in self.state.consumers(key):
            if self.state.nodes[n].status in ("pending", "running"):
                self.repair.give_up(self.wf.node(n), err, halted=False)

    def on_node_result(self, node_id: str, gen: int | None, meta: Any, exc: BaseException | None) -> None:
        s = self.state.nodes.get(node_id)
        if s is None or s.status != "running" or s.gen != gen:
            return  # a void submission (upstream failed, patched or given up since)
        node = self.state.node(node_id)
        if exc is not None:
            err = error_from_ray(exc)
            if not self.state.inputs_ready(node_id):
                return  # Ray passed an upstream's failure along: that node's result decides
            if s.cancelled:
                limit = self.state.timeout_of(node)
                err = ToolError(ErrorCode.timeout, f"{node.tool} ran past its time limit of {limit} s and was "
                                "cancelled", node=node_id, tool=node.tool).to_dict()
                self.trace.emit("timeout", node=node_id, tool=node.tool, message=err["message"],
                                data={"limit_s": limit, "cancelled": True})
            s.attempts += 1
            if err["code"] == ErrorCode.timeout.value and self.repair.retry_timeout(node, err, s.attempts):
                return
            self.repair.on_failure(node, err, s.attempts, repairable=err["code"] not in _NO_REPAIR)
            return
        if meta.get("not_run"):
            return  # its upstream failed; repairing that upstream resubmits this node
        s.attempts += 1
        attempt = s.attempts
        self.trace.emit("started", time=meta["t_start"], node=node_id, tool=node.tool, attempt=attempt,
                        args_digest=meta.get("args_digest"))
        call_hooks(self.hooks, "on_node_start", case=self.case.id, node=node_id, attempt=attempt, tool=node.tool)
        if not meta.get("ok"):
            err = meta["error"]
            if err["code"] == ErrorCode.timeout.value:
                self.trace.emit("timeout", node=node_id, tool=node.tool, attempt=attempt,
                                message=err["message"], data={"limit_s": self.state.timeout_of(node)})
                if self.repair.retry_timeout(node, err, attempt, meta):
                    return
            repairable = err["code"] not in _NO_REPAIR and meta.get("phase") != "write"
            self.repair.on_failure(node, err, attempt, repairable=repairable, meta=meta)
            return
        self._on_success(node, meta, attempt)

    def _on_success(self, node: Node, meta: dict[str, Any], attempt: int) -> None:
        st, s = self.state, self.state.nodes[node.id]
        s.status = "succeeded"
        cache = meta.get("cache") or {}
        rec = s.record
        rec.update(output_digests=meta["output_digests"], duration_s=round(meta["duration_s"], 4),
                   worker=f"{meta['worker']}:{meta['pid']}", input_digests=self._input_digests(node))
        if meta.get("method_card"):  # which method made this node's numbers (bcer.tools.methods)
            rec["method"] = meta["method_card"]
        if meta.get("flags"):  # e.g. low_confidence, near_tie: shown on the case page
            rec["flags"] = meta["flags"]
        if cache:
            rec["cache"] = {"key": cache["key"], "hit": bool(cache.get("hit")),
                            **({"stored_by": cache["stored_by"]} if cache.get("hit") else {})}
        if not cache.get("hit"):
            observe(node.tool, node.version, meta.get("run_s", meta["duration_s"]))  # the segment policy's cost model
        if cache.get("hit"):
            st.cache_hits += 1
            self.trace.emit("cache_hit", node=node.id, tool=node.tool, attempt=attempt,
                            data={"key": cache["key"], "stored_by": cache.get("stored_by")})
        where = {k: meta[k] for k in ("node_id", "gpu_ids", "actor") if meta.get(k) is not None}
        if where.get("gpu_ids") is not None or where.get("actor"):  # GPU placement, auditable per node
            rec["placement"] = where
            rec["device"] = meta["device"]  # an actor runs on its own device (CPU on a simulated GPU)
        self.trace.emit("succeeded", time=meta["t_end"], node=node.id, tool=node.tool, attempt=attempt,
                        duration_s=meta["duration_s"], worker=rec["worker"], message=f"device={meta['device']}",
                        data=rec.get("placement"))
        if cache.get("stored"):
            self.trace.emit("cache_stored", node=node.id, tool=node.tool, attempt=attempt,
                            data={"key": cache["key"], **({"replaced_corrupt": cache["replaced_corrupt"]}
                                                         if cache.get("replaced_corrupt") else {})})
        call_hooks(self.hooks, "on_node_end", case=self.case.id, node=node.id, status="succeeded",
                   duration_s=meta["duration_s"], error=None, attempt=attempt)
        if node.milestone and node.milestone not in st.milestones:
            st.milestones.append(node.milestone)
        for name, w in (meta.get("written") or {}).items():
            st.written[name] = w
            self.trace.emit("deliverable", node=node.id, tool=node.tool, message=Path(w["files"][0]).name)
        st.measurements.update(meta.get("measurements") or {})
        for w in self.submitter.reviewed_writes(node):  # R4: the driver reviews the report, then writes it
            from ..review import submit_review

            self.watch(("review", node.id, w["name"]), submit_review(self, node, w))
        now = time.time()
        for c in s.children:
            cs = st.nodes.get(c)
            if cs is not None and cs.status == "running" and st.inputs_ready(c) and cs.ready_at is None:
                cs.ready_at = now

    def _input_digests(self, node: Node) -> dict[str, str | None]:
        digests: dict[str, str | None] = {}
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                digests[port] = self.state.seq_meta(sequence_key(self.case, tok.name) or "").get("sha256")
            else:
                up = self.state.nodes.get(tok.name)
                digests[port] = ((up.record if up is not None else None) or {}).get("output_digests", {}).get(tok.field)
        return digests

    def block(self, node_id: str, why: str) -> None:
        n, s = self.wf.node(node_id), self.state.nodes[node_id]
        if s.status == "running":
            self.forget(("node", node_id, s.gen))
        s.status = "blocked"
        self.trace.emit("blocked", node=node_id, tool=n.tool, message=why)
        if n.required and self.state.error is None:
            self.state.error = {"code": ErrorCode.input_missing.value, "message": f"{node_id} blocked: {why}",
                                "node": node_id, "tool": n.tool}

    # ---- refs ---------------------------------------------------------------------------------
    def watch(self, tag: tuple, ref: Any) -> None:
        self.open[tag] = ref
        self.loop.watch(ref, self, tag)

    def forget(self, tag: tuple) -> None:
        ref = self.open.pop(tag, None)
        if ref is not None:
            self.loop.unwatch(ref)

    def _forget_all(self) -> None:
        for tag in list(self.open):
            self.forget(tag)

    # ---- values, reviewed reports, finishing --------------------------------------------------
    def fetch(self, node_id: str, field: str) -> Any:
        """The value of a node's output field (from the object store; blocks until it exists)."""
        import ray

        from ..noderun import _pluck

        ref, path = self.state.nodes[node_id].refs[field]
        return _pluck(ray.get(ref), tuple(path))

    def _on_reviewed(self, node_id: str, name: str, value: Any, exc: BaseException | None) -> None:
        node = self.state.node(node_id)
        if exc is None:
            written, measurements = value
            self.state.written[name] = written
            self.state.measurements.update(measurements)
            self.trace.emit("deliverable", node=node.id, tool=node.tool, message=Path(written["files"][0]).name)
            return
        err = (exc.to_dict() if isinstance(exc, ToolError) else
               ToolError(ErrorCode.internal, f"writing the reviewed report failed: {type(exc).__name__}: {exc}",
                         node=node_id, tool=node.tool).to_dict())
        self.trace.emit("failed", node=node_id, tool=node.tool, error_code=err["code"], message=err["message"])
        self.repair.give_up(node, err, halted=False)

    def loaded_sequence(self, key: str) -> Any | None:
        """The artifact this case's load task left in the object store for ``key``: what the
        plausibility checks read instead of decoding the file again (None: not loaded here,
        its load failed, or the object is gone)."""
        seq = self.state.seqs.get(key)
        if seq is None or seq.ref is None or not seq.ok:
            return None
        import ray

        try:
            return ray.get(seq.ref[0], timeout=_SEQ_GET_TIMEOUT_S)
        except Exception as e:  # lost with its node, or not retrievable in time: the checks read the file
            log.info("case %s: sequence %s not in the object store (%s); reading its file", self.case.id, key, e)
            return None

    def maybe_done(self) -> None:
        if self.finished or self.open:
            return
        for n in self.wf.nodes:
            if self.state.nodes[n.id].status in ("pending", "running", "repairing"):
                self.block(n.id, "its inputs never became available")
        from .finish import finish_case

        if self.clock is not None:
            try:
                self.clock.forget.remote(f"{self.case.id}:")
            except Exception:  # a lost clock forgets by itself
                pass
        self.outcome = finish_case(self, CaseOutcome)
        self.outcome.cache_hits = self.state.cache_hits
        self._done()

    def _done(self) -> None:
        self.state.finished = True
        self.outcome.duration_s = time.time() - self.state.t0
        self.outcome.repairs = self.state.repairs
        call_hooks(self.hooks, "on_case_end", case=self.case.id, outcome=self.outcome)
        if self.on_done is not None:
            self.on_done(self)


__all__ = ["CaseRun"]
