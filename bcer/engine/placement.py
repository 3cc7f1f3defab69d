"""Where a node runs and the Ray options it is submitted with, decided in one place each.

``place`` chooses resources and device for one node on the cluster at hand (GPU tags, CPU
fallback, caps at the cluster's totals); ``task_options`` turns that choice into the
options of the Ray task (resources, readable name ``case/node/tool``, returns, retries).
Both are pure functions (no Ray calls), so every decision made before ``.remote()`` is
testable on its own; GPU placement policies extend ``place`` and nothing else.

GPU sharing: a tool asking for a fraction of a GPU (``num_gpus: 0.25``) is packed by Ray with
others on one GPU (Ray never hands out more than 1.0 of a GPU). ``gpu_concurrency=K`` turns a
whole-GPU request into ``1/K`` (whole-GPU tools then share a GPU K ways) and raises a smaller
fraction to ``1/K``, so no GPU ever runs more than K bcer nodes at once.
GPUs held by model actors (``reserved_gpus``) are not offered to tasks, so a task never waits
for a GPU an actor keeps for the whole run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..contracts.errors import ErrorCode, ToolError
from ..contracts.workflow import Node

log = logging.getLogger(__name__)
_MB = 1024 * 1024
_GPU_QUANTUM = 1e-4  # Ray's resolution of fractional resources


def gpu_share(want: float, gpu_concurrency: int | None) -> float:
    """The GPU request of a node asking for ``want`` GPUs under a per-GPU limit of K nodes:
    ``1/K`` for one whole GPU, ``max(want, 1/K)`` for a fraction.

    ``1/K`` is rounded down to Ray's resolution (1e-4) so K shares always fit on one GPU and,
    as ``K * share > 1 - share``, a (K+1)-th never does. Multi-GPU requests (> 1) are whole
    GPUs and stay as asked.

    Raises:
        ToolError: ``schema`` for K < 1.
    """
    if not gpu_concurrency or want > 1.0:
        return want
    if gpu_concurrency < 1:
        raise ToolError(ErrorCode.schema, f"gpu_concurrency must be >= 1, got {gpu_concurrency}",
                        arg="gpu_concurrency")
    share = int((1.0 / gpu_concurrency) / _GPU_QUANTUM) * _GPU_QUANTUM
    if want >= 1.0:  # a whole GPU: one K-th of it
        return round(share, 4)
    return round(max(want, share), 4)  # a fraction: never below 1/K, so at most K per GPU


@dataclass(frozen=True)
class Placement:
    """How a node runs: Ray resource options and the device handed to the tool.

    ``fallback`` is the reason a GPU-capable tool runs on CPU although the cluster has a GPU (None
    when it does not, and on a CPU cluster, where the CPU path is the ordinary run).
    """

    num_cpus: float
    num_gpus: float
    memory: int | None
    device: str
    fallback: str | None = None


def place(node: Node, cluster: dict[str, float], device_policy: str = "auto",
          device_override: str | None = None, gpu_concurrency: int | None = None,
          reserved_gpus: float = 0.0) -> Placement:
    """Choose resources and device for ``node`` on a cluster with ``cluster`` resources.

    A request larger than the whole cluster would stay pending forever, so CPU and memory
    are capped at the cluster's totals; GPU tags decide between the GPU path, the CPU path
    (``fallback``) and a fast ``resource`` error. ``gpu_concurrency`` (K) shares each GPU
    between at most K nodes (:func:`gpu_share`); ``reserved_gpus`` are held by model actors
    and never offered to tasks.

    Raises:
        ToolError: ``resource`` for a ``gpu="required"`` tool when no GPU can be used.
    """
    res, gpus = node.resources, max(0.0, float(cluster.get("GPU", 0.0)) - reserved_gpus)
    cpus = min(float(res.num_cpus), float(cluster.get("CPU", res.num_cpus)) or res.num_cpus)
    memory = res.memory_mb * _MB if res.memory_mb else None
    if memory and cluster.get("memory"):
        memory = int(min(memory, cluster["memory"]))
    want_gpu = gpu_share(float(res.num_gpus) or 1.0, gpu_concurrency)
    use_gpu = gpus >= min(want_gpu, 1.0) and device_policy == "auto" and device_override != "cpu"
    if node.gpu == "required":
        if not use_gpu:
            why = _no_gpu_reason(gpus, reserved_gpus, device_policy)
            raise ToolError(ErrorCode.resource, f"{node.tool} needs a GPU and has no CPU path ({why})",
                            hint="run on a cluster with a GPU or plan a CPU tool", node=node.id, tool=node.tool)
        return Placement(cpus, want_gpu, memory, "cuda")
    if node.gpu == "optional":
        if use_gpu:
            return Placement(cpus, want_gpu, memory, "cuda")
        if not float(cluster.get("GPU", 0.0)) and device_policy == "auto":
            return Placement(cpus, 0.0, memory, "cpu")  # a CPU cluster: the CPU path is the ordinary run, no fallback
        why = ("patched to CPU" if gpus and device_override == "cpu" else
               _no_gpu_reason(gpus, reserved_gpus, device_policy))
        return Placement(cpus, 0.0, memory, "cpu", fallback=why)
    return Placement(cpus, 0.0, memory, "cpu")


def _no_gpu_reason(free_gpus: float, reserved: float, device_policy: str) -> str:
    if free_gpus == 0:
        return f"every GPU is held by model actors ({reserved:g})" if reserved else "no GPU in the cluster"
    return f"device policy {device_policy!r}"


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
                  max_retries: int, kind: str = "fused", num_returns: int = 2) -> dict[str, Any]:
    """Options of a fused task (a whole case, or a ``segment`` of a chain): the largest CPU and
    memory request of its nodes (they run one after another), named ``case/<first>..<last>/<kind>``."""
    memory = max((p.memory or 0) for p in placements) or None
    where = Placement(max(p.num_cpus for p in placements), 0.0, memory, "cpu")
    return task_options(task_name(case_id, f"{first}..{last}", kind), where, num_returns, max_retries)


__all__ = ["Placement", "fused_options", "gpu_share", "loader_options", "place", "task_name", "task_options"]
