"""Exemplar memory: sentence embeddings, FAISS indices, curation, persistence (no Ray, no engine).

The Ray actor that shares one memory across a cohort is ``bcer.agents.memory_actor``.
"""
from .curation import CurationPolicy, Decision, decide
from .embed import DIM, Embedder, HashingEmbedder, MiniLMEmbedder, make_embedder
from .index import FLAT_MAX, VectorIndex
from .records import Exemplar
from .store import ExemplarMemory

__all__ = ["DIM", "FLAT_MAX", "CurationPolicy", "Decision", "Embedder", "Exemplar", "ExemplarMemory",
           "HashingEmbedder", "MiniLMEmbedder", "VectorIndex", "decide", "make_embedder"]
