"""bcer.tools.registry: a name clash between two tools is a typed error naming both."""
from __future__ import annotations

import pytest

from bcer.contracts import Image
from bcer.contracts.errors import ErrorCode, ToolError
from bcer.tools.registry import REGISTRY, tool


def _first(image: Image) -> Image:
    """First toy tool."""
    return image


def _second(image: Image) -> Image:
    """Second toy tool under the same name."""
    return image


def test_a_second_tool_under_a_taken_name_is_refused():
    tool("toy.clash")(_first)
    try:
        tool("toy.clash")(_first)  # the same function again (a module re-imported): allowed
        with pytest.raises(ToolError) as e:
            tool("toy.clash")(_second)
        assert e.value.code is ErrorCode.schema and e.value.context["tool"] == "toy.clash"
        assert "_first" in e.value.message and "_second" in e.value.message
        assert REGISTRY["toy.clash"].fn is _first  # the first registration stays
    finally:
        REGISTRY.pop("toy.clash", None)
