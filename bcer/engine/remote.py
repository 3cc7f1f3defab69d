"""The Ray remote functions of the engine, made once per driver (importing this never imports ray)."""
from __future__ import annotations

import functools

from .noderun import load_sequence_task, run_node


@functools.cache
def remote_node():
    import ray

    return ray.remote(run_node)


@functools.cache
def remote_loader():
    import ray

    return ray.remote(num_returns=2)(load_sequence_task)


@functools.cache
def remote_fused():
    import ray

    from .fusion import run_fused

    return ray.remote(run_fused)


__all__ = ["remote_fused", "remote_loader", "remote_node"]
