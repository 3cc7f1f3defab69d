"""A no-op tool for the engine-overhead benchmark (importable by module name in Ray workers)."""
from __future__ import annotations

from bcer.contracts import Image
from bcer.tools.registry import tool


@tool("bench.noop", resources={"num_cpus": 1, "memory_mb": 0})
def noop(img: Image) -> Image:
    """Returns its input: every second spent is engine, not tool."""
    return img
