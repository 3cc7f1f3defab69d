"""LLM backends behind one interface (``base.LLMBackend``): OpenAI-compatible HTTP,
in-process vLLM on a Ray actor, a local CPU model, and record/replay; ``make_backend(spec)``
builds one from a spec string (``http://...``, ``vllm:MODEL``, ``local``, ``replay:FILE``).

Importing this package is cheap: no backend imports its heavy dependencies until used.
"""
from .base import LLMBackend, LLMReply, Message, prompt_digest
from .factory import SPECS, close_backend, make_backend

__all__ = ["LLMBackend", "LLMReply", "Message", "SPECS", "close_backend", "make_backend", "prompt_digest"]
