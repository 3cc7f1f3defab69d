"""What runs: the compiled DAG. JSON-serialisable (part of the audit record)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .spec import Resources


class Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    tool: str
    version: str = "1.0"
    inputs: dict[str, str] = Field(default_factory=dict)  # port -> token
    params: dict[str, Any] = Field(default_factory=dict)  # literal values or @case/@runtime tokens
    outputs: list[str] = Field(default_factory=list)
    resources: Resources = Field(default_factory=Resources)
    gpu: str = "none"
    required: bool = True
    milestone: str | None = None
    after: list[str] = Field(default_factory=list)
    why: str = ""


class Deliverable(BaseModel):
    """A node output the executor writes into the case folder."""

    model_config = ConfigDict(extra="forbid")
    name: str
    node: str
    field: str
    file: str


class Workflow(BaseModel):
    model_config = ConfigDict(extra="forbid")
    case_id: str
    task: str | None = None
    goal: str = ""
    nodes: list[Node]
    edges: list[tuple[str, str]] = Field(default_factory=list)
    deliverables: list[Deliverable] = Field(default_factory=list)

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise KeyError(node_id)

    def to_networkx(self):
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.id, tool=n.tool)
        g.add_edges_from(self.edges)
        return g

    def downstream(self, node_id: str) -> set[str]:
        import networkx as nx

        return set(nx.descendants(self.to_networkx(), node_id))
