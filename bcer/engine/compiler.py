"""The compiler: the only bridge from a planned ``PlanSketch`` to a runnable ``Workflow``.

It checks and completes what was planned (DESIGN "Compiler"), never instantiates a template:

1. every tool exists and the contract allows it;
2. every arg name is an input port or a params-model field of the tool;
3. every token parses and points to an existing sequence / node output / case key /
   runtime key, with a compatible ArtifactKind;
4. params are filled with the model's defaults and validated (``bcer.tools.validate_params``);
5. an unset required input port is linked only when exactly one upstream producer (another
   step's output, or a case sequence, of the port's kind) exists, never by a guess;
6. edges come from tokens plus ``after``; the graph must be acyclic;
7. every contract milestone and deliverable is produced by some node.

Rule 3 includes the role of a sequence (``_identity_problem``): a port named after a sequence
takes that sequence, a port with a contract role takes a sequence of that role, and an input
alternative stands in only for a missing input.

All problems are collected and raised together as one :class:`CompileError`, so the Brain
can revise its sketch in one round. Each error names the ``step``, the ``arg`` and, where
there are any, the valid alternatives ("did you mean ...?").

Compiled nodes are fully specified: ``@seq`` tokens name the case's sequence key exactly
(``@seq.t1ce`` in a plan becomes ``@seq.T1c`` when the case calls it ``T1c``), params hold
every field of the params model (JSON values) plus ``@case``/``@runtime`` tokens, which the
executor resolves at submission.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from ..contracts.artifacts import ArtifactKind
from ..contracts.case import Case
from ..contracts.errors import ErrorCode, ToolError, did_you_mean
from ..contracts.plan import PlanSketch, PlanStep
from ..contracts.spec import Port, ToolSpec
from ..contracts.task import TaskContract
from ..contracts.workflow import Deliverable, Node, Workflow
from .tokens import RUNTIME_KEYS, Token, find_tokens, is_token, normalise_seq, parse_token

log = logging.getLogger(__name__)

# Representative runtime values: they let params bound to @runtime.* be type-checked at
# compile time (the real values exist only when the executor submits the node).
RUNTIME_SAMPLES: dict[str, Any] = {"output_dir": "out", "device": "cpu", "seed": 0, "run_id": "run"}


class CompileError(ToolError):
    """Every problem found while compiling one sketch (or re-validating one node).

    ``errors`` holds the individual typed errors; the exception's own code, message and
    context are those of the first, so code routing on a ``ToolError`` still works.
    """

    def __init__(self, errors: list[ToolError]):
        self.errors = list(errors) or [ToolError(ErrorCode.internal, "compile failed without errors")]
        first = self.errors[0]
        more = f" (+{len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(first.code, first.message + more, first.hint, **first.context)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self.errors]

    def __reduce__(self):  # keep every error across pickling (Ray)
        return (CompileError, (self.errors,))


@dataclass
class _Ctx:
    """What the checks of one compilation share; ``errors`` accumulates."""

    case: Case
    contract: TaskContract | None
    tools: Mapping[str, Any]
    producers: dict[str, ToolSpec] = field(default_factory=dict)  # step id -> its tool's spec
    # steps that exist but may not be referenced here, and why ("" = already reported)
    hidden: dict[str, str] = field(default_factory=dict)
    errors: list[ToolError] = field(default_factory=list)

    def error(self, code: ErrorCode, message: str, hint: str = "", **context: Any) -> None:
        self.errors.append(ToolError(code, message, hint, **context))


class _GlobalRegistry(Mapping):
    """The global tool registry, loading every tool module only when a name is missing or the
    whole list is asked for (a plan of user tools compiles without importing torch)."""

    def _full(self) -> Mapping[str, Any]:
        from ..tools.registry import REGISTRY, load_all

        load_all()
        return REGISTRY

    def __getitem__(self, name: str) -> Any:
        from ..tools.registry import REGISTRY

        reg = REGISTRY.get(name)
        return reg if reg is not None else self._full()[name]

    def __iter__(self):
        return iter(self._full())

    def __len__(self) -> int:
        return len(self._full())


_GLOBAL = _GlobalRegistry()


def resolve_registry(registry: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    """``registry`` itself, or the global tool registry (its modules loaded on demand)."""
    return registry if registry is not None else _GLOBAL


def _resolve_tool(ctx: _Ctx, step_id: str, name: str) -> Any | None:
    """Rule 1: the tool exists and the contract allows it."""
    reg = ctx.tools.get(name)
    if reg is None:
        ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: unknown tool {name!r}",
                  did_you_mean(name, ctx.tools), step=step_id, arg="tool", tool=name)
        return None
    if ctx.contract is not None and not ctx.contract.allows(name):
        allowed = [t for t in ctx.tools if ctx.contract.allows(t)]
        ctx.error(ErrorCode.schema, f"step {step_id!r}: tool {name!r} is not allowed by task "
                  f"{ctx.contract.id!r}", did_you_mean(name, allowed), step=step_id, arg="tool", tool=name)
        return None
    return reg


def _split_args(ctx: _Ctx, step_id: str, spec: ToolSpec, args: Mapping[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rule 2: names that are ports become inputs, params-model fields become params."""
    ports = {p.name for p in spec.inputs}
    params = set(spec.param_names)
    inputs, values = {}, {}
    for name, value in args.items():
        if name in ports:
            inputs[name] = value
        elif name in params:
            values[name] = value
        else:
            ctx.error(ErrorCode.schema, f"step {step_id!r}: {spec.name} has no input or param {name!r}",
                      did_you_mean(name, sorted(ports | params)), step=step_id, arg=name, tool=spec.name)
    return inputs, values


def _check_seq(ctx: _Ctx, step_id: str, port: Port, tok: Token) -> str | None:
    """Rule 3 for ``@seq``: the (alias-normalised) sequence exists with the port's kind."""
    key = ctx.case.sequence_key(tok.name)
    if key is None:
        ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: case {ctx.case.id!r} has no sequence "
                  f"{tok.name!r}", did_you_mean(tok.name, ctx.case.sequences), step=step_id, arg=port.name,
                  token=tok.raw)
        return None
    kind = ctx.case.sequences[key].kind
    if kind != port.kind:
        same = [str(Token.seq(k)) for k, s in ctx.case.sequences.items() if s.kind == port.kind]
        ctx.error(ErrorCode.schema, f"step {step_id!r}: input {port.name!r} expects {port.kind.value}, "
                  f"but @seq.{key} is {kind.value}", f"sequences of kind {port.kind.value}: {same}",
                  step=step_id, arg=port.name, token=tok.raw)
        return None
    wrong = _identity_problem(ctx, step_id, port, key)
    if wrong:
        message, want = wrong
        ctx.error(ErrorCode.schema, f"step {step_id!r}: {message}",
                  f"bind {' or '.join(str(Token.seq(k)) for k in want)}" if want else "", step=step_id,
                  arg=port.name, token=tok.raw)
        return None
    return str(Token.seq(key))


def _canon(name: str) -> str:
    return normalise_seq(name) or name


def _identity_problem(ctx: _Ctx, step_id: str, port: Port, key: str) -> tuple[str, list[str]] | None:
    """Rule 3b: a sequence must fit the role of the port it feeds (a semantic swap binds the
    right kind of data to the wrong role, which no kind check sees):

    - a port named after a sequence (``t1c``, ``adc``, ``dwi``, ``t2w``) takes that sequence
      when the case has it;
    - a port the contract gives a role (``roles: {tool.port: [sequences]}``) takes one of them;
    - a contract input's alternative (``input_alternatives``) stands in only when the case
      lacks the input itself.

    Returns (message, sequence keys that would fit) or None.
    """
    got = _canon(key)
    named = normalise_seq(port.name)
    if named and (own := ctx.case.sequence_key(named)) is not None and got != named:
        return (f"input {port.name!r} is the {named} input, but binds @seq.{key} (the case has {named})",
                [own])
    tool = ctx.producers.get(step_id)
    if ctx.contract is None or tool is None:
        return None
    return ctx.contract.role_problem(tool.name, port.name, key, ctx.case.sequences)


def _check_node_ref(ctx: _Ctx, step_id: str, port: Port, tok: Token) -> str | None:
    """Rule 3 for ``@node``: the step exists, has that output field, of the port's kind."""
    spec = ctx.producers.get(tok.name)
    if tok.name in ctx.hidden:
        if ctx.hidden[tok.name]:
            ctx.error(ErrorCode.schema, f"step {step_id!r}: {tok.raw!r} {ctx.hidden[tok.name]}",
                      "bind an upstream output or a sequence", step=step_id, arg=port.name, token=tok.raw)
        return None
    if spec is None or tok.name == step_id:
        others = [s for s in ctx.producers if s != step_id]
        why = "a step cannot consume its own output" if tok.name == step_id else "no such step"
        ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: {tok.raw!r} names {why}",
                  did_you_mean(tok.name, others), step=step_id, arg=port.name, token=tok.raw)
        return None
    out = spec.output(tok.field or "")
    if out is None:
        ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: {spec.name} (step {tok.name!r}) has no output "
                  f"{tok.field!r}", did_you_mean(tok.field, [p.name for p in spec.outputs]),
                  step=step_id, arg=port.name, token=tok.raw)
        return None
    if len(tok.path) > 1:
        ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: {tok.raw!r} names a part of an artifact; "
                  f"input ports bind whole artifacts", f"use @node.{tok.name}.{tok.field}",
                  step=step_id, arg=port.name, token=tok.raw)
        return None
    if out.kind != port.kind:
        same = [str(Token.node(tok.name, p.name)) for p in spec.outputs if p.kind == port.kind]
        ctx.error(ErrorCode.schema, f"step {step_id!r}: input {port.name!r} expects {port.kind.value}, "
                  f"but {tok.raw} is {out.kind.value}", f"outputs of kind {port.kind.value}: {same}",
                  step=step_id, arg=port.name, token=tok.raw)
        return None
    return tok.raw


def _check_port(ctx: _Ctx, step_id: str, port: Port, value: Any) -> str | None:
    """Rule 3 for one input port: a token to a sequence or node output (never a literal)."""
    if not is_token(value):
        ctx.error(ErrorCode.schema, f"step {step_id!r}: input {port.name!r} takes a reference, not the "
                  f"literal {value!r}", "write @seq.<name> or @node.<id>.<field>", step=step_id, arg=port.name)
        return None
    try:
        tok = parse_token(value)
    except ToolError as e:
        ctx.errors.append(e.with_context(step=step_id, arg=port.name))
        return None
    if tok.scope == "seq":
        return _check_seq(ctx, step_id, port, tok)
    if tok.scope == "node":
        return _check_node_ref(ctx, step_id, port, tok)
    ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: input {port.name!r} needs an artifact, but "
              f"{tok.raw} is a {tok.scope} value", "bind @case/@runtime values to params",
              step=step_id, arg=port.name, token=tok.raw)
    return None


def _param_token_value(ctx: _Ctx, step_id: str, name: str, value: Any) -> tuple[bool, Any]:
    """(ok, sample value) of a token given for param ``name``: @case keys and runtime keys only."""
    try:
        tok = parse_token(value)
    except ToolError as e:
        ctx.errors.append(e.with_context(step=step_id, arg=name))
        return False, None
    if tok.scope == "case":
        if tok.name not in ctx.case.metadata:
            ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: case {ctx.case.id!r} has no metadata "
                      f"{tok.name!r}", did_you_mean(tok.name, ctx.case.metadata), step=step_id, arg=name,
                      token=tok.raw)
            return False, None
        return True, ctx.case.metadata[tok.name]
    if tok.scope == "runtime":
        if tok.name not in RUNTIME_KEYS:
            ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: unknown runtime key {tok.name!r}",
                      did_you_mean(tok.name, RUNTIME_KEYS), step=step_id, arg=name, token=tok.raw)
            return False, None
        return True, RUNTIME_SAMPLES[tok.name]
    ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: param {name!r} takes a literal, @case.* or "
              f"@runtime.*, not {tok.raw}", "bind artifacts (@seq/@node) to input ports",
              step=step_id, arg=name, token=tok.raw)
    return False, None


def _check_params(ctx: _Ctx, step_id: str, spec: ToolSpec, values: Mapping[str, Any]) -> dict[str, Any] | None:
    """Rules 3-4 for params: tokens exist; literals (and token samples) pass the params model.

    Returns every field of the model (defaults filled, JSON values) with token-bound fields
    kept as their tokens, or None after recording errors.
    """
    from ..tools.registry import validate_params

    n_before = len(ctx.errors)
    tokens, trial = {}, {}
    for name, value in values.items():
        if is_token(value):
            ok, sample = _param_token_value(ctx, step_id, name, value)
            if ok:
                tokens[name], trial[name] = value, sample
        elif find_tokens_safe(ctx, step_id, name, value):
            ctx.error(ErrorCode.bad_reference, f"step {step_id!r}: param {name!r} has a reference inside "
                      f"a value", "a token must be the whole param value", step=step_id, arg=name)
        elif not _finite(value):  # NaN/inf cannot go into the JSON audit record, nor mean a setting
            ctx.error(ErrorCode.value_range, f"step {step_id!r}: param {name!r} is not finite ({value!r})",
                      "give a finite number or leave the default", step=step_id, arg=name)
        else:
            trial[name] = value
    if len(ctx.errors) > n_before:
        return None
    try:
        model = validate_params(spec.name, trial)
    except ToolError as e:
        arg = e.context.get("arg")
        if arg in tokens:
            e.message = f"{tokens[arg]} gives {trial[arg]!r}, not valid here: {e.message}"
        ctx.errors.append(e.with_context(step=step_id))
        return None
    return {**model.model_dump(mode="json"), **tokens}


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def find_tokens_safe(ctx: _Ctx, step_id: str, name: str, value: Any) -> bool:
    """True if a nested value holds anything token-like (a malformed one is recorded too)."""
    if isinstance(value, (dict, list, tuple)):
        try:
            return bool(find_tokens(value))
        except ToolError as e:
            ctx.errors.append(e.with_context(step=step_id, arg=name))
            return True
    return False


@dataclass
class _Draft:
    """One step after its own checks: normalised input tokens and full params."""

    step: PlanStep
    spec: ToolSpec
    inputs: dict[str, str]
    params: dict[str, Any]
    given: set[str]  # ports the plan set (valid or not): never auto-linked


def _draft(ctx: _Ctx, step_id: str, spec: ToolSpec, args: Mapping[str, Any], step: PlanStep) -> _Draft:
    """Rules 2-4 for one step."""
    raw_inputs, values = _split_args(ctx, step_id, spec, args)
    inputs: dict[str, str] = {}
    given = {k for k, v in raw_inputs.items() if v is not None}
    for port in spec.inputs:  # port order, so the compiled workflow is byte-for-byte reproducible
        if port.name in given:
            token = _check_port(ctx, step_id, port, raw_inputs[port.name])
            if token is not None:
                inputs[port.name] = token
    params = _check_params(ctx, step_id, spec, values)
    return _Draft(step, spec, inputs, params or {}, given)


def _candidates(ctx: _Ctx, step_id: str, port: Port, drafts: Mapping[str, _Draft], graph: nx.DiGraph) -> list[str]:
    """Every producer of ``port.kind`` that could feed ``step_id`` without a cycle."""
    below = nx.descendants(graph, step_id) | {step_id}
    found = [str(Token.seq(k)) for k, s in ctx.case.sequences.items() if s.kind == port.kind]
    for sid, d in drafts.items():
        if sid not in below:
            found += [str(Token.node(sid, p.name)) for p in d.spec.outputs if p.kind == port.kind]
    return found


def _autolink(ctx: _Ctx, drafts: Mapping[str, _Draft], graph: nx.DiGraph) -> None:
    """Rule 5: fill an unset required port only from a unique producer of its kind."""
    for sid, d in drafts.items():
        for port in d.spec.inputs:
            if not port.required or port.name in d.given:
                continue
            found = _candidates(ctx, sid, port, drafts, graph)
            if len(found) == 1:
                d.inputs[port.name] = found[0]
                tok = parse_token(found[0])
                if tok.scope == "node":
                    graph.add_edge(tok.name, sid)
                log.debug("step %s: linked unset input %s to %s (unique %s)", sid, port.name, found[0],
                          port.kind.value)
            elif not found:
                ctx.error(ErrorCode.input_missing, f"step {sid!r}: required input {port.name!r} "
                          f"({port.kind.value}) is unset and nothing produces a {port.kind.value}",
                          "add a step producing it, or a case with that sequence", step=sid, arg=port.name)
            else:
                ctx.error(ErrorCode.bad_reference, f"step {sid!r}: required input {port.name!r} is unset "
                          f"and {len(found)} producers of {port.kind.value} exist; not guessing",
                          f"set it to one of {found}", step=sid, arg=port.name)


def _graph(ctx: _Ctx, drafts: Mapping[str, _Draft], all_ids: list[str]) -> nx.DiGraph:
    """Rule 6 (first half): edges from @node tokens plus explicit ``after``."""
    graph = nx.DiGraph()
    graph.add_nodes_from(drafts)
    for sid, d in drafts.items():
        for token in d.inputs.values():
            tok = parse_token(token)
            if tok.scope == "node":
                graph.add_edge(tok.name, sid)
        for dep in d.step.after:
            if dep not in all_ids:
                ctx.error(ErrorCode.bad_reference, f"step {sid!r}: 'after' names unknown step {dep!r}",
                          did_you_mean(dep, [s for s in all_ids if s != sid]), step=sid, arg="after")
            elif dep in drafts:
                graph.add_edge(dep, sid)
    return graph


def _check_acyclic(ctx: _Ctx, graph: nx.DiGraph) -> None:
    """Rule 6 (second half): report a cycle by its steps."""
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return
    path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
    ctx.error(ErrorCode.schema, f"the plan has a cycle: {path}", "remove one of these dependencies",
              step=cycle[0][0], arg="after", cycle=path)


def _topo(graph: nx.DiGraph, order: list[str]) -> list[str]:
    """Deterministic topological order: ties broken by plan order."""
    rank = {sid: i for i, sid in enumerate(order)}
    return list(nx.lexicographical_topological_sort(graph, key=lambda s: rank[s]))


def _providers(ctx: _Ctx, milestone: str, kind: ArtifactKind | None = None) -> list[str]:
    """Registered (and allowed) tools that would satisfy a milestone (the hint to the Brain)."""
    out = []
    for name, reg in ctx.tools.items():
        spec = reg.spec
        if spec.milestone == milestone and (kind is None or any(p.kind == kind for p in spec.outputs)):
            if ctx.contract is None or ctx.contract.allows(name):
                out.append(name)
    return sorted(out)


def _check_contract(ctx: _Ctx, drafts: Mapping[str, _Draft], order: list[str]) -> list[Deliverable]:
    """Rule 7: every milestone and deliverable of the contract is produced; pick deliverable nodes."""
    if ctx.contract is None:
        return []
    for m in ctx.contract.milestones:
        if not any(drafts[s].spec.milestone == m for s in order):
            ctx.error(ErrorCode.input_missing, f"no step reaches milestone {m!r} of task {ctx.contract.id!r}",
                      f"add a step with one of the tools {_providers(ctx, m)}", milestone=m)
    out = []
    for d in ctx.contract.deliverables:
        nodes = [s for s in order if drafts[s].spec.milestone == d.milestone
                 and any(p.kind == d.kind for p in drafts[s].spec.outputs)]
        if not nodes:
            ctx.error(ErrorCode.input_missing, f"no step produces deliverable {d.name!r} ({d.kind.value} at "
                      f"milestone {d.milestone!r}) of task {ctx.contract.id!r}",
                      f"add a step with one of the tools {_providers(ctx, d.milestone, d.kind)}",
                      deliverable=d.name, milestone=d.milestone)
            continue
        spec = drafts[nodes[-1]].spec
        port = next((p for p in spec.outputs if p.kind == d.kind and p.name == d.field), None) \
            or next(p for p in spec.outputs if p.kind == d.kind)
        out.append(Deliverable(name=d.name, node=nodes[-1], field=port.name, file=d.file))
    return out


def _required(ctx: _Ctx, drafts: Mapping[str, _Draft], graph: nx.DiGraph,
              deliverables: list[Deliverable]) -> set[str]:
    """Nodes that (transitively) feed a deliverable or a contract milestone; all without a contract."""
    if ctx.contract is None:
        return set(drafts)
    targets = {d.node for d in deliverables}
    targets |= {s for s, d in drafts.items() if d.spec.milestone in ctx.contract.milestones}
    needed = set(targets)
    for t in targets:
        needed |= nx.ancestors(graph, t)
    return needed


def _node(d: _Draft, required: bool) -> Node:
    spec = d.spec
    inputs = {p.name: d.inputs[p.name] for p in spec.inputs if p.name in d.inputs}  # port order
    return Node(id=d.step.id, tool=spec.name, version=spec.version, inputs=inputs, params=d.params,
                outputs=[p.name for p in spec.outputs], resources=spec.resources.model_copy(), gpu=spec.gpu,
                required=required, milestone=spec.milestone, after=list(d.step.after), why=d.step.why)


def _check_ids(ctx: _Ctx, sketch: PlanSketch) -> None:
    seen: set[str] = set()
    for step in sketch.steps:
        if step.id in seen:
            ctx.error(ErrorCode.schema, f"step id {step.id!r} is used twice", "give every step its own id",
                      step=step.id, arg="id")
        seen.add(step.id)


def compile_plan(sketch: PlanSketch, case: Case, contract: TaskContract | None = None,
                 registry: Mapping[str, Any] | None = None) -> Workflow:
    """Compile a planned sketch for one case into a runnable, fully specified Workflow.

    Args:
        sketch: the Brain's plan.
        case: the case it runs on (its sequences and metadata are what tokens point to).
        contract: the task contract (allowed tools, milestones, deliverables), if any.
            Without one, every node is required and there are no deliverables.
        registry: ``{tool name: RegisteredTool}`` to compile against; default: the global
            registry with every tool module loaded. Params are validated through
            ``bcer.tools.validate_params``, so a custom mapping must hold registered tools.

    Returns:
        The Workflow, nodes in a deterministic topological order.

    Raises:
        CompileError: with every problem found (``.errors``), each naming step and arg.

    >>> wf = compile_plan(sketch, case, contract)  # doctest: +SKIP
    """
    ctx = _Ctx(case, contract, resolve_registry(registry))
    _check_ids(ctx, sketch)
    ids = [s.id for s in sketch.steps]
    for step in sketch.steps:
        reg = _resolve_tool(ctx, step.id, step.tool)
        if reg is not None and step.id not in ctx.producers:
            ctx.producers[step.id] = reg.spec
    ctx.hidden = {s: "" for s in set(ids) - set(ctx.producers)}  # unknown tool: reported once
    drafts = {s.id: _draft(ctx, s.id, ctx.producers[s.id], s.args, s)
              for s in sketch.steps if s.id in ctx.producers and sketch.step(s.id) is s}
    graph = _graph(ctx, drafts, ids)
    _autolink(ctx, drafts, graph)
    _check_acyclic(ctx, graph)
    if ctx.errors:
        raise CompileError(ctx.errors)
    order = _topo(graph, ids)
    deliverables = _check_contract(ctx, drafts, order)
    if ctx.errors:
        raise CompileError(ctx.errors)
    required = _required(ctx, drafts, graph, deliverables)
    nodes = [_node(drafts[s], s in required) for s in order]
    log.info("compiled %d steps for case %s (%d required, %d deliverables)", len(nodes), case.id,
             len(required), len(deliverables))
    return Workflow(case_id=case.id, task=contract.id if contract else None, goal=sketch.goal, nodes=nodes,
                    edges=sorted(graph.edges), deliverables=deliverables)


def validate_node(workflow: Workflow, node: Node, case: Case, contract: TaskContract | None = None,
                  registry: Mapping[str, Any] | None = None) -> Node:
    """Re-check one (patched) node of a compiled workflow with the compiler's rules.

    The node's inputs must point at the case's sequences or at outputs of *other* workflow
    nodes that are not downstream of it (a patch may not create a cycle); its params are
    re-validated and completed with defaults; every required port must be bound.

    Returns:
        The normalised node (tool facts refreshed from its ToolSpec).

    Raises:
        CompileError: naming the node (as ``step``) and the arg.
    """
    ctx = _Ctx(case, contract, resolve_registry(registry))
    reg = _resolve_tool(ctx, node.id, node.tool)
    if reg is None:
        raise CompileError(ctx.errors)
    below = workflow.downstream(node.id) if any(n.id == node.id for n in workflow.nodes) else set()
    for n in workflow.nodes:
        other = ctx.tools.get(n.tool)
        if n.id != node.id and n.id not in below and other is not None:
            ctx.producers[n.id] = other.spec
    ctx.hidden = {n: f"is downstream of {node.id!r}: binding it would make a cycle" for n in below}
    step = PlanStep(id=node.id, tool=node.tool, after=node.after, why=node.why)
    d = _draft(ctx, node.id, reg.spec, {**node.inputs, **node.params}, step)
    for port in reg.spec.inputs:
        if port.required and port.name not in d.inputs and port.name not in d.given:
            ctx.error(ErrorCode.input_missing, f"node {node.id!r}: required input {port.name!r} is unbound",
                      f"bind a {port.kind.value}", step=node.id, arg=port.name)
    if ctx.errors:
        raise CompileError(ctx.errors)
    return _node(d, node.required)


__all__ = ["CompileError", "RUNTIME_SAMPLES", "compile_plan", "resolve_registry", "validate_node"]
