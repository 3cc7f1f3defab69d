"""LLM backends behind one interface (``base.LLMBackend``): OpenAI-compatible HTTP,
in-process vLLM on a Ray actor, a local CPU model, and record/replay.

Importing this package is cheap: no backend imports its heavy dependencies until used.
"""
from .base import LLMBackend, LLMReply, Message, prompt_digest

__all__ = ["LLMBackend", "LLMReply", "Message", "prompt_digest"]
