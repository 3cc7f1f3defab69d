"""Token grammar: valid forms parse exactly; everything else is a typed error, never a crash."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcer.contracts.errors import ErrorCode, ToolError
from bcer.engine.tokens import RUNTIME_KEYS, Token, find_tokens, is_token, normalise_seq, parse_token


@pytest.mark.parametrize("text, expected", [
    ("@seq.T1c", Token("seq", "T1c", (), "@seq.T1c")),
    ("@node.seg.mask", Token("node", "seg", ("mask",), "@node.seg.mask")),
    ("@node.seg.mask.x", Token("node", "seg", ("mask", "x"), "@node.seg.mask.x")),
    ("@case.weight", Token("case", "weight", (), "@case.weight")),
    ("@runtime.output_dir", Token("runtime", "output_dir", (), "@runtime.output_dir")),
    ("@seq._a9", Token("seq", "_a9", (), "@seq._a9")),
])
def test_valid_tokens_parse(text: str, expected: Token) -> None:
    tok = parse_token(text)
    assert tok == expected
    assert str(tok) == text


def test_field_property() -> None:
    assert parse_token("@node.seg.mask.x").field == "mask"
    assert parse_token("@seq.T1c").field is None


@pytest.mark.parametrize("text", [
    "@", "@seq", "@seq.", "@seq..T1c", "@seq.T1c.extra", "@node.seg", "@node.seg.", "@node..mask",
    "@case.weight.kg", "@runtime", "@foo.bar", "@SEQ.T1c", "@seq.1abc", "@seq.a-b", "@seq.a b",
    "@seq.T1c ", " @seq.T1c", "@seq.T1é", "@node.seg.mask\n", "seq.T1c", "", "@@seq.T1c",
])
def test_invalid_tokens_are_bad_reference(text: str) -> None:
    with pytest.raises(ToolError) as e:
        parse_token(text)
    assert e.value.code is ErrorCode.bad_reference


@pytest.mark.parametrize("value", [None, 3, 2.5, ["@seq.T1c"], {"a": 1}, b"@seq.T1c"])
def test_non_string_is_schema(value: object) -> None:
    with pytest.raises(ToolError) as e:
        parse_token(value)
    assert e.value.code is ErrorCode.schema


def test_unknown_scope_suggests() -> None:
    with pytest.raises(ToolError) as e:
        parse_token("@sq.T1c")
    assert "'seq'" in e.value.hint


def test_is_token() -> None:
    assert is_token("@anything") and is_token("@")
    assert not is_token("seq.T1c") and not is_token(None) and not is_token(1) and not is_token("")


def test_find_tokens_nested() -> None:
    value = {"a": "@seq.T1", "b": [1, "x", {"c": "@node.n.out"}, ("@case.age",)], "d": 2.0}
    assert [t.raw for t in find_tokens(value)] == ["@seq.T1", "@node.n.out", "@case.age"]
    assert find_tokens("plain") == [] and find_tokens(None) == []
    with pytest.raises(ToolError) as e:
        find_tokens({"a": ["@seq.T1", "@bogus"]})
    assert e.value.code is ErrorCode.bad_reference


@pytest.mark.parametrize("name, canon", [("t1ce", "T1c"), ("T1GD", "T1c"), ("t2w", "T2w"), ("adc", "ADC"),
                                         ("highb", "DWI"), ("cine", "CINE"), ("FLAIR", "FLAIR"),
                                         ("nonsense", None), (3, None)])
def test_normalise_seq(name: object, canon: str | None) -> None:
    assert normalise_seq(name) == canon


def test_runtime_keys() -> None:
    assert RUNTIME_KEYS == ("output_dir", "device", "seed", "run_id")


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.text().map(lambda s: "@" + s),
                 st.lists(st.sampled_from(["seq", "node", "case", "runtime", "x", "", "1", "_a", "é", " "]),
                          max_size=5).map(lambda p: "@" + ".".join(p))))
def test_arbitrary_text_only_raises_typed_errors(text: str) -> None:
    try:
        tok = parse_token(text)
    except ToolError as e:
        assert e.code in (ErrorCode.bad_reference, ErrorCode.schema)
        return
    # whatever parsed must round-trip exactly
    assert str(tok) == text and tok.scope in ("seq", "node", "case", "runtime")


@settings(max_examples=100, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.integers(), st.text()),
                    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                    max_leaves=10))
def test_find_tokens_arbitrary(value: object) -> None:
    try:
        find_tokens(value)
    except ToolError as e:
        assert e.code is ErrorCode.bad_reference
