"""Local repair, as data: what failed (``Failure``) and the verdicts (``Patch``, ``Halt``).

Pure models shared by the engine (which builds a Failure and applies a Patch) and the
Reflector (``bcer.agents.repair.reflector``, which decides); neither needs to import the other.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import ErrorCode
from .workflow import Node


class Failure(BaseModel):
    """One failed node, as the executor reports it to the Reflector.

    ``available``: token -> ArtifactKind value of every artifact bindable now (``@seq.*`` and
    outputs of nodes that finished or are running and are not downstream of the failed one).
    ``bound_kinds``: port -> kind of what was actually bound.
    """

    model_config = ConfigDict(extra="forbid")
    case_id: str
    node: Node
    error: dict[str, Any]
    attempt: int = 1
    available: dict[str, str] = Field(default_factory=dict)
    bound_kinds: dict[str, str] = Field(default_factory=dict)
    has_gpu: bool = False

    @property
    def code(self) -> ErrorCode:
        try:
            return ErrorCode(self.error.get("code", "internal"))
        except ValueError:
            return ErrorCode.internal

    @property
    def arg(self) -> str | None:
        return (self.error.get("context") or {}).get("arg")


class Patch(BaseModel):
    """A repair of one failed node (BCER's patch actions; ``Halt`` is the fourth).

    - ``action="retry"``: re-run the node with new args. ``inputs`` and ``params`` are the
      node's COMPLETE new inputs and params (so replacing and ``dict.update`` give the same
      node); ``device`` None keeps the executor's choice, "cpu" forces the CPU path.
    - ``action="insert"``: add the node ``insert`` (an allowed tool, bound to what is bindable
      now) before the failed node, then retry the failed node with ``inputs``/``params``,
      which must consume at least one output of the inserted node.
    - ``action="skip"``: the failed node is optional and nothing required depends on it; it
      is recorded as skipped and its optional dependents are blocked.
    """

    model_config = ConfigDict(extra="forbid")
    node_id: str
    inputs: dict[str, str]
    params: dict[str, Any]
    device: str | None = None
    reason: str
    tier: int
    action: Literal["retry", "insert", "skip"] = "retry"
    insert: Node | None = None

    def apply(self, node: Node) -> Node:
        """The node with this patch applied."""
        return node.model_copy(update={"inputs": dict(self.inputs), "params": dict(self.params)})


class Halt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str
    code: str
    reason: str


# failures no patch can fix (a path outside the sandbox, an input the case does not have): the
# case halts at once, every repair tier agrees
HALT_AT_ONCE = frozenset({ErrorCode.sandbox, ErrorCode.input_missing})

__all__ = ["Failure", "HALT_AT_ONCE", "Halt", "Patch"]
