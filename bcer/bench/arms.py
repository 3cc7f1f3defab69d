"""The four controller arms of the ablation (BCER's controller ladder) behind one call.

``react``, ``react_bind`` and ``react_bind_ref`` are :class:`bcer.bench.react.ScriptedReAct`
in process (see that module for exactly what each does on an error observation); ``bcer`` is
the real engine: the planner's sketch is compiled against the contract (typed compile errors
go back to the same planner for at most two revisions), the workflow runs on Ray with
symbolic binding, the case sandbox, a per-node timeout, and bounded local repair by the
Reflector (tier 1 here; tier 2 when an LLM is configured). Every arm takes any planner object
with ``plan``/``revise`` and the same budgets.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ..contracts import Case, ErrorCode, TaskContract, ToolError
from ..contracts.errors import parse_choices
from ..engine.trace import TraceWriter
from .react import ArmOutcome, Memo, ReActConfig, ScriptedReAct

log = logging.getLogger(__name__)

ARMS: tuple[str, ...] = ("react", "react_bind", "react_bind_ref", "bcer")
ARM_DOCS: dict[str, str] = {
    "react": "one call per step with literal arguments (paths, handles); no binder, no sandbox, no compiler; "
             "an error observation goes to the planner's revise (<= 2 per case), a timeout is re-issued once, "
             "else the agent stops",
    "react_bind": "as react, but references are tokens resolved by the engine's binder (alias table, kinds, "
                  "case sandbox on every read)",
    "react_bind_ref": "as react_bind, and a failed step goes first to the Reflector (tier 1, 2 repairs per step, "
                      "5 per case): its patch is applied and the step retried; its halt on sandbox/input_missing "
                      "is final; otherwise the planner's revise as in react",
    "bcer": "the engine: compile (typed errors back to the planner, <= 2 revisions), Ray DAG with binding, "
            "sandbox and per-node timeout (a timed-out node is re-submitted once), Reflector repair of the failed "
            "node only, halt at once on sandbox/input_missing",
}


def resolve_arms(arms: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"all"``, ``"a,b"`` or a list -> arm names, checked (a ``value_range`` ToolError naming an unknown one)."""
    return parse_choices(arms, ARMS, "arm", "arms")


def react_config(arm: str, call_timeout_s: float) -> ReActConfig:
    return ReActConfig(bind=arm != "react", reflector=arm == "react_bind_ref", call_timeout_s=call_timeout_s)


def run_react(arm: str, case: Case, contract: TaskContract, planner: Any, out_dir: Path, *, run_id: str,
              call_timeout_s: float, memo: Memo | None = None, hang_file: str | None = None,
              events: list[dict[str, Any]] = ()) -> ArmOutcome:
    runner = ScriptedReAct(planner, react_config(arm, call_timeout_s), memo=memo, hang_file=hang_file)
    return runner.run(case, contract, out_dir, run_id=run_id, events=events)


def run_engine(case: Case, contract: TaskContract, planner: Any, out_dir: Path, *, run_id: str,
               node_timeout_s: float, seed: int = 0, max_revisions: int = 2,
               events: list[dict[str, Any]] = ()) -> ArmOutcome:
    """The ``bcer`` arm: admit, plan and compile (revising), then the Ray executor. Never raises."""
    from ..agents.repair.reflector import Reflector
    from ..engine.driver import admit_case
    from ..engine.executor import RunContext, run_case_workflow
    from ..engine.planning import plan_and_compile

    t0 = time.time()
    out_dir.mkdir(parents=True, exist_ok=True)
    with TraceWriter(out_dir, run_id, case.id) as trace:
        for e in events:
            trace.emit(e["kind"], message=e.get("message"), data=e.get("data"))
        try:
            admit_case(case, contract)
            sketch, wf, revisions = plan_and_compile(planner, contract.goal, case, contract, max_revisions)
        except ToolError as e:
            trace.emit("plan_rejected", error_code=e.code.value, message=e.message)
            return ArmOutcome("rejected", e.to_dict(), duration_s=round(time.time() - t0, 3))
        except Exception as e:  # a planner crash is a failed case, not a crashed benchmark
            log.exception("planning crashed for %s", case.id)
            err = ToolError(ErrorCode.internal, f"planning crashed: {type(e).__name__}: {e}")
            return ArmOutcome("failed", err.to_dict(), duration_s=round(time.time() - t0, 3))
        trace.emit("plan_accepted", message=f"{len(wf.nodes)} nodes after {revisions} revision(s)")
    (out_dir / "plan.json").write_text(json.dumps(sketch.model_dump(mode="json"), indent=1))
    ctx = RunContext(run_id=run_id, output_dir=out_dir, seed=seed, node_timeout_s=node_timeout_s)
    outcome = run_case_workflow(wf, case, ctx, contract=contract, reflector=Reflector())
    return ArmOutcome(status=outcome.status, error=outcome.error, sr=int(outcome.sr or 0),
                      tcr=float(outcome.tcr or 0.0), validations=dict(outcome.validations),
                      deliverables={k: str(v) for k, v in outcome.deliverables.items()}, repairs=outcome.repairs,
                      revisions=revisions, duration_s=round(time.time() - t0, 3))


__all__ = ["ARMS", "ARM_DOCS", "react_config", "resolve_arms", "run_engine", "run_react"]
