"""Segment fusion: a linear chain of CPU nodes of one case (and its known-tiny nodes) runs as one Ray task.

A chain ``a -> b -> c`` (each node the only child of the one before and fed by no other
node) has no parallelism inside the case to lose, so running it as one task saves a
submission, a scheduling round and an argument resolution per node, with no cohort-width
condition (whole-case fusion, ``engine.fusion``, needs wide cohorts because it also fuses
branches). Branches and joins stay separate tasks, except nodes whose tool this driver has
seen run in under ``TINY_S`` every time (a measured cost model, ``observe``/``is_tiny``): a
fan-out of such nodes joins its parent's segment, since running them one after another
costs less than their tasks would.

Nothing else changes for the driver: the segment task returns, for every node in it, one
value per output field and its meta (exactly the returns of separate node tasks), then one
list of all its metas, which the driver watches. So every node keeps its own ObjectRefs
(downstream tasks, repair bindings), its own generation, events and provenance; every node
runs through ``noderun.execute_node`` (cache, time limit, deliverable writes, digests).
A node that fails inside a segment is repaired like any other; its not-run successors
go back to pending, and only it and its descendants are resubmitted, bound to the kept
ObjectRefs of the nodes that succeeded before it. A segment that Ray gives up on (worker
lost after retries, cancelled past its time limit) is rerun node by node, one task each.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from typing import Any

from ..contracts.errors import ToolError
from .context import error_from_ray
from .fusion import MAX_FUSED_NODES
from .models import serving
from .placement import fused_options, place

log = logging.getLogger(__name__)


# ---- driver side ---------------------------------------------------------------------------------

def _fusable_node(run: Any, node: Any) -> Any:
    """The node's CPU placement when it may join a segment, else None."""
    st = run.state
    if st.nodes[node.id].no_segment or run.submitter.reviewed_writes(node):
        return None
    if serving(st.ctx.model_server, node.tool, node.params):
        return None  # a node a model actor serves runs there
    try:
        where = place(node, st.cluster, st.ctx.device_policy, st.nodes[node.id].device,
                      st.ctx.gpu_concurrency, float(getattr(st.ctx.model_server, "reserved_gpus", 0.0) or 0.0))
    except ToolError:  # the ordinary path reports it
        return None
    return where if where.num_gpus == 0 else None


TINY_S = 0.002        # a tool this fast (median of its recent runs) costs less than its own task
_TINY_MIN_RUNS = 3    # runs seen before a tool counts as tiny
_RECENT = 9           # runs the median is taken over
_SEEN: dict[tuple[str, str], deque] = {}  # (tool, version) -> its recent run times, s


def observe(tool: str, version: str, run_s: float) -> None:
    """Record a tool's own run time (the driver calls it per executed node, cache hits excluded)."""
    _SEEN.setdefault((tool, version), deque(maxlen=_RECENT)).append(run_s)


def expected_s(tool: str, version: str) -> float:
    """The median of the tool's recent run times seen by this driver; 0.0 for a tool not seen yet."""
    recent = _SEEN.get((tool, version))
    return statistics.median(recent) if recent else 0.0


def critical_path_s(wf: Any) -> float:
    """The case's longest chain of expected tool times (``expected_s``): what bounds its wall
    time once its branches run side by side. 0.0 while none of its tools has been seen."""
    done: dict[str, float] = {}
    for n in wf.nodes:  # the compiler emits nodes in topological order
        ups = {u for u, v in wf.edges if v == n.id} | set(n.after)
        done[n.id] = expected_s(n.tool, n.version) + max((done[u] for u in ups if u in done), default=0.0)
    return max(done.values(), default=0.0)


def is_tiny(node: Any) -> bool:
    """Whether the median of the tool's last runs seen by this driver (at least
    ``_TINY_MIN_RUNS``) is under ``TINY_S``: grouping such nodes loses less parallelism than
    their tasks cost. A median, not the last or longest run: on a loaded machine a preempted
    no-op measured 4-20 ms now and then, and one such run must not switch the policy (with a
    running mean it did, run by run); a tool that turns slow switches after half the window."""
    recent = _SEEN.get((node.tool, node.version))
    return recent is not None and len(recent) >= _TINY_MIN_RUNS and statistics.median(recent) < TINY_S


def chain_from(run: Any, head: Any) -> list[tuple[Any, Any]]:
    """The segment headed by ``head``, in topological order: from each member, a pending
    fusable child joins when (a) it continues a linear chain (it is its parent's only child
    and that parent is its only upstream node), or (b) its tool is known tiny (``is_tiny``)
    and all its upstream nodes are members. (a) loses no parallelism inside the case, but
    only while the segment is one chain: once a member has several children, a slow node
    joining would make the others' consumers wait for it, so from then on only tiny nodes
    join; (b) loses less than the tasks it saves."""
    where = _fusable_node(run, head)
    if where is None:
        return []
    st = run.state
    members = {head.id: (head, where)}
    todo = [head.id]
    limited = st.timeout_of(head) is not None
    linear = True
    while todo and len(members) < MAX_FUSED_NODES:
        parent = todo.pop(0)
        kids = st.nodes[parent].children if parent in st.nodes else set()
        linear = linear and len(kids) <= 1
        for child in sorted(kids, key=st.index):
            if child in members or st.status(child) != "pending" or len(members) >= MAX_FUSED_NODES:
                continue
            deps = st.nodes[child].deps
            if deps is None or not deps[0] <= members.keys():
                continue
            ups, seqs = deps
            node = st.node(child)
            if not ((linear and ups == {parent}) or is_tiny(node)):
                continue
            if not all(st.has_seq_ref(k) and st.seq_meta(k).get("ok", True) for k in seqs):
                continue
            if (st.timeout_of(node) is not None) != limited:
                continue  # the segment's backstop is the sum of its limits: all or none have one
            where = _fusable_node(run, node)
            if where is None:
                continue
            members[child] = (node, where)
            todo.append(child)
    return sorted(members.values(), key=lambda m: st.index(m[0].id))


def submit_segment(run: Any, head: Any) -> bool:
    """Submit ``head`` and the chain below it as one task; False when the chain is a single
    node (or its head cannot be specified): the caller submits ``head`` on its own."""
    from .remote import remote_segment, submit

    st, sub = run.state, run.submitter
    members, specs, dropped = chain_from(run, head), [], set()
    chain = []
    for node, where in members:
        if st.nodes[node.id].deps[0] & dropped:
            dropped.add(node.id)
            continue
        try:
            specs.append(sub.node_spec(node, where.device))
            chain.append((node, where))
        except ToolError:  # submitted on its own, it reports the error as unfused (its dependents wait)
            dropped.add(node.id)
    if len(chain) < 2 or chain[0][0].id != head.id:
        return False
    index = {node.id: k for k, (node, _) in enumerate(chain)}
    args: list[Any] = []
    plan: dict[str, Any] = {"nodes": specs, "values": [], "deps": []}
    for (node, _), spec in zip(chain, specs):
        vslots, ports = [], []
        for (port, path), src in zip(spec["ports"], spec["sources"]):
            if src[0] == "node" and src[1] in index:
                vslots.append(("out", index[src[1]], src[2]))
                ports.append((port, tuple(path)))
            else:
                vslots.append(("arg", len(args)))
                ref, prefix = sub.source(src)
                args.append(ref)
                ports.append((port, (*prefix, *path)))
        spec["ports"] = ports
        dslots = []
        for d in spec["deps"]:
            kind, _, name = d.partition(".")
            if kind == "node" and name in index:
                dslots.append(("meta", index[name]))
            else:
                dslots.append(("arg", len(args)))
                args.append(sub.meta_ref(d))
        plan["values"].append(vslots)
        plan["deps"].append(dslots)
    gens = []
    for node, where in chain:
        if where.fallback:
            run.trace.emit("fallback", node=node.id, tool=node.tool, attempt=st.nodes[node.id].attempts + 1,
                           message=f"{node.tool} runs its CPU path: {where.fallback}")
        gens.append(st.nodes[node.id].gen + 1)
    for (node, _), spec, gen in zip(chain, specs, gens):
        spec.update(run.clock_fields(node.id, gen))
    n_returns = sum(len(node.outputs) + 1 for node, _ in chain) + 1
    opts = fused_options(st.case.id, chain[0][0].id, chain[-1][0].id, [w for _, w in chain],
                         st.ctx.task_max_retries, kind="segment", num_returns=n_returns)
    refs = submit(remote_segment(), opts, plan, *args)
    pos = 0
    for (node, where), spec, gen in zip(chain, specs, gens):
        s = st.nodes[node.id]
        s.gen, s.served, s.status = gen, False, "running"
        s.refs = {f: (r, ()) for f, r in zip(node.outputs, refs[pos:pos + len(node.outputs)])}
        s.meta_ref = refs[pos + len(node.outputs)]
        pos += len(node.outputs) + 1
        sub.record_submission(node, spec, where.device, s.attempts + 1)
    tag = ("seg", chain[0][0].id, gens[0])
    limits = [st.timeout_of(node) for node, _ in chain]
    st.segments[tag] = {"nodes": [(node.id, gen) for (node, _), gen in zip(chain, gens)], "t": time.time(),
                         "limit": None if any(x is None for x in limits) else sum(limits),
                         "clock_key": specs[0].get("clock_key"), "cancelled": False}
    run.watch(tag, refs[-1])
    return True


def in_segment(run: Any, node_id: str) -> bool:
    """Whether the node's current submission is part of a segment task still awaited."""
    s = run.state.nodes.get(node_id)
    gen = s.gen if s is not None else None
    return any((node_id, gen) in seg["nodes"] for seg in run.state.segments.values())


def on_segment_result(run: Any, tag: tuple, metas: Any, exc: BaseException | None) -> None:
    """Record every node of a segment as if each had been its own task (upstream first)."""
    st = run.state
    seg = st.segments.pop(tag, None)
    if seg is None:
        return
    if exc is None:
        for (node_id, gen), meta in zip(seg["nodes"], metas):
            run.on_node_result(node_id, gen, meta, None)
        return
    live = [n for n, g in seg["nodes"] if st.status(n) == "running" and st.nodes[n].gen == g]
    if not live or not st.inputs_ready(live[0]):
        return  # void already, or Ray passed an upstream's failure along: that node's result decides
    err = error_from_ray(exc)
    log.warning("case %s: segment %s..%s failed (%s): rerunning it node by node", run.case.id,
                seg["nodes"][0][0], seg["nodes"][-1][0], err["message"])
    run.trace.emit("retried", node=live[0], message=f"segment task failed ({err['code']}): rerun node by node",
                   error_code=err["code"])
    run.repair.void_descendants(live[0])  # tasks chained to the segment's refs never run
    for node_id in live:
        s = st.nodes[node_id]
        s.status, s.ready_at, s.no_segment = "pending", None, True


def check_segment_deadlines(run: Any, now: float, grace_s: float) -> None:
    """Backstop for a segment stuck in C code (each node's own alarm runs inside the task):
    past the sum of its nodes' limits plus the grace, it is cancelled and rerun node by node."""
    import ray

    for tag, seg in list(run.state.segments.items()):
        limit = seg["limit"]
        if seg["cancelled"] or not limit or tag not in run.open or now - seg["t"] <= limit + max(grace_s, limit):
            continue
        if not run.ran_past({"seg": seg["clock_key"]}, limit).get("seg", True):
            continue  # still queued for a worker
        seg["cancelled"] = True
        log.warning("case %s: segment %s past its %s s limit, cancelling it", run.case.id, tag[1], limit)
        ray.cancel(run.open[tag], force=True)


__all__ = ["TINY_S", "chain_from", "critical_path_s", "expected_s", "check_segment_deadlines", "in_segment", "is_tiny", "observe",
           "on_segment_result", "submit_segment"]
