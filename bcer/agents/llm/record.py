"""Record and replay: every prompt and answer to JSONL with digests; replay without a model.

A recording is one JSON object per line::

    {"request_digest": "...", "prompt_digest": "...", "request": {messages, json_schema, n,
     temperature, max_tokens, seed}, "reply": {texts, backend, model, prompt_tokens,
     completion_tokens, latency_s, meta}, "texts_digest": "..."}

``request_digest`` covers everything that determines an answer (messages, schema, n,
temperature, max_tokens, seed); replay looks answers up by it, so concurrent cases that
interleave their calls replay correctly. A request asked several times replays its recorded
answers in order (the last one again when the recording has fewer). A request that was
never recorded is a ``resource`` error: replay never invents an answer.

Lines are appended with one ``write`` on an ``O_APPEND`` descriptor, so several processes
(the driver's Brain, Reflector actors) can record into one file.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ...contracts.errors import ErrorCode, ToolError
from .base import LLMBackend, LLMReply, Message, prompt_digest

log = logging.getLogger(__name__)


def request_digest(messages: list[Message], json_schema: dict[str, Any] | None, n: int, temperature: float,
                   max_tokens: int, seed: int | None) -> str:
    """sha256 of everything that determines an answer (canonical JSON)."""
    blob = json.dumps({"messages": messages, "schema": json_schema, "n": n, "temperature": temperature,
                       "max_tokens": max_tokens, "seed": seed}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def texts_digest(texts: list[str]) -> str:
    return hashlib.sha256(json.dumps(texts, separators=(",", ":")).encode()).hexdigest()


class RecordingBackend:
    """Wraps any backend and appends each call (request, reply, digests) to ``path``.

    A call that raises is not recorded (replaying it would have nothing to return).
    """

    def __init__(self, inner: LLMBackend, path: str | Path):
        self.inner = inner
        self.path = Path(path).resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.name, self.model = inner.name, inner.model

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        reply = self.inner.complete(messages, json_schema=json_schema, n=n, temperature=temperature,
                                    max_tokens=max_tokens, seed=seed)
        self.model = reply.model
        line = json.dumps({
            "request_digest": request_digest(messages, json_schema, n, temperature, max_tokens, seed),
            "prompt_digest": reply.prompt_digest,
            "request": {"messages": messages, "json_schema": json_schema, "n": n, "temperature": temperature,
                        "max_tokens": max_tokens, "seed": seed},
            "reply": {"texts": reply.texts, "backend": reply.backend, "model": reply.model,
                      "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
                      "latency_s": reply.latency_s, "meta": reply.meta},
            "texts_digest": texts_digest(reply.texts)}, sort_keys=True, default=str)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        reply.meta = {**reply.meta, "recorded_to": str(self.path)}
        return reply

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class MemoBackend:
    """Answers a request asked before from memory, when the answer is determined by it.

    Only greedy requests (``temperature == 0``) are remembered: at temperature 0 a backend's
    answer is a function of the request, so asking again would spend model time for the same
    text. Used where the same prompt recurs by design (the controller ablation plans each case
    once per arm and fault). A remembered answer says so in ``meta`` (``memo_hit``) and keeps
    the original latency there, so events stay honest about what was computed.
    """

    def __init__(self, inner: LLMBackend):
        self.inner = inner
        self.name, self.model = inner.name, inner.model
        self._seen: dict[str, LLMReply] = {}
        self._lock = threading.Lock()
        self.hits = 0

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        if temperature != 0.0:
            return self.inner.complete(messages, json_schema=json_schema, n=n, temperature=temperature,
                                       max_tokens=max_tokens, seed=seed)
        key = request_digest(messages, json_schema, n, temperature, max_tokens, seed)
        with self._lock:
            old = self._seen.get(key)
        if old is not None:
            with self._lock:
                self.hits += 1
            return LLMReply(list(old.texts), old.backend, old.model, old.prompt_digest, old.prompt_tokens,
                            old.completion_tokens, 0.0, {**old.meta, "memo_hit": True,
                                                         "computed_latency_s": old.latency_s})
        reply = self.inner.complete(messages, json_schema=json_schema, n=n, temperature=temperature,
                                    max_tokens=max_tokens, seed=seed)
        self.model = reply.model
        with self._lock:
            self._seen[key] = reply
        return reply

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class ReplayBackend:
    """Answers from a recording; raises ``resource`` for a request it never saw."""

    name = "replay"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ToolError(ErrorCode.input_missing, f"no LLM recording at {self.path}",
                            "record one first with --llm-record FILE", file=str(self.path))
        self._answers: dict[str, list[dict[str, Any]]] = {}
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()
        for i, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key, reply = rec["request_digest"], rec["reply"]
                if texts_digest(reply["texts"]) != rec["texts_digest"]:
                    raise ValueError("texts do not match their digest")  # internal: caught below, a schema ToolError
            except (ValueError, KeyError, TypeError) as e:
                raise ToolError(ErrorCode.schema, f"line {i} of the LLM recording {self.path.name} is corrupt: {e}",
                                file=str(self.path)) from None
            self._answers.setdefault(key, []).append(reply)
        models = {r["model"] for rs in self._answers.values() for r in rs}
        self.model = models.pop() if len(models) == 1 else ("mixed" if models else "none")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return sum(len(v) for v in self._answers.values())

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        key = request_digest(messages, json_schema, n, temperature, max_tokens, seed)
        with self._lock:
            answers = self._answers.get(key)
            if not answers:
                raise ToolError(ErrorCode.resource, f"the recording {self.path.name} has no answer for this "
                                f"request (digest {key[:12]})", "replay needs the same prompts, schema and "
                                "sampling settings as the recorded run", file=str(self.path), request=key[:12])
            i = self._next.get(key, 0)
            self._next[key] = i + 1
            rec = answers[min(i, len(answers) - 1)]
        return LLMReply(texts=list(rec["texts"]), backend=self.name, model=rec["model"],
                        prompt_digest=prompt_digest(messages, json_schema), prompt_tokens=rec.get("prompt_tokens"),
                        completion_tokens=rec.get("completion_tokens"), latency_s=0.0,
                        meta={"recorded_backend": rec.get("backend"), "recorded_latency_s": rec.get("latency_s")})

    def close(self) -> None:
        return None


__all__ = ["MemoBackend", "RecordingBackend", "ReplayBackend", "request_digest", "texts_digest"]
