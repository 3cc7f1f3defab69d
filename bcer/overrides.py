"""User-set tool parameters (`--set denoise.nlm.h_factor=0.9`, ``Study(params=...)``).

Each value is checked against the tool's own params model when it is parsed, so a value out of
bounds is a typed error before Ray starts; the planner's steps of that tool then carry the value,
and the node records (``provenance.json``) show what ran.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Iterable, Mapping

from pydantic import ValidationError

from .contracts import Case, ErrorCode, PlanSketch, TaskContract, ToolError
from .contracts.errors import did_you_mean

log = logging.getLogger(__name__)


def parse_sets(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``["denoise.nlm.h_factor=0.9"]`` -> ``{"denoise.nlm": {"h_factor": 0.9}}``, every value
    checked. A value is read as JSON (numbers, true/false, lists) and else kept as text.

    Raises:
        ToolError: ``schema`` for a malformed item or an unknown tool/param, ``value_range``
            for a value outside the param's bounds (the message names the bound).
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        tool, dot, param = key.strip().rpartition(".")
        if not sep or not dot or not tool or not param:
            raise ToolError(ErrorCode.schema, f"--set {item!r}: expected TOOL.PARAM=VALUE",
                            hint="e.g. --set denoise.nlm.h_factor=0.9")
        out.setdefault(tool, {})[param] = _value(raw.strip())
    return check_params(out)


def _value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def check_params(params: Mapping[str, Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Validate ``{tool: {param: value}}`` field by field against each tool's params model;
    returns the values as the model coerces them."""
    from .tools.registry import get_tool

    checked: dict[str, dict[str, Any]] = {}
    for tool, values in (params or {}).items():
        model = get_tool(tool).params_model
        for name, value in values.items():
            if name not in model.model_fields:
                raise ToolError(ErrorCode.schema, f"{tool} has no param {name!r}",
                                hint=did_you_mean(name, model.model_fields) or f"`bcer tools {tool}` lists them",
                                tool=tool, arg=name)
            try:
                inst = model.__pydantic_validator__.validate_assignment(model.model_construct(), name, value)
            except ValidationError as e:
                raise _param_error(tool, name, value, e, model.model_json_schema()) from None
            checked.setdefault(tool, {})[name] = getattr(inst, name)
    return checked


def _param_error(tool: str, name: str, value: Any, err: ValidationError, schema: dict) -> ToolError:
    prop = schema.get("properties", {}).get(name, {})
    bounds = ", ".join(f"{word} {prop[k]}" for k, word in
                       (("minimum", "minimum"), ("exclusiveMinimum", "above"),
                        ("maximum", "maximum"), ("exclusiveMaximum", "below")) if k in prop)
    first = err.errors()[0]
    code = ErrorCode.value_range if "than" in first.get("type", "") else ErrorCode.schema
    return ToolError(code, f"{tool}.{name}={value!r}: {first.get('msg')}" + (f" ({bounds})" if bounds else ""),
                     hint=f"default {prop['default']!r}" if "default" in prop else "", tool=tool, arg=name)


class ParamSetter:
    """A planner that plans with ``inner`` and sets the given params on every step of each
    tool (a user's explicit value wins over the planner's).

    >>> planner = ParamSetter(OfflinePlanner(), {"denoise.nlm": {"h_factor": 0.9}})   # doctest: +SKIP
    """

    def __init__(self, inner: Any, params: Mapping[str, Mapping[str, Any]]):
        self.inner = inner
        self.params = {t: dict(v) for t, v in params.items()}
        self.name = getattr(inner, "name", "planner")

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _set(self, sketch: PlanSketch) -> PlanSketch:
        for step in sketch.steps:
            values = self.params.get(step.tool)
            if values:
                step.args.update(values)
                log.info("step %s (%s) params set: %s", step.id, step.tool, values)
        return sketch

    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        return self._set(self.inner.plan(goal, case, contract))

    def revise(self, sketch: PlanSketch, errors: list[ToolError], case: Case,
               contract: TaskContract | None = None) -> PlanSketch | None:
        revised = self.inner.revise(sketch, errors, case, contract)
        return None if revised is None else self._set(revised)


__all__ = ["ParamSetter", "check_params", "parse_sets"]
