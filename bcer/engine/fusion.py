"""Fusing a small case's whole DAG into one Ray task (what wide cohorts of tiny cases need).

With thousands of small cases the cluster is kept busy by running cases side by side, not
by the branches of one case, and what sets the pace is the per-task cost: a submission, a
scheduling round, an argument resolution per node and per sequence. A fused task loads the
case's sequences and runs its nodes in topological order in one worker, through exactly the
same per-node code as an unfused node (``noderun.execute_node``: cache, time limit,
deliverable writes, digests), and returns one meta per node and per load, so the driver
records the same per-node events and provenance as for separate tasks.

When every node succeeds the task returns no artifact at all (the deliverables are already
written). When one fails, its descendants do not run (as unfused) and the task also returns
every artifact it made, so the driver can repair the failed node and resubmit only it and its
descendants as ordinary tasks, bound to those kept results. A fused task that Ray gives up
on (worker lost, cancelled at its time limit) makes the driver rerun the case unfused.

``wide_enough`` and ``fusable`` are the "auto" policy of the cohort runner.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

from ..contracts.errors import ToolError
from .binder import resolved_ref
from .context import error_from_ray
from .placement import fused_options, place

log = logging.getLogger(__name__)

MAX_FUSED_NODES = 64


CASES_PER_CPU = 8


def wide_enough(n_cases: int, cluster_cpus: float) -> bool:
    """Enough cases to fill the cluster many times over without the parallelism inside one
    case. With few cases per CPU the longest case sets the end of the run, and running its
    branches side by side matters more than the per-task cost (the full-size nine-task bench,
    9 heavy cases on 2 CPUs, was slower fused)."""
    return n_cases >= CASES_PER_CPU * max(1.0, cluster_cpus)


def fusable(placements: list[Any]) -> bool:
    """A small DAG whose every node runs on CPU here (GPU nodes keep their own placement)."""
    return 0 < len(placements) <= MAX_FUSED_NODES and all(p.num_gpus == 0 for p in placements)


# ---- driver side: a CaseRun's fused submission and its result ------------------------------------

def submit_fused(run: Any) -> bool:
    """The whole case as one task (loads and nodes in one worker); False when it cannot be
    fused (a node failed planning, runs on GPU, or the DAG is large): submit it unfused."""
    from .models import serving
    from .remote import remote_fused, submit

    st, sub = run.state, run.submitter
    if st.error is not None or any(s.status != "pending" for s in st.nodes.values()):
        return False
    if any(sub.reviewed_writes(n) for n in st.wf.nodes):  # a report the driver reviews (R4) before writing
        return False
    if any(serving(st.ctx.model_server, n.tool, n.params) for n in st.wf.nodes):
        return False  # a node a model actor serves runs there, never inside a fused task
    try:
        placed = [(n, place(n, st.cluster, st.ctx.device_policy, st.nodes[n.id].device)) for n in st.wf.nodes]
        if not fusable([w for _, w in placed]):
            return False
        specs = [sub.node_spec(n, w.device) for n, w in placed]
        loads = []
        for key in st.needed_sequences():
            ref = resolved_ref(st.case, key)
            run.sandbox.check_read(ref.path)
            if not os.path.exists(ref.path):  # the node-by-node path halts the case before any node runs
                return False
            loads.append((key, ref))
    except ToolError:  # the ordinary path reports it, node by node
        return False
    for n, w in placed:
        if w.fallback:
            run.trace.emit("fallback", node=n.id, tool=n.tool, attempt=1,
                           message=f"{n.tool} runs its CPU path: {w.fallback}")
    for (n, _), spec in zip(placed, specs):
        spec.update(run.clock_fields(n.id, st.nodes[n.id].gen + 1))
    opts = fused_options(st.case.id, st.wf.nodes[0].id, st.wf.nodes[-1].id, [w for _, w in placed],
                         st.ctx.task_max_retries)
    kept, meta = submit(remote_fused(), opts, {"loads": loads, "nodes": specs})
    limits = [st.timeout_of(n) for n, _ in placed]
    st.fused = {"kept": kept, "t": time.time(), "cancelled": False,
                "limit": None if any(x is None for x in limits) else sum(limits),
                "clock_key": specs[0].get("clock_key")}
    for (n, w), spec in zip(placed, specs):
        s = st.nodes[n.id]
        s.gen += 1
        s.status = "running"
        s.record = {"tool": n.tool, "version": n.version, "params": spec["params"],
                    "inputs": dict(n.inputs), "device": w.device, "attempt": 1}
    run.watch(("fused",), meta)
    return True


def on_fused_result(run: Any, meta: Any, exc: BaseException | None) -> None:
    """Record every load and node of a fused task as if each had been its own task."""
    st = run.state
    if exc is not None:  # Ray gave up on it (worker lost after retries, cancelled): rerun unfused
        err = error_from_ray(exc)
        log.warning("case %s: fused task failed (%s): rerunning it node by node", st.case.id, err["message"])
        run.trace.emit("retried", message=f"fused task failed ({err['code']}): rerun node by node",
                       error_code=err["code"])
        for s in st.nodes.values():
            if s.status == "running":
                s.status = "pending"
        st.fused = None
        run.ensure_loads()
        return
    kept = st.fused["kept"]
    for key, m in meta["loads"].items():
        seq = st.seq(key)
        seq.meta = seq.meta_ref = m
        seq.ref = (kept, ("seq", key))
        if not m.get("ok"):
            run.on_seq_failed(key)
    for n in list(st.wf.nodes):
        m = meta["nodes"].get(n.id)
        if m is None:
            continue
        s = st.nodes[n.id]
        s.meta_ref = m
        s.refs = {f: (kept, ("node", n.id, f)) for f in n.outputs}
        run.on_node_result(n.id, s.gen, m, None)


__all__ = ["MAX_FUSED_NODES", "fusable", "on_fused_result", "submit_fused", "wide_enough"]
