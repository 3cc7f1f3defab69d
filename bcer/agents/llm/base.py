"""The one interface every LLM backend implements, and the reply it returns.

Callers (the LLM planner, the Reflector's tier 2, the R4 drafter and repairer) send chat
messages and, when they want structured output, a JSON schema; a backend returns ``n`` raw
texts. Callers always validate the texts themselves (pydantic), because a server may ignore
the schema (vLLM >= 0.12 silently ignores the removed ``guided_*`` keys): a backend never
promises valid JSON, only that it asked for it the right way.

Failures are ``ToolError`` with the usual codes: ``resource`` (server down, no GPU, package
missing), ``timeout``, ``schema`` (an answer that is not a completion at all), ``internal``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]  # {"role": "system"|"user"|"assistant", "content": "..."}


def prompt_digest(messages: list[Message], json_schema: dict[str, Any] | None = None) -> str:
    """sha256 of the messages and schema (canonical JSON): the key of record/replay and of events."""
    blob = json.dumps({"messages": messages, "schema": json_schema}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class LLMReply:
    """What one ``complete`` call returned.

    Attributes:
        texts: ``n`` raw completions (not yet validated).
        backend: backend kind ("http", "vllm", "local", "replay", "fake", ...).
        model: model name as the backend knows it.
        prompt_digest: ``prompt_digest(messages, json_schema)``.
        prompt_tokens / completion_tokens: as reported (None when unknown).
        latency_s: wall time of the call.
        meta: anything else worth an event (finish reasons, retries, server id).
    """

    texts: list[str]
    backend: str
    model: str
    prompt_digest: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    def event_data(self) -> dict[str, Any]:
        """The fields an ``llm_call`` event carries (never the prompt text itself)."""
        return {"backend": self.backend, "model": self.model, "prompt_digest": self.prompt_digest,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_s": round(self.latency_s, 4), "n": len(self.texts), **self.meta}


@runtime_checkable
class LLMBackend(Protocol):
    """``complete`` returns ``n`` completions of ``messages``; with ``json_schema`` the backend
    constrains decoding to it by its own mechanism (structured outputs, grammar)."""

    name: str
    model: str

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply: ...


__all__ = ["LLMBackend", "LLMReply", "Message", "prompt_digest"]
