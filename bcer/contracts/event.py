"""One line of a case's trace."""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EventKind = Literal["planned", "compiled", "started", "succeeded", "failed", "repaired",
                    "retried", "blocked", "deliverable", "validated", "skipped", "fallback",
                    "case_started", "case_finished"]


class Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    time: float = Field(default_factory=time.time)
    run: str = ""
    case: str = ""
    node: str | None = None
    kind: EventKind
    attempt: int = 0
    tool: str | None = None
    args_digest: str | None = None
    error_code: str | None = None
    message: str | None = None
    duration_s: float | None = None
    worker: str | None = None
    patch: dict[str, Any] | None = None
