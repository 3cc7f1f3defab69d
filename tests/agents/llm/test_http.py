"""The OpenAI-compatible HTTP backend against a real loopback server (pytest-httpserver):
the structured-output request body, retries with back-off, timeouts, a server that is down or
answers garbage, n > 1 for pass@k, and the LLM planner rejecting bad answers over HTTP."""
from __future__ import annotations

import json
import socket
import threading
import time

import numpy as np
import pytest
from werkzeug import Response

from bcer.agents.llm import make_backend
from bcer.agents.llm.http import OpenAIHTTPBackend
from bcer.agents.planners.llm import LLMPlanner
from bcer.contracts import Case, ErrorCode, Image, SequenceRef, ToolError, load_contract
from bcer.io import write_nifti

SCHEMA = {"title": "Answer", "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "yes or no?"}]


def completion(*texts: str, model: str = "fake-model") -> dict:
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"}
                        for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5 * len(texts), "total_tokens": 12 + 5 * len(texts)}}


def serve_models(httpserver, owner: str = "vllm") -> None:
    httpserver.expect_request("/v1/models", method="GET").respond_with_json(
        {"object": "list", "data": [{"id": "fake-model", "object": "model", "created": 0, "owned_by": owner}]})


def bodies(httpserver, path: str = "/v1/chat/completions") -> list[dict]:
    return [json.loads(req.get_data()) for req, _ in httpserver.log if req.path == path]


def backend(httpserver, **kw) -> OpenAIHTTPBackend:
    kw.setdefault("backoff_s", 0.01)
    return make_backend(httpserver.url_for("/v1"), **kw)


def test_vllm_server_gets_schema_both_ways_and_never_guided_keys(httpserver) -> None:
    serve_models(httpserver, "vllm")
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(
        completion('{"answer":"yes"}', '{"answer":"no"}', '{"answer":"yes"}'))
    be = backend(httpserver)
    reply = be.complete(MESSAGES, json_schema=SCHEMA, n=3, temperature=0.7, max_tokens=20, seed=3)
    assert reply.texts == ['{"answer":"yes"}', '{"answer":"no"}', '{"answer":"yes"}']
    assert reply.model == be.model == "fake-model" and reply.backend == "http"
    assert reply.prompt_tokens == 12 and reply.completion_tokens == 15 and reply.meta["retries"] == 0
    body = bodies(httpserver)[0]
    assert body["model"] == "fake-model" and body["n"] == 3 and body["seed"] == 3 and body["max_tokens"] == 20
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert body["response_format"]["json_schema"]["name"] == "Answer"
    assert body["structured_outputs"] == {"json": SCHEMA}  # vLLM's own key, sent as extra_body
    assert "guided" not in json.dumps(body)


def test_other_servers_get_response_format_only(httpserver) -> None:
    serve_models(httpserver, "llamacpp")
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(completion('{"answer":"no"}'))
    backend(httpserver).complete(MESSAGES, json_schema=SCHEMA)
    body = bodies(httpserver)[0]
    assert "structured_outputs" not in body and body["response_format"]["json_schema"]["schema"] == SCHEMA
    assert "guided" not in json.dumps(body)


def test_5xx_and_429_are_retried_a_bounded_number_of_times(httpserver) -> None:
    serve_models(httpserver)
    for status in (503, 429):
        httpserver.expect_oneshot_request("/v1/chat/completions", method="POST").respond_with_json(
            {"error": "busy"}, status=status)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json(completion('{"answer":"no"}'))
    reply = backend(httpserver, max_retries=3).complete(MESSAGES, json_schema=SCHEMA)
    assert reply.texts == ['{"answer":"no"}'] and reply.meta["retries"] == 2
    httpserver.clear()
    serve_models(httpserver)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json({"error": "down"}, status=502)
    with pytest.raises(ToolError) as err:
        backend(httpserver, max_retries=2).complete(MESSAGES)
    assert err.value.code is ErrorCode.resource and "502" in err.value.message
    assert len(bodies(httpserver)) == 3  # the first try and two retries, no more
    httpserver.clear()
    serve_models(httpserver)
    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_json({"error": "bad"}, status=400)
    with pytest.raises(ToolError) as err:
        backend(httpserver, max_retries=2).complete(MESSAGES)
    assert err.value.code is ErrorCode.internal and len(bodies(httpserver)) == 1  # a 400 is not retried


def test_timeout_is_typed_after_retries(httpserver) -> None:
    serve_models(httpserver)

    served = []

    def slow(request):
        time.sleep(0.6)
        served.append(1)
        return Response(json.dumps(completion("{}")), content_type="application/json")

    httpserver.expect_request("/v1/chat/completions", method="POST").respond_with_handler(slow)
    t0 = time.time()
    with pytest.raises(ToolError) as err:
        backend(httpserver, timeout_s=0.2, max_retries=1).complete(MESSAGES)
    assert err.value.code is ErrorCode.timeout and err.value.context["attempts"] == 2
    assert time.time() - t0 < 5
    while len(served) < 2 and time.time() - t0 < 10:  # let the server finish the abandoned requests, so
        time.sleep(0.1)                               # they cannot reach the next test's handlers


def test_server_down_is_resource() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    be = make_backend(f"http://127.0.0.1:{port}/v1#m", max_retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(ToolError) as err:
        be.complete(MESSAGES)
    assert err.value.code is ErrorCode.resource and "cannot reach" in err.value.message
    with pytest.raises(ToolError) as err:  # and without a model name it cannot even ask /models
        make_backend(f"http://127.0.0.1:{port}", max_retries=0).complete(MESSAGES)
    assert err.value.code is ErrorCode.resource and "name the model" in err.value.hint


def test_garbage_answers_are_schema_errors(httpserver) -> None:
    serve_models(httpserver)
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json({"id": "x", "choices": []})
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_data("<html>oops</html>",
                                                                              content_type="text/html")
    be = backend(httpserver, max_retries=0)
    for _ in range(2):
        with pytest.raises(ToolError) as err:
            be.complete(MESSAGES)
        assert err.value.code is ErrorCode.schema
    # a garbage body is retried (bounded) like a 5xx: garbage, then a completion
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_data("{\"choices\": nul",
                                                                              content_type="application/json")
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(completion('{"answer":"yes"}'))
    reply = backend(httpserver, max_retries=2).complete(MESSAGES)
    assert reply.texts == ['{"answer":"yes"}'] and reply.meta["retries"] == 1


class DroppingServer:
    """A raw TCP server on 127.0.0.1 that reads each request and closes the socket without a
    byte of answer (a crashed or restarting server); counts the connections it dropped."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.dropped = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                self.dropped += 1

    def close(self) -> None:
        self.sock.close()


def test_dropped_connections_are_retried_then_typed_and_recorded_as_llm_calls(tmp_path) -> None:
    server = DroppingServer()
    try:
        be = make_backend(f"http://127.0.0.1:{server.port}/v1#m", max_retries=2, backoff_s=0.01, timeout_s=5)
        with pytest.raises(ToolError) as err:
            be.complete(MESSAGES)
        assert err.value.code is ErrorCode.resource and err.value.context["attempts"] == 3
        assert server.dropped == 6  # /models and the completion: each the first try and two retries
        # the planner over a dead server: a typed error at once (no fallback), the failed call an event
        seqs = {k: SequenceRef(path=str(write_nifti(Image(np.ones((4, 4, 4), np.float32), np.eye(4)),
                                                    tmp_path / f"{k}.nii.gz"))) for k in ("T2", "FLAIR")}
        case = Case(id="d1", root=str(tmp_path), domain="brain", sequences=seqs)
        brain = LLMPlanner(be)
        with pytest.raises(ToolError) as err:
            brain.plan(load_contract("denoise").goal, case, load_contract("denoise"))
        assert err.value.code is ErrorCode.resource and server.dropped == 9
        calls = [e for e in brain.pop_events(case.id) if e["kind"] == "llm_call"]
        assert len(calls) == 1 and calls[0]["error_code"] == "resource"
        assert calls[0]["data"]["attempts"] == 3 and calls[0]["data"]["accepted"] is False
    finally:
        server.close()


def test_bad_spec_is_a_typed_error() -> None:
    for spec in ("ftp://x", "gpt-4", "replay:"):
        with pytest.raises(ToolError) as err:
            make_backend(spec)
        assert err.value.code is ErrorCode.value_range


def test_llm_brain_over_http_rejects_malformed_and_unknown_tools_and_uses_n(httpserver, tmp_path) -> None:
    seqs = {}
    for name in ("T1", "T1c", "T2", "FLAIR"):
        path = write_nifti(Image(np.ones((4, 4, 4), np.float32), np.eye(4)), tmp_path / f"{name}.nii.gz")
        seqs[name] = SequenceRef(path=str(path))
    case = Case(id="h1", root=str(tmp_path), domain="brain", sequences=seqs)
    contract = load_contract("segment_brain")
    good = json.dumps({"steps": [{"tool": "seg.brain_tumor", "id": "seg_brain_tumor",
                                  "args": {"t1": "@seq.T1", "t1c": "@seq.T1c", "t2": "@seq.T2", "flair": "@seq.FLAIR"}}]})
    unknown = good.replace("seg.brain_tumor", "os.system")
    serve_models(httpserver)
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(completion("{oops", unknown))
    httpserver.expect_oneshot_request("/v1/chat/completions").respond_with_json(completion(unknown, good))
    brain = LLMPlanner(backend(httpserver), k=2, max_revisions=1, decoding="plan")
    sketch = brain.plan(contract.goal, case, contract)
    assert [s.tool for s in sketch.steps] == ["seg.brain_tumor"]
    sent = bodies(httpserver)
    assert [b["n"] for b in sent] == [2, 2] and all(b["temperature"] > 0 for b in sent)
    tools = sent[0]["response_format"]["json_schema"]["schema"]["properties"]["steps"]["items"]["anyOf"]
    # the task's allowed tools: the segmenter, and the resampler the Reflector may insert
    assert sorted(t["properties"]["tool"]["const"] for t in tools) == ["resample.to_grid", "seg.brain_tumor"]
    events = brain.pop_events(case.id)
    assert [e["error_code"] for e in events if e["kind"] == "plan_rejected"] == ["schema", "bad_reference",
                                                                                 "bad_reference"]
    calls = [e for e in events if e["kind"] == "llm_call"]
    assert [c["data"]["accepted"] for c in calls] == [False, True] and calls[0]["data"]["backend"] == "http"
