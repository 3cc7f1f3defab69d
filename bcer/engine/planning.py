"""The planner interface and the plan→compile→revise loop shared by every entry point.

A planner turns (goal, case, contract) into a PlanSketch and, given the compiler's typed
errors, may revise it (bounded). The offline Brain and the LLM planners implement it; a
``StaticPlanner`` replays a sketch file (``--plan sketch.json``).
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol, runtime_checkable

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


def write_planner_events(planner: Planner, case_id: str, case_dir: Path, run_id: str) -> int:
    """Append the planner's pending events of a case (LLM calls, rejected and accepted plans,
    fallbacks) to the case's ``events.jsonl``; a planner without ``pop_events`` has none.

    The planner runs before the case's trace is opened, so its events wait in the planner
    until the engine writes them here, with their own times. Returns how many were written.
    """
    from .trace import TraceWriter

    pop = getattr(planner, "pop_events", None)
    events = pop(case_id) if pop is not None else []
    if events:
        with TraceWriter(case_dir, run_id, case_id) as trace:
            for e in events:
                trace.emit(**e)
    return len(events)


def plan_and_compile(planner: Planner, goal: str, case: Case, contract: TaskContract | None = None,
                     max_revisions: int = 2) -> tuple[PlanSketch, Workflow, int]:
    """Plan, compile, and hand compile errors back to the planner at most ``max_revisions`` times.

    Returns:
        (sketch, workflow, revisions used).
    Raises:
        ToolError: the first compile error (with all of them in ``context['errors']``) once the
            planner cannot or may no longer revise; planner errors pass through.
    """
    from .compiler import CompileError, compile_plan

    sketch = planner.plan(goal, case, contract)
    for revision in range(max_revisions + 1):
        try:
            return sketch, compile_plan(sketch, case, contract), revision
        except CompileError as e:
            errors = list(e.errors)
            log.info("case %s: compile errors (revision %d): %s", case.id, revision, errors)
            revised = planner.revise(sketch, errors, case, contract) if revision < max_revisions else None
            if revised is None:
                first = errors[0] if errors else ToolError(ErrorCode.schema, str(e))
                raise ToolError(first.code, f"plan does not compile: {first.message}", first.hint,
                                case=case.id, errors=[str(x) for x in errors],
                                **{k: v for k, v in first.context.items() if k != "case"}) from e
            sketch = revised
    raise AssertionError("unreachable")
