"""Which GPU ran which node, and how many nodes a GPU ran at once, read back from the trace.

A node that held a GPU records ``node_id`` and ``gpu_ids`` (``ray.get_gpu_ids()`` in the task
or actor) in the data of its ``succeeded`` event, and its run interval in the times of its
``started`` and ``succeeded`` events (both taken in the worker). From those, any run can be
audited: the distinct (node, GPU) pairs used and the peak number of nodes that overlapped
on each GPU (what ``--gpu-concurrency K`` bounds).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class GpuRun:
    """One node's run on one GPU: where and when (epoch seconds)."""

    case: str
    node: str
    gpu: tuple[str, str]  # (Ray node id, GPU id)
    start: float
    end: float
    actor: str | None = None


def gpu_runs(events: Iterable[dict[str, Any]]) -> list[GpuRun]:
    """The GPU runs in ``events`` (dicts of Event fields; ``data`` as a dict or JSON text).

    A node on several GPUs gives one run per GPU; attempts are matched by (case, node, attempt).
    """
    import json

    starts: dict[tuple, float] = {}
    runs: list[GpuRun] = []
    for e in sorted(events, key=lambda e: (e["kind"] != "started", e["time"])):
        key = (e["case"], e["node"], e.get("attempt"))
        if e["kind"] == "started":
            starts[key] = float(e["time"])
            continue
        if e["kind"] != "succeeded":
            continue
        data = e.get("data") or {}
        if isinstance(data, str):
            data = json.loads(data) if data else {}
        if not data.get("gpu_ids") or key not in starts:
            continue
        for gid in data["gpu_ids"]:
            runs.append(GpuRun(e["case"], e["node"], (data["node_id"], str(gid)), starts[key], float(e["time"]),
                               data.get("actor")))
    return runs


def peak_per_gpu(runs: Iterable[GpuRun]) -> dict[tuple[str, str], int]:
    """The largest number of runs that overlapped in time on each GPU (an end at the very
    instant of a start does not overlap it)."""
    edges: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for r in runs:
        edges[r.gpu] += [(r.start, 1), (r.end, -1)]
    peaks = {}
    for gpu, points in edges.items():
        now = peak = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):  # ends (-1) before starts at a tie
            now += step
            peak = max(peak, now)
        peaks[gpu] = peak
    return peaks


def usage_summary(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Distinct GPUs used, nodes per GPU, the peak concurrency per GPU and the actors seen."""
    runs = gpu_runs(events)
    peaks = peak_per_gpu(runs)
    per_gpu: dict[tuple[str, str], int] = defaultdict(int)
    for r in runs:
        per_gpu[r.gpu] += 1
    return {"gpu_runs": len(runs), "distinct_gpus": len(per_gpu),
            "nodes_per_gpu": {f"{n[:12]}/gpu{g}": c for (n, g), c in sorted(per_gpu.items())},
            "peak_per_gpu": {f"{n[:12]}/gpu{g}": p for (n, g), p in sorted(peaks.items())},
            "max_peak": max(peaks.values(), default=0),
            "actors": sorted({r.actor for r in runs if r.actor})}


__all__ = ["GpuRun", "gpu_runs", "peak_per_gpu", "usage_summary"]
