"""A scripted LLM backend for tests: answers from a list (or a function of the request) and
records every request, so tests can check what the Brain / Reflector asked for."""
from __future__ import annotations

import json
from typing import Any, Callable

from bcer.agents.llm.base import LLMReply, prompt_digest


class ScriptedBackend:
    name = "fake"
    model = "scripted"

    def __init__(self, answers: list[Any] | Callable[[list[dict], dict | None, int], Any]):
        self.answers = answers
        self.requests: list[dict[str, Any]] = []

    def complete(self, messages, *, json_schema=None, n=1, temperature=0.0, max_tokens=1024, seed=None) -> LLMReply:
        self.requests.append({"messages": messages, "json_schema": json_schema, "n": n,
                              "temperature": temperature, "max_tokens": max_tokens, "seed": seed})
        if callable(self.answers):
            out = self.answers(messages, json_schema, n)
        else:
            out = self.answers[min(len(self.requests), len(self.answers)) - 1]
        if isinstance(out, Exception):
            raise out
        texts = out if isinstance(out, list) else [out] * n
        texts = [t if isinstance(t, str) else json.dumps(t) for t in texts]
        return LLMReply(texts=texts, backend=self.name, model=self.model,
                        prompt_digest=prompt_digest(messages, json_schema), prompt_tokens=100,
                        completion_tokens=20 * len(texts), latency_s=0.01)
