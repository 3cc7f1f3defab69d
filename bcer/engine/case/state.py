"""The typed state of one running case: one ``NodeState`` per node, one ``SeqState`` per loaded
sequence, and the ``CaseState`` that holds them with the case's own fields.

The state machine (``case.run``), the submitter (``case.submit``) and the failure handler
(``case.repair``) all read and change this one record; the queries here (dependencies,
readiness, descendants) change nothing.

Node states: ``pending`` (not submitted) -> ``running`` (submitted, result awaited) ->
``succeeded`` | ``failed`` | ``blocked`` | ``skipped``; ``repairing`` while a verdict is awaited.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...contracts.case import Case
from ...contracts.task import TaskContract
from ...contracts.workflow import Node, Workflow
from ..context import RunContext

Source = tuple[Any, tuple]  # (ObjectRef or kept value, sub-path into it)


@dataclass
class NodeState:
    """One node of a running case.

    ``gen`` numbers its submissions (a result of an older one is void); ``attempts`` counts
    real outcomes; ``deps`` is None while its tokens cannot be bound; ``refs`` maps each output
    field to where its value is; ``record`` is what provenance says ran."""

    status: str = "pending"
    gen: int = 0
    attempts: int = 0
    deps: tuple[set[str], set[str]] | None = None   # (upstream node ids, sequence keys)
    children: set[str] = field(default_factory=set)
    targets: list[dict[str, str]] = field(default_factory=list)  # deliverables it writes
    refs: dict[str, Source] = field(default_factory=dict)
    meta_ref: Any = None
    ready_at: float | None = None      # when its inputs were all ready (the backstop's clock)
    cancelled: bool = False            # cancelled past its time limit: its error is a timeout
    served: bool = False               # its current submission runs on a model server
    no_segment: bool = False           # rerun as its own task (a segment Ray gave up on)
    timeouts: int = 0                  # timed-out attempts re-submitted unchanged
    device: str | None = None          # pinned by a patch ("cpu": its CPU path)
    repair_asked: tuple[float, int, dict[str, Any]] | None = None  # (asked at, attempt, error)
    record: dict[str, Any] | None = None
    reviewed: Any = None               # the R4-reviewed report (``engine.review``)


@dataclass
class SeqState:
    """One sequence the case loads: its artifact, the load's meta ref and the meta itself."""

    ref: Source | None = None
    meta_ref: Any = None
    meta: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return bool(self.meta and self.meta.get("ok"))


@dataclass
class CaseState:
    """One case in flight: its workflow (copied before a patch changes a shared one), its nodes
    and sequences, and what it has produced so far."""

    wf: Workflow
    case: Case
    ctx: RunContext
    contract: TaskContract | None
    cluster: dict[str, float]
    nodes: dict[str, NodeState] = field(default_factory=dict)
    seqs: dict[str, SeqState] = field(default_factory=dict)
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    measurements: dict[str, Any] = field(default_factory=dict)
    milestones: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    halted: bool = False
    repairs: int = 0
    cache_hits: int = 0
    fused: dict[str, Any] | None = None                 # the open whole-case task (``engine.fusion``)
    segments: dict[tuple, dict[str, Any]] = field(default_factory=dict)  # open segment tasks
    segment_chains: bool = False                          # fuse linear chains (set at start)
    finished: bool = False
    own_wf: bool = False
    t0: float = field(default_factory=time.time)
    _positions: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for n in self.wf.nodes:
            self.nodes.setdefault(n.id, NodeState())

    # ---- reading ----------------------------------------------------------------------------
    def status(self, node_id: str) -> str | None:
        s = self.nodes.get(node_id)
        return None if s is None else s.status

    def node_status(self) -> dict[str, str]:
        return {n: s.status for n, s in self.nodes.items()}

    def records(self) -> dict[str, dict[str, Any]]:
        """What ran, per submitted node (provenance)."""
        return {n: s.record for n, s in self.nodes.items() if s.record is not None}

    def seq(self, key: str) -> SeqState:
        return self.seqs.setdefault(key, SeqState())

    def seq_meta(self, key: str) -> dict[str, Any]:
        s = self.seqs.get(key)
        return (s.meta if s is not None else None) or {}

    def has_seq_ref(self, key: str) -> bool:
        s = self.seqs.get(key)
        return s is not None and s.ref is not None

    def index(self, node_id: str) -> int:
        """Topological position of a node (the node list only changes when a repair inserts one)."""
        if len(self._positions) != len(self.wf.nodes):
            self._positions = {n.id: i for i, n in enumerate(self.wf.nodes)}
        return self._positions.get(node_id, 0)

    def node(self, node_id: str) -> Node:
        return self.wf.nodes[self.index(node_id)]

    def deps_of(self, node_id: str) -> tuple[set[str], set[str]]:
        s = self.nodes.get(node_id)
        return (s.deps if s is not None and s.deps is not None else (set(), set()))

    def bound(self) -> dict[str, tuple[set[str], set[str]]]:
        """node id -> (upstream nodes, sequence keys), for the nodes whose tokens bind."""
        return {n: s.deps for n, s in self.nodes.items() if s.deps is not None}

    def needed_sequences(self) -> list[str]:
        return sorted({k for _, seqs in self.bound().values() for k in seqs})

    def consumers(self, key: str) -> list[str]:
        return [n for n, (_, seqs) in self.bound().items() if key in seqs]

    def timeout_of(self, node: Node) -> float | None:
        return self.ctx.node_timeout_s or getattr(node.resources, "timeout_s", None)

    def inputs_ready(self, node_id: str) -> bool:
        nodes, seqs = self.deps_of(node_id)
        return (all(self.status(u) == "succeeded" for u in nodes)
                and all(self.seq_meta(k).get("ok") for k in seqs))

    def submittable(self, node_id: str) -> bool:
        s = self.nodes[node_id]
        if s.status != "pending" or s.deps is None:
            return False
        nodes, seqs = s.deps
        return (all(self.status(u) in ("running", "succeeded") for u in nodes)
                and all(self.has_seq_ref(k) and self.seq_meta(k).get("ok", True) for k in seqs))

    def index_children(self) -> None:
        for s in self.nodes.values():
            s.children = set()
        for node_id, (ups, _) in self.bound().items():
            for u in ups:
                if u in self.nodes:  # the binder only binds nodes of the workflow
                    self.nodes[u].children.add(node_id)

    def descendants(self, node_id: str) -> set[str]:
        below, todo = set(), [node_id]
        while todo:
            s = self.nodes.get(todo.pop())
            for c in (s.children if s is not None else ()):
                if c not in below:
                    below.add(c)
                    todo.append(c)
        return below | (self.wf.downstream(node_id) if node_id in self.nodes else set())

    def deliverable_paths(self) -> dict[str, Path]:
        return {k: Path(v["files"][0]) for k, v in self.written.items()}


__all__ = ["CaseState", "NodeState", "SeqState"]
