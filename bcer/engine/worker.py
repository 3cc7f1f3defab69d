"""What runs inside a Ray worker for more than one node: a fused case (``engine.fusion``) and a
segment of a chain (``engine.segments``). Both run every node through ``noderun.execute_node``,
exactly as a node task does; the driver-side halves (when to fuse, what to submit, how to read
the result) stay in ``fusion`` and ``segments``, which import nothing from here but through
``remote``.
"""
from __future__ import annotations

import time
from typing import Any

from .noderun import _pluck, execute_node, load_sequence_task


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


def run_segment(plan: dict[str, Any], *args: Any) -> tuple[Any, ...]:
    """Ray entry point of a segment: ``plan = {"nodes": [spec], "values": [[slot]], "deps": [[slot]]}``;
    a slot is ``("arg", i)`` (the task's i-th argument, an upstream outside the segment),
    ``("out", k, field)`` (a field of the segment's k-th node) or ``("meta", k)`` (its meta).

    Returns:
        per node, one value per output field then its meta; last, the list of every meta.
    """
    outs: list[dict[str, Any] | None] = []
    metas: list[dict[str, Any]] = []
    for spec, vslots, dslots in zip(plan["nodes"], plan["values"], plan["deps"]):
        values = tuple(args[s[1]] if s[0] == "arg" else _field(outs[s[1]], s[2]) for s in vslots)
        deps = tuple(args[s[1]] if s[0] == "arg" else metas[s[1]] for s in dslots)
        outputs, meta = execute_node(spec, values, deps)
        outs.append(outputs)
        metas.append(meta)
    flat: list[Any] = []
    for spec, outputs, meta in zip(plan["nodes"], outs, metas):
        flat.extend([None] * len(spec["outputs"]) if outputs is None else [outputs[f] for f in spec["outputs"]])
        flat.append(meta)
    flat.append(metas)
    return tuple(flat)


def _field(outputs: dict[str, Any] | None, field: str) -> Any:
    return None if outputs is None else outputs[field]


__all__ = ["run_fused", "run_segment"]
