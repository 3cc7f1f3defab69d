"""Tier 2 of the Reflector: an LLM proposes one of BCER's patch actions for a failed node.

Actions (the ``Patch``/``Halt`` models of ``bcer.agents.repair.reflector``):

- ``retry``: the node again with corrected args: its own params (types and bounds from its
  params model) and input ports rebound only to artifacts bindable now, of the port's kind;
- ``insert``: an allowed tool added before the node (bound to what is bindable now), then the
  node retried consuming the inserted node's output;
- ``skip``: an optional node nothing required depends on is skipped;
- ``halt``: give up on the node with a reason.

The JSON schema of each request (:func:`patch_schema`) is built per failure from exactly
those whitelists, so a schema-following model cannot even name anything else; the answer is
checked against it again (a server may ignore schemas), and the Reflector re-validates
every patch with the compiler before anything runs. Sandbox violations and missing inputs
never reach this tier: the Reflector halts them at once.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from ...contracts.case import Case
from ...contracts.errors import ToolError
from ...contracts.task import TaskContract
from ...contracts.tokens import Token
from ...contracts.workflow import Node, Workflow
from ...engine.compiler import resolve_registry
from ..events import PendingEvents
from ...contracts.repair import HALT_AT_ONCE, Failure, Halt, Patch

log = logging.getLogger(__name__)
ACTIONS = ("retry", "insert", "skip", "halt")


def _params_object(spec: Any) -> dict[str, Any]:
    ps = json.loads(json.dumps(spec.params_schema))
    return {"type": "object", "properties": ps.get("properties", {}), "additionalProperties": False}


def _ports_object(spec: Any, available: Mapping[str, str], extra: Mapping[str, list[str]] | None = None
                  ) -> dict[str, Any]:
    """Input ports, each bindable only to a token of its kind (among ``available`` + ``extra``)."""
    props: dict[str, Any] = {}
    for port in spec.inputs:
        options = sorted(t for t, k in available.items() if k == port.kind.value)
        options += sorted((extra or {}).get(port.kind.value, []))
        if options:
            props[port.name] = {"type": "string", "enum": options}
    return {"type": "object", "properties": props, "additionalProperties": False}


def patch_schema(tool_name: str, available: Mapping[str, str] | None = None,
                 registry: Mapping[str, Any] | None = None, *, actions: tuple[str, ...] = ("retry",),
                 insert_tools: list[str] | None = None, insert_id: str | None = None) -> dict[str, Any]:
    """JSON schema of a patch an LLM may propose for one node of ``tool_name``.

    ``params`` may hold only the tool's own params (their types and bounds come from its params
    model; every one optional, since a patch names what it changes); ``inputs`` may rebind the
    tool's ports, each only to a token of the port's kind among ``available`` (plus, with
    ``insert``, the outputs of the node it inserts); ``device`` may only force "cpu";
    ``action`` is one of ``actions`` (retry when absent). With "insert" in ``actions``,
    ``insert`` names one of ``insert_tools`` with its own ports (bound to ``available``) and
    params, under the id ``insert_id``. Usable as a vLLM ``structured_outputs`` / OpenAI
    ``response_format`` JSON schema.

    Raises:
        KeyError: unknown tool.
    """
    reg = resolve_registry(registry)
    spec = reg[tool_name].spec
    available = available or {}
    extra: dict[str, list[str]] = {}
    branches = []
    if "insert" in actions and insert_tools and insert_id:
        for name in sorted(insert_tools):
            ins = reg[name].spec
            for out in ins.outputs:
                extra.setdefault(out.kind.value, []).append(str(Token.node(insert_id, out.name)))
            branches.append({"type": "object", "additionalProperties": False, "required": ["tool"],
                             "properties": {"tool": {"const": name}, "inputs": _ports_object(ins, available),
                                            "params": _params_object(ins)}})
    ps = spec.params_schema
    props: dict[str, Any] = {"action": {"enum": list(actions)}, "params": _params_object(spec),
                             "inputs": _ports_object(spec, available, extra), "device": {"enum": ["cpu"]}}
    if branches:
        props["insert"] = {"anyOf": branches}
    props["reason"] = {"type": "string", "maxLength": 300}
    schema: dict[str, Any] = {"title": f"Patch for {tool_name}", "type": "object", "additionalProperties": False,
                              "properties": props, "required": ["reason"]}
    defs = dict(ps.get("$defs", {}))
    for name in insert_tools or []:
        defs.update(reg[name].spec.params_schema.get("$defs", {}))
    if defs:  # nested params models: keep their '#/$defs/...' references valid
        schema["$defs"] = defs
    return schema


def repair_prompt(failure: Failure, schema: dict[str, Any]) -> str:
    """The instruction for one failure: the failed node, its typed error, what is bindable, the schema."""
    n = failure.node
    actions = schema["properties"].get("action", {}).get("enum", ["retry"])
    text = (
        "A node of an MRI analysis workflow failed. Choose ONE action and answer with JSON matching the "
        "schema: retry = the same node with corrected params or input bindings (the smallest change); "
        "insert = add one allowed tool before it, then retry the node consuming the new tool's output; "
        "skip = drop this optional node; halt = the failure cannot be repaired here. Change nothing else.\n"
        f"allowed actions: {', '.join(actions)}\n"
        f"tool: {n.tool}\nnode: {n.id} ({'required' if n.required else 'optional'})\n"
        f"inputs: {json.dumps(n.inputs)}\nparams: {json.dumps(n.params, default=str)}\n"
        f"error: {json.dumps(failure.error, default=str)}\nattempt: {failure.attempt}\n"
        f"bindable now: {json.dumps(failure.available)}\n")
    insert = schema["properties"].get("insert")
    if insert:
        tools = [b["properties"]["tool"]["const"] for b in insert["anyOf"]]
        first = schema["properties"]["inputs"]["properties"]
        new_tokens = sorted({t for p in first.values() for t in p.get("enum", []) if ".fix_" in t})
        text += f"tools you may insert: {', '.join(tools)} (their outputs: {', '.join(new_tokens)})\n"
    return text + f"schema: {json.dumps(schema)}"


def _schema_problem(payload: Any, schema: dict[str, Any]) -> str | None:
    from ...optional import optional_import

    jsonschema, ok = optional_import("jsonschema", extra="llm")
    if ok:
        try:
            jsonschema.validate(payload, schema)
        except jsonschema.ValidationError as e:
            return e.message
        return None
    # without jsonschema: at least the closed key sets (bounds are re-checked by the compiler)
    if not isinstance(payload, dict) or set(payload) - set(schema["properties"]):
        return "not an object with patch keys"
    for key in ("params", "inputs"):
        allowed = schema["properties"][key]["properties"]
        if not isinstance(payload.get(key, {}), dict) or set(payload.get(key, {})) - set(allowed):
            return f"{key} outside the tool's own {key}"
    return None


def _contract_of(workflow: Workflow) -> TaskContract | None:
    """The workflow's task contract when it is a shipped one (it narrows what may be inserted;
    the Reflector's compiler check, which has the run's contract, is what enforces it)."""
    if not workflow.task:
        return None
    from ...contracts import load_contract

    try:
        return load_contract(workflow.task)
    except (FileNotFoundError, ValueError):
        return None


class LLMTier:
    """Tier 2: asks an :class:`~bcer.agents.llm.base.LLMBackend` for a patch action.

    Args:
        backend: the model (the cohort's one backend, shared with the Brain).
        registry: tool registry mapping (default: the global one).
        max_tokens: per answer.
        actions: the actions offered (skip only ever for optional nodes, insert only when an
            allowed tool can feed one of the node's ports).

    ``pending_event`` holds the ``llm_call`` event of the last ``propose``; the Reflector
    settles it (accepted or not, and why) and keeps it for the case's trace.
    """

    tier = 2

    def __init__(self, backend: Any, registry: Mapping[str, Any] | None = None, max_tokens: int = 384,
                 actions: tuple[str, ...] = ACTIONS):
        self.backend = backend
        self._registry = registry
        self.max_tokens = max_tokens
        self.actions = tuple(a for a in ACTIONS if a in actions)
        self.pending_event: dict[str, Any] | None = None

    def propose(self, failure: Failure, workflow: Workflow, case: Case) -> Patch | Halt | None:
        self.pending_event = None
        reg = resolve_registry(self._registry)
        if failure.code in HALT_AT_ONCE or failure.node.tool not in reg:
            return None
        node = failure.node
        insert_id = f"fix_{node.id}_{failure.attempt}"
        insertable = self._insertable(failure, workflow, reg)
        actions = tuple(a for a in self.actions if (a != "skip" or not node.required)
                        and (a != "insert" or insertable))
        schema = patch_schema(node.tool, failure.available, reg, actions=actions, insert_tools=insertable,
                              insert_id=insert_id)
        messages = [{"role": "user", "content": repair_prompt(failure, schema)}]
        try:
            reply = self.backend.complete(messages, json_schema=schema, max_tokens=self.max_tokens)
        except ToolError as e:  # a failing backend must not crash the run; the next tier decides
            log.warning("LLM repair of %s failed: %s", node.id, e)
            self._event(failure, {"backend": getattr(self.backend, "name", "?"),
                                  "model": getattr(self.backend, "model", "?")}, None, e.code.value, e.message)
            return None
        text = reply.texts[0] if reply.texts else ""
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as e:
            self._event(failure, reply.event_data(), None, "schema", f"not JSON: {e}")
            return None
        problem = _schema_problem(payload, schema)
        if problem:
            self._event(failure, reply.event_data(), payload, "schema", f"outside its schema: {problem}")
            return None
        self._event(failure, reply.event_data(), payload, None, None)
        return self._proposal(payload, failure, insert_id)

    def _proposal(self, payload: dict[str, Any], failure: Failure, insert_id: str) -> Patch | Halt:
        node, action = failure.node, payload.get("action", "retry")
        reason = "llm: " + str(payload.get("reason", ""))
        if action == "halt":
            return Halt(node_id=node.id, code=failure.code.value, reason=reason)
        inputs = {**node.inputs, **payload.get("inputs", {})}
        params = {**node.params, **payload.get("params", {})}
        insert = None
        if action == "insert":
            spec = payload.get("insert") or {}
            insert = Node(id=insert_id, tool=str(spec.get("tool", "")), inputs=dict(spec.get("inputs", {})),
                          params=dict(spec.get("params", {})), why=f"inserted to repair {node.id}")
        return Patch(node_id=node.id, inputs=inputs, params=params, device=payload.get("device"), reason=reason,
                     tier=self.tier, action=action, insert=insert)

    def _insertable(self, failure: Failure, workflow: Workflow, reg: Mapping[str, Any]) -> list[str]:
        """Allowed tools without required params that make a kind one of the node's ports takes, and whose
        required ports can all be bound to what is bindable now."""
        if "insert" not in self.actions:
            return []
        contract = _contract_of(workflow)
        spec = reg[failure.node.tool].spec
        wanted = {p.kind for p in spec.inputs}
        have = set(failure.available.values())
        out = []
        for name, r in reg.items():
            s = r.spec
            if name == failure.node.tool or s.params_schema.get("required"):
                continue
            if contract is not None and not contract.allows(name):
                continue
            if any(p.kind in wanted for p in s.outputs) and all(p.kind.value in have for p in s.inputs if p.required):
                out.append(name)
        return sorted(out)

    def _event(self, failure: Failure, data: dict[str, Any], payload: Any, code: str | None,
               problem: str | None) -> None:
        action = payload.get("action", "retry") if isinstance(payload, dict) else None
        self.pending_event = {
            "kind": "llm_call", "node": failure.node.id, "tool": failure.node.tool, "attempt": failure.attempt,
            "error_code": code, "message": f"repair: {problem}" if problem else f"repair: proposed {action}",
            "data": {**data, "purpose": "repair", "action": action, "accepted": False if problem else None,
                     "reasons": [code] if code else []}}


def settle(tier: Any, case_id: str, events: PendingEvents, accepted: bool, why: str | None) -> None:
    """Record a tier's pending ``llm_call`` event with the Reflector's verdict on its proposal."""
    event = getattr(tier, "pending_event", None)
    if not event:
        return
    tier.pending_event = None
    data = dict(event.get("data") or {})
    if data.get("accepted") is None:  # the answer was well formed: the compiler's verdict decides
        data["accepted"] = accepted
        if not accepted:
            data["reasons"] = ["compile"]
            event = {**event, "error_code": "schema", "message": f"{event['message']}; rejected: {why}"}
    events.add(case_id, **{**event, "data": data})


__all__ = ["ACTIONS", "LLMTier", "patch_schema", "repair_prompt", "settle"]
