"""The state machine of one running case: submit the whole DAG, record results, repair, finish.

All nodes of a case are handed to Ray at once, chained by ObjectRefs (each node also gets its
upstreams' metas), so Ray pipelines them without a driver round trip per step. Results
arrive through the driver's event loop (``engine.loop``), one case or ten thousand:

- a node that succeeded is recorded (its worker already wrote and digested its deliverables);
- a node whose upstream failed did not run (``not_run``): its submission is void;
- a node that failed is described to the repairer (async for an actor); a Patch is applied
  in place and ONLY that node and its not-yet-run descendants are resubmitted, chained to
  the ObjectRefs of the finished upstream results, which are kept; a Halt gives up.

Node states: ``pending`` (not submitted) -> ``running`` (submitted, result awaited) ->
``succeeded`` | ``failed`` | ``blocked`` | ``skipped``; ``repairing`` while a verdict is awaited.
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

from ...contracts.artifacts import ArtifactKind
from ...contracts.case import Case
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.task import TaskContract
from ...contracts.workflow import Deliverable, Node, Workflow
from ...tools.registry import get_tool
from .. import repair as rp
from ..binder import node_dependencies, resolved_ref, sequence_key
from .repair import CaseRepair
from .submit import CaseSubmit
from ..context import CaseOutcome, RunContext, error_from_ray
from ..fusion import on_fused_result, submit_fused
from ..outputs import case_records
from ..segments import check_segment_deadlines, in_segment, observe, on_segment_result
from ..placement import loader_options
from ..tokens import parse_token
from ..trace import TraceWriter, call_hooks

log = logging.getLogger(__name__)
_SEQ_GET_TIMEOUT_S = 30.0  # a sequence already loaded is in shared memory: milliseconds, unless lost
_NO_REPAIR = {ErrorCode.worker_lost.value, ErrorCode.timeout.value}
_HALT_CASE = {ErrorCode.sandbox.value, ErrorCode.input_missing.value}  # an input problem halts the whole case
_BACKSTOP_GRACE_S = 10.0  # beyond a node's limit before the driver kills a task stuck in C code


class CaseRun(CaseRepair, CaseSubmit):
    """One case in flight, driven by an event loop (``watch``/``unwatch`` register refs).

    ``repairer``: a repairer, a pool of them (``for_case``), None (the registered default pool
    of the run) or False (no repair). ``on_done(run)`` is called once, when the case has
    finished (``run.outcome`` set).
    """

    def __init__(self, workflow: Workflow, case: Case, ctx: RunContext, contract: TaskContract | None,
                 repairer: Any, hooks: list, trace: TraceWriter, loop: Any, cluster: dict[str, float],
                 on_done: Callable[["CaseRun"], None] | None = None):
        from ..sandbox import Sandbox

        # the compiled workflow may be shared by many cases: copied only when a patch changes it
        self.wf = workflow if workflow.case_id == case.id else workflow.model_copy(update={"case_id": case.id})
        self._own_wf = False
        self.case, self.ctx, self.contract = case, ctx, contract
        self.hooks, self.trace, self.loop, self.cluster = hooks, trace, loop, cluster
        self.repairer, self.on_done = repairer, on_done  # a repairer, a pool, None (default) or False
        self._resolved_repairer: Any = None
        assets = Path(__file__).resolve().parents[2] / "assets"  # shipped bundles are read-only inputs
        self.read_roots = (str(assets), *map(str, getattr(ctx, "read_roots", ())))
        self.sandbox = Sandbox(case.root, ctx.output_dir, read_roots=self.read_roots)
        self.status: dict[str, str] = {n.id: "pending" for n in self.wf.nodes}
        self.gen: dict[str, int] = {}
        self.runs: dict[str, int] = {}                   # real outcomes per node (the attempt count)
        self.refs: dict[str, dict[str, Any]] = {}         # node -> field -> ObjectRef
        self.meta_refs: dict[str, Any] = {}
        self.seq_refs: dict[str, Any] = {}                # sequence key -> artifact ObjectRef
        self.seq_meta_refs: dict[str, Any] = {}
        self.seq_meta: dict[str, dict[str, Any]] = {}
        self.open: dict[tuple, Any] = {}                  # outstanding tag -> ref
        self.ready_at: dict[str, float] = {}
        self.cancelled: set[str] = set()
        self.served: set[str] = set()  # nodes whose current submission runs on a model server
        self.repair_asked: dict[str, tuple[float, int, dict[str, Any]]] = {}
        self.device_override: dict[str, str] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.written: dict[str, dict[str, Any]] = {}
        self.measurements: dict[str, Any] = {}
        self.milestones: list[str] = []
        self.error: dict[str, Any] | None = None
        self.halted = False
        self.repairs = 0
        self.cache_hits = 0
        self.deps: dict[str, tuple[set[str], set[str]]] = {}
        self.children: dict[str, set[str]] = {}
        self.targets: dict[str, list[dict[str, str]]] = {}
        self.outcome: CaseOutcome | None = None
        self.fused: dict[str, Any] | None = None
        self.segments: dict[tuple, dict[str, Any]] = {}  # open segment tasks (``engine.segments``)
        self.segment_chains = False                       # fuse linear chains (set by ``start``)
        self.no_segment: set[str] = set()                 # nodes rerun one task each (a segment Ray gave up on)
        self.timeouts: dict[str, int] = {}               # timed-out attempts re-submitted per node
        self.clock: Any = None                            # the node clock actor (with ``node_timeout_s``)
        self.reviewed: dict[str, Any] = {}                # node -> reviewed report (R4, engine.review)
        self._positions: dict[str, int] = {}
        self.finished = False
        self.t0 = time.time()

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, announce: bool = True, fuse: bool = False, segments: bool = True) -> None:
        """Submit the whole DAG (and one load per sequence), or all of it as one fused task
        when ``fuse`` and the DAG is small and CPU-only (see ``engine.fusion``). With
        ``segments`` each linear chain of CPU nodes runs as one task (``engine.segments``);
        without, every node is its own task."""
        self.segment_chains = segments
        if announce:
            self.trace.emit("case_started", message=f"{len(self.wf.nodes)} nodes")
        call_hooks(self.hooks, "on_case_start", case=self.case.id, workflow=self.wf, run_id=self.ctx.run_id)
        self._plan_dependencies()
        self._plan_targets()
        if not (fuse and submit_fused(self)):
            self._ensure_loads()
            self._submit_ready()
        self._maybe_done()

    def order(self, tag: tuple) -> int:
        """Dispatch order within one batch of results: loads, then nodes upstream first."""
        if tag[0] == "seq":
            return -1
        if tag[0] in ("node", "seg"):
            return self._index(tag[1])
        return 1 << 20

    def dispatch(self, tag: tuple, value: Any, exc: BaseException | None) -> None:
        """A watched ref is ready: route it, resubmit what became ready, finish when done."""
        if self.finished or self.open.get(tag) is None:
            return
        self.open.pop(tag)
        if tag[0] == "seq":
            self._on_seq_result(tag[1], value, exc)
        elif tag[0] == "node":
            self._on_node_result(tag[1], tag[2], value, exc)
        elif tag[0] == "repair":
            self._on_verdict(tag[1], tag[2], value, exc)
        elif tag[0] == "seg":
            on_segment_result(self, tag, value, exc)
        elif tag[0] == "fused":
            on_fused_result(self, value, exc)
        elif tag[0] == "review":
            self._on_reviewed(tag[1], tag[2], value, exc)
        self._submit_ready()
        self._maybe_done()

    def crash(self, exc: BaseException) -> None:
        """Any exception in this case's handling: the case fails with ``internal``, the rest go on."""
        if self.finished:
            return
        tb = "".join(traceback.format_exception(exc))[-4000:]
        log.error("case %s crashed in the engine: %s", self.case.id, tb)
        self._forget_all()
        err = {"code": ErrorCode.internal.value, "message": f"engine crashed: {type(exc).__name__}: {exc}",
               "node": None, "tool": None, "hint": "", "context": {}}
        self.error = self.error or err
        self.outcome = CaseOutcome(self.case.id, "failed", err, node_status=dict(self.status),
                                   deliverables=self.deliverable_paths(), repairs=self.repairs,
                                   measurements=dict(self.measurements), workflow=self.wf,
                                   measurement_rows=case_records(self.written),
                                   sr=0 if self.contract is not None else None,
                                   tcr=0.0 if self.contract is not None else None)
        self.trace.emit("case_finished", error_code=err["code"], message=err["message"], data={"traceback": tb})
        self._done()

    def check_deadlines(self, now: float) -> None:
        """Backstop for node time limits (a tool stuck in C code ignores the worker's alarm) and
        the repairer's answer time."""
        import ray

        if self.fused is not None and ("fused",) in self.open and not self.fused["cancelled"]:
            limit = self.fused["limit"]
            if limit and now - self.fused["t"] > limit + max(_BACKSTOP_GRACE_S, limit) and self._ran_past(
                    {"fused": self.fused.get("clock_key")}, limit).get("fused", True):
                self.fused["cancelled"] = True
                log.warning("case %s: fused task past its %s s limit, cancelling it", self.case.id, limit)
                ray.cancel(self.open[("fused",)], force=True)  # -> the case reruns unfused
        if self.segments:
            check_segment_deadlines(self, now, _BACKSTOP_GRACE_S)
        late: dict[str, float] = {}
        for node_id, t_ready in list(self.ready_at.items()):
            if self.status.get(node_id) != "running" or node_id in self.cancelled:
                continue
            if self.segments and in_segment(self, node_id):
                continue  # its segment's backstop covers it
            limit = self._timeout_of(self.wf.node(node_id))
            if limit and now - t_ready > limit + max(_BACKSTOP_GRACE_S, limit):
                late[node_id] = limit
        if late:
            ran = self._ran_past({n: self._clock_key(n) for n in late}, late)
            for node_id, limit in late.items():
                if not ran.get(node_id, True):
                    continue  # still queued for a worker (or within its limit): not hung
                self.cancelled.add(node_id)
                log.warning("case %s node %s: past its %s s limit, cancelling the task", self.case.id, node_id, limit)
                # its result then raises -> timeout (an actor's call cannot be force-cancelled)
                ray.cancel(self.meta_refs[node_id], force=node_id not in self.served)
        for node_id, (t_ask, attempt, _err) in list(self.repair_asked.items()):
            if now - t_ask > self.ctx.reflector_timeout_s:
                self._forget(("repair", node_id, attempt))
                halt = rp.halt_for(node_id, f"reflector gave no answer within {self.ctx.reflector_timeout_s} s")
                self._on_verdict(node_id, attempt, halt, None)
                self._submit_ready()
                self._maybe_done()

    # ---- node clock (run time, not queue time) -------------------------------------------------
    def _clock_key(self, node_id: str, gen: int | None = None) -> str | None:
        if self.clock is None:
            return None
        return f"{self.case.id}:{node_id}:{self.gen.get(node_id, 0) if gen is None else gen}"

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

    def _ran_past(self, keys: dict[str, str | None], limits: dict[str, float] | float) -> dict[str, bool]:
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

    # ---- dependencies --------------------------------------------------------------------------
    def _plan_dependencies(self) -> None:
        for n in self.wf.nodes:
            try:
                self.deps[n.id] = node_dependencies(self.wf, n, self.case)
            except ToolError as e:
                self.runs[n.id] = self.runs.get(n.id, 0) + 1
                self._on_failure(n, e.with_context(node=n.id, tool=n.tool).to_dict(), self.runs[n.id])
        self._index_children()

    def _index_children(self) -> None:
        self.children = {n.id: set() for n in self.wf.nodes}
        for node_id, (ups, _) in self.deps.items():
            for u in ups:
                self.children.setdefault(u, set()).add(node_id)

    def descendants(self, node_id: str) -> set[str]:
        below, todo = set(), [node_id]
        while todo:
            for c in self.children.get(todo.pop(), ()):
                if c not in below:
                    below.add(c)
                    todo.append(c)
        return below | (self.wf.downstream(node_id) if node_id in self.status else set())

    def _ensure_loads(self) -> None:
        """One load task per sequence any node needs (also after a patch rebinds a port)."""
        for key in sorted({s for _, seqs in self.deps.values() for s in seqs}):
            if self.halted:
                return
            if key not in self.seq_refs and key not in self.seq_meta:
                self._load_sequence(key)

    def _load_sequence(self, key: str) -> None:
        from ..remote import remote_loader, submit

        ref = resolved_ref(self.case, key)
        try:
            self.sandbox.check_read(ref.path)
            if not os.path.exists(ref.path):  # checked before any node runs: a halt leaves nothing half-made
                raise ToolError(ErrorCode.input_missing, f"sequence {key} of case {self.case.id} is listed but "
                                f"{ref.path} does not exist", hint="restore the file or drop the sequence")
        except ToolError as e:
            self.seq_meta[key] = {"ok": False, "error": e.with_context(file=ref.path).to_dict()}
            self._on_seq_failed(key)
            return
        opts = loader_options(self.case.id, key, self.ctx.loader_num_cpus, self.ctx.task_max_retries)
        art, meta = submit(remote_loader(), opts, ref)
        self.seq_refs[key], self.seq_meta_refs[key] = (art, ()), meta
        self._watch(("seq", key), meta)

    # ---- results ------------------------------------------------------------------------------
    def _on_seq_result(self, key: str, meta: Any, exc: BaseException | None) -> None:
        if exc is not None:
            meta = {"ok": False, "error": error_from_ray(exc)}
        self.seq_meta[key] = meta
        if not meta.get("ok"):
            self._on_seq_failed(key)
            return
        for n in self._consumers(key):
            if self.status.get(n) == "running" and self._inputs_ready(n):
                self.ready_at.setdefault(n, time.time())

    def _consumers(self, key: str) -> list[str]:
        return [n for n, (_, seqs) in self.deps.items() if key in seqs]

    def _on_seq_failed(self, key: str) -> None:
        err = dict(self.seq_meta[key]["error"])
        err["context"] = dict(err.get("context", {}), sequence=key)
        self.trace.emit("failed", node=f"seq.{key}", tool="io.load_sequence", error_code=err["code"],
                        message=err["message"])
        if err["code"] in _HALT_CASE:  # reading outside the case or a missing input halts the whole case
            self._halt_case(f"seq.{key}", err)
            return
        for n in self._consumers(key):
            if self.status[n] in ("pending", "running"):
                self._give_up(self.wf.node(n), err, halted=False)

    def _on_node_result(self, node_id: str, gen: int, meta: Any, exc: BaseException | None) -> None:
        if self.status.get(node_id) != "running" or self.gen.get(node_id) != gen:
            return  # a void submission (upstream failed, patched or given up since)
        node = self._node(node_id)
        if exc is not None:
            err = error_from_ray(exc)
            if not self._inputs_ready(node_id):
                return  # Ray passed an upstream's failure along: that node's result decides
            if node_id in self.cancelled:
                err = ToolError(ErrorCode.timeout, f"{node.tool} ran past its time limit of "
                                f"{self._timeout_of(node)} s and was cancelled", node=node_id,
                                tool=node.tool).to_dict()
                self.trace.emit("timeout", node=node_id, tool=node.tool, message=err["message"],
                                data={"limit_s": self._timeout_of(node), "cancelled": True})
            self.runs[node_id] = attempt = self.runs.get(node_id, 0) + 1
            if err["code"] == ErrorCode.timeout.value and self._retry_timeout(node, err, attempt):
                return
            self._on_failure(node, err, attempt, repairable=err["code"] not in _NO_REPAIR)
            return
        if meta.get("not_run"):
            return  # its upstream failed; repairing that upstream resubmits this node
        self.runs[node_id] = attempt = self.runs.get(node_id, 0) + 1
        self.trace.emit("started", time=meta["t_start"], node=node_id, tool=node.tool, attempt=attempt,
                        args_digest=meta.get("args_digest"))
        call_hooks(self.hooks, "on_node_start", case=self.case.id, node=node_id, attempt=attempt, tool=node.tool)
        if not meta.get("ok"):
            err = meta["error"]
            if err["code"] == ErrorCode.timeout.value:
                self.trace.emit("timeout", node=node_id, tool=node.tool, attempt=attempt,
                                message=err["message"], data={"limit_s": self._timeout_of(node)})
                if self._retry_timeout(node, err, attempt, meta):
                    return
            repairable = err["code"] not in _NO_REPAIR and meta.get("phase") != "write"
            self._on_failure(node, err, attempt, repairable=repairable, meta=meta)
            return
        self._on_success(node, meta, attempt)

    def _on_success(self, node: Node, meta: dict[str, Any], attempt: int) -> None:
        self.status[node.id] = "succeeded"
        cache = meta.get("cache") or {}
        rec = self.records[node.id]
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
            self.cache_hits += 1
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
        if node.milestone and node.milestone not in self.milestones:
            self.milestones.append(node.milestone)
        for name, w in (meta.get("written") or {}).items():
            self.written[name] = w
            self.trace.emit("deliverable", node=node.id, tool=node.tool, message=Path(w["files"][0]).name)
        self.measurements.update(meta.get("measurements") or {})
        for w in self._reviewed_writes(node):  # R4: the driver reviews the report, then writes it
            from ..review import submit_review

            self._watch(("review", node.id, w["name"]), submit_review(self, node, w))
        now = time.time()
        for c in self.children.get(node.id, ()):
            if self.status.get(c) == "running" and self._inputs_ready(c):
                self.ready_at.setdefault(c, now)

    def _input_digests(self, node: Node) -> dict[str, str | None]:
        digests: dict[str, str | None] = {}
        for port, raw in node.inputs.items():
            tok = parse_token(raw)
            if tok.scope == "seq":
                digests[port] = self.seq_meta.get(sequence_key(self.case, tok.name) or "", {}).get("sha256")
            else:
                digests[port] = self.records.get(tok.name, {}).get("output_digests", {}).get(tok.field)
        return digests

    def _index(self, node_id: str) -> int:
        """Topological position of a node (the node list only changes when a repair inserts one)."""
        if len(self._positions) != len(self.wf.nodes):
            self._positions = {n.id: i for i, n in enumerate(self.wf.nodes)}
        return self._positions.get(node_id, 0)

    def _node(self, node_id: str) -> Node:
        return self.wf.nodes[self._index(node_id)]

    def _block(self, node_id: str, why: str) -> None:
        n = self.wf.node(node_id)
        if self.status.get(node_id) == "running":
            self._forget(("node", node_id, self.gen.get(node_id)))
        self.status[node_id] = "blocked"
        self.trace.emit("blocked", node=node_id, tool=n.tool, message=why)
        if n.required and self.error is None:
            self.error = {"code": ErrorCode.input_missing.value, "message": f"{node_id} blocked: {why}",
                          "node": node_id, "tool": n.tool}

    # ---- refs ---------------------------------------------------------------------------------
    def _watch(self, tag: tuple, ref: Any) -> None:
        self.open[tag] = ref
        self.loop.watch(ref, self, tag)

    def _forget(self, tag: tuple) -> None:
        ref = self.open.pop(tag, None)
        if ref is not None:
            self.loop.unwatch(ref)

    def _forget_all(self) -> None:
        for tag in list(self.open):
            self._forget(tag)

    # ---- writing and finishing ----------------------------------------------------------------
    def _plan_targets(self) -> None:
        """Deliverables of the workflow (without any, the outputs of its sink nodes), per node."""
        targets: dict[str, list[dict[str, str]]] = {}
        for d in self._deliverables():
            targets.setdefault(d.node, []).append({"name": d.name, "field": d.field, "file": d.file})
        self.targets = targets

    def _deliverables(self) -> list[Deliverable]:
        if self.wf.deliverables or self.contract is not None:
            return list(self.wf.deliverables)
        sinks = {n.id for n in self.wf.nodes} - {u for ups, _ in self.deps.values() for u in ups}
        return [Deliverable(name=f"{n.id}.{f}" if len(n.outputs) > 1 else n.id, node=n.id, field=f,
                            file=f"{n.id}_{f}" if len(n.outputs) > 1 else n.id)
                for n in self.wf.nodes if n.id in sinks for f in n.outputs]

    def _reviewed_writes(self, node: Node) -> list[dict[str, str]]:
        """The node's report deliverables when a reviewer is set: the driver reviews (R4) and
        writes them (``engine.review``); the worker writes the others."""
        if getattr(self.ctx, "reviewer", None) is None or node.id not in self.targets:
            return []
        spec = get_tool(node.tool).spec
        return [w for w in self.targets[node.id]
                if (port := spec.output(w["field"])) is not None and port.kind == ArtifactKind.report]

    def _worker_writes(self, node: Node) -> list[dict[str, str]]:
        reviewed = self._reviewed_writes(node)
        return [w for w in self.targets.get(node.id, ()) if w not in reviewed]

    def fetch(self, node_id: str, field: str) -> Any:
        """The value of a node's output field (from the object store; blocks until it exists)."""
        import ray

        from ..noderun import _pluck

        ref, path = self.refs[node_id][field]
        return _pluck(ray.get(ref), tuple(path))

    def _on_reviewed(self, node_id: str, name: str, value: Any, exc: BaseException | None) -> None:
        node = self._node(node_id)
        if exc is None:
            written, measurements = value
            self.written[name] = written
            self.measurements.update(measurements)
            self.trace.emit("deliverable", node=node.id, tool=node.tool, message=Path(written["files"][0]).name)
            return
        err = (exc.to_dict() if isinstance(exc, ToolError) else
               ToolError(ErrorCode.internal, f"writing the reviewed report failed: {type(exc).__name__}: {exc}",
                         node=node_id, tool=node.tool).to_dict())
        self.trace.emit("failed", node=node_id, tool=node.tool, error_code=err["code"], message=err["message"])
        self._give_up(node, err, halted=False)

    def loaded_sequence(self, key: str) -> Any | None:
        """The artifact this case's load task left in the object store for ``key``: what the
        plausibility checks read instead of decoding the file again (None: not loaded here,
        its load failed, or the object is gone)."""
        if key not in self.seq_refs or not self.seq_meta.get(key, {}).get("ok"):
            return None
        import ray

        try:
            return ray.get(self.seq_refs[key][0], timeout=_SEQ_GET_TIMEOUT_S)
        except Exception as e:  # lost with its node, or not retrievable in time: the checks read the file
            log.info("case %s: sequence %s not in the object store (%s); reading its file", self.case.id, key, e)
            return None

    def deliverable_paths(self) -> dict[str, Path]:
        return {k: Path(v["files"][0]) for k, v in self.written.items()}

    def _maybe_done(self) -> None:
        if self.finished or self.open:
            return
        for n in self.wf.nodes:
            if self.status[n.id] in ("pending", "running", "repairing"):
                self._block(n.id, "its inputs never became available")
        from .finish import finish_case

        if self.clock is not None:
            try:
                self.clock.forget.remote(f"{self.case.id}:")
            except Exception:  # a lost clock forgets by itself
                pass
        self.outcome = finish_case(self, CaseOutcome)
        self.outcome.cache_hits = self.cache_hits
        self._done()

    def _done(self) -> None:
        self.finished = True
        self.outcome.duration_s = time.time() - self.t0
        self.outcome.repairs = self.repairs
        call_hooks(self.hooks, "on_case_end", case=self.case.id, outcome=self.outcome)
        if self.on_done is not None:
            self.on_done(self)


__all__ = ["CaseRun"]
