"""The LLM path through the engine on Ray: an LLM repair (insert) applied by the executor with
its ``llm_call`` in the trace; an LLM-planned cohort recorded from a loopback OpenAI-compatible
server and replayed bit for bit without it; a case whose answers are all invalid is rejected
and nothing of it runs."""
from __future__ import annotations

import importlib
import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest

import bcer
from bcer.agents.repair.reflector import Reflector, Tier1
from bcer.agents.repair.llm_tier import LLMTier
from bcer.contracts import Case, Image, PlanSketch, SequenceRef
from bcer.engine.compiler import compile_plan
from bcer.engine.executor import RunContext, run_case_workflow
from bcer.engine.trace import read_case_trace
from bcer.io import write_nifti

importlib.import_module("tests.engine._exec_tools")  # xtoy.* tools, in the driver and the workers
fake = importlib.import_module("tests.agents._fake_llm")
pytestmark = pytest.mark.timeout(240)


def nifti_case(root: Path, case_id: str, shape=(8, 8, 4), seed: int = 0) -> Case:
    root.mkdir(parents=True, exist_ok=True)
    # a bright ball in noise: denoising it keeps the image (pure noise would not stay plausible)
    grid = np.indices(shape).astype(np.float32) - (np.asarray(shape, np.float32) - 1)[:, None, None, None] / 2
    ball = 200.0 * (np.sqrt((grid ** 2).sum(0)) < min(shape) / 2)
    data = (ball + np.random.default_rng(seed).normal(100, 10, shape)).astype(np.float32)
    path = write_nifti(Image(data, np.diag([1.5, 1.5, 3.0, 1.0])), root / f"{case_id}_t1.nii.gz")
    return Case(id=case_id, root=str(root), domain="brain", sequences={"T1": SequenceRef(path=str(path))})


def test_llm_insert_repair_runs_through_the_executor(ray_local, tmp_path) -> None:
    case = nifti_case(tmp_path / "in", "odd", shape=(7, 8, 4))
    plan = PlanSketch(goal="t", steps=[{"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1}},
                                       {"id": "even", "tool": "xtoy.needs_even", "args": {"img": "@node.a.image"}}])

    def answer(messages, schema, n):
        assert "xtoy.pad_even" in json.dumps(schema["properties"]["insert"])
        return json.dumps({"action": "insert", "insert": {"tool": "xtoy.pad_even", "inputs": {"img": "@node.a.image"}},
                           "inputs": {"img": "@node.fix_even_1.image"}, "reason": "pad the odd axis"})

    reflector = Reflector([Tier1(), LLMTier(fake.ScriptedBackend(answer))])
    rc = RunContext(run_id="t-" + uuid.uuid4().hex[:6], output_dir=tmp_path / "out" / case.id)
    outcome = run_case_workflow(compile_plan(plan, case), case, rc, reflector=reflector)
    assert outcome.status == "succeeded", outcome.error
    events = read_case_trace(rc.output_dir)
    kinds = [e.kind for e in events]
    call = events[kinds.index("llm_call")]
    assert kinds.index("failed") < kinds.index("llm_call") < kinds.index("repaired")  # in order, in the trace
    assert call.node == "even" and call.data["accepted"] is True and call.data["action"] == "insert"
    assert [e.node for e in events if e.kind == "succeeded"].count("fix_even_1") == 1


PLAN = {"steps": [{"tool": "denoise.nlm", "id": "denoise_nlm", "args": {"image": "@seq.T1", "h_factor": 0.9}}]}


def test_llm_cohort_is_recorded_and_replayed_bit_for_bit(ray_local, httpserver, tmp_path, monkeypatch) -> None:
    # whole-plan decoding: the fake server answers whole plans (a one-input denoise plan has no
    # choice left for the step decoder, which would autofill it without asking the model)
    from bcer.agents.planners.llm import LLMPlanner
    from bcer.agents.specs import Controller

    monkeypatch.setattr(Controller, "new_planner", lambda self: LLMPlanner(self.backend, k=self.llm_k, decoding="plan"))
    httpserver.expect_request("/v1/models").respond_with_json(
        {"object": "list", "data": [{"id": "fake-model", "object": "model", "owned_by": "vllm"}]})

    def chat(request):
        from werkzeug import Response

        body = json.loads(request.get_data())
        case_id = re.search(r"^case (\S+) ", body["messages"][1]["content"], re.M).group(1)
        text = "{garbage" if case_id == "bad" else json.dumps(PLAN)
        return Response(json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": "fake-model",
                                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                 "finish_reason": "stop"}],
                                    "usage": {"prompt_tokens": 50, "completion_tokens": 30}}),
                        content_type="application/json")

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(chat)
    cases = [nifti_case(tmp_path / "in", f"c{i}", seed=i) for i in range(2)] + [nifti_case(tmp_path / "in", "bad")]
    rec = tmp_path / "llm.jsonl"
    # audit: the plan and workflow files of both runs are compared below
    common = dict(task="denoise", planner="llm", reflector="tier1,llm", max_in_flight=2, audit=True)
    first = bcer.Study(cases, out=tmp_path / "rec", llm=httpserver.url_for("/v1"), llm_record=rec, **common).run()
    asked = len(httpserver.log)
    status = {r["case"]: r["status"] for r in first.rows}
    assert status == {"c0": "succeeded", "c1": "succeeded", "bad": "rejected"}, first.rows
    bad = read_case_trace(tmp_path / "rec" / "bad")
    # nothing of it ran: the trace holds the case's start and end and the planner's events only
    assert {e.kind for e in bad} == {"case_started", "llm_call", "plan_rejected", "case_finished"}
    assert all(e.error_code == "schema" for e in bad if e.kind == "plan_rejected")

    again = bcer.Study(cases, out=tmp_path / "rep", llm=f"replay:{rec}", **common).run()
    assert len(httpserver.log) == asked  # the replay asked no model
    assert [(r["case"], r["status"], r["sr"]) for r in again.rows] == [(r["case"], r["status"], r["sr"]) for r in first.rows]
    for c in ("c0", "c1"):
        a, b = tmp_path / "rec" / c, tmp_path / "rep" / c
        assert (a / "plan.json").read_text() == (b / "plan.json").read_text()
        assert (a / "workflow.json").read_text() == (b / "workflow.json").read_text()
        digests = [{k: v["artifact_digest"] for k, v in json.loads((d / "provenance.json").read_text())
                    ["deliverables"].items()} for d in (a, b)]
        assert digests[0] == digests[1] and all(digests[0].values())
        calls = [e for e in read_case_trace(b) if e.kind == "llm_call"]
        assert calls[0].data["backend"] == "replay" and calls[0].data["accepted"] is True
    table = again.events.to_pylist()
    assert any(r["kind"] == "plan_accepted" and json.loads(r["data"])["model"] == "fake-model" for r in table)


def test_cohort_with_a_dead_server_ends_with_typed_rejections(ray_local, tmp_path) -> None:
    """Nothing listens at the planner's address: every case is rejected with a typed error after
    bounded retries, each attempt is an ``llm_call`` event, and the cohort returns (never hangs)."""
    import socket

    from bcer.bench.cases import synth_task_cases

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a port that was free a moment ago: connections are refused
    cases = synth_task_cases("brain_report", 2, tmp_path / "data", "small", seed=3)
    result = bcer.Study(cases, out=tmp_path / "out", task="brain_report", planner="llm",
                        llm=f"http://127.0.0.1:{port}/v1", max_in_flight=2).run()
    assert [r["status"] for r in result.rows] == ["rejected", "rejected"]
    assert all(r["error_code"] == "resource" and "cannot reach" in r["error_message"] for r in result.rows)
    calls = [e for e in result.events.to_pylist() if e["kind"] == "llm_call"]
    assert {e["case"] for e in calls} == {c.id for c in cases}
    assert all(json.loads(e["data"])["accepted"] is False for e in calls)
