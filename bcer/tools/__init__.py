"""Extremity: registered, typed MRI tools. Imports contracts only; never imports ray."""
from .registry import REGISTRY, call_tool, get_tool, list_tools, load_all, tool, validate_params

__all__ = ["REGISTRY", "call_tool", "get_tool", "list_tools", "load_all", "tool", "validate_params"]
