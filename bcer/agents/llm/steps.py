"""The grammar of one plan step, rebuilt from what the plan holds so far.

A plan is decoded one step at a time. Before each step, :func:`choices` lists what may come
next, and :func:`step_schema` turns that list into the JSON schema the model decodes under
(xgrammar locally, ``structured_outputs``/``response_format`` on a server):

- **tools**: only tools that make progress, i.e. reach a contract milestone or deliverable
  not yet produced, or make an input one of those tools lacks (an enabler), and whose
  required inputs can all be bound now; each tool at most once; a tool whose inputs are all
  optional (a report) only when no other tool can come next;
- **bindings**: a required input port takes only tokens that exist: a sequence the case has
  (of the port's kind, of its identity when the port is named after one, of the role the
  contract gives it), or an output of a step *already emitted* of the port's kind. A
  ``@node`` reference to a step that does not exist cannot be written;
- **milestones**: the plan ends only when every contract milestone and deliverable is
  produced: there is no "done" while one is missing, and when nothing is missing no step is
  asked for.

What is left without a choice is not asked (:meth:`Choice.forced`): a single candidate tool,
a port with one option. The caller fills those in and records them as ``autofill``.

Optional ports and params are not asked either: the offline planner's finishing rules
(same-name sources, metadata-named params) complete them deterministically afterwards.

A server may ignore the schema, so :func:`check_step` validates every answer against the same
choices and returns typed errors to send back.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...contracts import ArtifactKind, Case, ErrorCode, PlanStep, TaskContract, ToolError, ToolSpec
from ...contracts.errors import did_you_mean
from ...contracts.sequences import canonical_sequence
from ...contracts.tokens import Token, ref_name
from ..planners.offline import ANCHOR_PORTS

MAX_ENABLER_DEPTH = 5


def step_id(tool: str, i: int = 1) -> str:
    """The id of the i-th step using ``tool`` (as the offline planner names them)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", tool)
    return base if i == 1 else f"{base}_{i}"


@dataclass
class Choice:
    """One tool that may come next, with the tokens each required input port may bind (ranked)."""

    tool: str
    spec: ToolSpec
    options: dict[str, list[str]]

    def free(self) -> dict[str, list[str]]:
        """Ports with more than one option: the model's to choose."""
        return {p: o for p, o in self.options.items() if len(o) > 1}

    def forced(self) -> dict[str, str]:
        """Ports with exactly one option: filled in without asking."""
        return {p: o[0] for p, o in self.options.items() if len(o) == 1}


@dataclass
class StepState:
    """A plan being decoded: the case, its contract, the allowed tools and the steps so far.

    ``rank`` orders tools and ``pref`` orders sequences (the offline planner's rules, so the
    options a model sees come best first); ``banned`` holds ``(tool, port, token)`` options a
    compile error ruled out (``(tool, "", "")`` bans a tool).
    """

    case: Case
    contract: TaskContract | None
    tools: Mapping[str, ToolSpec]
    goal_milestones: list[str] = field(default_factory=list)
    rank: Callable[[ToolSpec], Any] = lambda s: s.name
    pref: Mapping[str, int] = field(default_factory=dict)
    steps: list[PlanStep] = field(default_factory=list)
    banned: set[tuple[str, str, str]] = field(default_factory=set)

    def used(self) -> set[str]:
        return {s.tool for s in self.steps}

    def _seq_rank(self, key: str) -> tuple:
        canon = canonical_sequence(key) or key
        return (self.pref.get(canon, len(self.pref)), key)

    def available(self, kind: ArtifactKind) -> list[str]:
        """Tokens of ``kind``: the case's sequences (preferred first), then emitted outputs."""
        seqs = sorted((k for k, r in self.case.sequences.items() if r.kind == kind), key=self._seq_rank)
        out = [str(Token.seq(k)) for k in seqs]
        for s in sorted(self.steps, key=lambda s: self.rank(self.tools[s.tool])):  # stable: plan order in ties
            out += [str(Token.node(s.id, p.name)) for p in self.tools[s.tool].outputs if p.kind == kind]
        return out

    def identity(self, token: str) -> str | None:
        """The sequence an artifact is a version of: its own for ``@seq``; for an output, that of
        the step's first input of the same kind (a resampled T1 is still T1); None: derived."""
        tok = Token.try_parse(token)
        if tok is None or tok.scope not in ("seq", "node"):
            return None
        if tok.scope == "seq":
            return canonical_sequence(tok.name) or tok.name
        step = next((s for s in self.steps if s.id == tok.name), None)
        spec = self.tools.get(step.tool) if step is not None else None
        out = spec.output(".".join(tok.path)) if spec is not None else None
        if out is None:
            return None
        src = next((step.args[p.name] for p in spec.inputs
                    if p.kind == out.kind and isinstance(step.args.get(p.name), str)), None)
        return self.identity(src) if src else None

    def needs(self) -> list[tuple[str, ArtifactKind | None, str | None]]:
        """(milestone, kind, deliverable field) the plan must still reach: the contract's
        deliverables, then its milestones no deliverable covers (the offline planner's order);
        without a contract the milestones the goal names."""
        specs = [self.tools[s.tool] for s in self.steps]
        wanted: list[tuple[str, ArtifactKind | None, str | None]] = []
        if self.contract is not None:
            wanted += [(d.milestone, d.kind, d.field or d.name) for d in self.contract.deliverables]
            covered = {d.milestone for d in self.contract.deliverables}
            wanted += [(m, None, None) for m in self.contract.milestones if m not in covered]
        else:
            wanted += [(m, None, None) for m in self.goal_milestones]
        return [w for w in dict.fromkeys(wanted) if not any(_serves(s, w[0], w[1]) for s in specs)]


def _serves(spec: ToolSpec, milestone: str, kind: ArtifactKind | None) -> bool:
    return spec.milestone == milestone and (kind is None or any(p.kind == kind for p in spec.outputs))


def port_options(state: StepState, spec: ToolSpec, port: Any) -> list[str]:
    """Tokens ``spec.port`` may bind now: the compiler's rules 3 and 3b applied before decoding.

    A port named after a sequence (``t1c``, ``adc``: the alias table) takes only that sequence
    among the case's, or a derived artifact of its kind (never another sequence); sequences the contract gives another
    role are left out (unless none would be left: the compiler then says why)."""
    options = state.available(port.kind)
    identity = canonical_sequence(port.name)
    seq = {t: n for t in options if (n := ref_name(t, "seq")) is not None}
    same = [t for t in options if t in seq and canonical_sequence(seq[t]) == identity]
    if identity:  # never another sequence in its place (the offline planner's rule too)
        options = same + [t for t in options if t not in seq and state.identity(t) in (None, identity)]
    seqs = [t for t in options if t in seq]
    options = _namesake(state, port, _one_field_per_step(state, port.name, options))
    if state.contract is not None:
        have = state.case.sequences
        fit = [t for t in seqs if state.contract.role_problem(spec.name, port.name, seq[t], have) is None]
        if fit and len(fit) < len(seqs):
            options = fit + [t for t in options if t not in seq]
    return [t for t in options if (spec.name, port.name, t) not in state.banned]


def _namesake(state: StepState, port: Any, options: list[str]) -> list[str]:
    """A port of a derived kind named like the output of a tool the task needs (``function``,
    ``findings``, ``gland``, ``labels``) takes only that output: it waits for its producer
    instead of binding another artifact of the kind (measured: SmolLM2 fed the ACDC
    classifier's ``function`` the ED/ES ``phases`` table). Image ports are left alone (a
    denoised ``image`` is not what every image port wants)."""
    if port.kind == ArtifactKind.image or not _namesake_makers(state, port):
        return options
    return [t for t in options if (tok := Token.try_parse(t)) is not None and tok.scope == "node"
            and tok.field == port.name]


def _namesake_makers(state: StepState, port: Any) -> list[ToolSpec]:
    """Tools the task needs that output an artifact named like ``port``, of its kind."""
    wanted = set(state.goal_milestones)
    if state.contract is not None:
        wanted = set(state.contract.milestones) | {d.milestone for d in state.contract.deliverables}
    return [s for s in state.tools.values() if s.milestone in wanted
            and any(p.name == port.name and p.kind == port.kind for p in s.outputs)]


def _one_field_per_step(state: StepState, port: str, options: list[str]) -> list[str]:
    """One output per producing step: the field named like the port, else the step's first
    output of the kind (the compiler's rule for deliverables). The choice is between
    producers; which of a segmenter's four masks feeds a ``mask`` port is not a planning
    decision a model can make better than that rule (measured: SmolLM2 bound ``tc``/``wt``)."""
    out, seen = [], set()
    for t in options:
        sid = ref_name(t, "node")
        if sid is None:
            out.append(t)
            continue
        if sid in seen:
            continue
        same = str(Token.node(sid, port))
        out.append(same if same in options else t)
        seen.add(sid)
    return out


def _distinct_defaults(options: dict[str, list[str]]) -> dict[str, list[str]]:
    """Anchor ports (``fixed``, ``reference``) first; a later port's default is not a sequence
    an earlier port's default already takes (a registration's moving image is not its fixed
    one; the offline planner's rule). The option stays, only lower in the list."""
    taken: set[str] = set()
    out: dict[str, list[str]] = {}
    for port in sorted(options, key=lambda p: p not in ANCHOR_PORTS):
        opts = options[port]
        ranked = [t for t in opts if t not in taken] + [t for t in opts if t in taken]
        if ranked and ref_name(ranked[0], "seq") is not None:
            taken.add(ranked[0])
        out[port] = ranked
    return {p: out[p] for p in options}


def _choice(state: StepState, spec: ToolSpec) -> Choice | None:
    """The tool with its port options, or None when a required port has nothing to bind (or,
    for a tool whose inputs are all optional, when none of them has)."""
    options = _distinct_defaults({p.name: port_options(state, spec, p) for p in spec.inputs if p.required})
    if any(not o for o in options.values()):
        return None
    if spec.inputs and not options:  # a gatherer binds its first port that has a source (the
        # offline planner's rule); the finishing rules bind the rest
        # which source a report files as its first input is a rule (the best-ranked), not a
        # choice (measured: SmolLM2 filed the ED/ES phases as the cardiac report's measurements)
        first = next(((p.name, o[:1]) for p in spec.inputs if (o := port_options(state, spec, p))), None)
        if first is None:
            return None
        options = dict([first])
    return Choice(spec.name, spec, options)


def _lacking(state: StepState, spec: ToolSpec, gatherers: bool) -> list[Any]:
    """Input ports of ``spec`` that nothing can feed yet (for a gatherer, with ``gatherers``:
    all its ports while none has a source)."""
    required = [p for p in spec.inputs if p.required]
    if required:
        return [p for p in required if not port_options(state, spec, p)]
    if not gatherers or any(port_options(state, spec, p) for p in spec.inputs):
        return []
    return list(spec.inputs)


def _feeds(state: StepState, maker: ToolSpec, port: Any) -> bool:
    """Whether an output of ``maker`` could feed ``port`` (its kind; its name, for a port that
    waits for its namesake)."""
    outs = [p for p in maker.outputs if p.kind == port.kind]
    if port.kind != ArtifactKind.image and _namesake_makers(state, port):
        outs = [p for p in outs if p.name == port.name]
    return bool(outs)


def choices(state: StepState) -> list[Choice]:
    """Tools that may come next, best first (empty: the plan is complete, or stuck; see
    :func:`stuck`)."""
    needs = state.needs()
    if not needs:
        return []
    free = {n: s for n, s in state.tools.items() if n not in state.used() and (n, "", "") not in state.banned}
    wanted: set[str] = set()
    for milestone, kind, name in needs:
        serving = {n for n, s in free.items() if _serves(s, milestone, kind)}
        # a deliverable named like some tools' output (``features``, ``function``, ``gland``) is
        # what those tools make: the contract's name narrows the producers (measured: SmolLM2
        # took quant.roi_stats for brain_grade's ``features`` on every case)
        named = {n for n in serving if any(p.name == name for p in free[n].outputs)}
        wanted |= named or serving
    # tools that make what a wanted tool still lacks; a gatherer's inputs come from the other
    # needs, so only when nothing else can come next does it pull producers in
    found = _candidates(state, free, wanted, gatherers=False) or _candidates(state, free, wanted, gatherers=True)
    # a tool whose inputs are all optional (a report, a grade from any evidence) gathers what the
    # plan made: it comes once nothing else can, so it sees every artifact it could take
    makers = [c for c in found if not _gatherer(c.spec)]
    return sorted(makers or found, key=lambda c: state.rank(c.spec))


def _candidates(state: StepState, free: Mapping[str, ToolSpec], wanted: set[str], gatherers: bool
                ) -> list[Choice]:
    wanted, frontier = set(wanted), set(wanted)
    for _ in range(MAX_ENABLER_DEPTH):
        lacking = [p for n in frontier for p in _lacking(state, free[n], gatherers)]
        frontier = {n for n, s in free.items() if n not in wanted and any(_feeds(state, s, p) for p in lacking)}
        if not frontier:
            break
        wanted |= frontier
    return [c for c in (_choice(state, free[n]) for n in wanted) if c is not None]


def _gatherer(spec: ToolSpec) -> bool:
    return bool(spec.inputs) and not any(p.required for p in spec.inputs)


def stuck(state: StepState) -> ToolError:
    """The typed error when milestones remain and no tool can be planned towards them."""
    missing = list(dict.fromkeys(w[0] for w in state.needs()))
    return ToolError(ErrorCode.input_missing, f"case {state.case.id!r} (sequences {sorted(state.case.sequences)}): "
                     f"no allowed tool can reach {', '.join(missing)} from the steps so far "
                     f"{[s.tool for s in state.steps]}", "give a case with the inputs the task needs",
                     case=state.case.id)


def step_schema(options: list[Choice]) -> dict[str, Any]:
    """JSON schema of the next step: one ``anyOf`` branch per tool; ``args`` may hold the ports
    with a choice, each an ``enum`` of its options; a port left out takes its first (default)
    option."""
    branches = []
    for c in options:
        free = c.free()
        args = {"type": "object", "additionalProperties": False,
                "properties": {p: {"type": "string", "enum": o} for p, o in sorted(free.items())}}
        branches.append({"type": "object", "additionalProperties": False, "required": ["tool", "args"],
                         "properties": {"tool": {"const": c.tool}, "args": args}})
    return {"title": "PlanStep", "anyOf": branches} if len(branches) > 1 else {"title": "PlanStep", **branches[0]}


def _json_object(text: str) -> Any:
    """The JSON value of an answer; an unconstrained model often wraps it in prose or a code
    fence, so the first ``{...}`` that parses is taken (it is validated like any other)."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        pass
    dec = json.JSONDecoder()
    for m in re.finditer(r"\{", text or ""):
        try:
            return dec.raw_decode(text[m.start():])[0]
        except json.JSONDecodeError:
            continue
    raise ToolError(ErrorCode.schema, "the answer holds no JSON object", "answer with one JSON step only",
                    answer=(text or "")[:120])


def check_step(text: str, options: list[Choice]) -> tuple[Choice, dict[str, str]]:
    """The choice and port bindings an answer makes, checked against ``options``.

    Raises:
        ToolError: ``schema`` (no JSON object, no ``tool``, an arg that is not a choice of that
            tool), ``bad_reference`` (a tool or token that is not an option), with the valid
            options as the hint.
    """
    payload = _json_object(text)
    if not isinstance(payload, dict) or not isinstance(payload.get("tool"), str):
        raise ToolError(ErrorCode.schema, "the answer is not a step: it needs a 'tool' string and 'args'",
                        answer=str(text)[:120])
    by_name = {c.tool: c for c in options}
    choice = by_name.get(payload["tool"])
    if choice is None:
        raise ToolError(ErrorCode.bad_reference, f"tool {payload['tool']!r} cannot come next",
                        f"one of {sorted(by_name)}" + _dym(payload["tool"], by_name), arg="tool", tool=payload["tool"])
    args = payload.get("args") or {}
    if not isinstance(args, dict):
        raise ToolError(ErrorCode.schema, "'args' must be an object", arg="args")
    free, problems = choice.free(), []
    for port, value in args.items():
        if port in choice.forced() and value == choice.forced()[port]:
            continue  # the one option, written out: harmless
        if port not in free:
            problems.append(ToolError(ErrorCode.schema, f"{choice.tool} has no input {port!r} to choose",
                                      f"choose {sorted(free) or 'nothing'}", arg=port, tool=choice.tool))
        elif value not in free[port]:
            problems.append(ToolError(ErrorCode.bad_reference, f"input {port!r} of {choice.tool} cannot bind "
                                      f"{value!r}", f"one of {free[port]}", arg=port, tool=choice.tool))
    if problems:
        raise problems[0] if len(problems) == 1 else ToolError(
            problems[0].code, "; ".join(p.message for p in problems),
            " | ".join(p.hint for p in problems if p.hint), tool=choice.tool)
    return choice, {p: args.get(p, o[0]) for p, o in free.items()}  # left out: the default


def _dym(name: str, options: Mapping[str, Any]) -> str:
    hint = did_you_mean(name, options)
    return f" ({hint})" if hint else ""


def case_summary(case: Case) -> str:
    """Sequences (kind, shape, spacing from headers where cheap) and metadata keys; no values."""
    lines = [f"case {case.id} (domain {case.domain})", "sequences:"]
    for key, ref in sorted(case.sequences.items()):
        lines.append(f"  @seq.{key}: {ref.kind.value}{_header(ref)}")
    lines.append(f"metadata keys: {', '.join(sorted(case.metadata)) or 'none'}")
    return "\n".join(lines)


def _header(ref: Any) -> str:
    if ref.format not in ("nifti", "nifti_frames"):  # other formats would be loaded whole: skip
        return f" ({ref.format})"
    try:
        from ...io import sequence_header

        h = sequence_header(ref)
        return (f", shape {'x'.join(str(int(n)) for n in h['shape'])}, spacing "
                f"{'x'.join(f'{float(s):.2g}' for s in h['spacing'])} mm")
    except Exception:  # an unreadable header is the loader's error to report, not the planner's
        return ""


def step_text(state: StepState) -> str:
    """The plan so far, as the model sees it: each step and the outputs it offers."""
    if not state.steps:
        return "Plan so far: no steps yet."
    lines = ["Plan so far:"]
    for s in state.steps:
        outs = ", ".join(f"{Token.node(s.id, p.name)} ({p.kind.value})" for p in state.tools[s.tool].outputs)
        lines.append(f"- {s.id} = {s.tool}({', '.join(f'{k}={v}' for k, v in s.args.items())}) -> {outs}")
    return "\n".join(lines)


def choices_text(options: list[Choice]) -> str:
    """The candidate tools and the options of each port to choose, best first by bcer's rules
    (the first is marked as the default), each tool with its milestone and outputs."""
    lines = []
    for i, c in enumerate(options):
        desc = re.split(r"(?<=\.)\s", (c.spec.description or "").strip(), maxsplit=1)[0][:140]
        outs = ", ".join(f"{p.name} ({p.kind.value})" for p in c.spec.outputs)
        lines.append(f"- {c.tool}{' (default)' if i == 0 else ''} [milestone {c.spec.milestone}; makes {outs}]: {desc}")
        for port, opts in sorted(c.free().items()):
            lines.append(f"    {port}: {opts[0]} (default), or one of {', '.join(opts[1:])}")
    return "\n".join(lines)


__all__ = ["Choice", "StepState", "case_summary", "check_step", "choices", "choices_text", "port_options", "step_id",
           "step_schema", "step_text", "stuck"]
