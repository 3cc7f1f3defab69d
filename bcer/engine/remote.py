"""How nodes become Ray tasks, in one place: the remote functions of a node, a segment (a chain
of nodes), a whole fused case and a sequence load (made once per driver; importing this never
imports ray), and the one call that submits a task with its options. Which of them a node goes
to is decided by ``case.submit``, ``segments`` and ``fusion``.

``submit`` validates each distinct option shape once (resources, returns, retries) and adds
the per-task name, instead of paying ``.options()`` (a merge, a validation and a new wrapper
class) for every node of every case: that cost was a third of the driver's time per node.
"""
from __future__ import annotations

import functools
import logging
from typing import Any

from .noderun import load_sequence_task, run_node

log = logging.getLogger(__name__)


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

    from .worker import run_fused

    return ray.remote(run_fused)


@functools.cache
def remote_segment():
    import ray

    from .worker import run_segment

    return ray.remote(run_segment)


_VALIDATED: dict[tuple, dict[str, Any]] = {}


def _validated(fn: Any, shape: dict[str, Any]) -> dict[str, Any] | None:
    """Ray's own merge and validation of one option shape (cached); None when this Ray has no
    such internals (then ``.options()`` is used)."""
    key = (id(fn), tuple(sorted(shape.items())))
    if key not in _VALIDATED:
        try:
            from ray._common import ray_option_utils as opt
        except ImportError:
            try:
                from ray._private import ray_option_utils as opt  # older Ray
            except ImportError:
                return None
        defaults = dict(fn._default_options)
        defaults.pop("max_calls", None)
        merged = opt.update_options(defaults, shape)
        opt.validate_task_options(merged, in_options=True)
        _VALIDATED[key] = merged
    return _VALIDATED[key]


def submit(fn: Any, opts: dict[str, Any], *args: Any) -> Any:
    """``fn.options(**opts).remote(*args)``, with the validation of ``opts`` minus its name cached."""
    shape = {k: v for k, v in opts.items() if k != "name"}
    try:
        merged = _validated(fn, shape)
        remote = getattr(fn, "_remote", None)
        if merged is not None and remote is not None:
            return remote(args=list(args), kwargs={}, serialized_runtime_env_info=fn._serialized_base_runtime_env_info,
                          **dict(merged, name=opts.get("name", "")))
    except (AttributeError, TypeError) as e:  # Ray internals moved: the public path still works
        log.debug("fast submission unavailable (%s): using .options()", e)
    return fn.options(**opts).remote(*args)


__all__ = ["remote_fused", "remote_loader", "remote_node", "remote_segment", "submit"]
