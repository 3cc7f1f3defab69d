"""The Reflector: bounded, local repair of one failed node (DESIGN "Failure and repair").

Given a :class:`Failure` (the node, its ``ToolError`` as a dict, what is bindable now), the
Reflector returns a :class:`Patch` (new inputs/params/device for that node only) or a
:class:`Halt`. Repair tiers are tried in order:

- :class:`Tier1` is deterministic and routes on ``ErrorCode`` and ``error["context"]["arg"]``
  (which ``bcer.tools.registry`` sets), never on message text.
- Tier 2 (``bcer.agents.repair.llm_tier.LLMTier``) asks an LLM backend for one of BCER's patch
  actions (retry with corrected args, insert an allowed tool, skip an optional node, halt),
  constrained by a per-failure JSON schema (``patch_schema``: the tool's own params, ports
  bound only to artifacts bindable now, insertable tools).

Every patch is re-validated by ``bcer.engine.compiler.validate_node`` before it is returned
(an invalid or no-op patch falls through to the next tier). Budgets per (case, node) and per
case bound the loop; sandbox violations and missing inputs halt at once, never "repaired"
into something else.
"""
from __future__ import annotations

import difflib
import json
import logging
import math
import re
import zlib
from collections import Counter
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ...contracts.artifacts import ArtifactKind
from ...contracts.case import Case
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.repair import HALT_AT_ONCE, Failure, Halt, Patch  # re-exported: they live in contracts
from ...contracts.task import TaskContract
from ...contracts.tokens import RUNTIME_KEYS, Token, is_token, normalise_seq, parse_token, ref_name
from ...contracts.workflow import Node, Workflow
from ...engine.compiler import CompileError, resolve_registry, validate_node
from ..events import PendingEvents
from .plugins import import_plugins, plugin_modules

log = logging.getLogger(__name__)

# the tool that puts an image on another image's grid (the insert repair of a grid mismatch)
RESAMPLER = "resample.to_grid"
_SHRINKABLE = re.compile(r"(window|patch|roi|batch)", re.IGNORECASE)


def halts_at_once(failure: Failure) -> bool:
    """Sandbox violations always halt; ``input_missing`` halts when data is missing, not when
    the plan left a required port of the node unbound (a planning slip, not a missing
    modality: the next tier or the planner may bind it)."""
    if failure.code is ErrorCode.sandbox:
        return True
    if failure.code is not ErrorCode.input_missing:
        return False
    ctx = failure.error.get("context") or {}
    unbound = failure.arg is not None and failure.arg not in failure.node.inputs and not ctx.get("file")
    return not unbound


@runtime_checkable
class RepairTier(Protocol):
    def propose(self, failure: Failure, workflow: Workflow, case: Case) -> Patch | Halt | None:
        """A patch, a halt, or None for "not mine" (the next tier is asked)."""


def _closest(name: str, options: list[str], cutoff: float = 0.6) -> str | None:
    found = difflib.get_close_matches(name, options, n=1, cutoff=cutoff)
    return found[0] if found else None


def _bounds(field: Any) -> tuple[float | None, bool, float | None, bool]:
    """(low, low_strict, high, high_strict) of a pydantic field, from its metadata."""
    lo = hi = None
    lo_strict = hi_strict = False
    for m in field.metadata:
        if getattr(m, "ge", None) is not None:
            lo, lo_strict = m.ge, False
        if getattr(m, "gt", None) is not None:
            lo, lo_strict = m.gt, True
        if getattr(m, "le", None) is not None:
            hi, hi_strict = m.le, False
        if getattr(m, "lt", None) is not None:
            hi, hi_strict = m.lt, True
    return lo, lo_strict, hi, hi_strict


def clamp_value(field: Any, value: Any) -> Any:
    """``value`` moved into the field's numeric bounds (integers stay integers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    lo, lo_strict, hi, hi_strict = _bounds(field)
    is_int = isinstance(value, int)
    if lo is not None and (value < lo or (lo_strict and value == lo)):
        value = (math.floor(lo) + 1 if is_int else math.nextafter(lo, math.inf)) if lo_strict else lo
    if hi is not None and (value > hi or (hi_strict and value == hi)):
        value = (math.ceil(hi) - 1 if is_int else math.nextafter(hi, -math.inf)) if hi_strict else hi
    return int(value) if is_int else value


def _halve(field: Any, value: Any) -> Any:
    """Half of a size param (int, float or a list/tuple of them), kept within bounds."""
    if isinstance(value, (list, tuple)):
        return type(value)(_halve(field, v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    half = max(1, value // 2) if isinstance(value, int) else value / 2
    return clamp_value(field, half)


class Tier1:
    """Deterministic repairs keyed by ErrorCode (see the module docstring for the list).

    Args:
        registry: ``{tool name: RegisteredTool}``; default: the global registry.
    """

    tier = 1

    def __init__(self, registry: Mapping[str, Any] | None = None):
        self._registry = registry

    def propose(self, failure: Failure, workflow: Workflow, case: Case) -> Patch | Halt | None:
        code = failure.code
        if halts_at_once(failure):
            return Halt(node_id=failure.node.id, code=code.value,
                        reason=f"{code.value} is never repaired: {failure.error.get('message', '')}")
        reg = resolve_registry(self._registry).get(failure.node.tool)
        if reg is None:
            return None
        if code is ErrorCode.bad_reference:
            return self._fix_reference(failure, reg, case, workflow)
        if code is ErrorCode.shape:
            return self._regrid(failure, reg, workflow)
        handler = {ErrorCode.schema: self._fix_schema,
                   ErrorCode.value_range: self._fix_range, ErrorCode.resource: self._fix_resource,
                   ErrorCode.numeric: self._drop_overrides, ErrorCode.internal: self._drop_overrides}.get(code)
        return handler(failure, reg, case) if handler else None

    # -- helpers ---------------------------------------------------------------------------------
    def _patch(self, failure: Failure, reason: str, inputs: dict | None = None, params: dict | None = None,
               device: str | None = None) -> Patch:
        node = failure.node
        return Patch(node_id=node.id, inputs=dict(node.inputs if inputs is None else inputs),
                     params=dict(node.params if params is None else params), device=device, reason=reason,
                     tier=self.tier)

    # -- bad_reference: token alias / field-name fix -----------------------------------------------
    def _fix_reference(self, failure: Failure, reg: Any, case: Case, workflow: Workflow) -> Patch | None:
        node, arg = failure.node, failure.arg
        if arg in node.params and is_token(node.params[arg]):
            return self._fix_param_token(failure, arg, case)
        ports = [arg] if arg in node.inputs else [p for p, t in node.inputs.items() if t not in failure.available]
        inputs, fixed = dict(node.inputs), []
        for port_name in ports:
            port = reg.spec.input(port_name)
            if port is None:
                continue
            options = [t for t, k in failure.available.items() if k == port.kind.value]
            new = _repair_token(inputs[port_name], options, [n.id for n in workflow.nodes])
            if new is not None and new != inputs[port_name]:
                fixed.append(f"{port_name}: {inputs[port_name]} -> {new}")
                inputs[port_name] = new
        if not fixed:
            return None
        return self._patch(failure, "fixed reference " + "; ".join(fixed), inputs=inputs)

    def _fix_param_token(self, failure: Failure, arg: str, case: Case) -> Patch | None:
        raw = str(failure.node.params[arg])
        # split by hand, not parsed: the token failed to resolve and may be malformed too
        scope, _, name = raw[1:].partition(".")
        keys = {"case": list(case.metadata), "runtime": list(RUNTIME_KEYS)}.get(scope, [])
        new = _closest(name, keys)
        if new is None:
            return None
        fixed = str(Token.case(new) if scope == "case" else Token.runtime(new))
        params = dict(failure.node.params, **{arg: fixed})
        return self._patch(failure, f"param {arg}: {raw} -> {fixed}", params=params)

    # -- schema: swapped inputs, unknown param name, invalid override --------------------------------
    def _fix_schema(self, failure: Failure, reg: Any, case: Case) -> Patch | None:
        node, arg, fields = failure.node, failure.arg, reg.params_model.model_fields
        if arg is None or reg.spec.input(arg) is not None:
            return self._swap_inputs(failure, reg)
        if arg in node.params and arg not in fields:
            params = {k: v for k, v in node.params.items() if k != arg}
            new = _closest(arg, list(fields))
            if new is None:
                return self._patch(failure, f"dropped unknown param {arg!r}", params=params)
            params[new] = node.params[arg]
            return self._patch(failure, f"renamed unknown param {arg!r} to {new!r}", params=params)
        if arg in fields and not fields[arg].is_required():
            default = fields[arg].get_default(call_default_factory=True)
            params = dict(node.params, **{arg: default})
            return self._patch(failure, f"invalid override {arg}={node.params.get(arg)!r} back to default "
                               f"{default!r}", params=params)
        return None

    def _swap_inputs(self, failure: Failure, reg: Any) -> Patch | None:
        node = failure.node
        bound = {p: failure.bound_kinds.get(p) or failure.available.get(t) for p, t in node.inputs.items()}
        want = {p.name: p.kind.value for p in reg.spec.inputs}
        wrong = [p for p, k in bound.items() if k is not None and p in want and k != want[p]]
        inputs, used, swapped = dict(node.inputs), set(), []
        for p in wrong:
            q = next((q for q in wrong if q != p and {p, q}.isdisjoint(used)
                      and bound[q] == want[p] and bound[p] == want[q]), None)
            if q is not None:
                inputs[p], inputs[q] = inputs[q], inputs[p]
                used |= {p, q}
                swapped.append((p, q))
        if not swapped:
            return None
        return self._patch(failure, "swapped inputs of mismatched kinds: " +
                           ", ".join(f"{p}<->{q}" for p, q in swapped), inputs=inputs)

    # -- shape: an input on another grid -> insert a resampling onto the reference input ------------------
    def _regrid(self, failure: Failure, reg: Any, workflow: Workflow) -> Patch | None:
        """Two image inputs that must share a voxel grid do not (the tool names the odd one as
        ``arg`` and the one it was checked against as ``reference``): insert ``resample.to_grid``
        of the odd input onto the reference input's grid, and bind the port to its output. The
        images keep their world positions, so nothing is guessed; a mask, a cine or a port
        without a named reference is not regridded here."""
        node, ctx = failure.node, failure.error.get("context") or {}
        arg, ref = failure.arg, ctx.get("reference")
        resampler = resolve_registry(self._registry).get(RESAMPLER)
        if resampler is None or arg not in node.inputs or ref not in node.inputs or arg == ref:
            return None
        image = ArtifactKind.image.value
        port, ref_port = reg.spec.input(arg), reg.spec.input(ref)
        if port is None or ref_port is None or port.kind.value != image or ref_port.kind.value != image:
            return None
        if (up := ref_name(node.inputs[arg], "node")) is not None and workflow.node(up).tool == RESAMPLER:
            return None  # already regridded once: the mismatch is not one of grids
        taken = {n.id for n in workflow.nodes}
        new_id, i = f"regrid_{arg}_{node.id}", 2
        while new_id in taken:
            new_id, i = f"regrid_{arg}_{node.id}_{i}", i + 1
        insert = Node(id=new_id, tool=RESAMPLER, inputs={"image": node.inputs[arg], "reference": node.inputs[ref]},
                      params={"interpolator": "linear"}, why=f"{arg} of {node.id} onto the grid of {ref}")
        patch = self._patch(failure, f"{arg} is on another grid than {ref}: resampled onto it by {RESAMPLER}",
                            inputs=dict(node.inputs, **{arg: str(Token.node(new_id, "image"))}))
        return patch.model_copy(update={"action": "insert", "insert": insert})

    # -- value_range: clamp into bounds -----------------------------------------------------------------
    def _fix_range(self, failure: Failure, reg: Any, case: Case) -> Patch | None:
        node, arg, fields = failure.node, failure.arg, reg.params_model.model_fields
        if arg not in fields:
            return None
        value = node.params.get(arg)
        new = clamp_value(fields[arg], value)
        if new == value or is_token(value):
            # in bounds already (an enum/literal/length error) or a bound value: use the default
            if fields[arg].is_required():
                return None
            new = fields[arg].get_default(call_default_factory=True)
            return self._patch(failure, f"{arg}={value!r} invalid, back to default {new!r}",
                               params=dict(node.params, **{arg: new}))
        return self._patch(failure, f"clamped {arg} from {value!r} to {new!r}", params=dict(node.params, **{arg: new}))

    # -- resource: no GPU -> CPU; out of memory -> halve window/patch/roi/batch -----------------------
    def _fix_resource(self, failure: Failure, reg: Any, case: Case) -> Patch | Halt | None:
        node = failure.node
        ctx = failure.error.get("context") or {}
        ran_on = ctx.get("device")
        # no_device: the worker got a GPU from Ray but cannot use it (no CUDA build, simulated GPU)
        no_gpu = not failure.has_gpu or bool(ctx.get("no_device"))
        if node.gpu == "required" and no_gpu:
            return Halt(node_id=node.id, code=ErrorCode.resource.value,
                        reason=f"{node.tool} needs a GPU and " + ("the cluster has none" if not failure.has_gpu
                                                                  else "its worker has no usable GPU device"))
        if node.gpu == "optional" and no_gpu and ran_on != "cpu":
            return self._patch(failure, "no GPU: run the CPU path" if not failure.has_gpu
                               else "GPU not usable in the worker: run the CPU path", device="cpu")
        fields = reg.params_model.model_fields
        params, halved = dict(node.params), []
        for name, value in node.params.items():
            if name in fields and _SHRINKABLE.search(name) and not is_token(value):
                new = _halve(fields[name], value)
                if new != value:
                    params[name] = new
                    halved.append(f"{name} {value!r}->{new!r}")
        if halved:
            return self._patch(failure, "out of memory: halved " + ", ".join(halved), params=params)
        if node.gpu == "optional" and ran_on != "cpu":
            return self._patch(failure, "out of GPU memory and nothing to shrink: run the CPU path", device="cpu")
        return None

    # -- numeric / internal: drop overrides back to defaults --------------------------------------------
    def _drop_overrides(self, failure: Failure, reg: Any, case: Case) -> Patch | None:
        fields = reg.params_model.model_fields
        params, dropped = dict(failure.node.params), []
        for name, value in failure.node.params.items():
            if name not in fields or fields[name].is_required() or is_token(value):
                continue
            default = fields[name].get_default(call_default_factory=True)
            if _jsonable(default) != _jsonable(value):
                params[name] = default
                dropped.append(name)
        if not dropped:
            return None
        return self._patch(failure, f"{failure.code.value} error: overrides {dropped} back to defaults",
                           params=params)


def _jsonable(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, default=str))
    except (TypeError, ValueError):
        return repr(value)


def _repair_token(raw: str, options: list[str], node_ids: list[str]) -> str | None:
    """The bindable token that ``raw`` evidently meant, or None.

    Sequences are matched only through the alias table (``@seq.t1ce`` -> ``@seq.T1c``), never
    by spelling: T1 and T2 look alike and are different data. A node reference keeps its node
    (a misspelt id is corrected to the closest workflow node) and gets the closest field.
    """
    cleaned = re.sub(r"\.{2,}", ".", re.sub(r"\s+", "", raw)).rstrip(".")
    try:
        tok = parse_token(cleaned)
    except Exception:  # beyond a whitespace/dot slip: not evidently anything
        return None
    if tok.scope == "seq":
        want = normalise_seq(tok.name)
        return next((o for o in options if want is not None and (n := ref_name(o, "seq")) is not None
                     and normalise_seq(n) == want), None)
    if tok.scope != "node":
        return None
    node_id = tok.name if tok.name in node_ids else _closest(tok.name, node_ids)
    fields = {parse_token(o).field: o for o in options if ref_name(o, "node") == node_id}
    field = tok.field if tok.field in fields else _closest(tok.field or "", list(fields))
    if field is None:
        field = next((f for f in fields if f.lower() == (tok.field or "").lower()), None)
    return fields.get(field) if field is not None else None


# -- tier 2 (an LLM patch action) lives in ``llm_tier``; re-exported lazily below ---------------

# -- the Reflector --------------------------------------------------------------------------------

class Reflector:
    """Tries its tiers in order and returns a validated Patch or a Halt, within budgets.

    Args:
        tiers: repair tiers, first wins; default ``[Tier1()]``.
        max_per_node: repairs allowed for one (case, node).
        max_per_case: repairs allowed for one case in total.
        registry: tool registry mapping for validation (default: the global one).
        plugin_modules: {module: file} of tools registered outside bcer, imported first (by
            name, else by file, as a node task does), so they are in the global registry.

    >>> r = Reflector(max_per_node=2)                                  # doctest: +SKIP
    >>> r.repair(failure, workflow, case)                              # doctest: +SKIP
    Patch(node_id='seg', ..., reason='clamped threshold from 1.5 to 1.0', tier=1)
    """

    def __init__(self, tiers: list[RepairTier] | None = None, max_per_node: int = 2, max_per_case: int = 5,
                 registry: Mapping[str, Any] | None = None, plugin_modules: Mapping[str, str] | None = None):
        import_plugins(plugin_modules or {})
        self.tiers: list[RepairTier] = list(tiers) if tiers is not None else [Tier1(registry)]
        self.max_per_node, self.max_per_case = max_per_node, max_per_case
        self._registry = registry
        self._per_node: Counter[tuple[str, str]] = Counter()
        self._per_case: Counter[str] = Counter()
        self._events = PendingEvents()  # LLM calls of tiers, until the engine writes them to the trace
        self._why: str | None = None  # why the last proposal was rejected (for its llm_call event)

    def repair(self, failure: Failure, workflow: Workflow, case: Case,
               contract: TaskContract | None = None) -> Patch | Halt:
        """A Patch for the failed node (re-validated by the compiler), or a Halt."""
        node, code = failure.node, failure.code
        if halts_at_once(failure):
            return Halt(node_id=node.id, code=code.value,
                        reason=f"{code.value} halts at once: {failure.error.get('message', '')}")
        used_node, used_case = self._per_node[(failure.case_id, node.id)], self._per_case[failure.case_id]
        if used_node >= self.max_per_node or used_case >= self.max_per_case:
            return Halt(node_id=node.id, code=code.value,
                        reason=f"repair budget exhausted (node {used_node}/{self.max_per_node}, "
                               f"case {used_case}/{self.max_per_case})")
        for tier in self.tiers:
            try:
                proposal = tier.propose(failure, workflow, case)
            except Exception as e:  # one broken tier must not end the case; the next may help
                log.warning("repair tier %s crashed on %s: %s: %s", type(tier).__name__, node.id,
                            type(e).__name__, e)
                continue
            if isinstance(proposal, Halt):
                self._settle(tier, failure.case_id, True, None)
                return proposal
            self._why = None
            patch = self._validated(proposal, failure, workflow, case, contract) if proposal else None
            self._settle(tier, failure.case_id, patch is not None, self._why)
            if patch is not None:
                self._per_node[(failure.case_id, node.id)] += 1
                self._per_case[failure.case_id] += 1
                log.info("case %s node %s: tier %d patch: %s", failure.case_id, node.id, patch.tier, patch.reason)
                return patch
        return Halt(node_id=node.id, code=code.value,
                    reason=f"no repair tier has a valid patch for {code.value}: {failure.error.get('message', '')}")

    def _validated(self, patch: Patch, failure: Failure, workflow: Workflow, case: Case,
                   contract: TaskContract | None) -> Patch | None:
        """The patch re-checked by the compiler (normalised), or None when it is invalid."""
        if patch.node_id != failure.node.id:
            return self._reject("patch for %s targets another node %s", failure.node.id, patch.node_id)
        if patch.action == "skip":
            return self._validated_skip(patch, failure, workflow)
        inserted, target_wf = None, workflow
        try:
            if patch.action == "insert":
                inserted, target_wf = self._validated_insert(patch, failure, workflow, case, contract)
            node = validate_node(target_wf, patch.apply(failure.node), case, contract, registry=self._registry)
        except CompileError as e:
            return self._reject("patch for %s rejected by the compiler: %s", failure.node.id,
                                "; ".join(str(x) for x in e.errors))
        except ValueError as e:
            return self._reject("patch for %s rejected: %s", failure.node.id, e)
        if inserted is not None and not any(ref_name(t, "node") == inserted.id for t in node.inputs.values()):
            return self._reject("insert patch for %s does not use the inserted node %s", failure.node.id,
                                inserted.id)
        if (inserted is None and patch.device is None and node.inputs == failure.node.inputs
                and _jsonable(node.params) == _jsonable(failure.node.params)):
            return self._reject("patch for %s changes nothing", failure.node.id)
        return patch.model_copy(update={"inputs": node.inputs, "params": node.params, "insert": inserted})

    def _validated_insert(self, patch: Patch, failure: Failure, workflow: Workflow, case: Case,
                          contract: TaskContract | None) -> tuple[Node, Workflow]:
        """The inserted node checked like a compiled one, and the workflow that contains it.

        Its ValueErrors are internal: ``_validated`` turns them into a rejected patch (the patch
        comes from a planner or an LLM, not from the user).
        """
        new = patch.insert
        if new is None:
            raise ValueError("insert patch without a node to insert")
        if any(n.id == new.id for n in workflow.nodes):
            raise ValueError(f"inserted node id {new.id!r} already exists")
        below = workflow.downstream(failure.node.id) | {failure.node.id}
        bad = [t for t in new.inputs.values() if ref_name(t, "node") in below]
        if bad:
            raise ValueError(f"inserted node binds {bad[0]}, which is not upstream of {failure.node.id}")
        node = validate_node(workflow, new.model_copy(update={"required": failure.node.required}), case,
                             contract, registry=self._registry)
        edges = [(up, node.id) for t in node.inputs.values() if (up := ref_name(t, "node")) is not None]
        wf = workflow.model_copy(update={"nodes": [*workflow.nodes, node], "edges": [*workflow.edges, *edges]})
        return node, wf

    def _validated_skip(self, patch: Patch, failure: Failure, workflow: Workflow) -> Patch | None:
        if failure.node.required:
            return self._reject("skip patch for required node %s", failure.node.id)
        needed = [d for d in workflow.downstream(failure.node.id) if workflow.node(d).required]
        if needed:
            return self._reject("skip patch for %s: required node %s depends on it", failure.node.id, needed[0])
        return patch.model_copy(update={"inputs": dict(failure.node.inputs), "params": dict(failure.node.params)})

    def _reject(self, fmt: str, *args: Any) -> None:
        """Log why a proposal is refused and keep the reason for the tier's ``llm_call`` event."""
        self._why = fmt % args
        log.info("%s: rejected", self._why)
        return None

    def _settle(self, tier: Any, case_id: str, accepted: bool, why: str | None) -> None:
        if getattr(tier, "pending_event", None):
            from .llm_tier import settle

            settle(tier, case_id, self._events, accepted, why)

    def drain_events(self, case_id: str) -> list[dict[str, Any]]:
        """Events of this case's repairs not yet in its trace (``llm_call`` of tier 2), oldest first."""
        return self._events.pop(case_id)

    def reset(self, case_id: str | None = None) -> None:
        """Forget the repairs counted for one case (e.g. when it starts a fresh run), or all."""
        if case_id is None:
            self._per_node.clear()
            self._per_case.clear()
            return
        for key in [k for k in self._per_node if k[0] == case_id]:
            del self._per_node[key]
        self._per_case.pop(case_id, None)

    def usage(self, case_id: str) -> dict[str, int]:
        """Repairs used so far for a case: ``{"case": n, "<node>": n, ...}``."""
        out = {node: n for (c, node), n in self._per_node.items() if c == case_id}
        return {"case": self._per_case[case_id], **out}


def reflector_actor(tiers: list[RepairTier] | None = None, max_per_node: int = 2, max_per_case: int = 5,
                    *, name: str | None = None, namespace: str | None = None,
                    registry: Mapping[str, Any] | None = None, plugin_modules: Mapping[str, str] | None = None):
    """Start (or, with ``name``, get-or-create) a Reflector Ray actor (``num_cpus=0``: it is
    light and must never wait for a CPU that the failing workload holds)."""
    opts: dict[str, Any] = {"name": name, "namespace": namespace, "get_if_exists": True} if name else {}
    return _actor_class().options(**opts).remote(tiers, max_per_node, max_per_case, registry, plugin_modules)


class ReflectorPool:
    """A small pool of Reflector actors shared by the cases of a run (so a tier-2 LLM client is
    held by a few actors, not one per case). A case always goes to the same member, chosen by
    a stable hash of its id, because its repair budget lives there. Members start on first
    use: a run without failures starts no actor at all.

    Implements the engine's ``RepairerPool`` protocol (``bcer.engine.repair``).

    Args:
        size: number of actors.
        prefix: actor names are ``f"{prefix}{sep}{i}"`` (get-or-create: drivers share them).
        registry: tools the actors validate against; ``"auto"`` (default): the actors' own
            registry, after importing the modules of this driver's tools registered outside
            bcer (plugins, user tools) by name or by file (:func:`plugin_modules`).
        **kwargs: passed to :func:`reflector_actor` (tiers, budgets, namespace).
    """

    def __init__(self, size: int = 2, prefix: str = "bcer_reflector", sep: str = "_",
                 registry: Mapping[str, Any] | str | None = "auto", **kwargs: Any):
        if size < 1:
            raise ToolError(ErrorCode.value_range, f"a reflector pool needs at least one actor, got size={size}",
                            hint="size >= 1", arg="size")
        self.size, self.prefix, self.sep = size, prefix, sep
        self._registry, self._kwargs = registry, kwargs
        self._members: dict[int, Any] = {}

    @property
    def members(self) -> list[Any]:
        """The actors started so far."""
        return [self._members[i] for i in sorted(self._members)]

    def for_case(self, case_id: str) -> Any:
        """The actor handle that repairs ``case_id`` (started on first use)."""
        slot = zlib.crc32(case_id.encode()) % self.size
        if slot not in self._members:
            where = ({"plugin_modules": plugin_modules()} if self._registry == "auto"
                     else {"registry": self._registry})
            self._members[slot] = reflector_actor(name=f"{self.prefix}{self.sep}{slot}", **where, **self._kwargs)
        return self._members[slot]

    def close(self) -> None:
        """Kill the started actors (their budgets die with the run)."""
        import ray

        for member in self.members:
            try:
                ray.kill(member, no_restart=True)
            except Exception:  # already gone with its cluster
                log.debug("reflector actor already gone", exc_info=True)
        self._members.clear()


def reflector_pool(run_id: str, size: int = 2, **kwargs: Any) -> ReflectorPool:
    """THE pool of one run (the API, CLI and bench build it and hand it to the engine)."""
    return ReflectorPool(size, prefix=f"bcer-reflector-{run_id}", sep="-", **kwargs)


_ACTOR_CLS: Any = None


def _actor_class() -> Any:
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        import ray

        _ACTOR_CLS = ray.remote(num_cpus=0)(Reflector)
    return _ACTOR_CLS


def __getattr__(name: str) -> Any:
    """``ReflectorActor`` (built on first access: importing this module never imports ray) and tier 2."""
    if name == "ReflectorActor":
        return _actor_class()
    if name in ("LLMTier", "patch_schema", "repair_prompt"):  # tier 2 loads only when asked for
        from . import llm_tier

        return getattr(llm_tier, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register_default() -> None:
    """Direct engine users (``run_case_workflow`` without a repairer) get this run's pool."""
    from ...engine.repair import set_default_repairer

    set_default_repairer(reflector_pool)


_register_default()

__all__ = ["Failure", "Halt", "HALT_AT_ONCE", "LLMTier", "Patch", "RESAMPLER", "Reflector", "ReflectorActor",
           "ReflectorPool", "RepairTier", "Tier1", "clamp_value", "halts_at_once", "patch_schema", "reflector_actor",
           "plugin_modules", "reflector_pool", "repair_prompt"]
