"""The planner interface, the plan→compile→revise loop, and reuse of compiled plans.

A planner turns (goal, case, contract) into a PlanSketch and, given the compiler's typed
errors, may revise it (bounded). The offline Brain and the LLM planners implement it; a
``StaticPlanner`` replays a sketch file (``--plan sketch.json``).

Optional planner attributes the engine honours:

- ``deterministic = True``: the same (goal, contract, case signature) always gives the same
  plan, so a cohort plans and compiles once per distinct signature (:class:`PlanCache`).
  The signature is :func:`case_signature` (domain, sequence names/kinds/formats, metadata
  keys, and the values of dict-valued metadata, which planners copy into plans); a planner
  that reads other case values defines ``plan_signature(goal, case, contract) -> str``.
  LLM planners leave it unset and are asked per case.
- ``plan``/``revise`` accepting an ``emit`` keyword: called with the case trace's
  ``emit(kind, **fields)``, so a planner can record ``llm_call``/``plan_*`` events.
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

from ..contracts import Case, ErrorCode, PlanSketch, TaskContract, ToolError, Workflow

log = logging.getLogger(__name__)


@runtime_checkable
class Planner(Protocol):
    name: str

    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch: ...

    def revise(self, sketch: PlanSketch, errors: list[ToolError], case: Case,
               contract: TaskContract | None = None) -> PlanSketch | None: ...


class StaticPlanner:
    """Replays one sketch for every case; it cannot revise (compile errors end the case)."""

    name = "static"
    deterministic = True

    def __init__(self, sketch: PlanSketch):
        self.sketch = sketch

    @classmethod
    def from_file(cls, path: str | Path) -> "StaticPlanner":
        path = Path(path)
        try:
            return cls(PlanSketch.model_validate(json.loads(path.read_text())))
        except FileNotFoundError:
            raise ToolError(ErrorCode.input_missing, f"plan file not found: {path}", file=str(path)) from None
        except (ValueError, TypeError) as e:
            raise ToolError(ErrorCode.schema, f"invalid plan sketch {path.name}: {e}", file=str(path)) from e

    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        return self.sketch.model_copy(deep=True)

    def revise(self, sketch, errors, case, contract=None):
        return None


@functools.lru_cache(maxsize=256)
def _takes_emit(fn: Callable) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "emit" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _call(fn: Callable, *args: Any, emit: Callable | None) -> Any:
    if emit is not None and _takes_emit(getattr(fn, "__func__", fn)):
        return fn(*args, emit=emit)
    return fn(*args)


def plan_and_compile(planner: Planner, goal: str, case: Case, contract: TaskContract | None = None,
                     max_revisions: int = 2, emit: Callable[..., Any] | None = None
                     ) -> tuple[PlanSketch, Workflow, int]:
    """Plan, compile, and hand compile errors back to the planner at most ``max_revisions`` times.

    Args:
        emit: the case trace's ``emit``; passed to planners whose ``plan``/``revise`` take it.

    Returns:
        (sketch, workflow, revisions used).
    Raises:
        ToolError: the first compile error (with all of them in ``context['errors']``) once the
            planner cannot or may no longer revise; planner errors pass through.
    """
    from .compiler import CompileError, compile_plan

    sketch = _call(planner.plan, goal, case, contract, emit=emit)
    for revision in range(max_revisions + 1):
        try:
            return sketch, compile_plan(sketch, case, contract), revision
        except CompileError as e:
            errors = list(e.errors)
            log.info("case %s: compile errors (revision %d): %s", case.id, revision, errors)
            revised = (_call(planner.revise, sketch, errors, case, contract, emit=emit)
                       if revision < max_revisions else None)
            if revised is None:
                first = errors[0] if errors else ToolError(ErrorCode.schema, str(e))
                raise ToolError(first.code, f"plan does not compile: {first.message}", first.hint,
                                case=case.id, errors=[str(x) for x in errors],
                                **{k: v for k, v in first.context.items() if k != "case"}) from e
            sketch = revised
    raise AssertionError("unreachable")


def case_signature(case: Case) -> str:
    """What a deterministic planner and the compiler read of a case, as one string."""
    seqs = sorted((k, r.kind.value, r.format, sorted(r.options)) for k, r in case.sequences.items())
    meta = sorted((k, v if isinstance(v, (dict, list)) else type(v).__name__) for k, v in case.metadata.items())
    return json.dumps({"domain": case.domain, "sequences": seqs, "metadata": meta}, sort_keys=True, default=str)


def plan_signature(planner: Any, goal: str, case: Case, contract: TaskContract | None) -> str | None:
    """The key under which a compiled plan is reused; None for a planner that must plan per case."""
    if not getattr(planner, "deterministic", False):
        return None
    custom = getattr(planner, "plan_signature", None)
    part = custom(goal, case, contract) if callable(custom) else case_signature(case)
    # one PlanCache serves one cohort (one contract object), so the contract's id names it
    return json.dumps([getattr(planner, "name", type(planner).__name__), goal,
                       contract.id if contract is not None else None, part])


class PlanCache:
    """Compiled plans per plan signature, for one cohort.

    ``plan()`` returns ``(sketch, workflow, revisions, reused)``; the workflow is shared by the
    cases that reuse it (the executor copies it before a repair changes it). A case whose
    planning fails is not remembered: its error names that case, and the next case plans anew.
    """

    def __init__(self) -> None:
        self._store: dict[str, tuple[PlanSketch, Workflow, int]] = {}
        self.hits = 0

    def plan(self, planner: Planner, goal: str, case: Case, contract: TaskContract | None,
             max_revisions: int = 2, emit: Callable[..., Any] | None = None
             ) -> tuple[PlanSketch, Workflow, int, bool]:
        key = plan_signature(planner, goal, case, contract)
        if key is not None and key in self._store:
            self.hits += 1
            return (*self._store[key], True)
        sketch, wf, revisions = plan_and_compile(planner, goal, case, contract, max_revisions, emit)
        if key is not None:
            self._store[key] = (sketch, wf, revisions)
        return sketch, wf, revisions, False
