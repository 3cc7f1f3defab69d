"""Record/replay: every call to JSONL with digests; replay answers identically without a model,
never invents an answer, refuses a corrupt recording."""
from __future__ import annotations

import importlib
import json
import pickle

import pytest

from bcer.agents.llm import make_backend
from bcer.agents.llm.record import ReplayBackend, request_digest
from bcer.contracts import ErrorCode, ToolError

fake = importlib.import_module("tests.agents._fake_llm")
SCHEMA = {"type": "object", "properties": {"x": {"type": "integer"}}}


def test_record_then_replay_gives_the_same_answers(tmp_path) -> None:
    rec = tmp_path / "calls.jsonl"
    inner = fake.ScriptedBackend(['{"x":1}', ['{"x":2}', '{"x":3}'], '{"x":4}'])
    be = make_backend(inner, record=rec)
    m1, m2 = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    first = be.complete(m1, json_schema=SCHEMA)
    second = be.complete(m2, json_schema=SCHEMA, n=2, temperature=0.7, seed=1)
    again = be.complete(m1, json_schema=SCHEMA)  # the same request asked twice, answered differently
    lines = [json.loads(x) for x in rec.read_text().splitlines()]
    assert len(lines) == 3 and lines[0]["request"]["messages"] == m1 and lines[1]["request"]["n"] == 2
    assert lines[0]["request_digest"] == request_digest(m1, SCHEMA, 1, 0.0, 1024, None)
    assert lines[0]["prompt_digest"] == first.prompt_digest and len(lines[0]["texts_digest"]) == 64
    replay = make_backend(f"replay:{rec}")
    replay = pickle.loads(pickle.dumps(replay))  # travels into Reflector actors
    r2 = replay.complete(m2, json_schema=SCHEMA, n=2, temperature=0.7, seed=1)
    r1 = replay.complete(m1, json_schema=SCHEMA)
    r1b = replay.complete(m1, json_schema=SCHEMA)
    assert (r1.texts, r2.texts, r1b.texts) == (first.texts, second.texts, again.texts)
    assert r1.backend == "replay" and r1.model == "scripted" and r1.meta["recorded_backend"] == "fake"
    assert r1.prompt_digest == first.prompt_digest and len(inner.requests) == 3  # no model call on replay
    with pytest.raises(ToolError) as err:  # different sampling settings: not the recorded request
        replay.complete(m1, json_schema=SCHEMA, seed=7)
    assert err.value.code is ErrorCode.resource


def test_failed_calls_are_not_recorded_and_bad_recordings_refused(tmp_path) -> None:
    rec = tmp_path / "calls.jsonl"
    be = make_backend(fake.ScriptedBackend([ToolError("timeout", "slow")]), record=rec)
    with pytest.raises(ToolError):
        be.complete([{"role": "user", "content": "a"}])
    assert not rec.exists() or rec.read_text() == ""
    with pytest.raises(ToolError) as err:
        ReplayBackend(tmp_path / "missing.jsonl")
    assert err.value.code is ErrorCode.input_missing
    ok = make_backend(fake.ScriptedBackend(['{"x":1}']), record=rec)
    ok.complete([{"role": "user", "content": "a"}])
    line = json.loads(rec.read_text())
    line["reply"]["texts"] = ['{"x":666}']  # tampered answer: its digest no longer matches
    rec.write_text(json.dumps(line) + "\n")
    with pytest.raises(ToolError) as err:
        ReplayBackend(rec)
    assert err.value.code is ErrorCode.schema and "line 1" in err.value.message


def test_memo_answers_a_repeated_greedy_request_without_the_model() -> None:
    from bcer.agents.llm.record import MemoBackend

    inner = fake.ScriptedBackend(['{"x":1}', '{"x":2}', '{"x":3}', '{"x":4}'])
    be = MemoBackend(inner)
    m1, m2 = [{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]
    first = be.complete(m1, json_schema=SCHEMA)
    again = be.complete(m1, json_schema=SCHEMA)
    other = be.complete(m2, json_schema=SCHEMA)  # another prompt: the model answers
    hot1 = be.complete(m1, json_schema=SCHEMA, temperature=0.7)  # sampled: never remembered
    hot2 = be.complete(m1, json_schema=SCHEMA, temperature=0.7)
    assert first.texts == again.texts == ['{"x":1}'] and other.texts == ['{"x":2}']
    assert (hot1.texts, hot2.texts) == (['{"x":3}'], ['{"x":4}'])
    assert len(inner.requests) == 4 and be.hits == 1
    assert again.meta["memo_hit"] is True and again.latency_s == 0.0 and "memo_hit" not in first.meta
