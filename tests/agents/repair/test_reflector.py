"""Reflector: every tier-1 patch kind, re-validation, budgets and immediate halts.
Toy tools are registered here (no real MRI tools)."""
from __future__ import annotations

import json
import math
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

import bcer.tools.registry as registry_mod
from bcer.agents.repair.reflector import (Failure, Halt, LLMTier, Patch, Reflector, ReflectorPool, Tier1,
                                   patch_schema, reflector_actor)
from bcer.contracts import Case, ErrorCode, Image, Mask, PlanSketch, SequenceRef, Table, ToolError, Workflow
from bcer.engine.compiler import compile_plan
from bcer.tools.registry import REGISTRY, tool


class SmoothParams(BaseModel):
    model_config = {"extra": "forbid"}
    sigma: float = Field(1.0, ge=0.1, le=5.0)
    iterations: int = Field(3, ge=1, le=10)
    overlap: float = Field(0.25, ge=0.0, lt=1.0)
    mode: Literal["gauss", "median"] = "gauss"


@tool("tr.smooth", milestone="smoothed")
def _smooth(image: Image, params: SmoothParams) -> Image:
    """Toy smoother."""
    return image


class SegParams(BaseModel):
    model_config = {"extra": "forbid"}
    roi_size: tuple[int, int, int] = (64, 64, 32)
    sw_batch_size: int = Field(4, ge=1)
    threshold: float = 0.5


@tool("tr.segment", gpu="optional", output="mask")
def _segment(image: Image, params: SegParams) -> Mask:
    """Toy segmenter with a GPU path."""
    raise NotImplementedError


@tool("tr.gpu_only", gpu="required")
def _gpu_only(image: Image) -> Image:
    """Toy GPU-only tool."""
    raise NotImplementedError


@tool("tr.apply")
def _apply(image: Image, mask: Mask) -> Image:
    """Toy masking (two ports of different kinds)."""
    raise NotImplementedError


class MeasureParams(BaseModel):
    model_config = {"extra": "forbid"}
    weight_kg: float | None = Field(None, gt=0)


@tool("tr.measure", output="table")
def _measure(mask: Mask, params: MeasureParams) -> Table:
    """Toy measurement."""
    raise NotImplementedError


TOOLS = {n: REGISTRY[n] for n in ("tr.smooth", "tr.segment", "tr.gpu_only", "tr.apply", "tr.measure")}
CASE = Case(id="c7", root="/data/c7", metadata={"weight": 70.0},
            sequences={"T1c": SequenceRef(path="t1c.nii.gz"), "T2": SequenceRef(path="t2.nii.gz")})
AVAILABLE = {"@seq.T1c": "image", "@seq.T2": "image", "@node.smooth.image": "image", "@node.seg.mask": "mask"}


@pytest.fixture(autouse=True)
def _no_tool_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_mod, "_LOADED", True)  # toy tools only


@pytest.fixture
def wf() -> Workflow:
    sketch = PlanSketch(goal="toy", steps=[
        {"id": "smooth", "tool": "tr.smooth", "args": {"image": "@seq.T1c"}},
        {"id": "seg", "tool": "tr.segment", "args": {"image": "@node.smooth.image"}},
        {"id": "apply", "tool": "tr.apply", "args": {"image": "@node.smooth.image", "mask": "@node.seg.mask"}},
        {"id": "vol", "tool": "tr.measure", "args": {"mask": "@node.seg.mask", "weight_kg": "@case.weight"}},
        {"id": "gpu", "tool": "tr.gpu_only", "args": {"image": "@seq.T2"}},
    ])
    return compile_plan(sketch, CASE, registry=TOOLS)


def failure(wf: Workflow, node_id: str, code: str, arg: str | None = None, *, inputs: dict | None = None,
            params: dict | None = None, has_gpu: bool = False, bound: dict | None = None, **ctx: Any) -> Failure:
    node = wf.node(node_id)
    node = node.model_copy(update={"inputs": {**node.inputs, **(inputs or {})},
                                   "params": {**node.params, **(params or {})}})
    err = ToolError(code, f"injected {code}", arg=arg, tool=node.tool, **ctx).to_dict()
    return Failure(case_id=CASE.id, node=node, error=err, available=AVAILABLE, bound_kinds=bound or {},
                   has_gpu=has_gpu)


def repair(wf: Workflow, f: Failure, reflector: Reflector | None = None) -> Patch | Halt:
    return (reflector or Reflector(registry=TOOLS)).repair(f, wf, CASE)


# --- tier 1, one test per patch kind ------------------------------------------------------------

@pytest.mark.parametrize("node_id, port, bad, good", [
    ("smooth", "image", "@seq.t1ce", "@seq.T1c"),            # alias through the alias table
    ("smooth", "image", "@seq.T1C", "@seq.T1c"),
    ("apply", "image", "@node.smooth.imag", "@node.smooth.image"),  # field-name fix
    ("apply", "mask", "@node.seg.Mask", "@node.seg.mask"),
    ("apply", "mask", "@node.seg.MASK", "@node.seg.mask"),
    ("apply", "image", "@node.smoth.image", "@node.smooth.image"),  # misspelt node id
    ("smooth", "image", "@seq. t1ce", "@seq.T1c"),  # whitespace slip in the token
    ("apply", "image", "@node..smooth.image", "@node.smooth.image"),
])
def test_token_alias_and_field_fix(wf: Workflow, node_id: str, port: str, bad: str, good: str) -> None:
    p = repair(wf, failure(wf, node_id, "bad_reference", port, inputs={port: bad}))
    assert isinstance(p, Patch) and p.tier == 1 and p.inputs[port] == good
    assert p.params == wf.node(node_id).params  # nothing else touched


@pytest.mark.parametrize("bad", ["@seq.T1", "@seq.FLAIR", "@seq.T2c", "@node.apply.image", "@bogus.x"])
def test_reference_never_guessed_into_other_data(wf: Workflow, bad: str) -> None:
    # T1 is not T1c or T2 (they only look alike); apply has not run: a missing input halts
    h = repair(wf, failure(wf, "smooth", "bad_reference", "image", inputs={"image": bad}))
    assert isinstance(h, Halt) and h.code == "bad_reference"


def test_param_token_fix(wf: Workflow) -> None:
    p = repair(wf, failure(wf, "vol", "bad_reference", "weight_kg", params={"weight_kg": "@case.wieght"}))
    assert isinstance(p, Patch) and p.params["weight_kg"] == "@case.weight"


def test_unknown_param_name_renamed(wf: Workflow) -> None:
    f = failure(wf, "smooth", "schema", "sigam", params={"sigam": 2.0})
    p = repair(wf, f)
    assert isinstance(p, Patch) and p.params["sigma"] == 2.0 and "sigam" not in p.params


def test_invalid_override_back_to_default(wf: Workflow) -> None:
    p = repair(wf, failure(wf, "smooth", "schema", "iterations", params={"iterations": "three"}))
    assert isinstance(p, Patch) and p.params["iterations"] == 3


@pytest.mark.parametrize("name, value, expected", [
    ("sigma", 9.0, 5.0), ("sigma", 0.0, 0.1), ("iterations", 0, 1), ("iterations", 40, 10),
    ("overlap", 1.0, math.nextafter(1.0, 0.0)), ("mode", "box", "gauss"),
])
def test_value_out_of_bounds_clamped(wf: Workflow, name: str, value: Any, expected: Any) -> None:
    p = repair(wf, failure(wf, "smooth", "value_range", name, params={name: value}))
    assert isinstance(p, Patch) and p.params[name] == expected and type(p.params[name]) is type(expected)


@pytest.mark.parametrize("bound", [{"image": "mask", "mask": "image"}, {}])  # {}: kinds from `available`
def test_swapped_inputs_swapped_back(wf: Workflow, bound: dict) -> None:
    f = failure(wf, "apply", "schema", "image", inputs={"image": "@node.seg.mask", "mask": "@node.smooth.image"},
                bound=bound)
    p = repair(wf, f)
    assert isinstance(p, Patch) and p.inputs == {"image": "@node.smooth.image", "mask": "@node.seg.mask"}


def test_no_gpu_falls_back_to_cpu(wf: Workflow) -> None:
    p = repair(wf, failure(wf, "seg", "resource", has_gpu=False))
    assert isinstance(p, Patch) and p.device == "cpu" and p.params == wf.node("seg").params


def test_oom_halves_window_params(wf: Workflow) -> None:
    p = repair(wf, failure(wf, "seg", "resource", has_gpu=True, device="cuda"))
    assert isinstance(p, Patch) and p.params["roi_size"] == [32, 32, 16] and p.params["sw_batch_size"] == 2
    assert p.params["threshold"] == 0.5 and p.device is None
    # at the minimum there is nothing to halve: the GPU tool moves to its CPU path instead
    f = failure(wf, "seg", "resource", has_gpu=True, device="cuda", params={"roi_size": [1, 1, 1], "sw_batch_size": 1})
    p = repair(wf, f)
    assert isinstance(p, Patch) and p.device == "cpu"


def test_gpu_required_without_gpu_halts(wf: Workflow) -> None:
    h = repair(wf, failure(wf, "gpu", "resource", has_gpu=False))
    assert isinstance(h, Halt) and h.code == "resource"


@pytest.mark.parametrize("code", ["numeric", "internal"])
def test_numeric_or_internal_drops_overrides(wf: Workflow, code: str) -> None:
    p = repair(wf, failure(wf, "smooth", code, params={"sigma": 4.0, "iterations": 9}))
    assert isinstance(p, Patch) and p.params["sigma"] == 1.0 and p.params["iterations"] == 3
    # without overrides there is nothing deterministic to do
    h = repair(wf, failure(wf, "smooth", code))
    assert isinstance(h, Halt) and h.code == code


# --- immediate halts, budgets, validation ----------------------------------------------------------

class AlwaysPatch:
    """A tier that would 'repair' anything by lowering sigma (must never see sandbox errors)."""

    tier = 9
    calls = 0

    def __init__(self, sigma: float = 2.0):
        self.sigma = sigma

    def propose(self, failure: Failure, workflow: Workflow, case: Case) -> Patch:
        AlwaysPatch.calls += 1
        return Patch(node_id=failure.node.id, inputs=failure.node.inputs,
                     params={**failure.node.params, "sigma": self.sigma}, reason="always", tier=self.tier)


@pytest.mark.parametrize("code", ["sandbox", "input_missing"])
def test_sandbox_and_input_missing_halt_at_once(wf: Workflow, code: str) -> None:
    AlwaysPatch.calls = 0
    h = Reflector([AlwaysPatch()], registry=TOOLS).repair(failure(wf, "smooth", code, "image"), wf, CASE)
    assert isinstance(h, Halt) and h.code == code and AlwaysPatch.calls == 0
    assert isinstance(Tier1(TOOLS).propose(failure(wf, "smooth", code), wf, CASE), Halt)


def test_budget_per_node_then_per_case(wf: Workflow) -> None:
    r = Reflector(max_per_node=2, max_per_case=3, registry=TOOLS)
    f = failure(wf, "smooth", "value_range", "sigma", params={"sigma": 9.0})
    assert isinstance(repair(wf, f, r), Patch) and isinstance(repair(wf, f, r), Patch)
    h = repair(wf, f, r)
    assert isinstance(h, Halt) and "budget" in h.reason and h.code == "value_range"
    g = failure(wf, "seg", "resource", has_gpu=False)
    assert isinstance(repair(wf, g, r), Patch)  # another node: third repair of the case
    h = repair(wf, g, r)
    assert isinstance(h, Halt) and "case 3/3" in h.reason
    assert r.usage(CASE.id) == {"case": 3, "smooth": 2, "seg": 1}
    r.reset(CASE.id)  # a fresh run of the case gets a fresh budget
    assert r.usage(CASE.id) == {"case": 0} and isinstance(repair(wf, f, r), Patch)


def test_invalid_or_noop_patch_falls_through_to_next_tier(wf: Workflow) -> None:
    f = failure(wf, "smooth", "value_range", "sigma", params={"sigma": 9.0})
    p = Reflector([AlwaysPatch(sigma=99.0), Tier1(TOOLS)], registry=TOOLS).repair(f, wf, CASE)
    assert isinstance(p, Patch) and p.tier == 1 and p.params["sigma"] == 5.0
    noop = Reflector([AlwaysPatch(sigma=1.0)], registry=TOOLS)  # sigma already 1.0: changes nothing
    assert isinstance(noop.repair(failure(wf, "smooth", "shape"), wf, CASE), Halt)


def test_crashing_tier_is_skipped(wf: Workflow) -> None:
    class Broken:
        def propose(self, failure, workflow, case):
            raise RuntimeError("boom")

    p = Reflector([Broken(), AlwaysPatch()], registry=TOOLS).repair(failure(wf, "smooth", "shape"), wf, CASE)
    assert isinstance(p, Patch) and p.params["sigma"] == 2.0


def test_unrepairable_code_halts_with_its_code(wf: Workflow) -> None:
    h = repair(wf, failure(wf, "smooth", "shape", "image"))
    assert isinstance(h, Halt) and h.code == "shape" and h.node_id == "smooth"


# --- tier 2 interface ----------------------------------------------------------------------------

def test_patch_schema_limits_llm_to_tool_params() -> None:
    import jsonschema

    s = patch_schema("tr.apply", AVAILABLE, registry=TOOLS)
    assert s["properties"]["inputs"]["properties"] == {
        "image": {"type": "string", "enum": ["@node.smooth.image", "@seq.T1c", "@seq.T2"]},
        "mask": {"type": "string", "enum": ["@node.seg.mask"]}}
    s = patch_schema("tr.smooth", AVAILABLE, registry=TOOLS)
    assert set(s["properties"]["params"]["properties"]) == {"sigma", "iterations", "overlap", "mode"}
    jsonschema.validate({"params": {"sigma": 2.0}, "reason": "r"}, s)
    for bad in ({"params": {"evil": 1}, "reason": "r"}, {"params": {"sigma": 50}, "reason": "r"},
                {"params": {}, "reason": "r", "code": "import os"}, {"params": {}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, s)


def answers(*payloads: Any) -> Any:
    import importlib

    return importlib.import_module("tests.agents._fake_llm").ScriptedBackend(
        [p if isinstance(p, (str, Exception)) else json.dumps(p) for p in payloads])


def test_llm_tier_retry_is_schema_checked_revalidated_and_recorded(wf: Workflow) -> None:
    backend = answers({"action": "retry", "params": {"sigma": 2.5}, "reason": "smaller kernel"})
    r = Reflector([Tier1(TOOLS), LLMTier(backend, TOOLS)], registry=TOOLS)
    p = r.repair(failure(wf, "smooth", "shape", "image"), wf, CASE)  # tier 1 has nothing for shape
    assert isinstance(p, Patch) and p.tier == 2 and p.action == "retry" and p.params["sigma"] == 2.5
    req = backend.requests[0]
    assert "tr.smooth" in req["messages"][0]["content"] and "[shape]" not in req["messages"][0]["content"]
    assert "skip" not in req["json_schema"]["properties"]["action"]["enum"]  # smooth is required
    events = r.drain_events(CASE.id)
    assert [e["kind"] for e in events] == ["llm_call"] and events[0]["data"]["accepted"] is True
    assert events[0]["node"] == "smooth" and events[0]["data"]["purpose"] == "repair" and r.drain_events(CASE.id) == []
    for bad in ({"params": {"sigma": 2.0, "shell": "rm -rf /"}, "reason": "x"},  # not a param of the tool
                {"params": {"sigma": 0.0}, "reason": "x"},                        # out of its bounds
                {"action": "skip", "reason": "x"},                               # not offered for a required node
                "not json"):
        tier = LLMTier(answers(bad), TOOLS)
        assert tier.propose(failure(wf, "smooth", "shape"), wf, CASE) is None
        assert tier.pending_event["data"]["accepted"] is False and tier.pending_event["error_code"] == "schema"
    # well formed but the compiler refuses it (the node would read its own output): rejected, recorded why
    cyclic = Reflector([LLMTier(answers({"inputs": {"image": "@node.smooth.image"}, "reason": "x"}), TOOLS)],
                       registry=TOOLS)
    assert isinstance(cyclic.repair(failure(wf, "smooth", "shape"), wf, CASE), Halt)
    event = cyclic.drain_events(CASE.id)[0]
    assert event["data"]["accepted"] is False and event["data"]["reasons"] == ["compile"]
    assert "rejected" in event["message"]


def test_llm_tier_insert_skip_halt(wf: Workflow) -> None:
    insert = {"action": "insert", "insert": {"tool": "tr.smooth", "inputs": {"image": "@seq.T2"}, "params": {"sigma": 2}},
              "inputs": {"image": "@node.fix_apply_1.image"}, "reason": "smooth T2 first"}
    backend = answers(insert)
    p = Reflector([LLMTier(backend, TOOLS)], registry=TOOLS).repair(failure(wf, "apply", "shape", "image"), wf, CASE)
    assert isinstance(p, Patch) and p.action == "insert" and p.insert.tool == "tr.smooth"
    assert p.insert.id == "fix_apply_1" and p.insert.params["sigma"] == 2 and p.inputs["image"] == "@node.fix_apply_1.image"
    schema = backend.requests[0]["json_schema"]
    offered = sorted(b["properties"]["tool"]["const"] for b in schema["properties"]["insert"]["anyOf"])
    assert offered == ["tr.gpu_only", "tr.segment", "tr.smooth"]  # tools that make an image or a mask
    assert "@node.fix_apply_1.mask" in schema["properties"]["inputs"]["properties"]["mask"]["enum"]
    unused = dict(insert, inputs={})  # inserting without consuming it is refused
    assert isinstance(Reflector([LLMTier(answers(unused), TOOLS)], registry=TOOLS).repair(
        failure(wf, "apply", "shape", "image"), wf, CASE), Halt)
    optional = wf.model_copy(deep=True)
    optional.node("vol").required = False
    f = failure(optional, "vol", "numeric")
    p = Reflector([LLMTier(answers({"action": "skip", "reason": "side measurement"}), TOOLS)],
                  registry=TOOLS).repair(f, optional, CASE)
    assert isinstance(p, Patch) and p.action == "skip" and p.reason == "llm: side measurement"
    h = Reflector([LLMTier(answers({"action": "halt", "reason": "the scan is unusable"}), TOOLS)],
                  registry=TOOLS).repair(failure(wf, "smooth", "shape"), wf, CASE)
    assert isinstance(h, Halt) and h.code == "shape" and "unusable" in h.reason


def test_llm_tier_never_sees_sandbox_or_missing_input_and_survives_a_dead_backend(wf: Workflow) -> None:
    backend = answers({"params": {"sigma": 2.0}, "reason": "x"})
    r = Reflector([LLMTier(backend, TOOLS)], registry=TOOLS)
    for code in ("sandbox", "input_missing"):
        assert isinstance(r.repair(failure(wf, "smooth", code), wf, CASE), Halt)
    assert backend.requests == []
    dead = Reflector([LLMTier(answers(ToolError("resource", "server down")), TOOLS)], registry=TOOLS)
    assert isinstance(dead.repair(failure(wf, "smooth", "shape"), wf, CASE), Halt)
    assert dead.drain_events(CASE.id)[0]["error_code"] == "resource"


# --- the Ray actor wrapper -------------------------------------------------------------------------

def test_reflector_actor(ray_local, wf: Workflow) -> None:
    actor = reflector_actor(max_per_node=1, max_per_case=1, name="bcer_test_reflector", registry=TOOLS)
    assert ray_local.get(actor.repair.remote(failure(wf, "smooth", "sandbox", "path"), wf, CASE)).code == "sandbox"
    f = failure(wf, "smooth", "numeric", params={"sigma": 4.0})
    p = ray_local.get(actor.repair.remote(f, wf, CASE))
    assert isinstance(p, Patch) and p.params["sigma"] == 1.0
    again = reflector_actor(name="bcer_test_reflector")  # get-or-create by name: the same actor and budget
    h = ray_local.get(again.repair.remote(f, wf, CASE))
    assert isinstance(h, Halt) and "budget" in h.reason
    ray_local.kill(actor)


def test_reflector_pool_of_no_actors_is_refused() -> None:
    with pytest.raises(ToolError) as e:
        ReflectorPool(size=0)
    assert e.value.code is ErrorCode.value_range and e.value.context["arg"] == "size"


def test_reflector_pool_routes_a_case_to_one_member(ray_local) -> None:
    pool = ReflectorPool(size=2, prefix="bcer_test_pool", registry=TOOLS)
    ids = {c: pool.for_case(c)._actor_id for c in ("c0", "c1", "c2", "c3", "c4", "c5")}
    assert {c: pool.for_case(c)._actor_id for c in ids} == ids  # stable
    assert len(set(ids.values())) == 2  # both members used (crc32 of these ids is mixed)
    for m in pool.members:
        ray_local.kill(m)


def test_pool_actor_loads_a_user_tool_module_its_worker_cannot_import_by_name(ray_local, tmp_path) -> None:
    """A user's tool module in a folder no Ray worker has on its path (the driver loaded it by
    file): the pool's actor imports it by file before anything of it is unpickled, and the
    tool is in the actor's registry (a pickled registry snapshot killed the actor instead)."""
    import importlib.util
    import sys
    import uuid

    import ray

    from bcer.agents.repair.reflector import ReflectorPool, plugin_modules
    from bcer.tools.registry import REGISTRY

    name = f"probe_{uuid.uuid4().hex[:8]}"
    src = tmp_path / f"{name}.py"
    src.write_text(
        "from pydantic import BaseModel\n"
        "from bcer import Image, tool\n\n\n"
        "class P(BaseModel):\n    k: int = 1\n\n\n"
        f"@tool('user.{name}', milestone='quantification', output='image')\n"
        "def probe(image: Image, params: P) -> Image:\n    return image\n")
    spec = importlib.util.spec_from_file_location(name, src)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        assert plugin_modules()[name] == str(src)
        pool = ReflectorPool(1, prefix=f"bcer-test-{name}")
        actor = pool.for_case("c1")
        ray.get(actor.__ray_ready__.remote(), timeout=120)
        assert ray.get(actor.usage.remote("c1"), timeout=60) is not None
        pool.close()
    finally:
        REGISTRY.pop(f"user.{name}", None)
        sys.modules.pop(name, None)
