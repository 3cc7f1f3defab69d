"""Compiler: each of the seven rules accepts a good sketch and rejects a bad one with a typed,
located error (step, arg, alternatives). Toy tools are registered here (no real MRI tools)."""
from __future__ import annotations

import pickle
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

import bcer.tools.registry as registry_mod
from bcer.contracts import (Case, Cine, DeliverableSpec, ErrorCode, Image, Mask, PlanSketch, Report,
                            SequenceRef, Table, TaskContract, Transform, Workflow)
from bcer.engine.compiler import CompileError, compile_plan, validate_node
from bcer.tools.registry import REGISTRY, tool


class DenoiseParams(BaseModel):
    model_config = {"extra": "forbid"}
    strength: float = Field(0.5, ge=0.0, le=1.0)
    window: int = Field(8, ge=2, le=64)


@tool("tc.denoise", milestone="denoised")
def _denoise(image: Image, params: DenoiseParams) -> Image:
    """Toy denoiser."""
    return image


class SegOut(NamedTuple):
    mask: Mask
    probs: Image


class SegParams(BaseModel):
    model_config = {"extra": "forbid"}
    threshold: float = Field(0.5, ge=0.0, le=1.0)


@tool("tc.segment", milestone="segmented", resources={"num_cpus": 2, "memory_mb": 1024}, gpu="optional",
      version="2.1")
def _segment(image: Image, params: SegParams) -> SegOut:
    """Toy segmenter with two outputs."""
    raise NotImplementedError


class RegOut(NamedTuple):
    transform: Transform
    warped: Image


@tool("tc.register", milestone="registered")
def _register(fixed: Image, moving: Image) -> RegOut:
    """Toy registration."""
    raise NotImplementedError


class MeasureParams(BaseModel):
    model_config = {"extra": "forbid"}
    weight_kg: float | None = Field(None, gt=0)
    seed: int = 0
    label: str = "all"


@tool("tc.measure", milestone="measured", output="table")
def _measure(mask: Mask, image: Image | None = None, params: MeasureParams = MeasureParams()) -> Table:
    """Toy measurement."""
    raise NotImplementedError


@tool("tc.report", milestone="reported")
def _report(table: Table) -> Report:
    """Toy report."""
    raise NotImplementedError


@tool("tc.cine_mid")
def _cine_mid(cine: Cine) -> Image:
    """Toy cine frame picker."""
    raise NotImplementedError


TOOLS = {n: REGISTRY[n] for n in ("tc.denoise", "tc.segment", "tc.register", "tc.measure", "tc.report",
                                   "tc.cine_mid")}


@pytest.fixture(autouse=True)
def _no_tool_discovery(monkeypatch: pytest.MonkeyPatch) -> None:
    # validate_params looks tools up globally; the real tool modules are not needed here
    monkeypatch.setattr(registry_mod, "_LOADED", True)


def make_case(**seqs: str) -> Case:
    seqs = seqs or {"T1c": "image", "t2w": "image", "CINE": "cine"}
    return Case(id="c1", root="/data/c1",
                sequences={k: SequenceRef(path=f"{k}.nii.gz", kind=v) for k, v in seqs.items()},
                metadata={"weight": 70.5, "history": "none"})


CONTRACT = TaskContract(
    id="toy", domain="brain", goal="segment and measure", allowed_tools=["tc.*"],
    milestones=["segmented", "measured"],
    deliverables=[DeliverableSpec(name="seg", kind="mask", milestone="segmented", file="seg.nii.gz"),
                  DeliverableSpec(name="volumes", kind="table", milestone="measured", file="volumes.json")])


def sketch(*steps: dict) -> PlanSketch:
    return PlanSketch(goal="toy", steps=list(steps))


def compile_(sk: PlanSketch, case: Case | None = None, contract: TaskContract | None = None) -> Workflow:
    return compile_plan(sk, case or make_case(), contract, registry=TOOLS)


def errors_of(sk: PlanSketch, case: Case | None = None, contract: TaskContract | None = None) -> list:
    with pytest.raises(CompileError) as e:
        compile_(sk, case, contract)
    return e.value.errors


GOOD = sketch(
    {"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.t1ce", "strength": 0.2}},
    {"id": "seg", "tool": "tc.segment", "args": {"image": "@node.den.image"}},
    {"id": "vol", "tool": "tc.measure", "args": {"mask": "@node.seg.mask", "weight_kg": "@case.weight",
                                                 "seed": "@runtime.seed"}},
)


def test_good_plan_compiles_fully_specified() -> None:
    wf = compile_(GOOD, contract=CONTRACT)
    assert [n.id for n in wf.nodes] == ["den", "seg", "vol"]
    den, seg, vol = wf.nodes
    assert den.inputs == {"image": "@seq.T1c"}  # alias normalised to the case's own key
    assert den.params == {"strength": 0.2, "window": 8}  # rule 4: defaults filled
    assert vol.params == {"weight_kg": "@case.weight", "seed": "@runtime.seed", "label": "all"}
    assert seg.outputs == ["mask", "probs"] and seg.version == "2.1" and seg.gpu == "optional"
    assert seg.resources.num_cpus == 2 and seg.resources.memory_mb == 1024 and seg.milestone == "segmented"
    assert sorted(wf.edges) == [("den", "seg"), ("seg", "vol")]
    assert wf.task == "toy" and wf.case_id == "c1"
    assert Workflow.model_validate_json(wf.model_dump_json()) == wf  # JSON audit record round-trips


# --- rule 1: tools exist and are allowed -------------------------------------------------------

def test_rule1_unknown_tool_suggests() -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoize", "args": {"image": "@seq.T1c"}}))
    assert [e.code for e in errs] == [ErrorCode.bad_reference]
    assert errs[0].context["step"] == "den" and "'tc.denoise'" in errs[0].hint


def test_rule1_tool_not_allowed_by_contract() -> None:
    narrow = CONTRACT.model_copy(update={"allowed_tools": ["tc.segment", "tc.measure"]})
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}}), contract=narrow)
    assert errs[0].code is ErrorCode.schema and errs[0].context["arg"] == "tool"
    assert "tc.segment" in errs[0].hint
    # the same step passes without the restriction
    assert compile_(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}})).nodes


def test_rule1_reference_to_unknown_tool_step_reported_once() -> None:
    errs = errors_of(sketch({"id": "a", "tool": "tc.nope", "args": {}},
                            {"id": "b", "tool": "tc.denoise", "args": {"image": "@node.a.image"}}))
    assert len(errs) == 1 and errs[0].context["step"] == "a"


# --- rule 2: arg names exist -------------------------------------------------------------------

def test_rule2_unknown_arg_did_you_mean() -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c", "strenght": 0.3}}))
    assert errs[0].code is ErrorCode.schema
    assert errs[0].context["step"] == "den" and errs[0].context["arg"] == "strenght"
    assert "did you mean 'strength'" in errs[0].hint


def test_rule2_duplicate_step_id() -> None:
    errs = errors_of(sketch({"id": "a", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}},
                            {"id": "a", "tool": "tc.denoise", "args": {"image": "@seq.t2w"}}))
    assert errs[0].code is ErrorCode.schema and errs[0].context["arg"] == "id"


# --- rule 3: tokens point to something of the right kind -----------------------------------------

@pytest.mark.parametrize("args, code, arg, hint_has", [
    ({"image": "@seq.FLAIR"}, ErrorCode.bad_reference, "image", "valid"),
    ({"image": "@seq.T1cc"}, ErrorCode.bad_reference, "image", "'T1c'"),
    ({"image": "@seq.CINE"}, ErrorCode.schema, "image", "@seq.T1c"),  # cine into an image port
    ({"image": "@seq."}, ErrorCode.bad_reference, "image", ""),
    ({"image": "@case.weight"}, ErrorCode.bad_reference, "image", "params"),
    ({"image": "T1c.nii.gz"}, ErrorCode.schema, "image", "@seq"),  # literal for a port
    ({"image": "@seq.T1c", "strength": "@case.wieght"}, ErrorCode.bad_reference, "strength", "'weight'"),
    ({"image": "@seq.T1c", "strength": "@runtime.sed"}, ErrorCode.bad_reference, "strength", "'seed'"),
    ({"image": "@seq.T1c", "strength": "@seq.T1c"}, ErrorCode.bad_reference, "strength", "ports"),
    ({"image": "@seq.T1c", "strength": "@case.history"}, ErrorCode.schema, "strength", ""),  # str into float
])
def test_rule3_bad_tokens(args: dict, code: ErrorCode, arg: str, hint_has: str) -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": args}))
    assert errs[0].code is code, errs
    assert errs[0].context["step"] == "den" and errs[0].context["arg"] == arg
    assert hint_has in errs[0].hint


@pytest.mark.parametrize("token, code, hint_has", [
    ("@node.den.imag", ErrorCode.bad_reference, "'image'"),
    ("@node.dne.image", ErrorCode.bad_reference, "'den'"),
    ("@node.seg.mask", ErrorCode.schema, "@node.seg.probs"),  # mask into an image port
    ("@node.den.image.data", ErrorCode.bad_reference, "@node.den.image"),
])
def test_rule3_bad_node_references(token: str, code: ErrorCode, hint_has: str) -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}},
                            {"id": "seg", "tool": "tc.segment", "args": {"image": "@seq.T1c"}},
                            {"id": "d2", "tool": "tc.denoise", "args": {"image": token}}))
    assert errs[0].code is code and errs[0].context["arg"] == "image" and errs[0].context["step"] == "d2"
    assert hint_has in errs[0].hint


def test_rule3_good_tokens_of_every_scope() -> None:
    wf = compile_(sketch({"id": "mid", "tool": "tc.cine_mid", "args": {"cine": "@seq.cine"}},
                         {"id": "seg", "tool": "tc.segment", "args": {"image": "@node.mid.image"}},
                         {"id": "vol", "tool": "tc.measure", "args": {"mask": "@node.seg.mask",
                                                                      "image": "@node.seg.probs",
                                                                      "label": "@runtime.run_id"}}))
    assert wf.node("mid").inputs == {"cine": "@seq.CINE"}
    assert wf.node("vol").inputs == {"mask": "@node.seg.mask", "image": "@node.seg.probs"}
    assert wf.node("vol").params["label"] == "@runtime.run_id"


def test_rule3_nested_token_in_param_rejected() -> None:
    errs = errors_of(sketch({"id": "vol", "tool": "tc.measure",
                             "args": {"mask": "@seq.T1c", "label": ["@case.weight"]}},),
                     make_case(T1c="mask"))
    assert errs[0].code is ErrorCode.bad_reference and errs[0].context["arg"] == "label"


# --- rule 4: params validated against bounds -----------------------------------------------------

@pytest.mark.parametrize("value, code", [(1.5, ErrorCode.value_range), (-0.1, ErrorCode.value_range),
                                         ("strong", ErrorCode.schema), (float("nan"), ErrorCode.value_range)])
def test_rule4_param_out_of_bounds(value: object, code: ErrorCode) -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c", "strength": value}}))
    assert errs[0].code is code and errs[0].context["arg"] == "strength" and errs[0].context["step"] == "den"


def test_rule4_case_value_checked_against_bounds() -> None:
    case = make_case()
    case.metadata["weight"] = -3
    errs = errors_of(sketch({"id": "vol", "tool": "tc.measure", "args": {"mask": "@seq.T1c",
                                                                         "weight_kg": "@case.weight"}}),
                     case.model_copy(update={"sequences": {"T1c": SequenceRef(path="m.nii.gz", kind="mask")}}))
    assert errs[0].code is ErrorCode.value_range and "@case.weight gives -3" in errs[0].message


# --- rule 5: unset ports linked only from a unique producer --------------------------------------

def test_rule5_unique_producer_linked() -> None:
    wf = compile_(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}},
                         {"id": "seg", "tool": "tc.segment", "args": {"image": "@node.den.image"}},
                         {"id": "vol", "tool": "tc.measure", "args": {}}))
    assert wf.node("vol").inputs == {"mask": "@node.seg.mask"}  # optional image stays unset
    assert ("seg", "vol") in wf.edges
    one = compile_(sketch({"id": "den", "tool": "tc.denoise", "args": {}}), make_case(T2="image"))
    assert one.node("den").inputs == {"image": "@seq.T2"}


def test_rule5_ambiguous_is_an_error_not_a_guess() -> None:
    errs = errors_of(sketch({"id": "seg", "tool": "tc.segment", "args": {}}))  # T1c and t2w are images
    assert errs[0].code is ErrorCode.bad_reference and errs[0].context["arg"] == "image"
    assert "@seq.T1c" in errs[0].hint and "@seq.t2w" in errs[0].hint


def test_rule5_no_producer() -> None:
    errs = errors_of(sketch({"id": "rep", "tool": "tc.report", "args": {}}))
    assert errs[0].code is ErrorCode.input_missing and errs[0].context["arg"] == "table"


def test_rule5_downstream_steps_are_not_candidates() -> None:
    # den's only image candidates would be @seq.T2 and seg.probs, but seg depends on den
    wf = compile_(sketch({"id": "den", "tool": "tc.denoise", "args": {}},
                         {"id": "seg", "tool": "tc.segment", "args": {"image": "@node.den.image"}}),
                  make_case(T2="image"))
    assert wf.node("den").inputs == {"image": "@seq.T2"}


# --- rule 6: edges from tokens + after, acyclic --------------------------------------------------

def test_rule6_after_adds_edges_and_orders() -> None:
    wf = compile_(sketch({"id": "b", "tool": "tc.denoise", "args": {"image": "@seq.t2w"}, "after": ["a"]},
                         {"id": "a", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}}))
    assert [n.id for n in wf.nodes] == ["a", "b"] and wf.edges == [("a", "b")]


def test_rule6_after_unknown_step() -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}},
                            {"id": "d2", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}, "after": ["dne"]}))
    assert errs[0].code is ErrorCode.bad_reference and errs[0].context["arg"] == "after"
    assert "'den'" in errs[0].hint


def test_rule6_cycle_named() -> None:
    errs = errors_of(sketch({"id": "a", "tool": "tc.denoise", "args": {"image": "@node.b.image"}},
                            {"id": "b", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}, "after": ["a"]}))
    assert errs[0].code is ErrorCode.schema
    assert errs[0].context["cycle"] in ("a -> b -> a", "b -> a -> b")


# --- rule 7: contract milestones and deliverables ------------------------------------------------

def test_rule7_deliverables_from_last_node_and_required_flags() -> None:
    wf = compile_(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.T1c"}},
                         {"id": "seg0", "tool": "tc.segment", "args": {"image": "@seq.T1c"}},
                         {"id": "seg", "tool": "tc.segment", "args": {"image": "@node.den.image"}},
                         {"id": "vol", "tool": "tc.measure", "args": {"mask": "@node.seg.mask"}},
                         {"id": "side", "tool": "tc.denoise", "args": {"image": "@seq.t2w"}}),
                  contract=CONTRACT)
    got = {d.name: (d.node, d.field, d.file) for d in wf.deliverables}
    assert got == {"seg": ("seg", "mask", "seg.nii.gz"), "volumes": ("vol", "table", "volumes.json")}
    req = {n.id: n.required for n in wf.nodes}
    assert req == {"den": True, "seg0": True, "seg": True, "vol": True, "side": False}


def test_rule7_missing_milestone_and_deliverable() -> None:
    errs = errors_of(sketch({"id": "seg", "tool": "tc.segment", "args": {"image": "@seq.T1c"}}),
                     contract=CONTRACT)
    assert {e.context.get("milestone") for e in errs} == {"measured"}
    assert {e.context.get("deliverable") for e in errs} == {None, "volumes"}
    assert all("tc.measure" in e.hint for e in errs)


def test_no_contract_everything_required_no_deliverables() -> None:
    wf = compile_(GOOD)
    assert all(n.required for n in wf.nodes) and wf.deliverables == [] and wf.task is None


def test_all_errors_collected_in_one_round() -> None:
    errs = errors_of(sketch({"id": "den", "tool": "tc.denoise", "args": {"image": "@seq.FLAIR", "strenght": 1}},
                            {"id": "seg", "tool": "tc.segmnt", "args": {}},
                            {"id": "vol", "tool": "tc.measure", "args": {"mask": "@node.den.mask"}}))
    assert [(e.context["step"], e.context["arg"]) for e in errs] == [
        ("seg", "tool"), ("den", "strenght"), ("den", "image"), ("vol", "mask")]


def test_compile_error_pickles_with_all_errors() -> None:
    with pytest.raises(CompileError) as e:
        compile_(sketch({"id": "a", "tool": "tc.x"}, {"id": "b", "tool": "tc.y"}))
    back = pickle.loads(pickle.dumps(e.value))
    assert isinstance(back, CompileError) and len(back.errors) == 2
    assert back.code is ErrorCode.bad_reference and back.errors[1].context["step"] == "b"


# --- validate_node: one patched node, same rules ---------------------------------------------------

def test_validate_node_accepts_and_normalises() -> None:
    wf = compile_(GOOD, contract=CONTRACT)
    patched = wf.node("den").model_copy(update={"params": {"strength": 0.9}, "inputs": {"image": "@seq.T1GD"}})
    node = validate_node(wf, patched, make_case(), CONTRACT, registry=TOOLS)
    assert node.params == {"strength": 0.9, "window": 8} and node.inputs == {"image": "@seq.T1c"}
    assert node.required and node.milestone == "denoised"


@pytest.mark.parametrize("update, code, arg", [
    ({"params": {"strength": 3.0}}, ErrorCode.value_range, "strength"),
    ({"params": {"strenth": 0.1}}, ErrorCode.schema, "strenth"),
    ({"inputs": {"image": "@node.vol.table"}}, ErrorCode.schema, "image"),  # downstream: a cycle
    ({"inputs": {}}, ErrorCode.input_missing, "image"),
    ({"inputs": {"image": "@seq.DWI"}}, ErrorCode.bad_reference, "image"),
])
def test_validate_node_rejects(update: dict, code: ErrorCode, arg: str) -> None:
    wf = compile_(GOOD, contract=CONTRACT)
    with pytest.raises(CompileError) as e:
        validate_node(wf, wf.node("den").model_copy(update=update), make_case(), CONTRACT, registry=TOOLS)
    assert e.value.code is code and e.value.context["arg"] == arg and e.value.context["step"] == "den"


# --- robustness: whatever a planner writes, the compiler answers with typed errors -----------------

_values = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=12),
                    st.sampled_from(["@seq.T1c", "@seq.t1ce", "@seq.CINE", "@node.a.image", "@node.b.mask",
                                     "@case.weight", "@runtime.seed", "@", "@node.a", "@seq.T1c.x"]),
                    st.lists(st.text(max_size=4), max_size=3))
_names = st.sampled_from(["image", "strength", "window", "mask", "label", "weight_kg", "bogus", "threshold"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(TOOLS) + ["tc.nope"]), st.dictionaries(_names, _values, max_size=4),
                          st.lists(st.sampled_from(["a", "b", "c", "zz"]), max_size=2)), min_size=1, max_size=3))
def test_arbitrary_sketches_compile_or_raise_typed_errors(steps: list) -> None:
    sk = sketch(*({"id": sid, "tool": t, "args": args, "after": after}
                  for sid, (t, args, after) in zip("abc", steps)))
    try:
        wf = compile_(sk, contract=None)
    except CompileError as e:
        assert e.errors and all(isinstance(x.code, ErrorCode) for x in e.errors)
        assert all("step" in x.context or "milestone" in x.context for x in e.errors)
        return
    assert Workflow.model_validate_json(wf.model_dump_json()) == wf
    for n in wf.nodes:  # every compiled input is a token naming something real
        for tok in n.inputs.values():
            if tok.startswith("@seq."):
                assert tok[5:] in make_case().sequences
            else:
                assert (tok.split(".")[1], n.id) in wf.edges


def test_non_finite_literal_in_unbounded_param_rejected() -> None:
    errs = errors_of(sketch({"id": "seg", "tool": "tc.segment", "args": {"image": "@seq.T1c"}},
                            {"id": "vol", "tool": "tc.measure", "args": {"mask": "@node.seg.mask",
                                                                         "weight_kg": float("inf")}}))
    assert errs[0].code is ErrorCode.value_range and errs[0].context["arg"] == "weight_kg"


def test_compiled_workflow_is_reproducible() -> None:
    # inputs follow the tool's port order whatever order the plan wrote them in
    a = compile_(sketch({"id": "r", "tool": "tc.register", "args": {"moving": "@seq.t2w", "fixed": "@seq.T1c"}}))
    b = compile_(sketch({"id": "r", "tool": "tc.register", "args": {"fixed": "@seq.T1c", "moving": "@seq.t2w"}}))
    assert list(a.node("r").inputs) == ["fixed", "moving"] and a.model_dump_json() == b.model_dump_json()
