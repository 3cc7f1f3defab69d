"""What a tool is, as planners and the compiler see it."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .artifacts import ArtifactKind


class Resources(BaseModel):
    """What one call of a tool needs. ``timeout_s``: a call running longer fails with
    ``timeout`` (``--node-timeout`` overrides it for every tool; None: no limit)."""

    model_config = ConfigDict(extra="forbid")
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory_mb: int = 512
    timeout_s: float | None = Field(3600.0, gt=0)


class Port(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: ArtifactKind
    required: bool = True
    description: str = ""


class ToolSpec(BaseModel):
    """The typed signature of a registered tool (derived from its function by ``@tool``).

    ``gpu``: "none" (CPU only), "optional" (GPU path used when a GPU is there, CPU path
    otherwise), "required" (no CPU path: fails fast with ``resource`` without a GPU).
    ``frameworks``: the heavy modules the tool's code imports on every device (torch for a
    network that also runs on the CPU); ``gpu_frameworks``: those only its GPU path imports
    (cupy; torch where the CPU path is numpy or scikit-image). The engine imports the installed
    ones a run needs before arming the node's time limit. ``frameworks=None``: torch for a tool
    with a GPU path that declares no ``gpu_frameworks``, nothing otherwise.
    """

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    name: str
    version: str = "1.0"
    description: str = ""
    inputs: list[Port] = Field(default_factory=list)
    outputs: list[Port] = Field(default_factory=list)
    params_schema: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)
    milestone: str | None = None
    gpu: Literal["none", "optional", "required"] = "none"
    frameworks: list[str] | None = None
    gpu_frameworks: list[str] = Field(default_factory=list)
    # what makes its numbers (bcer.tools.methods.MethodCard as a dict): None = a computation
    # named by the tool and its version; a tool may refine it per call in meta["method_card"]
    method: dict[str, Any] | None = None

    def input(self, name: str) -> Port | None:
        return next((p for p in self.inputs if p.name == name), None)

    def output(self, name: str) -> Port | None:
        return next((p for p in self.outputs if p.name == name), None)

    @property
    def param_names(self) -> list[str]:
        return list(self.params_schema.get("properties", {}))
