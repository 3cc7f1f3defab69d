"""The exemplar memory: per-task FAISS indices + Parquet sidecar, durable by a write-ahead log.

Layout of a memory folder::

    manifest.json            generation, embedder, dim, tasks -> index file and size, wal_seq
    records.<gen>.parquet    every record with its index position (the sidecar)
    <task>.<gen>.faiss       one index per task (retrieval never crosses tasks)
    wal.jsonl                adds and merges since the last checkpoint, one fsync'd line each
    .lock                    held (flock) by the one writer

Every ``add`` is appended to the WAL and fsync'd before it returns, so a killed process
loses nothing that was acknowledged; ``checkpoint`` writes a new generation of index files
and sidecar (temp file + rename each), then the manifest (the atomic switch), then empties
the WAL. Loading reads the manifest's generation and replays WAL entries newer than it
(``seq`` makes the replay idempotent). One writer per folder (an exclusive ``flock``), any
number of read-only openers; inside one process a readers-writer lock lets searches run
concurrently while an add waits for them.
"""
from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..contracts.errors import ErrorCode, ToolError
from .curation import CurationPolicy, decide
from .embed import Embedder, make_embedder
from .index import FLAT_MAX, VectorIndex, set_threads
from .records import Exemplar, read_sidecar, write_sidecar

log = logging.getLogger(__name__)
MANIFEST, WAL, LOCK = "manifest.json", "wal.jsonl", ".lock"


class RWLock:
    """Many readers or one writer (writers are not starved: a waiting writer blocks new readers)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class _Shard:
    index: VectorIndex
    ids: list[str] = field(default_factory=list)  # position -> record id


def _safe(task: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", task)


def _atomic_json(data: Any, path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ExemplarMemory:
    """FAISS exemplar memory with curation and crash-safe persistence.

    Args:
        root: folder to persist in (None: in memory only).
        embedder: an Embedder or a name (``minilm``, ``hash``).
        policy: curation rules (near-duplicate cosine, per-task cap).
        readonly: load and search only (no lock taken; ``add`` raises).
        checkpoint_every: adds between automatic checkpoints (the WAL covers the rest).
        threads: FAISS/torch threads (None: ``OMP_NUM_THREADS``, which Ray sets to the actor's CPUs).

    Raises:
        ToolError: ``resource`` when another process holds the folder for writing; ``schema``
            when the folder was built with a different embedder or is corrupt.
    """

    def __init__(self, root: str | Path | None = None, embedder: Embedder | str = "minilm",
                 policy: CurationPolicy | None = None, *, readonly: bool = False, checkpoint_every: int = 256,
                 index_kind: str = "auto", flat_max: int = FLAT_MAX, threads: int | None = None):
        self.root = Path(root) if root is not None else None
        self.embedder = make_embedder(embedder, threads) if isinstance(embedder, str) else embedder
        self.policy = policy or CurationPolicy()
        self.readonly, self.checkpoint_every = readonly, checkpoint_every
        self.index_kind, self.flat_max = index_kind, flat_max
        set_threads(threads)
        self._rw = RWLock()
        self._shards: dict[str, _Shard] = {}
        self._records: dict[str, Exemplar] = {}
        self._gen, self._seq, self._ckpt_seq, self._since_ckpt = 0, 0, 0, 0
        self._lock_fd: int | None = None
        self._wal = None
        self.counters = {"added": 0, "merged": 0, "rejected": 0, "searches": 0, "replayed": 0}
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            if not readonly:
                self._take_lock()
            self._load()
            if not readonly:
                self._wal = open(self.root / WAL, "a", encoding="utf-8")

    # ---- persistence ------------------------------------------------------------------------
    def _take_lock(self) -> None:
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = (self.root / LOCK).read_text().strip() or "another process"
            raise ToolError(ErrorCode.resource, f"exemplar memory {self.root} is open for writing by {holder}",
                            hint="share one memory actor, or open it read-only") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._lock_fd = fd

    def _load(self) -> None:
        man_path = self.root / MANIFEST
        if man_path.exists():
            man = json.loads(man_path.read_text())
            if man.get("embedder") != self.embedder.name:
                raise ToolError(ErrorCode.schema, f"memory {self.root} was built with embedder "
                                f"{man.get('embedder')!r}, not {self.embedder.name!r}",
                                hint="open it with the same embedder, or use another --memory folder")
            self._gen, self._ckpt_seq = int(man["generation"]), int(man.get("wal_seq", 0))
            self._seq = self._ckpt_seq
            for task, info in man.get("tasks", {}).items():
                idx = VectorIndex.read(self.root / info["index"], self.index_kind, self.flat_max)
                self._shards[task] = _Shard(idx, [""] * idx.ntotal)
            for rec, pos in read_sidecar(self.root / man["records"]):
                self._records[rec.id] = rec
                shard = self._shards.get(rec.task)
                if shard is None or pos >= len(shard.ids):
                    raise ToolError(ErrorCode.schema, f"memory {self.root}: record {rec.id} has no vector")
                shard.ids[pos] = rec.id
        self._replay()

    def _replay(self) -> None:
        wal = self.root / WAL
        if not wal.exists():
            return
        for line in wal.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a torn last line of a killed writer: never acknowledged
                log.warning("memory %s: skipping a torn WAL line", self.root)
                continue
            if int(entry["seq"]) <= self._ckpt_seq:
                continue
            self._seq = max(self._seq, int(entry["seq"]))
            if entry["op"] == "add":
                vec = np.frombuffer(base64.b64decode(entry["vector"]), dtype=np.float32)
                self._insert(Exemplar.from_dict(entry["record"]), vec)
            elif entry["op"] == "merge":
                self._merge(entry["id"], entry["case"])
            self.counters["replayed"] += 1
            self._since_ckpt += 1

    def _log(self, entry: dict[str, Any]) -> None:
        if self._wal is None:
            return
        self._seq += 1
        self._wal.write(json.dumps(dict(entry, seq=self._seq)) + "\n")
        self._wal.flush()
        os.fsync(self._wal.fileno())

    def checkpoint(self) -> None:
        """Write a new generation (indices, sidecar, manifest) and empty the WAL."""
        if self.root is None or self.readonly:
            return
        with self._rw.write():
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        gen = self._gen + 1
        tasks = {}
        for task, shard in self._shards.items():
            name = f"{_safe(task)}.{gen}.faiss"
            shard.index.write(self.root / name)
            tasks[task] = {"index": name, "n": shard.index.ntotal, "kind": shard.index.kind}
        pos = {rid: i for shard in self._shards.values() for i, rid in enumerate(shard.ids)}
        records = f"records.{gen}.parquet"
        write_sidecar([(r, pos[r.id]) for r in self._records.values()], self.root / records)
        _atomic_json({"version": 1, "generation": gen, "embedder": self.embedder.name, "dim": self.embedder.dim,
                      "tasks": tasks, "records": records, "wal_seq": self._seq, "written": time.time()},
                     self.root / MANIFEST)
        self._gen, self._ckpt_seq, self._since_ckpt = gen, self._seq, 0
        if self._wal is not None:
            self._wal.close()
            _atomic_write_empty(self.root / WAL)
            self._wal = open(self.root / WAL, "a", encoding="utf-8")
        for old in self.root.iterdir():  # earlier generations are unreachable now
            m = re.search(r"\.(\d+)\.(faiss|parquet)$", old.name)
            if m and int(m.group(1)) < gen:
                old.unlink(missing_ok=True)

    def close(self) -> None:
        if self.root is not None and not self.readonly and self._since_ckpt:
            self.checkpoint()
        if self._wal is not None:
            self._wal.close()
            self._wal = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---- records ----------------------------------------------------------------------------
    def _shard(self, task: str) -> _Shard:
        if task not in self._shards:
            self._shards[task] = _Shard(VectorIndex(self.embedder.dim, self.index_kind, self.flat_max))
        return self._shards[task]

    def _insert(self, rec: Exemplar, vec: np.ndarray) -> None:
        if rec.id in self._records:
            return
        shard = self._shard(rec.task)
        shard.index.add(vec.reshape(1, -1))
        shard.ids.append(rec.id)
        self._records[rec.id] = rec

    def _merge(self, rid: str, case: str) -> None:
        rec = self._records.get(rid)
        if rec is not None:
            rec.support += 1
            if case and case not in rec.merged_cases:
                rec.merged_cases.append(case)

    def add(self, rec: Exemplar, *, verified: bool = True, material_issues: int = 0) -> dict[str, Any]:
        """Curate and (maybe) add one exemplar.

        Returns:
            ``{action: added|merged|rejected, reason, id, similar_id, similarity, size}``.
        """
        if self.readonly:
            raise ToolError(ErrorCode.sandbox, f"exemplar memory {self.root} is open read-only")
        vec = self.embedder.embed([rec.profile_text])[0]
        with self._rw.write():
            shard = self._shards.get(rec.task)
            near_id, near = None, None
            if rec.id in self._records:
                near_id, near = rec.id, 1.0
            elif shard is not None and shard.index.ntotal:
                # the nearest exemplar of the same structure (a duplicate must agree on it)
                scores, pos = shard.index.search(vec.reshape(1, -1), 8)
                for sc, p in zip(scores[0], pos[0]):
                    if p >= 0 and self._records[shard.ids[int(p)]].structure == rec.structure:
                        near_id, near = shard.ids[int(p)], float(sc)
                        break
            d = decide(self.policy, verified=verified, material_issues=material_issues,
                       task_size=len(shard.ids) if shard else 0, nearest_id=near_id, nearest_cosine=near)
            if d.action == "add":
                self._log({"op": "add", "record": rec.to_dict(),
                           "vector": base64.b64encode(vec.astype(np.float32).tobytes()).decode()})
                self._insert(rec, vec)
                self.counters["added"] += 1
            elif d.action == "merge":
                self._log({"op": "merge", "id": d.similar_id, "case": rec.case})
                self._merge(d.similar_id, rec.case)
                self.counters["merged"] += 1
            else:
                self.counters["rejected"] += 1
            if d.action != "reject":
                self._since_ckpt += 1
                if self.root is not None and self._since_ckpt >= self.checkpoint_every:
                    self._checkpoint_locked()
            size = len(self._shards[rec.task].ids) if rec.task in self._shards else 0
        return {"action": {"add": "added", "merge": "merged", "reject": "rejected"}[d.action], "reason": d.reason,
                "id": rec.id if d.action == "add" else d.similar_id, "similar_id": d.similar_id,
                "similarity": d.similarity, "size": size}

    def search(self, task: str, text: str, k: int = 3, *, profile: str | None = None,
               exclude_case: str | None = None) -> list[dict[str, Any]]:
        """Top-``k`` exemplars of ``task`` nearest to ``text`` (cosine), best first.

        ``profile`` keeps only exemplars of that evidence profile (searched with 4x
        oversampling); ``exclude_case`` drops exemplars that came from that case (a rerun
        must not retrieve its own report). Each hit: ``{score, record}``.
        """
        vec = self.embedder.embed([text])
        with self._rw.read():
            self.counters["searches"] += 1
            shard = self._shards.get(task)
            if shard is None or not shard.ids or k <= 0:
                return []
            want = k * 4 if (profile or exclude_case) else k
            scores, pos = shard.index.search(vec, want)
            hits = []
            for s, p in zip(scores[0], pos[0]):
                if p < 0:
                    continue
                rec = self._records[shard.ids[int(p)]]
                if (profile and rec.profile != profile) or (exclude_case and exclude_case in (rec.case, *rec.merged_cases)):
                    continue
                hits.append({"score": float(s), "record": rec.to_dict()})
                if len(hits) == k:
                    break
            return hits

    def get(self, rid: str) -> dict[str, Any] | None:
        with self._rw.read():
            rec = self._records.get(rid)
            return rec.to_dict() if rec else None

    def __len__(self) -> int:
        return len(self._records)

    def stats(self) -> dict[str, Any]:
        with self._rw.read():
            tasks = {}
            for task, shard in sorted(self._shards.items()):
                recs = [self._records[r] for r in shard.ids]
                profiles: dict[str, int] = {}
                for r in recs:
                    profiles[r.profile] = profiles.get(r.profile, 0) + 1
                tasks[task] = {"exemplars": len(recs), "support": sum(r.support for r in recs),
                               "index": shard.index.kind, "profiles": profiles}
            return {"root": str(self.root) if self.root else None, "embedder": self.embedder.name,
                    "dim": self.embedder.dim, "exemplars": len(self._records), "generation": self._gen,
                    "wal_pending": self._since_ckpt, "readonly": self.readonly, "tasks": tasks,
                    "policy": {"dup_cosine": self.policy.dup_cosine, "per_task_cap": self.policy.per_task_cap},
                    **self.counters}

    def records(self, task: str | None = None) -> list[dict[str, Any]]:
        with self._rw.read():
            return [r.to_dict() for r in self._records.values() if task is None or r.task == task]

    def export(self, path: str | Path) -> Path:
        """Every record as JSON lines (``.jsonl``) or Parquet (``.parquet``)."""
        path = Path(path)
        recs = self.records()
        if path.suffix == ".parquet":
            return write_sidecar([(Exemplar.from_dict(r), i) for i, r in enumerate(recs)], path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
        os.replace(tmp, path)
        return path


def _atomic_write_empty(path: Path) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = ["ExemplarMemory", "MANIFEST", "RWLock", "WAL"]
