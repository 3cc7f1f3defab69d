"""An OpenAI-compatible HTTP backend (``vllm serve``, llama.cpp server, any compatible endpoint).

Structured output is requested the one way every compatible server understands,
``response_format={"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; when
the server says it is vLLM (``/v1/models`` entries ``owned_by: "vllm"``) or ``structured="vllm"``
is forced, the same schema also goes as ``extra_body={"structured_outputs": {"json": schema}}``.
The removed ``guided_json``/``guided_decoding`` keys are never sent: vLLM >= 0.12 accepts and
silently ignores them, returning unconstrained text.

Transport failures are retried a bounded number of times with exponential back-off (429, 5xx,
timeouts, refused or dropped connections, bodies that are not a completion), then become typed
``ToolError``s (with ``attempts`` in their context): ``timeout`` (the server did
not answer in time), ``resource`` (unreachable, unknown model, refused credentials),
``schema`` (an answer that is not a chat completion), ``internal`` (any other refusal).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from ...contracts.errors import ErrorCode, ToolError
from .base import LLMReply, Message, prompt_digest

log = logging.getLogger(__name__)
RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


def split_spec(spec: str) -> tuple[str, str | None]:
    """``http://host:8000/v1#model`` -> (base URL ending in ``/v1``, model or None)."""
    url, _, model = spec.partition("#")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ToolError(ErrorCode.value_range, f"not an http(s) URL: {spec!r}",
                        "e.g. http://127.0.0.1:8000/v1#Qwen/Qwen2.5-7B-Instruct", arg="llm")
    base = url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    return base, (model or None)


class OpenAIHTTPBackend:
    """``complete`` over ``/v1/chat/completions`` with the ``openai`` client.

    Args:
        base_url: server root or its ``/v1`` URL.
        model: model name; None: the first model ``/v1/models`` lists (``vllm serve`` serves one).
        api_key: sent as a bearer token (``vllm serve --api-key``); default ``$BCER_LLM_API_KEY`` or "EMPTY".
        timeout_s: per request.
        max_retries: retries after the first try on 429/5xx/timeouts/refused connections.
        backoff_s: first back-off; doubles on each retry.
        structured: "auto" (add vLLM's ``structured_outputs`` when the server is vLLM),
            "vllm" (always add it), "response_format" (never).
    """

    name = "http"

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 timeout_s: float = 60.0, max_retries: int = 3, backoff_s: float = 0.5,
                 structured: str = "auto"):
        if structured not in ("auto", "vllm", "response_format"):
            raise ToolError(ErrorCode.value_range, f"structured must be auto, vllm or response_format, "
                            f"got {structured!r}", arg="structured")
        self.base_url, given = split_spec(base_url)
        self.model = model or given or ""
        # vllm serve --api-key KEY: pass it, or set BCER_LLM_API_KEY (never written to recordings)
        self.api_key = api_key or os.environ.get("BCER_LLM_API_KEY") or "EMPTY"
        self.timeout_s, self.max_retries, self.backoff_s = timeout_s, max_retries, backoff_s
        self.structured = structured
        self._is_vllm: bool | None = {"vllm": True, "response_format": False}.get(structured)
        self._client: Any = None
        self._lock = threading.Lock()

    # Ray pickles backends into Reflector actors: the client (sockets, locks) is rebuilt there.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"], state["_lock"] = None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _openai(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as e:
                    raise ToolError(ErrorCode.resource, f"the openai client is not installed ({e})",
                                    hint="pip install 'bcer[llm]'") from None
                # retries are ours (counted, typed, logged), so the client's own are off
                self._client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key,
                                             timeout=self.timeout_s, max_retries=0)
            return self._client

    # ---- model discovery ---------------------------------------------------------------------
    def _discover(self) -> None:
        """Fill the model name (when not given) and whether the server is vLLM, from /v1/models."""
        if self.model and self._is_vllm is not None:
            return
        try:
            models = self._call(lambda c: c.models.list(), what="list models")
            entries = list(getattr(models, "data", []) or [])
        except ToolError as e:
            if not self.model:
                raise ToolError(e.code, f"cannot learn the model name from {self.base_url}/models: {e.message}",
                                "name the model: http://HOST:PORT/v1#MODEL", url=self.base_url) from None
            entries = []  # some servers have no /models; the model was named, go on without it
        if not self.model:
            if not entries:
                raise ToolError(ErrorCode.resource, f"{self.base_url} serves no model",
                                "name the model: http://HOST:PORT/v1#MODEL", url=self.base_url)
            self.model = str(entries[0].id)
        if self._is_vllm is None:
            self._is_vllm = any(str(getattr(m, "owned_by", "")).lower() == "vllm" for m in entries)

    # ---- the call ----------------------------------------------------------------------------
    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        self._discover()
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages, "n": n,
                                  "temperature": temperature, "max_tokens": max_tokens}
        if seed is not None:
            kwargs["seed"] = seed
        if json_schema is not None:
            kwargs["response_format"] = {"type": "json_schema", "json_schema": {
                "name": _schema_name(json_schema), "schema": json_schema, "strict": True}}
            if self._is_vllm:
                kwargs["extra_body"] = {"structured_outputs": {"json": json_schema}}
        def create(client: Any) -> tuple[Any, tuple[list[str], list[str | None]]]:
            resp = client.chat.completions.create(**kwargs)
            return resp, _texts(resp, self.base_url)  # a garbage body is retried like a 5xx

        t0 = time.perf_counter()
        (resp, (texts, finish)), retries = self._call(create, what="chat completion", count=True)
        latency = time.perf_counter() - t0
        usage = getattr(resp, "usage", None)
        return LLMReply(texts=texts, backend=self.name, model=str(getattr(resp, "model", None) or self.model),
                        prompt_digest=prompt_digest(messages, json_schema),
                        prompt_tokens=getattr(usage, "prompt_tokens", None),
                        completion_tokens=getattr(usage, "completion_tokens", None), latency_s=latency,
                        meta={"retries": retries, "finish_reasons": finish,
                              "structured": "vllm+response_format" if self._is_vllm and json_schema
                              else ("response_format" if json_schema else "none")})

    def _call(self, fn: Any, *, what: str, count: bool = False) -> Any:
        """``fn(client)`` with bounded retries and back-off; typed errors when it keeps failing."""
        import openai

        client = self._openai()
        delay = self.backoff_s
        for attempt in range(self.max_retries + 1):
            try:
                out = fn(client)
                return (out, attempt) if count else out
            except openai.APITimeoutError:
                err = ToolError(ErrorCode.timeout, f"{what}: {self.base_url} did not answer within "
                                f"{self.timeout_s:g} s", "raise the timeout or check the server load",
                                url=self.base_url, attempts=attempt + 1)
                retry = True
            except openai.APIConnectionError as e:
                err = ToolError(ErrorCode.resource, f"{what}: cannot reach {self.base_url}: {e}",
                                "is the server running (vllm serve ...)?", url=self.base_url, attempts=attempt + 1)
                retry = True
            except openai.APIStatusError as e:
                err = _status_error(e, what, self.base_url, attempt + 1)
                retry = e.status_code in RETRY_STATUS
            except openai.APIResponseValidationError as e:
                err = ToolError(ErrorCode.schema, f"{what}: {self.base_url} answered something that is not a "
                                f"completion: {e}", url=self.base_url, attempts=attempt + 1)
                retry = True
            except ValueError as e:  # a body that says JSON and is not (the client's json.loads)
                err = ToolError(ErrorCode.schema, f"{what}: {self.base_url} answered a body that is not JSON: {e}",
                                url=self.base_url, attempts=attempt + 1)
                retry = True
            except ToolError as e:  # the body parsed but holds no completion (no choices, no text)
                if e.code is not ErrorCode.schema:
                    raise
                err, retry = e.with_context(attempts=attempt + 1), True
            except openai.OpenAIError as e:
                raise ToolError(ErrorCode.internal, f"{what}: {type(e).__name__}: {e}", url=self.base_url) from None
            if not retry or attempt == self.max_retries:
                raise err
            log.warning("%s (try %d/%d), retrying in %.2f s", err.message, attempt + 1, self.max_retries + 1, delay)
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def _status_error(e: Any, what: str, url: str, attempts: int) -> ToolError:
    status = int(getattr(e, "status_code", 0) or 0)
    body = str(getattr(e, "message", "") or e)[:300]
    if status in (401, 403, 404):
        return ToolError(ErrorCode.resource, f"{what}: {url} refused ({status}): {body}",
                         "check the model name (URL#MODEL) and the API key", url=url, status=status)
    code = ErrorCode.timeout if status in (408, 504) else (
        ErrorCode.resource if status in (429, 502, 503) else ErrorCode.internal)
    return ToolError(code, f"{what}: {url} answered {status}: {body}", url=url, status=status, attempts=attempts)


def _texts(resp: Any, url: str) -> tuple[list[str], list[str | None]]:
    """The choices' texts, in choice order; a reply without choices or text is not a completion."""
    choices = getattr(resp, "choices", None)
    if not isinstance(choices, list) or not choices:
        raise ToolError(ErrorCode.schema, f"{url} answered without choices: {str(resp)[:200]}", url=url)
    choices = sorted(choices, key=lambda c: getattr(c, "index", 0) or 0)
    texts, finish = [], []
    for c in choices:
        content = getattr(getattr(c, "message", None), "content", None)
        if not isinstance(content, str):
            raise ToolError(ErrorCode.schema, f"{url} answered a choice without text content", url=url)
        texts.append(content)
        finish.append(getattr(c, "finish_reason", None))
    return texts, finish


def _schema_name(schema: dict[str, Any]) -> str:
    """OpenAI wants ``[A-Za-z0-9_-]{1,64}`` as the schema's name."""
    import re

    title = re.sub(r"[^A-Za-z0-9_-]+", "_", str(schema.get("title") or "bcer_output")).strip("_")
    return (title or "bcer_output")[:64]


__all__ = ["OpenAIHTTPBackend", "split_spec"]
