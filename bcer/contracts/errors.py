"""The one error type of bcer and its closed set of codes.

Retries and repairs route on ``ToolError.code``, never on message text.
"""
from __future__ import annotations

from enum import Enum
from typing import Any, Iterable


class ErrorCode(str, Enum):
    input_missing = "input_missing"
    bad_reference = "bad_reference"
    schema = "schema"
    shape = "shape"
    value_range = "value_range"
    numeric = "numeric"
    resource = "resource"
    timeout = "timeout"
    sandbox = "sandbox"
    worker_lost = "worker_lost"
    internal = "internal"


class ToolError(Exception):
    """A typed failure raised by tools, the compiler and the engine.

    Args:
        code: what kind of failure this is (routing key for repair).
        message: a sentence naming the offending value.
        hint: what would fix it (e.g. valid alternatives).
        context: where it happened: ``case``, ``node``, ``tool``, ``arg``, ``file``...
    """

    def __init__(self, code: ErrorCode | str, message: str, hint: str = "", **context: Any):
        self.code = ErrorCode(code)
        self.message = message
        self.hint = hint
        self.context = {k: v for k, v in context.items() if v is not None}
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = " ".join(f"{k}={v}" for k, v in self.context.items())
        text = f"[{self.code.value}] {self.message}"
        if where:
            text += f" ({where})"
        if self.hint:
            text += f" hint: {self.hint}"
        return text

    def with_context(self, **context: Any) -> "ToolError":
        """Add where-information (case, node, tool) without losing what is already there."""
        for k, v in context.items():
            if v is not None:
                self.context.setdefault(k, v)
        self.args = (self.__str__(),)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code.value, "message": self.message, "hint": self.hint,
                "context": {k: str(v) for k, v in self.context.items()}}

    def __reduce__(self):  # keeps code/hint/context across Ray's pickling
        return (_rebuild, (self.code.value, self.message, self.hint, self.context))


def _rebuild(code: str, message: str, hint: str, context: dict[str, Any]) -> ToolError:
    return ToolError(code, message, hint, **context)


def did_you_mean(name: str, options, n: int = 3) -> str:
    """A 'did you mean ...?' hint for misspelt names (planners misspell)."""
    import difflib

    opts = sorted(str(o) for o in options)
    close = difflib.get_close_matches(str(name), opts, n=n, cutoff=0.5)
    if close:
        return f"did you mean {', '.join(repr(c) for c in close)}? valid: {opts}"
    return f"valid: {opts}"


def parse_choices(value: str | Iterable[str], choices: Iterable[str], what: str, arg: str,
                  every: str | None = "all") -> list[str]:
    """The one parser of choice lists (``--task a,b``, ``--arms all``, ``--planner llm,offline``):
    ``"a,b"``, a list, or ``every`` (all choices) -> the chosen names in order, each once.

    Raises:
        ToolError: ``value_range`` naming an unknown choice (with did-you-mean) or an empty list.
    """
    known = list(choices)
    if isinstance(value, str):
        value = known if every is not None and value.strip() == every else value.split(",")
    chosen = list(dict.fromkeys(v.strip() for v in value if v.strip()))
    bad = [v for v in chosen if v not in known]
    if bad:
        raise ToolError(ErrorCode.value_range, f"unknown {what} {bad[0]!r}", hint=did_you_mean(bad[0], known), arg=arg)
    if not chosen:
        raise ToolError(ErrorCode.value_range, f"no {what} given", hint=f"valid: {sorted(known)}", arg=arg)
    return chosen
