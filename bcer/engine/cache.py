"""The content-addressed node cache: (tool, version, params, input digests, device) -> outputs.

A node's key is composed in ONE place, :func:`node_key`, from the small per-type digests of
``engine.digest``: the tool's name and version, the digest of its resolved params, the
content digest of every input (a sequence file's sha256, an upstream output's artifact
digest) and the device it runs on. Equal keys mean equal work, whichever cohort, case or run
asked for it, so a cache folder can be shared by cohorts and by the workers of a cluster
(local disk for one machine, shared storage for many).

One entry is one file ``<root>/<key[:2]>/<key>.entry``: a JSON manifest line (key, tool,
version, params, input and output digests, who stored it, payload length and sha256), then
the pickled outputs. Entries are published atomically (temp file in the same folder, then
``os.replace``), so concurrent writers of the same key never expose half a file and the last
identical copy wins. A reader checks the payload's length and sha256 before unpickling; a
corrupt entry raises :class:`CorruptEntry`, and the node recomputes and republishes it.

The cache holds pickles: point it only at storage you trust, as you would a Python path.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import time
from pathlib import Path
from typing import Any

from ..io import atomic_write_bytes
from .digest import canonical_json

log = logging.getLogger(__name__)
_FORMAT = "bcer-node-cache/1"


class CorruptEntry(Exception):
    """A cache entry whose bytes do not match its manifest (recompute and republish)."""


def node_key(tool: str, version: str, params: dict[str, Any], input_digests: dict[str, str | None],
             device: str) -> str:
    """The cache key of one node run: the only place that composes it."""
    doc = {"format": _FORMAT, "tool": tool, "version": version, "params": params,
           "inputs": dict(sorted(input_digests.items())), "device": device}
    return hashlib.sha256(canonical_json(doc)).hexdigest()


def folder_digest(path: str | os.PathLike) -> str | None:
    """Digest of a model folder as the file system describes it: every file's relative path,
    size and modification time. A node's params name a ``bundle_dir`` by its path only, so new
    weights written into the same folder would otherwise keep the key and be served the old
    model's outputs; stat() instead of hashing keeps multi-GB weights cheap on every node (a
    copy with new times is a miss, never a wrong hit). None when the folder does not exist
    (the tool raises its own error naming it)."""
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(q for q in root.rglob("*") if q.is_file()):
        st = f.stat()
        h.update(f"{f.relative_to(root).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def subfield_digest(digest: str | None, path: tuple[str, ...] | list[str]) -> str | None:
    """Digest of ``@node.<id>.<field>.<sub>...``: the field's digest and the path taken into it."""
    if digest is None or not path:
        return digest
    return hashlib.sha256(f"{digest}:{'.'.join(path)}".encode()).hexdigest()


class NodeCache:
    """A cache folder (created on first write).

    >>> import tempfile; c = NodeCache(tempfile.mkdtemp())
    >>> k = node_key("t.x", "1.0", {"a": 1}, {"img": "d1"}, "cpu")
    >>> c.get(k) is None
    True
    >>> _ = c.put(k, {"value": 3}, {"tool": "t.x"})
    >>> c.get(k)[0]
    {'value': 3}
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.entry"

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """``(outputs, manifest)`` of a stored entry, or None when there is none.

        Raises:
            CorruptEntry: the entry exists but is truncated, altered or not for this key.
        """
        path = self.path(key)
        try:
            with open(path, "rb") as fh:
                head = fh.readline()
                payload = fh.read()
        except FileNotFoundError:
            return None
        try:
            manifest = json.loads(head)
        except ValueError as e:
            raise CorruptEntry(f"unreadable manifest: {e}") from None
        if manifest.get("key") != key or manifest.get("format") != _FORMAT:
            raise CorruptEntry("manifest names another key or format")
        if len(payload) != manifest.get("payload_bytes"):
            raise CorruptEntry(f"payload has {len(payload)} bytes, manifest says {manifest.get('payload_bytes')}")
        if hashlib.sha256(payload).hexdigest() != manifest.get("payload_sha256"):
            raise CorruptEntry("payload sha256 differs from the manifest")
        try:
            outputs = pickle.loads(payload)
        except Exception as e:  # the digest matched, so this is a version skew in the classes
            raise CorruptEntry(f"payload does not unpickle: {type(e).__name__}: {e}") from None
        return outputs, manifest

    def put(self, key: str, outputs: dict[str, Any], manifest: dict[str, Any]) -> Path:
        """Publish an entry atomically (a concurrent identical publish is harmless)."""
        payload = pickle.dumps(outputs, protocol=pickle.HIGHEST_PROTOCOL)
        head = dict(manifest, key=key, format=_FORMAT, payload_bytes=len(payload),
                    payload_sha256=hashlib.sha256(payload).hexdigest(), stored=time.time())
        return atomic_write_bytes(self.path(key), json.dumps(head, default=str).encode() + b"\n", payload)

    def discard(self, key: str) -> None:
        """Remove an entry (a corrupt one, before it is recomputed)."""
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass


__all__ = ["CorruptEntry", "NodeCache", "node_key", "subfield_digest"]
