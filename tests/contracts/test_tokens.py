"""The plan language in contracts: Token builders, parse round trips, Case.sequence_key."""
from __future__ import annotations

import pytest

from bcer.contracts.case import Case, SequenceRef
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.contracts.tokens import Token, parse_token, ref_name
from bcer.engine import tokens as engine_tokens


@pytest.mark.parametrize("token, text, scope, name, path", [
    (Token.seq("T1"), "@seq.T1", "seq", "T1", ()),
    (Token.node("a", "image"), "@node.a.image", "node", "a", ("image",)),
    (Token.node("seg", "stats", "volume_ml"), "@node.seg.stats.volume_ml", "node", "seg", ("stats", "volume_ml")),
    (Token.case("age"), "@case.age", "case", "age", ()),
    (Token.runtime("seed"), "@runtime.seed", "runtime", "seed", ()),
])
def test_builders_round_trip(token, text, scope, name, path):
    assert str(token) == text
    assert (token.scope, token.name, token.path) == (scope, name, path)
    assert Token.parse(text) == token
    assert Token.parse(str(token)) == token


def test_node_field():
    assert Token.node("a", "image").field == "image"
    assert Token.seq("T1").field is None


@pytest.mark.parametrize("text", ["@seq", "@seq.T1.extra", "@node.a", "@nodes.a.b", "@seq.1bad",
                                  "seq.T1", "@case.", "@runtime.a.b"])
def test_bad_text_names_the_text(text):
    with pytest.raises(ToolError) as err:
        Token.parse(text)
    assert err.value.code == ErrorCode.bad_reference
    assert repr(text) in str(err.value)


@pytest.mark.parametrize("build, args, text", [(Token.seq, ("T 1",), "@seq.T 1"), (Token.node, ("a", ""), "@node.a."),
                                               (Token.case, ("1x",), "@case.1x"), (Token.runtime, ("a.b",), "@runtime.a.b")])
def test_builders_keep_the_text_and_the_parser_rejects_bad_names(build, args, text):
    # builders list what a case offers (keys need not be valid names); the compiler parses
    assert str(build(*args)) == text
    with pytest.raises(ToolError) as err:
        Token.parse(str(build(*args)))
    assert err.value.code == ErrorCode.bad_reference


@pytest.mark.parametrize("value, want", [("@seq.T1", Token.seq("T1")), ("@node.a.mask", Token.node("a", "mask")),
                                         ("@node.a", None), ("@bogus.x", None), ("T1", None), (3, None), (None, None)])
def test_try_parse(value, want):
    assert Token.try_parse(value) == want


@pytest.mark.parametrize("value, scope, want", [("@node.seg.mask", "node", "seg"), ("@seq.T1", "seq", "T1"),
                                                ("@seq.T1", "node", None), ("@node.seg", "node", None),
                                                ("x.seg", "node", None), (None, "seq", None)])
def test_ref_name(value, scope, want):
    assert ref_name(value, scope) == want


def test_non_string_is_schema_error():
    with pytest.raises(ToolError) as err:
        Token.parse(3)
    assert err.value.code == ErrorCode.schema


def test_engine_module_reexports_the_contract_parser():
    assert engine_tokens.Token is Token and engine_tokens.parse_token is parse_token


def _case(*keys: str) -> Case:
    return Case(id="c1", root="/tmp", sequences={k: SequenceRef(path=f"{k}.nii.gz") for k in keys})


@pytest.mark.parametrize("keys, name, want", [
    (("T1c", "FLAIR"), "t1ce", "T1c"),     # alias of the key
    (("t1ce", "FLAIR"), "T1c", "t1ce"),    # key is the alias, name is canonical
    (("T1c", "t1ce"), "t1ce", "t1ce"),     # an exact key wins over an alias match
    (("FLAIR",), "flair", "FLAIR"),
    (("FLAIR",), "T2w", None),
    (("custom",), "custom", "custom"),     # a name outside the alias table: exact only
    ((), "T1", None),
])
def test_case_sequence_key(keys, name, want):
    assert _case(*keys).sequence_key(name) == want
