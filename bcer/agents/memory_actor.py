"""The exemplar memory as a Ray actor, shared by every case (and cohort) that names its folder.

One actor per memory folder (named after the folder, get-or-create), so all workers and
drivers share one index and one writer. It is a threaded actor (``max_concurrency``): searches
run concurrently under the store's readers-writer lock, adds wait for them. FAISS and torch
use the actor's CPUs (Ray sets ``OMP_NUM_THREADS`` to ``num_cpus``). Ray restarts a killed
actor (``max_restarts``); the new one reloads the last checkpoint and replays the WAL, so
every add that returned survives; calls are retried (search is read-only, add is idempotent
by record id).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
from pathlib import Path
from typing import Any

from ..memory import CurationPolicy, Exemplar, ExemplarMemory

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 120.0


class MemoryService:
    """The actor's body (also usable in-process): an ExemplarMemory behind dict-only methods."""

    def __init__(self, root: str | None = None, embedder: str = "minilm", dup_cosine: float = 0.97,
                 per_task_cap: int = 50_000, threads: int | None = None, checkpoint_every: int = 256):
        threads = threads or int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
        self._args = (root, embedder, CurationPolicy(dup_cosine=dup_cosine, per_task_cap=per_task_cap))
        self._kw = {"threads": threads, "checkpoint_every": checkpoint_every}
        self._mem: ExemplarMemory | None = None
        self._embedder = None
        self._open_lock = threading.Lock()  # a threaded actor: two first calls must not both open it

    @property
    def mem(self) -> ExemplarMemory:
        """The open memory; reopened after ``close`` (a later cohort reuses the named actor, and
        the writer lock is held only while a cohort works)."""
        with self._open_lock:
            if self._mem is None:
                root, embedder, policy = self._args
                self._mem = ExemplarMemory(root, self._embedder or embedder, policy, **self._kw)
                self._embedder = self._mem.embedder  # keep the loaded model across reopenings
            return self._mem

    @mem.setter
    def mem(self, value: ExemplarMemory) -> None:
        self._mem = value

    def add(self, record: dict[str, Any], verified: bool = True, material_issues: int = 0) -> dict[str, Any]:
        rec = Exemplar.from_dict(record)
        if self.mem.get(rec.id) is not None:  # a retried call after a restart: already durable
            return {"action": "exists", "reason": "already in memory", "id": rec.id, "size": len(self.mem)}
        return self.mem.add(rec, verified=verified, material_issues=material_issues)

    def search(self, task: str, text: str, k: int = 3, profile: str | None = None,
               exclude_case: str | None = None) -> list[dict[str, Any]]:
        return self.mem.search(task, text, k, profile=profile, exclude_case=exclude_case)

    def stats(self) -> dict[str, Any]:
        return self.mem.stats()

    def records(self, task: str | None = None) -> list[dict[str, Any]]:
        return self.mem.records(task)

    def export(self, path: str) -> str:
        return str(self.mem.export(path))

    def checkpoint(self) -> None:
        self.mem.checkpoint()

    def close(self) -> None:
        with self._open_lock:
            if self._mem is not None:
                self._mem.close()
                self._mem = None

    def pid(self) -> int:
        return os.getpid()


@functools.cache
def _actor_class() -> Any:
    import ray

    return ray.remote(MemoryService)


def actor_name(root: str | Path | None) -> str:
    key = str(Path(root).resolve()) if root else f"in-memory-{os.getpid()}"
    return "bcer_memory_" + hashlib.sha1(key.encode()).hexdigest()[:12]


def memory_actor(root: str | Path | None = None, *, embedder: str = "minilm", num_cpus: float = 1,
                 name: str | None = None, max_restarts: int = 3, **kwargs: Any) -> Any:
    """Get or create the memory actor of ``root`` (None: an in-memory actor for this driver)."""
    cls = _actor_class()
    return cls.options(name=name or actor_name(root), get_if_exists=True, num_cpus=num_cpus,
                       max_restarts=max_restarts, max_task_retries=3, max_concurrency=4).remote(
        str(Path(root).resolve()) if root else None, embedder, threads=max(1, int(num_cpus)), **kwargs)


class MemoryClient:
    """Synchronous calls to a memory actor handle or an in-process MemoryService/ExemplarMemory."""

    def __init__(self, target: Any, timeout_s: float = CALL_TIMEOUT_S):
        if isinstance(target, ExemplarMemory):
            svc = MemoryService.__new__(MemoryService)
            svc._embedder, svc._open_lock = target.embedder, threading.Lock()
            svc.mem = target
            target = svc
        self.target, self.timeout_s = target, timeout_s
        self.remote = hasattr(getattr(target, "search", None), "remote")

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self.target, method)
        if self.remote:
            import ray

            return ray.get(fn.remote(*args, **kwargs), timeout=self.timeout_s)
        return fn(*args, **kwargs)

    def add(self, record: dict[str, Any], verified: bool = True, material_issues: int = 0) -> dict[str, Any]:
        return self._call("add", record, verified, material_issues)

    def search(self, task: str, text: str, k: int = 3, profile: str | None = None,
               exclude_case: str | None = None) -> list[dict[str, Any]]:
        return self._call("search", task, text, k, profile, exclude_case)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        self._call("close")


__all__ = ["MemoryClient", "MemoryService", "actor_name", "memory_actor"]
