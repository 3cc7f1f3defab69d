"""Step-by-step plan decoding: the LLM planner's default way to ask a model for a plan.

Each step is one model call under the step grammar of :mod:`.steps` (only tools that make
progress, only tokens that exist); what has a single option is filled in without a call and
recorded as an ``autofill`` event; the finished steps get the offline planner's finishing
touches (optional ports, metadata params, also ``autofill``) and then the compiler. A compile
error bans the options it names and the plan is decoded again (at most ``max_revisions``
times); an answer that breaks the step grammar (a server that ignores ``response_format``) is
sent back with the errors at most ``max_reasks`` times, then the planner gives up with a
typed error that says so. Nothing reaches the compiler that the step check did not accept.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...contracts import Case, ErrorCode, PlanSketch, PlanStep, TaskContract, ToolError, ToolSpec
from ...engine.compiler import CompileError, compile_plan
from ..planners.offline import OfflinePlanner, goal_milestones
from ..events import PendingEvents
from .base import LLMBackend, LLMReply, Message
from .steps import (
    Choice,
    StepState,
    case_summary,
    check_step,
    choices,
    choices_text,
    step_id,
    step_schema,
    step_text,
    stuck,
)

log = logging.getLogger(__name__)

STEP_SYSTEM = (
    "You are the Brain of bcer, an MRI analysis engine. You build a workflow one step at a time. "
    "Each answer is ONE JSON step: the tool to run next and, in args, the inputs you bind to another "
    "option than their default. Options are listed best first by bcer's rules; the first tool and the "
    "first option of each input are the defaults: keep them (leave the input out of args) unless the goal "
    "asks for something else. Answer with the JSON step only.")
# placeholder names that no case or tool has: a small model copies an example's tokens
STEP_EXAMPLE = '{"tool":"x.tool","args":{}} (defaults) or {"tool":"x.tool","args":{"mask":"@node.y_tool.mask"}}'
STEP_MAX_TOKENS = 128  # one step is ~40 tokens; a rambling unconstrained answer is cut here


@dataclass
class PlanStats:
    """What one decoded plan cost and who decided what (the benchmark and ``plan_accepted``)."""

    calls: int = 0
    model_choices: int = 0  # decisions the model made (a tool among several, a port's option)
    autofilled: int = 0  # decisions without a choice (single candidate, single option, finishing)
    reasks: int = 0
    first_ranked: int = 0  # model decisions that took the first (best-ranked) option
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "model_choices": self.model_choices, "autofilled": self.autofilled,
                "reasks": self.reasks, "first_ranked": self.first_ranked, "decisions": self.decisions}


def step_messages(goal: str, summary: str, contract: TaskContract | None, state: StepState,
                  options: list[Choice]) -> list[Message]:
    task = "no task contract"
    if contract is not None:
        dels = ", ".join(f"{d.name} ({d.kind.value} at {d.milestone})" for d in contract.deliverables)
        task = f"task {contract.id}: milestones {', '.join(contract.milestones)}; deliverables {dels or 'none'}"
    missing = ", ".join(dict.fromkeys(w[0] for w in state.needs()))
    user = (f"Goal: {goal}\n{task}\n{summary}\n{step_text(state)}\nStill missing: {missing}\n"
            f"Choose the next step among:\n{choices_text(options)}\n"
            f"Answer format (other tools): {STEP_EXAMPLE}")
    return [{"role": "system", "content": STEP_SYSTEM}, {"role": "user", "content": user}]


def step_feedback(error: ToolError) -> Message:
    return {"role": "user", "content": f"That step is not valid: [{error.code.value}] {error.message}"
            + (f" ({error.hint})" if error.hint else "") + "\nAnswer with one valid JSON step only."}


def bans(errors: list[ToolError], sketch: PlanSketch) -> set[tuple[str, str, str]]:
    """Options a compile error rules out: ``(tool, port, token)``, or ``(tool, "", "")``."""
    out: set[tuple[str, str, str]] = set()
    for e in errors:
        step = sketch.step(str(e.context.get("step") or ""))
        arg = e.context.get("arg")
        if step is None:
            continue
        if arg == "tool":
            out.add((step.tool, "", ""))
        elif isinstance(arg, str) and isinstance(step.args.get(arg), str):
            out.add((step.tool, arg, step.args[arg]))
    return out


class StepDecoder:
    """Decodes one plan step by step over ``backend`` (see the module docstring)."""

    def __init__(self, backend: LLMBackend, events: PendingEvents, *, k: int = 1, temperature: float = 0.0,
                 revise_temperature: float = 0.7, max_tokens: int = STEP_MAX_TOKENS, max_steps: int = 8,
                 max_reasks: int = 2, max_revisions: int = 2, seed: int = 0,
                 registry: Mapping[str, Any] | None = None):
        self.backend, self.events = backend, events
        self.k, self.temperature, self.revise_temperature = k, temperature, revise_temperature
        self.max_tokens, self.max_steps, self.max_reasks = min(max_tokens, STEP_MAX_TOKENS), max_steps, max_reasks
        self.max_revisions, self.seed, self.registry = max_revisions, seed, registry

    def plan(self, goal: str, case: Case, contract: TaskContract | None, tools: Mapping[str, ToolSpec],
             domain: str, banned: set[tuple[str, str, str]] | None = None) -> tuple[PlanSketch, int, PlanStats]:
        """A compiling sketch, the revisions it took, and its stats.

        Raises:
            ToolError: ``input_missing`` (no tool reaches a milestone), the model's last step
                error after ``max_reasks`` re-asks, a backend error, or the last compile error.
        """
        offline = OfflinePlanner(self.registry)
        rank, pref = offline.ranking(goal, case, contract)
        banned = set(banned or ())
        stats = PlanStats()
        summary = case_summary(case)
        for rnd in range(self.max_revisions + 1):
            state = StepState(case, contract, tools, [] if contract else goal_milestones(goal), rank, pref,
                              banned=banned)
            sketch = self._decode(goal, summary, case, contract, state, domain, rnd, stats)
            sketch = self._finish(offline, sketch, case, contract, stats)
            try:
                wf = compile_plan(sketch, case, contract, registry=self.registry)
            except CompileError as e:
                errors = list(e.errors)
                self.events.add(case.id, "plan_rejected", error_code=errors[0].code.value,
                                message=f"decoded plan of round {rnd}: {errors[0].message[:300]}",
                                data={"round": rnd, "stage": "compile", "errors": [str(x)[:300] for x in errors[:8]]})
                new = bans(errors, sketch) - banned
                if not new or rnd == self.max_revisions:
                    raise ToolError(errors[0].code, f"no compiling plan after {rnd} revision(s): "
                                    f"{errors[0].message}", errors[0].hint, case=case.id) from None
                banned |= new
                continue
            self._compiler_links(case, sketch, wf, stats)
            return sketch, rnd, stats
        raise AssertionError("unreachable")

    # ---- one plan -------------------------------------------------------------------------
    def _decode(self, goal: str, summary: str, case: Case, contract: TaskContract | None, state: StepState,
                domain: str, rnd: int, stats: PlanStats) -> PlanSketch:
        while True:
            options = choices(state)
            if not options:
                if state.needs():
                    raise stuck(state)
                return PlanSketch(goal=goal, domain=domain, steps=state.steps)
            if len(state.steps) >= self.max_steps:
                raise ToolError(ErrorCode.schema, f"the plan reached {self.max_steps} steps with "
                                f"{sorted({w[0] for w in state.needs()})} still missing", case=case.id)
            if len(options) == 1 and not options[0].free():
                choice, picked = options[0], {}
                self._autofill(case, stats, step_id(choice.tool), "tool", choice.tool,
                               "the only tool that can come next")
            else:
                choice, picked = self._ask(goal, summary, case, contract, state, options, rnd, stats)
            sid = step_id(choice.tool)
            for port, tok in choice.forced().items():
                self._autofill(case, stats, sid, port, tok, "the only compatible source")
            args = {**choice.forced(), **picked}
            args = {p.name: args[p.name] for p in choice.spec.inputs if p.name in args}
            state.steps.append(PlanStep(id=sid, tool=choice.tool, args=args, why="decoded step by step"))

    def _ask(self, goal: str, summary: str, case: Case, contract: TaskContract | None, state: StepState,
             options: list[Choice], rnd: int, stats: PlanStats) -> tuple[Choice, dict[str, str]]:
        """One step from the model: asked, checked, re-asked with the errors, or given up."""
        schema = step_schema(options)
        messages = step_messages(goal, summary, contract, state, options)
        index = len(state.steps)
        for attempt in range(self.max_reasks + 1):
            temperature = self.temperature if attempt == 0 else self.revise_temperature
            reply = self._complete(case, messages, schema, temperature, rnd, index, attempt, stats)
            failures: list[tuple[str, ToolError]] = []
            for text in reply.texts:
                try:
                    choice, picked = check_step(text, options)
                except ToolError as e:
                    failures.append((text, e))
                    continue
                self._call_event(case, reply, rnd, index, attempt, [e.code.value for _, e in failures], True)
                self._count_choice(options, choice, picked, stats)
                return choice, picked
            self._call_event(case, reply, rnd, index, attempt, [e.code.value for _, e in failures], False,
                             failures[0][1].message)
            stats.reasks += attempt < self.max_reasks
            messages = messages + [{"role": "assistant", "content": failures[0][0][:2000]},
                                   step_feedback(failures[0][1])]
        err = failures[0][1]
        raise ToolError(err.code, f"the model {self.backend.model!r} ({self.backend.name}) gave no valid step "
                        f"{index + 1} in {self.max_reasks + 1} tries; giving up: {err.message}",
                        "the server may ignore the JSON schema (response_format); use a server that "
                        "honours it, or a larger model", case=case.id, step=index)

    def _complete(self, case: Case, messages: list[Message], schema: dict[str, Any], temperature: float,
                  rnd: int, index: int, attempt: int, stats: PlanStats) -> LLMReply:
        stats.calls += 1
        try:
            return self.backend.complete(messages, json_schema=schema, n=self.k, temperature=temperature,
                                         max_tokens=self.max_tokens, seed=self.seed + 7 * rnd + attempt)
        except ToolError as e:
            self.events.add(case.id, "llm_call", error_code=e.code.value,
                            message=f"step {index + 1}: {e.message[:300]}",
                            data={"backend": self.backend.name, "model": self.backend.model, "purpose": "step",
                                  "round": rnd, "step": index, "attempt": attempt, "accepted": False,
                                  "reasons": [e.code.value], **{k: v for k, v in e.context.items()
                                                                if k in ("attempts", "status", "url")}})
            raise

    def _call_event(self, case: Case, reply: LLMReply, rnd: int, index: int, attempt: int, reasons: list[str],
                    accepted: bool, why: str = "") -> None:
        self.events.add(case.id, "llm_call", duration_s=round(reply.latency_s, 4),
                        error_code=None if accepted else (reasons[0] if reasons else None),
                        message=f"step {index + 1} (round {rnd}, try {attempt + 1}): "
                                + ("accepted" if accepted else f"rejected: {why[:200]}"),
                        data={**reply.event_data(), "purpose": "step", "round": rnd, "step": index,
                              "attempt": attempt, "accepted": accepted, "reasons": reasons})

    @staticmethod
    def _count_choice(options: list[Choice], choice: Choice, picked: dict[str, str], stats: PlanStats) -> None:
        decisions = [(len(options) > 1, options[0].tool == choice.tool)]
        decisions += [(True, choice.free()[p][0] == tok) for p, tok in picked.items()]
        for asked, first in decisions:
            if asked:
                stats.model_choices += 1
                stats.first_ranked += first
        stats.decisions.append({"tool": choice.tool, "args": picked, "of": [c.tool for c in options]})

    # ---- autofill -------------------------------------------------------------------------
    def _autofill(self, case: Case, stats: PlanStats, sid: str, arg: str, value: Any, why: str,
                  source: str = "decoding") -> None:
        stats.autofilled += 1
        self.events.add(case.id, "autofill", message=f"step {sid}: {arg} = {value} ({why})",
                        data={"step": sid, "arg": arg, "value": value, "why": why, "source": source})

    def _finish(self, offline: OfflinePlanner, sketch: PlanSketch, case: Case, contract: TaskContract | None,
                stats: PlanStats) -> PlanSketch:
        done = offline.finish(sketch, case, contract)
        before = {s.id: s.args for s in sketch.steps}
        for step in done.steps:
            for arg, value in step.args.items():
                if arg not in before.get(step.id, {}):
                    self._autofill(case, stats, step.id, arg, value, "finishing rule (optional port or metadata "
                                   "param)", "finish")
        return done

    def _compiler_links(self, case: Case, sketch: PlanSketch, wf: Any, stats: PlanStats) -> None:
        """Required ports the compiler linked to their unique producer (its rule 5)."""
        for node in wf.nodes:
            step = sketch.step(node.id)
            for port, tok in node.inputs.items():
                if step is not None and port not in step.args:
                    self._autofill(case, stats, node.id, port, tok, "unique producer", "compiler")


__all__ = ["STEP_SYSTEM", "PlanStats", "StepDecoder", "bans", "step_feedback", "step_messages"]
