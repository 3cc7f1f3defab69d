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

import time
from typing import Any

from .noderun import _pluck, execute_node, load_sequence_task

MAX_FUSED_NODES = 64


def wide_enough(n_cases: int, cluster_cpus: float) -> bool:
    """Enough cases to fill the cluster without the parallelism inside one case."""
    return n_cases >= 2 * max(1.0, cluster_cpus)


def fusable(placements: list[Any]) -> bool:
    """A small DAG whose every node runs on CPU here (GPU nodes keep their own placement)."""
    return 0 < len(placements) <= MAX_FUSED_NODES and all(p.num_gpus == 0 for p in placements)


def run_fused(plan: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Ray entry point of a fused case: ``plan = {"loads": [(key, SequenceRef)], "nodes": [spec]}``
    (node specs in topological order, each with ``sources`` naming where its inputs come from).

    Returns:
        (the artifacts made, kept only when some node failed; ``{"loads": {key: meta},
        "nodes": {node: meta}, "t_start", "t_end"}``).
    """
    t0 = time.time()
    values: dict[tuple[str, str], Any] = {}
    metas: dict[tuple[str, str], dict[str, Any]] = {}
    for key, ref in plan["loads"]:
        art, meta = load_sequence_task(ref)
        metas[("seq", key)] = meta
        if meta.get("ok"):
            values[("seq", key)] = art
    failed = False
    for spec in plan["nodes"]:
        deps = tuple(metas[_dep_key(d)] for d in spec["deps"])
        inputs = tuple(_value(values, src) for src in spec["sources"])
        outputs, meta = execute_node(spec, inputs, deps)
        metas[("node", spec["node"])] = meta
        if outputs is not None:
            values[("node", spec["node"])] = outputs
        failed = failed or not meta.get("ok")
    kept = None
    if failed:
        kept = {"seq": {k: v for (kind, k), v in values.items() if kind == "seq"},
                "node": {k: v for (kind, k), v in values.items() if kind == "node"}}
    return kept, {"loads": {k: m for (kind, k), m in metas.items() if kind == "seq"},
                  "nodes": {k: m for (kind, k), m in metas.items() if kind == "node"},
                  "t_start": t0, "t_end": time.time()}


def _dep_key(dep: str) -> tuple[str, str]:
    kind, _, name = dep.partition(".")
    return kind, name


def _value(values: dict[tuple[str, str], Any], src: tuple) -> Any:
    """``("seq", key)`` or ``("node", id, field)``: the value a port receives (None if not made;
    the node's deps then say an upstream failed and it does not run)."""
    if src[0] == "seq":
        return values.get(("seq", src[1]))
    made = values.get(("node", src[1]))
    return None if made is None else _pluck(made, (src[2],))


__all__ = ["MAX_FUSED_NODES", "fusable", "run_fused", "wide_enough"]
