"""What a Brain emits: a sketch of steps. Strict, so an LLM can be constrained by its schema."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PlanStep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tool: str
    args: dict[str, Any] = Field(default_factory=dict)
    after: list[str] = Field(default_factory=list)
    why: str = ""


class PlanSketch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    goal: str
    domain: str = "general"
    steps: list[PlanStep]

    def step(self, step_id: str) -> PlanStep | None:
        return next((s for s in self.steps if s.id == step_id), None)
