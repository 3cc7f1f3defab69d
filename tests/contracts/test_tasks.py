"""The task contracts (the nine of BCER plus the generic ``recon``): they load, and every milestone/deliverable is producible by a
registered tool the contract allows."""
from __future__ import annotations

import pytest

from bcer.bench.quality import METRICS
from bcer.contracts import list_contracts, load_contract
from bcer.contracts.sequences import canonical_sequence
from bcer.tools import list_tools

NINE = ["brain_grade", "brain_report", "cardiac_report", "denoise", "prostate_report", "recon", "recon_cardiac",
        "register_prostate", "segment_brain", "superres"]


@pytest.fixture(scope="module")
def specs():
    return list_tools()


def test_the_nine_contracts_are_listed() -> None:
    assert set(NINE) <= set(list_contracts())


@pytest.mark.parametrize("task", NINE)
def test_contract_is_consistent(task: str) -> None:
    c = load_contract(task)
    assert c.id == task and c.goal and c.deliverables and c.milestones
    assert c.chain == ("long" if task.endswith(("report", "grade")) else "short")
    for seq in c.inputs + [a for alts in c.input_alternatives.values() for a in alts]:
        assert canonical_sequence(seq) == seq, f"{task}: input {seq!r} is not a canonical sequence name"
    names = [d.name for d in c.deliverables]
    assert len(names) == len(set(names)) and len({d.file for d in c.deliverables}) == len(names)
    for d in c.deliverables:
        assert d.milestone in c.milestones, f"{task}: deliverable {d.name} at a milestone the task does not require"
        assert d.validators and d.validators[0].type == "exists"
    for q in c.quality:
        assert q.metric in METRICS, f"{task}: no quality metric {q.metric!r}"
        assert q.deliverable in names


@pytest.mark.parametrize("task", NINE)
def test_deliverables_and_milestones_are_producible(task: str, specs) -> None:
    c = load_contract(task)
    allowed = [s for s in specs if c.allows(s.name)]
    for pattern in c.allowed_tools:
        assert any(s.name == pattern or (pattern.endswith(".*") and s.name.startswith(pattern[:-1]))
                   for s in specs), f"{task}: allowed tool {pattern!r} matches no registered tool"
    for m in c.milestones:
        assert any(s.milestone == m for s in allowed), f"{task}: no allowed tool reaches milestone {m!r}"
    for d in c.deliverables:
        makers = [s for s in allowed if s.milestone == d.milestone and any(p.kind == d.kind for p in s.outputs)]
        assert makers, f"{task}: no allowed tool produces {d.name} ({d.kind.value} at {d.milestone})"
        if d.field:
            assert any(s.output(d.field) is not None and s.output(d.field).kind == d.kind for s in makers), \
                f"{task}: no producer of {d.name} has an output port {d.field!r}"


def test_unknown_contract_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match="known"):
        load_contract("segment_brian")


def test_role_problem_is_rule_3b_for_compiler_and_llm_schema() -> None:
    """One rule for the compiler and the LLM planner's schema: roles pin a port's sequences, an
    input alternative stands in only when the case lacks the input (aliases resolve)."""
    reg = load_contract("register_prostate")
    have = ["T2w", "ADC", "DWI"]
    assert reg.role_problem("register.rigid", "fixed", "T2w", have) is None
    why, fits = reg.role_problem("register.rigid", "fixed", "ADC", have)
    assert "takes T2w" in why and fits == ["T2w"]
    assert reg.role_problem("register.rigid", "moving", "adc", have) is None  # alias of ADC
    why, fits = reg.role_problem("register.rigid", "moving", "DWI", have)  # DWI only without ADC
    assert "alternative" in why and fits == ["ADC"]
    assert reg.role_problem("register.rigid", "moving", "DWI", ["T2w", "DWI"]) is None
    den = load_contract("denoise")
    assert den.role_problem("denoise.nlm", "image", "FLAIR", ["T1", "FLAIR"])[1] == ["T1"]
    assert den.role_problem("denoise.nlm", "image", "FLAIR", ["FLAIR"]) is None
