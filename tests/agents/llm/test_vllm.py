"""The in-process vLLM backend with a fake ``vllm`` module: SamplingParams carry the schema as
``structured_outputs`` and ``n``; the engine runs in a Ray actor; a GPU-less cluster fails at
once with ``resource``."""
from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from bcer.agents.llm import make_backend
from bcer.agents.llm.vllm_actor import VLLMBackend, VLLMEngine, check_gpus
from bcer.contracts import ErrorCode, ToolError

SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
FAKE_VLLM = '''
"""A stand-in for vllm: records what it is given, answers from the schema it was given."""
import json
from types import SimpleNamespace

CALLS = []


class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw


class LLM:
    def __init__(self, model, **kw):
        CALLS.append(("init", model, kw))

    def chat(self, conversations, params, use_tqdm=True):
        CALLS.append(("chat", conversations, params.kw))
        so = params.kw.get("structured_outputs")
        answer = json.dumps({"answer": so.json["properties"]["answer"]["enum"][1]}) if so else "free text"
        outs = [SimpleNamespace(text=answer, token_ids=[1, 2, 3], finish_reason="stop")
                for _ in range(params.kw["n"])]
        return [SimpleNamespace(outputs=outs, prompt_token_ids=list(range(7)))]
'''
FAKE_SAMPLING = '''
from dataclasses import dataclass
from typing import Any


@dataclass
class StructuredOutputsParams:
    json: Any = None
'''


@pytest.fixture()
def fake_vllm(tmp_path, monkeypatch):
    pkg = tmp_path / "fakevllm" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(FAKE_VLLM))
    (pkg / "sampling_params.py").write_text(textwrap.dedent(FAKE_SAMPLING))
    monkeypatch.syspath_prepend(str(pkg.parent))
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    yield pkg.parent
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        sys.modules.pop(name, None)


def test_engine_passes_schema_as_structured_outputs_and_n(fake_vllm) -> None:
    import vllm

    engine = VLLMEngine("org/model", tensor_parallel_size=2, engine_kwargs={"max_model_len": 4096})
    out = engine.complete([{"role": "user", "content": "?"}], SCHEMA, n=3, temperature=0.5, max_tokens=32, seed=4)
    assert out["texts"] == ['{"answer": "no"}'] * 3 and out["prompt_tokens"] == 7 and out["completion_tokens"] == 9
    init, chat = vllm.CALLS
    assert init == ("init", "org/model", {"tensor_parallel_size": 2, "max_model_len": 4096,
                                          "distributed_executor_backend": "mp"})
    kw = chat[2]
    assert kw["n"] == 3 and kw["temperature"] == 0.5 and kw["seed"] == 4 and kw["max_tokens"] == 32
    assert kw["structured_outputs"].json == SCHEMA
    assert not any("guided" in k for k in kw)


def test_gpu_less_cluster_fails_at_once(ray_local) -> None:
    t0 = time.time()
    with pytest.raises(ToolError) as err:
        make_backend("vllm:org/model")
    assert err.value.code is ErrorCode.resource and "GPU" in err.value.message
    assert time.time() - t0 < 10  # never a pending actor
    with pytest.raises(ToolError) as err:  # two one-GPU nodes cannot hold tensor parallel 2
        check_gpus(2, {"GPU": 2.0}, [{"Alive": True, "Resources": {"GPU": 1.0}}] * 2)
    assert err.value.code is ErrorCode.resource and "one node" in err.value.message
    check_gpus(2, {"GPU": 2.0}, [{"Alive": True, "Resources": {"GPU": 2.0}}])
    with pytest.raises(ToolError) as err:
        make_backend("vllm:org/model@two")
    assert err.value.code is ErrorCode.value_range


def test_engine_actor_on_ray_answers_through_the_backend(ray_local, fake_vllm) -> None:
    """The engine in a Ray actor (no GPU asked here: the fake needs none), reached through the
    backend's handle exactly as the Brain and the Reflector reach it."""
    path = os.pathsep.join(p for p in (str(fake_vllm), os.environ.get("PYTHONPATH", "")) if p)
    actor = ray_local.remote(VLLMEngine).options(num_cpus=0, runtime_env={"env_vars": {"PYTHONPATH": path}}).remote(
        "org/model", 1, None)
    backend = VLLMBackend.attach(actor, "org/model")
    try:
        reply = backend.complete([{"role": "user", "content": "?"}], json_schema=SCHEMA, n=2)
        assert reply.texts == ['{"answer": "no"}'] * 2 and reply.backend == "vllm" and reply.prompt_tokens == 7
        free = backend.complete([{"role": "user", "content": "?"}])
        assert free.texts == ["free text"]
    finally:
        backend.close()
    deadline = time.time() + 20  # ray.kill is asynchronous: a call may still slip in just before it lands
    while True:
        try:
            backend.complete([{"role": "user", "content": "?"}])
        except ToolError as err:  # the engine is gone: a typed error, not a hang
            assert err.code is ErrorCode.resource
            break
        assert time.time() < deadline, "a killed engine still answers"
        time.sleep(0.5)
