"""Where a node runs and the Ray options it is submitted with, decided in one place each.

``place`` chooses resources and device for one node on the cluster at hand (GPU tags, CPU
fallback, caps at the cluster's totals); ``task_options`` turns that choice into the
options of the Ray task (resources, readable name ``case/node/tool``, returns, retries).
Both are pure functions (no Ray calls), so every decision made before ``.remote()`` is
testable on its own; GPU placement policies extend ``place`` and nothing else.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.workflow import Node

log = logging.getLogger(__name__)
_MB = 1024 * 1024


@dataclass(frozen=True)
class Placement:
    """How a node runs: Ray resource options and the device handed to the tool.

    ``fallback`` is the reason a GPU-capable tool runs on CPU (None when it does not).
    """

    num_cpus: float
    num_gpus: float
    memory: int | None
    device: str
    fallback: str | None = None


def place(node: Node, cluster: dict[str, float], device_policy: str = "auto",
          device_override: str | None = None) -> Placement:
    """Choose resources and device for ``node`` on a cluster with ``cluster`` resources.

    A request larger than the whole cluster would stay pending forever, so CPU and memory
    are capped at the cluster's totals; GPU tags decide between the GPU path, the CPU path
    (``fallback``) and a fast ``resource`` error.

    Raises:
        ToolError: ``resource`` for a ``gpu="required"`` tool when no GPU can be used.
    """
    res, gpus = node.resources, float(cluster.get("GPU", 0.0))
    cpus = min(float(res.num_cpus), float(cluster.get("CPU", res.num_cpus)) or res.num_cpus)
    memory = res.memory_mb * _MB if res.memory_mb else None
    if memory and cluster.get("memory"):
        memory = int(min(memory, cluster["memory"]))
    want_gpu = float(res.num_gpus) or 1.0
    use_gpu = gpus >= min(want_gpu, 1.0) and device_policy == "auto" and device_override != "cpu"
    if node.gpu == "required":
        if not use_gpu:
            why = "no GPU in the cluster" if gpus == 0 else f"device policy {device_policy!r}"
            raise ToolError(ErrorCode.resource, f"{node.tool} needs a GPU and has no CPU path ({why})",
                            hint="run on a cluster with a GPU or plan a CPU tool", node=node.id, tool=node.tool)
        return Placement(cpus, want_gpu, memory, "cuda")
    if node.gpu == "optional":
        if use_gpu:
            return Placement(cpus, want_gpu, memory, "cuda")
        why = ("no GPU in the cluster" if gpus == 0 else
               "patched to CPU" if device_override == "cpu" else f"device policy {device_policy!r}")
        return Placement(cpus, 0.0, memory, "cpu", fallback=why)
    return Placement(cpus, 0.0, memory, "cpu")


def task_name(case_id: str, node_id: str, tool: str) -> str:
    """The name the Ray dashboard shows for a node's task."""
    return f"{case_id}/{node_id}/{tool}"


def task_options(name: str, where: Placement, num_returns: int, max_retries: int) -> dict[str, Any]:
    """Ray ``.options()`` of one task: its resources, a readable name, its returns and retries.

    ``retry_exceptions`` stays False: a ToolError is a verdict for the Reflector (returned, not
    raised), and only system failures (a worker or node lost) are Ray's to retry.
    """
    opts: dict[str, Any] = dict(num_cpus=where.num_cpus, num_gpus=where.num_gpus, name=name,
                                num_returns=num_returns, max_retries=max_retries, retry_exceptions=False)
    if where.memory:
        opts["memory"] = where.memory
    return opts


def loader_options(case_id: str, key: str, num_cpus: float, max_retries: int) -> dict[str, Any]:
    """Options of a sequence-load task (``case/seq.<key>/io.load_sequence``)."""
    return dict(name=task_name(case_id, f"seq.{key}", "io.load_sequence"), num_cpus=num_cpus,
                num_returns=2, max_retries=max_retries, retry_exceptions=False)


def fused_options(case_id: str, first: str, last: str, placements: list[Placement],
                  max_retries: int) -> dict[str, Any]:
    """Options of a fused case task: the largest CPU and memory request of its nodes (they run
    one after another), named ``case/<first>..<last>/fused``."""
    memory = max((p.memory or 0) for p in placements) or None
    where = Placement(max(p.num_cpus for p in placements), 0.0, memory, "cpu")
    return task_options(task_name(case_id, f"{first}..{last}", "fused"), where, 2, max_retries)


__all__ = ["Placement", "fused_options", "loader_options", "place", "task_name", "task_options"]
