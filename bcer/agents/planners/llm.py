"""The LLM planner: a planner that asks a language model for the PlanSketch.

By default (``decoding="steps"``) the plan is decoded one step at a time under a grammar
rebuilt per step (:mod:`bcer.agents.llm.steps`, :mod:`bcer.agents.llm.decode`): only tools
that make progress, only tokens that exist, no end before every milestone; what has one
option is autofilled. The rest of this docstring describes ``decoding="plan"``, where the
model writes the whole plan in one answer.

The prompt holds the goal, the task contract's milestones and deliverables, a summary of
the case (sequence names, kinds, shapes and spacings read from headers, metadata KEYS; never
values nor ground truth) and the allowed tools with their ports, params and milestones.

The answer is constrained to a JSON schema derived from ``PlanSketch`` (:func:`plan_schema`):
``tool`` is one of the allowed tools (one ``anyOf`` branch per tool, so each step's ``args``
keys are that tool's own ports and params), step ids are derived from the tool name, input
ports take only tokens of their artifact kind (a port named after a sequence only that sequence
or a derived artifact), and params take the tool's own param schema or an ``@case``/``@runtime``
token. A backend may ignore the schema, so every answer is checked
again here: not JSON, not a PlanSketch, or a tool outside the allowed set is rejected; then
the compiler checks tokens, kinds, params, links and the contract, and its typed errors go
back to the model for at most ``max_revisions`` more rounds. Nothing rejected is ever run.
With ``fallback`` (``--planner llm,offline``) the offline planner plans when the model cannot,
and the trace says so (``plan_fallback``).

Every model call is an ``llm_call`` event (backend, model, prompt digest, tokens, latency,
accepted or rejected and why); a rejected candidate is a ``plan_rejected`` event with its
errors and the final plan a ``plan_accepted`` event. Events are held per case until the
engine writes them into the case's trace (:meth:`LLMPlanner.pop_events`).
"""
from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from ...contracts import Case, ErrorCode, PlanSketch, PlanStep, TaskContract, ToolError, ToolSpec
from ...contracts.sequences import canonical_sequence
from ...contracts.tokens import RUNTIME_KEYS, Token, ref_name
from ...engine.compiler import CompileError, compile_plan
from .offline import OfflinePlanner, plannable_tools
from ..events import PendingEvents
from ..llm.base import LLMBackend, LLMReply, Message
from ..llm.decode import StepDecoder
from ..llm.steps import case_summary, step_id

log = logging.getLogger(__name__)

SYSTEM = (
    "You are the Brain of bcer, an MRI analysis engine. You plan a workflow as JSON: a list of steps, "
    "each calling one of the allowed tools. Rules: use only the allowed tools; bind every input port "
    "with a token, @seq.<sequence> for a sequence of the case or @node.<step id>.<output> for an output "
    "of another step; set a param only to change its default (a literal, or @case.<metadata key>); "
    "produce every deliverable and milestone of the task, with as few steps as possible. "
    "Answer with the JSON plan only.")
EXAMPLE = ('{"steps":[{"tool":"a.first","id":"a_first","args":{"image":"@seq.T2"}},'
           '{"tool":"b.second","id":"b_second","args":{"image":"@seq.T2","mask":"@node.a_first.mask"}}]}')



# ---- the schema ---------------------------------------------------------------------------------

def _clean(schema: Any, defs: Mapping[str, Any]) -> Any:
    """A pydantic param schema without titles/defaults/descriptions, ``$ref`` inlined and
    ``null`` alternatives dropped (a plan that wants the default leaves the param out)."""
    if isinstance(schema, list):
        return [_clean(s, defs) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        return _clean(defs.get(schema["$ref"].split("/")[-1], {}), defs)
    out = {k: _clean(v, defs) for k, v in schema.items()
           if k not in ("title", "description", "default", "examples", "$defs")}
    if "anyOf" in out:
        alts = [a for a in out["anyOf"] if a != {"type": "null"}]
        if len(alts) == 1:
            rest = {k: v for k, v in out.items() if k != "anyOf"}
            return {**alts[0], **rest}
        out["anyOf"] = alts
    return out


def _fits_contract(key: str, tool: str, port: str, case: Case, contract: TaskContract | None) -> bool:
    """Whether ``@seq.<key>`` fits port ``tool.port`` by the contract's roles and input
    alternatives: the compiler's rule 3b (``TaskContract.role_problem``) applied to the
    schema, so constrained decoding cannot write what the compiler would reject. Measured: a
    135M model bound the alternative @seq.T2 to denoise on BraTS cases that have T1 in 8 of 10
    cases and did not take the compiler's hint in two revisions."""
    return contract is None or contract.role_problem(tool, port, key, case.sequences) is None


def _port_options(port: Any, case: Case, ports: Mapping[str, list[str]], tool: str = "",
                  contract: TaskContract | None = None) -> list[str]:
    """Tokens a port may bind: artifacts of its kind; a port named after a sequence (``t1c``,
    ``adc``, ``flair``: the alias table) takes only that sequence among the case's sequences
    (or any derived artifact of its kind), as the offline planner binds it. Measured: without
    this a 135M model bound T2 to all four ports of the tumour segmenter, a plan that compiles
    and validates and is wrong. Sequences the contract gives another role are left out too
    (unless that would leave the port no sequence at all: the compiler then says why)."""
    options = list(ports.get(port.kind.value, []))
    identity = canonical_sequence(port.name)
    seq = {t: n for t in options if (n := ref_name(t, "seq")) is not None}
    same = [t for t in options if t in seq and canonical_sequence(seq[t]) == identity]
    if identity and same:
        options = same + [t for t in options if t not in seq]
    seqs = [t for t in options if t in seq]
    fit = [t for t in seqs if _fits_contract(seq[t], tool, port.name, case, contract)]
    if fit and len(fit) < len(seqs):
        options = fit + [t for t in options if t not in seq]
    return options


def _args_schema(spec: ToolSpec, case: Case, ports: Mapping[str, list[str]],
                 contract: TaskContract | None = None) -> dict[str, Any]:
    defs = spec.params_schema.get("$defs", {})
    meta_tokens = [str(Token.case(k)) for k in case.metadata] + [str(Token.runtime(k)) for k in RUNTIME_KEYS]
    props: dict[str, Any] = {}
    for port in spec.inputs:
        options = _port_options(port, case, ports, spec.name, contract)
        props[port.name] = {"type": "string", "enum": options} if options else {"type": "string", "maxLength": 64}
    for name, ps in spec.params_schema.get("properties", {}).items():
        props[name] = {"anyOf": [_clean(ps, defs), {"type": "string", "enum": meta_tokens}]}
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": [p.name for p in spec.inputs if p.required]}


def plan_schema(tools: Mapping[str, ToolSpec], case: Case, max_steps: int = 8,
                repeats: int = 1, contract: TaskContract | None = None) -> dict[str, Any]:
    """JSON schema of the plan an LLM may write for ``case`` with ``tools``.

    It is ``PlanSketch`` narrowed: ``steps`` items are ``PlanStep``s whose ``tool`` is one of
    ``tools`` (a ``const`` per ``anyOf`` branch), whose ``id`` is that tool's step id (a tool
    may appear ``repeats`` times), and whose ``args`` hold only that tool's ports (tokens of
    the port's kind: the case's sequences, or outputs of the allowed tools) and params; at most
    ``repeats`` steps per tool (one by default: a second id variant invited a 135M model to
    bind ``@node.<tool>_2...`` steps it never planned). The goal and domain are not asked for:
    the planner knows them.
    """
    ids = {name: [step_id(name, i) for i in range(1, repeats + 1)] for name in tools}
    ports: dict[str, list[str]] = {}
    for key, ref in sorted(case.sequences.items()):
        ports.setdefault(ref.kind.value, []).append(str(Token.seq(key)))
    for name, spec in sorted(tools.items()):
        for out in spec.outputs:
            ports.setdefault(out.kind.value, []).extend(str(Token.node(sid, out.name)) for sid in ids[name])
    branches = []
    for name, spec in sorted(tools.items()):
        branches.append({"type": "object", "additionalProperties": False, "required": ["tool", "id", "args"],
                         "properties": {"tool": {"const": name}, "id": {"enum": ids[name]},
                                        "args": _args_schema(spec, case, ports, contract)}})
    return {"title": "PlanSketch", "type": "object", "additionalProperties": False, "required": ["steps"],
            "properties": {"steps": {"type": "array", "minItems": 1,
                                     "maxItems": max(1, min(max_steps, repeats * len(tools))),
                                     "items": {"anyOf": branches}}}}


# ---- the prompt ---------------------------------------------------------------------------------

def _param_text(name: str, schema: dict[str, Any]) -> str:
    bounds = [f"{op} {schema[k]}" for k, op in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                                                ("exclusiveMaximum", "<")) if k in schema]
    if "enum" in schema:
        bounds.append("one of " + "/".join(map(str, schema["enum"])))
    return f"{name}={json.dumps(schema.get('default'))}" + (f" ({', '.join(bounds)})" if bounds else "")


def tools_text(tools: Mapping[str, ToolSpec]) -> str:
    lines = []
    for name, s in sorted(tools.items()):
        desc = re.split(r"(?<=\.)\s", (s.description or "").strip(), maxsplit=1)[0][:160]
        ins = ", ".join(f"{p.name} ({p.kind.value}{'' if p.required else ', optional'})" for p in s.inputs)
        outs = ", ".join(f"{p.name} ({p.kind.value})" for p in s.outputs)
        params = "; ".join(_param_text(k, v) for k, v in s.params_schema.get("properties", {}).items())
        lines.append(f"- {name} [milestone {s.milestone}]: {desc}\n  inputs: {ins or 'none'}; outputs: {outs}"
                     + (f"\n  params: {params}" if params else ""))
    return "\n".join(lines)


def plan_messages(goal: str, case: Case, contract: TaskContract | None, tools: Mapping[str, ToolSpec]
                  ) -> list[Message]:
    task = "no task contract"
    if contract is not None:
        dels = ", ".join(f"{d.name} ({d.kind.value} at milestone {d.milestone})" for d in contract.deliverables)
        task = (f"task {contract.id}: milestones {', '.join(contract.milestones)}; deliverables {dels or 'none'}")
    user = (f"Goal: {goal}\n{task}\n{case_summary(case)}\nAllowed tools:\n{tools_text(tools)}\n"
            f"Step ids are the tool name with '.' replaced by '_'; use each tool at most once. Example of the format (other tools):\n{EXAMPLE}")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]


def feedback_message(errors: list[ToolError]) -> Message:
    lines = [f"- [{e.code.value}] {e.message}" + (f" ({e.hint})" if e.hint else "") for e in errors[:8]]
    return {"role": "user", "content": "The plan was rejected:\n" + "\n".join(lines)
            + "\nWrite the corrected complete plan as JSON."}


# ---- checking an answer -------------------------------------------------------------------------

def _drop_repeats(steps: list[PlanStep]) -> list[PlanStep]:
    """A step written again word for word (same id, tool, args) is one step: small models
    repeat themselves (measured: SmolLM2 wrote ``resample_to_grid`` or ``recon_grappa`` twice on
    every segment_brain, superres and recon_cardiac case). A repeated id with other content stays,
    and the compiler rejects it with a typed error."""
    seen: set[str] = set()
    out = []
    for s in steps:
        key = json.dumps(s.model_dump(mode="json"), sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out


def parse_plan(text: str, goal: str, domain: str, allowed: set[str]) -> PlanSketch:
    """The PlanSketch an answer holds, or a typed error: ``schema`` (not JSON, not a plan),
    ``bad_reference`` (a tool outside ``allowed``)."""
    try:
        payload = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise ToolError(ErrorCode.schema, f"the answer is not JSON: {e}", "answer with the JSON plan only",
                        answer=text[:120]) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("steps"), list):
        raise ToolError(ErrorCode.schema, "the answer is not a plan: it needs a 'steps' list", answer=text[:120])
    try:
        steps = [PlanStep.model_validate(s) for s in payload["steps"]]
    except ValidationError as e:
        first = e.errors()[0]
        raise ToolError(ErrorCode.schema, f"a step is not valid: {'.'.join(map(str, first['loc']))}: "
                        f"{first['msg']}", answer=text[:120]) from None
    steps = _drop_repeats(steps)
    unknown = [s.tool for s in steps if s.tool not in allowed]
    if unknown:
        from ...contracts.errors import did_you_mean

        raise ToolError(ErrorCode.bad_reference, f"unknown or disallowed tool {unknown[0]!r}",
                        did_you_mean(unknown[0], allowed), arg="tool", tool=unknown[0])
    return PlanSketch(goal=goal, domain=domain, steps=steps)


class LLMPlanner:
    """A planner (``plan``/``revise``) over any :class:`~bcer.agents.llm.base.LLMBackend`.

    Args:
        backend: the model (``bcer.agents.llm.make_backend(spec)``).
        fallback: a planner used when the model gives no compiling plan (``OfflinePlanner()`` for
            ``--planner llm,offline``); None: the case is rejected with the last error.
        max_revisions: model rounds after the first that get the compiler's errors back.
        k: completions per round (pass@k; the first that compiles wins). k > 1 samples at
            ``temperature``; k = 1 decodes the first round greedily.
        revise_temperature: sampling temperature of revision rounds (seeded).
        max_tokens: per completion.
        registry: tool registry mapping (default: the global one).
    """

    deterministic = False  # a model may answer differently per case: plans are never shared

    def __init__(self, backend: LLMBackend, fallback: Any = None, max_revisions: int = 2, k: int = 1,
                 temperature: float = 0.7, max_tokens: int = 512, max_steps: int = 8, seed: int = 0,
                 registry: Mapping[str, Any] | None = None, revise_temperature: float = 0.7,
                 decoding: str = "steps", max_reasks: int = 2):
        if decoding not in ("steps", "plan"):
            raise ToolError(ErrorCode.value_range, f"decoding must be 'steps' or 'plan', got {decoding!r}",
                            arg="decoding")
        self.decoding = decoding
        self.backend, self.fallback = backend, fallback
        self.max_revisions, self.k, self.max_tokens, self.max_steps = max_revisions, k, max_tokens, max_steps
        self.temperature = temperature if k > 1 else 0.0
        # a greedy model shown its own rejected answer tends to repeat it (measured: 3 identical
        # rounds); revision rounds sample (seeded, so reruns and replays are identical)
        self.revise_temperature = max(self.temperature, revise_temperature)
        self.seed = seed
        self._registry = registry
        self.events = PendingEvents()
        self.name = "llm" + (f",{getattr(fallback, 'name', 'fallback')}" if fallback is not None else "")
        self.decoder = StepDecoder(backend, self.events, k=k, temperature=self.temperature,
                                   revise_temperature=self.revise_temperature, max_tokens=max_tokens,
                                   max_steps=max_steps, max_reasks=max_reasks, max_revisions=max_revisions,
                                   seed=seed, registry=registry)

    # ---- the planner interface ----------------------------------------------------------------
    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        """A sketch that compiles, from the model (or the fallback); never an unchecked one.

        Raises:
            ToolError: the model's last error (``schema``, ``bad_reference``, a compile error, or
                the backend's ``resource``/``timeout``) when there is no fallback.
        """
        t0 = time.perf_counter()
        stats: dict[str, Any] = {}
        try:
            sketch, rounds, stats = self._plan_llm(goal, case, contract)
        except ToolError as e:
            if self.fallback is None:
                raise
            self.events.add(case.id, "plan_fallback", error_code=e.code.value,
                            message=f"{getattr(self.fallback, 'name', 'fallback')} planner used: the model gave no "
                                    f"valid plan ({e.message[:200]})",
                            data={"from": "llm", "to": getattr(self.fallback, "name", "fallback")})
            return self.fallback.plan(goal, case, contract)
        self.events.add(case.id, "plan_accepted", message=f"{len(sketch.steps)} steps from the model",
                        duration_s=round(time.perf_counter() - t0, 4),
                        data={"planner": "llm", "decoding": self.decoding, "revisions": rounds,
                              "backend": self.backend.name, "model": self.backend.model,
                              "tools": [s.tool for s in sketch.steps], **stats})
        return sketch

    def revise(self, sketch: PlanSketch, errors: list[ToolError], case: Case,
               contract: TaskContract | None = None) -> PlanSketch | None:
        """One more model round with the compiler's errors; None when it gives no valid sketch.

        Step decoding bans the options the errors name and decodes the plan again."""
        tools = self._tools(case, contract)
        if self.decoding == "steps":
            from ..llm.decode import bans

            try:
                revised, _, _ = self.decoder.plan(sketch.goal, case, contract, tools, self._domain(case, contract),
                                                  bans(errors, sketch))
            except ToolError:
                return None
            return None if revised == sketch else revised
        messages = plan_messages(sketch.goal, case, contract, tools)
        messages += [{"role": "assistant", "content": _steps_json(sketch)}, feedback_message(errors)]
        try:
            revised, _, _ = self._round(messages, tools, sketch.goal, case, contract, "revise", 0)
        except ToolError:
            return None
        return revised

    def pop_events(self, case_id: str) -> list[dict[str, Any]]:
        """Planning events of a case not yet written to its trace (the engine drains them)."""
        return self.events.pop(case_id)

    # ---- the loop -------------------------------------------------------------------------------
    def _tools(self, case: Case, contract: TaskContract | None) -> dict[str, ToolSpec]:
        tools = plannable_tools(case, contract, self._registry)
        if not tools:
            raise ToolError(ErrorCode.input_missing, f"no tool may be planned for case {case.id!r}"
                            + (f" under task {contract.id!r}" if contract else ""), case=case.id)
        return tools

    def _domain(self, case: Case, contract: TaskContract | None) -> str:
        if contract is not None and contract.domain != "any":
            return contract.domain
        return case.domain if case.domain not in ("", "unknown") else "general"

    def _plan_llm(self, goal: str, case: Case, contract: TaskContract | None
                  ) -> tuple[PlanSketch, int, dict[str, Any]]:
        OfflinePlanner._check_domain(goal, case, contract)  # a wrong-domain case is no model's job
        tools = self._tools(case, contract)
        if self.decoding == "steps":
            sketch, rounds, stats = self.decoder.plan(goal, case, contract, tools, self._domain(case, contract))
            return sketch, rounds, stats.as_dict()
        messages = plan_messages(goal, case, contract, tools)
        for rnd in range(self.max_revisions + 1):
            sketch, best_text, errors = self._round(messages, tools, goal, case, contract,
                                                    "plan" if rnd == 0 else "revise", rnd)
            if sketch is not None:
                return sketch, rnd, {}
            messages = messages + [{"role": "assistant", "content": best_text}, feedback_message(errors)]
        first = errors[0]
        raise ToolError(first.code, f"no valid plan from the model after {self.max_revisions} revision(s): "
                        f"{first.message}", first.hint, case=case.id)

    def _round(self, messages: list[Message], tools: Mapping[str, ToolSpec], goal: str, case: Case,
               contract: TaskContract | None, purpose: str, rnd: int
               ) -> tuple[PlanSketch | None, str, list[ToolError]]:
        """One model call: the first candidate that compiles, else the least bad one's text and errors."""
        schema = plan_schema(tools, case, self.max_steps, contract=contract)
        temperature = self.temperature if purpose == "plan" else self.revise_temperature
        try:
            reply = self.backend.complete(messages, json_schema=schema, n=self.k, temperature=temperature,
                                          max_tokens=self.max_tokens, seed=self.seed + rnd)
        except ToolError as e:
            self.events.add(case.id, "llm_call", error_code=e.code.value, message=f"{purpose}: {e.message[:300]}",
                            data={"backend": self.backend.name, "model": self.backend.model, "purpose": purpose,
                                  "round": rnd, "accepted": False, "reasons": [e.code.value]})
            raise
        domain, allowed = self._domain(case, contract), set(tools)
        verdicts: list[tuple[str, list[ToolError], str]] = []  # (answer, errors, stage: parse | compile)
        for text in reply.texts:
            try:
                sketch = parse_plan(text, goal, domain, allowed)
            except ToolError as e:
                verdicts.append((text, [e], "parse"))
                continue
            try:
                compile_plan(sketch, case, contract, registry=self._registry)
            except CompileError as e:
                verdicts.append((text, list(e.errors), "compile"))
                continue
            self._record_call(case, reply, purpose, rnd, verdicts, accepted=True)
            return sketch, text, []
        self._record_call(case, reply, purpose, rnd, verdicts, accepted=False)
        text, errors, _ = min(verdicts, key=lambda v: (v[2] == "parse", len(v[1])))
        return None, text, errors

    def _record_call(self, case: Case, reply: LLMReply, purpose: str, rnd: int,
                     verdicts: list[tuple[str, list[ToolError], str]], accepted: bool) -> None:
        for i, (_, errs, stage) in enumerate(verdicts):
            self.events.add(case.id, "plan_rejected", error_code=errs[0].code.value,
                            message=f"candidate {i + 1} of round {rnd}: {errs[0].message[:300]}",
                            data={"round": rnd, "candidate": i, "stage": stage,
                                  "errors": [str(e)[:300] for e in errs[:8]]})
        reasons = [v[1][0].code.value for v in verdicts]
        self.events.add(case.id, "llm_call", duration_s=round(reply.latency_s, 4),
                        error_code=None if accepted else (reasons[0] if reasons else None),
                        message=f"{purpose} round {rnd}: " + ("accepted" if accepted else "rejected (" +
                                                              ", ".join(reasons) + ")"),
                        data={**reply.event_data(), "purpose": purpose, "round": rnd, "accepted": accepted,
                              "reasons": reasons})


def _steps_json(sketch: PlanSketch) -> str:
    return json.dumps({"steps": [{"tool": s.tool, "id": s.id, "args": s.args} for s in sketch.steps]},
                      separators=(",", ":"), default=str)


__all__ = ["LLMPlanner", "case_summary", "feedback_message", "parse_plan", "plan_messages", "plan_schema",
           "step_id", "tools_text"]
