"""The content-addressed node cache: keys, atomic publication, corruption, reuse across cohorts."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

import bcer
from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.cache import CorruptEntry, NodeCache, node_key
from bcer.io import read_nifti, write_nifti


pytestmark = pytest.mark.timeout(150)


def test_key_changes_with_every_part_and_only_with_them():
    base = dict(tool="t.x", version="1.0", params={"a": 1, "b": [1, 2]}, input_digests={"img": "d1"}, device="cpu")
    k = node_key(**base)
    assert k == node_key(**dict(base, params={"b": [1, 2], "a": 1}))  # key order is not content
    for change in (dict(tool="t.y"), dict(version="1.1"), dict(params={"a": 2, "b": [1, 2]}),
                   dict(input_digests={"img": "d2"}), dict(device="cuda")):
        assert node_key(**dict(base, **change)) != k


def test_entries_publish_atomically_and_corruption_is_detected(tmp_path):
    cache = NodeCache(tmp_path)
    key = node_key("t.x", "1", {}, {"img": "d"}, "cpu")
    payload = {"image": np.arange(200_000, dtype=np.float32)}
    seen: list = []

    def reader():
        for _ in range(300):
            try:
                got = cache.get(key)
            except CorruptEntry as e:  # a reader must never see half an entry
                seen.append(f"corrupt: {e}")
                return
            if got is not None:
                seen.append(float(got[0]["image"].sum()))

    writers = [threading.Thread(target=cache.put, args=(key, payload, {"n": i})) for i in range(6)]
    r = threading.Thread(target=reader)
    r.start()
    for w in writers:
        w.start()
    for t in (*writers, r):
        t.join()
    assert not [s for s in seen if isinstance(s, str)]
    outputs, manifest = cache.get(key)
    np.testing.assert_array_equal(outputs["image"], payload["image"])
    assert manifest["key"] == key and not list(cache.path(key).parent.glob("*.tmp"))
    raw = cache.path(key).read_bytes()
    cache.path(key).write_bytes(raw[:-10] + b"x" * 10)  # a flipped tail
    with pytest.raises(CorruptEntry, match="sha256"):
        cache.get(key)
    cache.path(key).write_bytes(raw[: len(raw) // 2])  # a truncated file
    with pytest.raises(CorruptEntry, match="bytes"):
        cache.get(key)


def plan(m2_add: float = 1.0) -> PlanSketch:
    """a -> b -> {m1, m2}: two measurement branches; only m2's param changes between runs."""
    return PlanSketch(goal="cache", steps=[
        {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1}},
        {"id": "b", "tool": "xtoy.step", "args": {"img": "@node.a.image", "add": 2}},
        {"id": "m1", "tool": "xtoy.measure", "args": {"img": "@node.b.image"}},
        {"id": "m2", "tool": "xtoy.step", "args": {"img": "@node.b.image", "add": m2_add}}])


def cases(root: Path, n: int = 2) -> list[Case]:
    out = []
    for i in range(n):
        p = write_nifti(Image(np.full((5, 5, 3), float(i), np.float32), np.eye(4)), root / f"k{i}" / "t1.nii.gz")
        out.append(Case(id=f"k{i}", root=str(p.parent), sequences={"T1": SequenceRef(path=str(p))}))
    return out


def executed(result) -> dict[str, list[str]]:
    """Per case, the nodes that really executed in this run (succeeded without a cache hit)."""
    ev = [e for e in result.events.to_pylist() if e["run"] == result.run_id]
    hits = {(e["case"], e["node"]) for e in ev if e["kind"] == "cache_hit"}
    out: dict[str, list[str]] = {}
    for e in ev:
        if e["kind"] == "succeeded" and (e["case"], e["node"]) not in hits:
            out.setdefault(e["case"], []).append(e["node"])
    return {k: sorted(v) for k, v in out.items()}


def files(out: Path, case: str) -> dict:
    prov = json.loads((out / case / "provenance.json").read_text())["deliverables"]
    return {k: v["files"] for k, v in prov.items()}


def test_cache_reuse_changed_param_and_corrupt_entry(ray_local, tmp_path):
    cs, cache = cases(tmp_path / "in"), tmp_path / "cache"
    first = bcer.Study(cs, plan=plan(), out=tmp_path / "o1", cache=cache).run()
    assert executed(first) == {"k0": ["a", "b", "m1", "m2"], "k1": ["a", "b", "m1", "m2"]}
    stored = [e for e in first.events.to_pylist() if e["kind"] == "cache_stored"]
    assert len(stored) == 8 and len(list(cache.rglob("*.entry"))) == 8

    again = bcer.Study(cs, plan=plan(), out=tmp_path / "o2", cache=cache).run()  # another cohort, same cache
    assert executed(again) == {}
    assert all(files(tmp_path / "o2", c.id) == files(tmp_path / "o1", c.id) for c in cs)
    chain = json.loads((tmp_path / "o2" / "k0" / "provenance.json").read_text())["deliverables"]["m2"]["chain"]
    assert all(r["cache"]["hit"] and r["cache"]["stored_by"]["run"] == first.run_id for r in chain)

    changed = bcer.Study(cs, plan=plan(m2_add=5.0), out=tmp_path / "o3", cache=cache).run()
    assert executed(changed) == {"k0": ["m2"], "k1": ["m2"]}  # only the changed node re-executes
    np.testing.assert_allclose(read_nifti(tmp_path / "o3" / "k1" / "m2.nii.gz").data, 1 + 1 + 2 + 5)

    key = next(r["cache"]["key"] for r in chain if r["node"] == "b")
    entry = NodeCache(cache).path(key)
    entry.write_bytes(entry.read_bytes()[:-7])  # corrupt b's entry of case k0
    fixed = bcer.Study(cs, plan=plan(), out=tmp_path / "o4", cache=cache).run()
    assert executed(fixed) == {"k0": ["b"]}  # detected, recomputed; its consumers hit again (same digest)
    ev = [e for e in fixed.events.to_pylist() if e["kind"] == "cache_stored"]
    assert len(ev) == 1 and "replaced_corrupt" in json.loads(ev[0]["data"])
    assert files(tmp_path / "o4", "k0") == files(tmp_path / "o1", "k0")
    assert NodeCache(cache).get(key) is not None


def test_new_weights_in_the_same_bundle_dir_change_the_key(tmp_path):
    """A node's params name its bundle folder by path only: retrained weights written into the
    same folder must change the key (else the cache serves the old model's labels)."""
    import os

    from bcer.engine.cache import folder_digest
    from bcer.engine.noderun import _key_inputs

    bundle = tmp_path / "bundle"
    (bundle / "models").mkdir(parents=True)
    (bundle / "configs").mkdir()
    (bundle / "configs" / "metadata.json").write_text("{}")
    weights = bundle / "models" / "model.pt"
    weights.write_bytes(b"old weights")
    spec = {"ports": [], "port_deps": [], "params": {"bundle_dir": str(bundle), "method": "auto"}}
    first = _key_inputs(spec, ())
    assert first == {"@bundle_dir": folder_digest(bundle)} and first["@bundle_dir"] is not None
    assert _key_inputs(spec, ()) == first  # nothing changed: same key, a hit
    st = weights.stat()
    weights.write_bytes(b"new weights")  # same size: only the time tells
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert _key_inputs(spec, ())["@bundle_dir"] != first["@bundle_dir"]
    k = node_key("seg.x", "1.0", spec["params"], first, "cpu")
    assert node_key("seg.x", "1.0", spec["params"], _key_inputs(spec, ()), "cpu") != k
    assert folder_digest(tmp_path / "absent") is None
    assert _key_inputs({"ports": [], "port_deps": [], "params": {"bundle_dir": None}}, ()) == {}
