"""The HTTP backend against a real third-party OpenAI-compatible server the test starts:
``transformers serve`` with the shipped SmolLM2 checkpoint on 127.0.0.1.

``transformers serve`` ignores ``response_format``, so its answers are unconstrained: the LLM
Brain must check each step, re-ask with the errors, and give up with a typed error that says
so. The schema-honouring server, llama.cpp's ``llama-server``, is tested in
test_llama_server.py."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from bcer.agents.llm import make_backend
from bcer.agents.llm.local import converted_checkpoint
from bcer.agents.planners.llm import LLMPlanner
from bcer.contracts import Case, ErrorCode, Image, SequenceRef, ToolError, load_contract
from bcer.io import write_nifti

pytestmark = pytest.mark.timeout(600)
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"],
          "additionalProperties": False}
READY_S = 300  # import + model load on two busy cores; the loop ends as soon as /v1/models answers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cli() -> str:
    exe = Path(sys.executable).with_name("transformers")
    return str(exe) if exe.exists() else (shutil.which("transformers") or "transformers")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``transformers serve`` preloading the converted SmolLM2 (once per module)."""
    port, ckpt = _free_port(), converted_checkpoint()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen([_cli(), "serve", str(ckpt), "--host", "127.0.0.1", "--port", str(port),
                                 "--device", "cpu"], stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        t0 = time.monotonic()
        while True:  # bounded wait on the server's own readiness, not a fixed sleep
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited ({proc.returncode}): {log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() - t0 > READY_S:
                    pytest.fail(f"transformers serve not listening after {READY_S} s: {log.read_text()[-2000:]}")
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_transformers_serve_answers_but_ignores_the_schema(served) -> None:
    backend = make_backend(served, timeout_s=300, max_retries=1)
    reply = backend.complete([{"role": "user", "content": "Is the brain in the head? Answer in JSON."}],
                             json_schema=SCHEMA, max_tokens=12)
    assert reply.backend == "http" and reply.model.rstrip("/").endswith(converted_checkpoint().name)
    assert reply.meta["structured"] == "response_format" and reply.completion_tokens
    try:  # unconstrained decoding: the answer does not follow the schema it was sent
        jsonschema.validate(json.loads(reply.texts[0]), SCHEMA)
        followed = True
    except (ValueError, jsonschema.ValidationError):
        followed = False
    assert not followed, reply.texts


def test_the_planner_re_asks_an_unconstrained_server_and_says_when_it_gives_up(served, tmp_path) -> None:
    seqs = {k: SequenceRef(path=str(write_nifti(Image(np.ones((4, 4, 4), np.float32), np.eye(4)),
                                                tmp_path / f"{k}.nii.gz"))) for k in ("T2", "FLAIR")}
    case = Case(id="srv1", root=str(tmp_path), domain="brain", sequences=seqs)  # denoise: T2 or FLAIR?
    contract = load_contract("denoise")
    brain = LLMPlanner(make_backend(served, timeout_s=300, max_retries=0), max_reasks=1, max_tokens=16)
    with pytest.raises(ToolError) as err:
        brain.plan(contract.goal, case, contract)
    assert err.value.code is ErrorCode.schema and "giving up" in err.value.message
    assert "ignore the JSON schema" in err.value.hint
    calls = [e for e in brain.pop_events(case.id) if e["kind"] == "llm_call"]
    assert [c["data"]["attempt"] for c in calls] == [0, 1] and not any(c["data"]["accepted"] for c in calls)
    assert all(c["data"]["backend"] == "http" and c["error_code"] == "schema" for c in calls)
