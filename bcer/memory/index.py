"""One FAISS index over unit vectors (inner product = cosine), chosen by size.

Exact ``IndexFlatIP`` while the index holds at most ``FLAT_MAX`` vectors, ``IndexHNSWFlat``
beyond. Why not flat up to ~200k: a flat search scans every vector, and on this project's
2-core machines a single query over 100k x 384 float32 (154 MB) took 26 ms p50 (load 6) to
273 ms (load 30), far from the 1 ms goal; HNSW (M=32, efSearch=128) answered in 0.2-0.35 ms
p50 with recall@10 0.99-1.0 against exact search on clustered data (``benchmarks/memory_ann.py``).
Below ``FLAT_MAX`` exact search costs ~1-3 ms and needs no build, so small memories stay
exact. Positions are the vectors' ids (0..n-1, in order of addition): the store maps them to
records. Nothing is ever removed (curation refuses instead), so HNSW's lack of removal
does not matter.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from ..contracts.errors import ErrorCode, ToolError
from ..optional import optional_import

log = logging.getLogger(__name__)
FLAT_MAX = 10_000
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128


def faiss_module():
    faiss, ok = optional_import("faiss", extra="memory")
    if not ok:
        raise ToolError(ErrorCode.resource, "faiss is not installed", hint="pip install 'bcer[memory]'")
    return faiss


def set_threads(n: int | None) -> None:
    """FAISS OpenMP threads: the CPUs its process was given (Ray sets OMP_NUM_THREADS to them)."""
    n = n or int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or 1
    faiss_module().omp_set_num_threads(max(1, int(n)))


class VectorIndex:
    """A flat or HNSW FAISS index; ``kind="auto"`` starts flat and becomes HNSW past ``flat_max``."""

    def __init__(self, dim: int, kind: str = "auto", flat_max: int = FLAT_MAX, index=None):
        if kind not in ("auto", "flat", "hnsw"):
            raise ToolError(ErrorCode.value_range, f"unknown index kind {kind!r}", hint="auto | flat | hnsw")
        self.dim, self.mode, self.flat_max = dim, kind, flat_max
        self.index = index if index is not None else self._new("hnsw" if kind == "hnsw" else "flat")

    @staticmethod
    def _hnsw(dim: int):
        faiss = faiss_module()
        idx = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        idx.hnsw.efSearch = HNSW_EF_SEARCH
        return idx

    def _new(self, kind: str):
        return self._hnsw(self.dim) if kind == "hnsw" else faiss_module().IndexFlatIP(self.dim)

    @property
    def kind(self) -> str:
        return "hnsw" if "HNSW" in type(self.index).__name__ else "flat"

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        if self.mode == "auto" and self.kind == "flat" and self.ntotal + len(vectors) > self.flat_max:
            self._upgrade()
        self.index.add(vectors)

    def _upgrade(self) -> None:
        """Flat -> HNSW, rebuilt from the stored vectors, same positions."""
        old = self.index.reconstruct_n(0, self.ntotal) if self.ntotal else np.zeros((0, self.dim), np.float32)
        self.index = self._hnsw(self.dim)
        if len(old):
            self.index.add(old)
        log.info("exemplar index upgraded to HNSW at %d vectors", len(old))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, positions), each (n_queries, k); missing neighbours are position -1."""
        q = np.ascontiguousarray(queries, dtype=np.float32).reshape(-1, self.dim)
        if self.ntotal == 0 or k <= 0:
            return np.zeros((len(q), max(k, 0)), np.float32), -np.ones((len(q), max(k, 0)), np.int64)
        return self.index.search(q, min(k, self.ntotal))

    def __getstate__(self) -> dict:
        """Picklable (Ray, multiprocessing) through ``faiss.serialize_index``."""
        return {"dim": self.dim, "mode": self.mode, "flat_max": self.flat_max, "blob": self.to_bytes()}

    def __setstate__(self, state: dict) -> None:
        self.dim, self.mode, self.flat_max = state["dim"], state["mode"], state["flat_max"]
        self.index = faiss_module().deserialize_index(np.frombuffer(state["blob"], dtype=np.uint8))
        if "HNSW" in type(self.index).__name__:
            self.index.hnsw.efSearch = HNSW_EF_SEARCH

    def to_bytes(self) -> bytes:
        return faiss_module().serialize_index(self.index).tobytes()

    @classmethod
    def from_bytes(cls, blob: bytes, mode: str = "auto", flat_max: int = FLAT_MAX) -> "VectorIndex":
        idx = faiss_module().deserialize_index(np.frombuffer(blob, dtype=np.uint8))
        return cls(idx.d, mode, flat_max, index=idx)

    def write(self, path: Path) -> Path:
        """``faiss.write_index`` to a temp file, fsync, rename: a reader never sees half a file."""
        path = Path(path)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        faiss_module().write_index(self.index, str(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, path: Path, mode: str = "auto", flat_max: int = FLAT_MAX) -> "VectorIndex":
        idx = faiss_module().read_index(str(path))
        if "HNSW" in type(idx).__name__:
            idx.hnsw.efSearch = HNSW_EF_SEARCH
        return cls(idx.d, mode, flat_max, index=idx)


__all__ = ["FLAT_MAX", "VectorIndex", "faiss_module", "set_threads"]
