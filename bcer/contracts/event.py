"""One line of a case's trace."""
from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

EventKind = Literal[
    # engine
    "planned", "compiled", "started", "succeeded", "failed", "repaired", "retried", "blocked",
    "deliverable", "validated", "skipped", "fallback", "case_started", "case_finished",
    "resumed", "cache_hit", "cache_stored", "timeout", "plausibility",
    # planners and LLM backends
    "llm_call", "plan_accepted", "plan_rejected", "plan_fallback", "autofill",
    # R4 report loop and exemplar memory
    "r4_route", "r4_retrieve", "r4_draft", "r4_reflect", "r4_repair", "memory_add",
    # benchmarks
    "fault_injected"]


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
    data: dict[str, Any] | None = None  # kind-specific detail (LLM backend/tokens/latency, cache key, ...)
