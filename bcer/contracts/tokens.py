"""The plan language: the one token grammar, parser and builders (symbolic references in plans).

Build tokens with ``Token.seq("T1")``, ``Token.node("seg", "mask")``, ``Token.case("age")``
and ``Token.runtime("seed")``; ``str(token)`` gives the text form, ``Token.parse(text)``
reads it back. Never split or format token strings by hand.

Grammar (DESIGN "Tokens"); names are ``[A-Za-z_][A-Za-z0-9_]*``:

- ``@seq.<name>``: a sequence of the case (name normalised through the alias table);
- ``@node.<id>.<field>[.<subfield>...]``: an output field of another node;
- ``@case.<key>``: a metadata value of the case;
- ``@runtime.<key>``: a runtime value (one of ``RUNTIME_KEYS``).

Anything else starting with ``@`` is a ``bad_reference`` error, never a literal string
passed to a tool. Whether a token *points* at something (the sequence exists, the node has
that field, the runtime key is known) is the compiler's job; this module checks form only.

>>> parse_token("@node.seg.mask")
Token(scope='node', name='seg', path=('mask',), raw='@node.seg.mask')
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Any, Literal

from .errors import ErrorCode, ToolError, did_you_mean
from .sequences import canonical_sequence

Scope = Literal["seq", "node", "case", "runtime"]
SCOPES: tuple[str, ...] = ("seq", "node", "case", "runtime")
RUNTIME_KEYS: tuple[str, ...] = ("output_dir", "device", "seed", "run_id")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Token:
    """A parsed reference. ``path`` holds the parts after the name (field, subfields)."""

    scope: Scope
    name: str
    path: tuple[str, ...] = ()
    # the text it was read from; not compared, so a built token equals the parsed one
    raw: str = dc_field(default="", compare=False)

    @property
    def field(self) -> str | None:
        """The output field of a ``@node`` token (first path part), else None."""
        return self.path[0] if self.path else None

    def __str__(self) -> str:
        return self.raw or "@" + ".".join((self.scope, self.name, *self.path))


    @classmethod
    def parse(cls, text: Any) -> Token:
        """Parse ``text`` (see :func:`parse_token`)."""
        return parse_token(text)

    @classmethod
    def seq(cls, name: str) -> Token:
        """``@seq.<name>``, e.g. ``str(Token.seq("T1")) == "@seq.T1"``."""
        return cls._build("seq", name)

    @classmethod
    def node(cls, node_id: str, field: str, *subfields: str) -> Token:
        """``@node.<id>.<field>[.<subfield>...]``, e.g. ``"@node.a.image"``."""
        return cls._build("node", node_id, field, *subfields)

    @classmethod
    def case(cls, key: str) -> Token:
        """``@case.<key>``: a metadata value of the case."""
        return cls._build("case", key)

    @classmethod
    def runtime(cls, key: str) -> Token:
        """``@runtime.<key>``: a runtime value (form only; the compiler checks the key)."""
        return cls._build("runtime", key)

    @classmethod
    def try_parse(cls, value: Any) -> Token | None:
        """The token ``value`` spells, or None for anything else (non-strings, literals, bad form).

        For code that sorts a plan's values into tokens and literals after the compiler has
        checked them; use :meth:`parse` where a bad reference must fail loudly.
        """
        if not is_token(value):
            return None
        try:
            return parse_token(value)
        except ToolError:
            return None

    @classmethod
    def _build(cls, scope: str, name: str, *path: str) -> Token:
        # The form is not checked here: builders list what a case or plan offers (a sequence
        # key need not be a valid name), and the compiler parses every token a plan uses.
        return cls(scope=scope, name=name, path=tuple(path))  # type: ignore[arg-type]


def is_token(value: Any) -> bool:
    """True for any string starting with ``@`` (valid or not: invalid ones must fail loudly)."""
    return isinstance(value, str) and value.startswith("@")


def _bad(text: str, why: str, hint: str = "") -> ToolError:
    return ToolError(ErrorCode.bad_reference, f"bad reference {text!r}: {why}",
                     hint=hint or "use @seq.<name>, @node.<id>.<field>, @case.<key> or "
                                  "@runtime.<key>; names are [A-Za-z_][A-Za-z0-9_]*",
                     token=text)


def parse_token(text: Any) -> Token:
    """Parse one token.

    Args:
        text: the reference, e.g. ``"@seq.T1c"`` or ``"@node.seg.mask"``.

    Returns:
        The parsed :class:`Token`.

    Raises:
        ToolError: ``schema`` if ``text`` is not a string; ``bad_reference`` for anything
            that does not follow the grammar.
    """
    if not isinstance(text, str):
        raise ToolError(ErrorCode.schema, f"a reference must be a string, got {type(text).__name__}",
                        hint="write references as '@scope.name'")
    if not text.startswith("@"):
        raise _bad(text, "references start with '@'")
    parts = text[1:].split(".")
    scope = parts[0]
    if scope not in SCOPES:
        raise _bad(text, f"unknown scope {scope!r}", hint=did_you_mean(scope, SCOPES))
    if len(parts) < 2:
        raise _bad(text, "missing name")
    bad = [p for p in parts[1:] if not _NAME.fullmatch(p)]
    if bad:
        raise _bad(text, f"invalid name {bad[0]!r}")
    if scope == "node":
        if len(parts) < 3:
            raise _bad(text, "a node reference needs a field", hint="write @node.<id>.<field>")
    elif len(parts) != 2:
        raise _bad(text, f"@{scope} takes exactly one name", hint=f"write @{scope}.<name>")
    return Token(scope=scope, name=parts[1], path=tuple(parts[2:]), raw=text)  # type: ignore[arg-type]


def find_tokens(value: Any) -> list[Token]:
    """Every token in a (nested) dict/list/tuple value, in order of appearance.

    Raises:
        ToolError: ``bad_reference`` for the first ``@`` string that is not a valid token.
    """
    if is_token(value):
        return [parse_token(value)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in find_tokens(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in find_tokens(v)]
    return []


def ref_name(value: Any, scope: Scope) -> str | None:
    """The name (node id, sequence name, key) of a well-formed ``scope`` token; None otherwise.

    >>> ref_name("@node.seg.mask", "node"), ref_name("@seq.T1", "node"), ref_name(3, "seq")
    ('seg', None, None)
    """
    tok = Token.try_parse(value)
    return tok.name if tok is not None and tok.scope == scope else None


def normalise_seq(name: str) -> str | None:
    """Canonical sequence name through the one alias table (``t1ce`` -> ``T1c``), or None."""
    if not isinstance(name, str):
        return None
    return canonical_sequence(name)


__all__ = ["RUNTIME_KEYS", "SCOPES", "Token", "find_tokens", "is_token", "normalise_seq", "parse_token", "ref_name"]
