"""One model actor per GPU for bundle inference: load a MONAI bundle once, serve many cases.

``BundleActorPool`` implements the engine's ``ModelServer`` protocol (``bcer.engine.models``).
It starts one Ray actor per GPU of the cluster (each asks for a whole GPU, so Ray gives every
actor its own GPU), each actor loads the chosen bundles once in its constructor (the
per-process cache of ``bcer.tools.seg.bundle``), and the engine hands it every node of a
chosen tool that runs the chosen bundle. The actor runs the very same entry point as a node
task (``engine.noderun.run_node``): same binding, cache, deliverable writing and typed errors;
only the process (and so the loaded network) lives across cases.

The actor's device is "cuda" when torch sees a CUDA device, else "cpu": on a simulated GPU
cluster (``ray.cluster_utils.Cluster`` nodes with ``num_gpus``) Ray assigns GPU ids but
there is no device, and the network runs on CPU (``stats()["simulated_gpu"]`` says so).

An actor whose process dies (killed, out of host memory, a node lost) is restarted by Ray
(``max_restarts``: the constructor loads its bundles again) and the calls it held are re-run
there (``max_task_retries``; a node call is idempotent: same inputs, same files). After
``MAX_RESTARTS`` deaths the calls fail and each case gets a typed error, as for a lost task.

Each actor serves at most ``concurrency`` calls at once (``max_concurrency``): with
``--gpu-concurrency K`` no GPU runs more than K served nodes at a time. GPUs held by the
actors are ``reserved_gpus``: placement never offers them to node tasks.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from pathlib import Path
from typing import Any, Mapping

from ..contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)
_READY_TIMEOUT_S = 300.0
MAX_RESTARTS = 3  # per actor; a bundle that kills its process every time stops being retried


class BundleActor:
    """The body of one model actor (wrapped by ``ray.remote`` in :class:`BundleActorPool`)."""

    def __init__(self, name: str, folders: list[str], tools: list[str]):
        from ..engine.noderun import gpu_where
        from ..tools.registry import load_all
        from ..tools.seg import bundle as B

        self.name = name
        self.where = gpu_where()
        self.device = _device(bool(self.where.get("gpu_ids")))
        self.calls = 0
        self._lock = threading.Lock()
        load_all()  # every tool registered before concurrent calls (imports are not thread-safe)
        for folder in folders:
            B.load_bundle(folder, self.device)
        self.tools = list(tools)
        log.info("model actor %s on %s (GPU %s, device %s) loaded %s", name, self.where.get("node_id", "?")[:12],
                 self.where.get("gpu_ids"), self.device, folders)

    def run_node(self, spec: dict[str, Any], *args: Any) -> tuple[Any, ...]:
        """``engine.noderun.run_node`` on this actor's device; the meta names the actor."""
        from ..engine.noderun import run_node
        from ..tools.seg import bundle as B

        with self._lock:
            self.calls += 1
        out = run_node(dict(spec, device=self.device), *args)
        meta = out[-1]
        meta.update(actor=self.name, bundle_loads=B.cache_info().misses)
        return out

    def stats(self) -> dict[str, Any]:
        """Who and where this actor is, how often it loaded a bundle and how many nodes it ran."""
        from ..tools.seg import bundle as B

        info = B.cache_info()
        return {"name": self.name, "pid": os.getpid(), "device": self.device, **self.where,
                "simulated_gpu": bool(self.where.get("gpu_ids")) and self.device == "cpu",
                "bundle_loads": info.misses, "bundle_hits": info.hits, "calls": self.calls}


def _device(has_gpu_ids: bool) -> str:
    if not has_gpu_ids:
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


class BundleActorPool:
    """Serves the nodes of chosen bundle tools from one actor per GPU (``engine.models.ModelServer``).

    Args:
        bundles: ``{tool: bundle folder}`` (as ``agents.planners.bundles.resolve_bundles`` returns it).
        num_actors: how many actors (default: one per GPU of the cluster).
        concurrency: calls one actor runs at once (the per-GPU concurrency K).
        num_cpus: CPUs each actor holds.
        gpus_per_actor: GPUs each actor holds (1: its own GPU; Ray never shares it).

    Raises:
        ToolError: ``resource`` when the cluster has fewer GPUs than the actors need, or the
            actors do not come up in time; ``schema`` for a bad setting.
    """

    def __init__(self, bundles: Mapping[str, str], num_actors: int | None = None, concurrency: int = 1,
                 num_cpus: float = 1.0, gpus_per_actor: float = 1.0):
        import ray

        if not bundles:
            raise ToolError(ErrorCode.schema, "a bundle actor pool needs at least one --bundle TOOL=DIR",
                            arg="bundle")
        if concurrency < 1 or gpus_per_actor <= 0:
            raise ToolError(ErrorCode.schema, f"concurrency {concurrency} and gpus_per_actor {gpus_per_actor} "
                            "must be positive", arg="gpu_concurrency")
        self.bundles = {tool: str(Path(folder).resolve()) for tool, folder in bundles.items()}
        gpus = float(ray.cluster_resources().get("GPU", 0.0))
        n = int(num_actors if num_actors is not None else gpus // gpus_per_actor)
        if n < 1 or n * gpus_per_actor > gpus + 1e-9:
            raise ToolError(ErrorCode.resource, f"{max(n, 1)} bundle actor(s) of {gpus_per_actor:g} GPU need "
                            f"{max(n, 1) * gpus_per_actor:g} GPUs; the cluster has {gpus:g}",
                            hint="run bundle tools as tasks (their CPU path) or add GPUs")
        cls = ray.remote(BundleActor)
        folders = sorted(set(self.bundles.values()))
        opts = dict(num_gpus=gpus_per_actor, num_cpus=num_cpus, max_concurrency=concurrency,
                    max_restarts=MAX_RESTARTS, max_task_retries=1)
        self.actors = [cls.options(**opts).remote(f"bundle-actor-{i}", folders, sorted(self.bundles))
                       for i in range(n)]
        self.reserved_gpus = n * gpus_per_actor
        self._next = itertools.cycle(range(n))
        try:  # loaded before any case starts: a broken bundle fails here, not in every case
            self.started = ray.get([a.stats.remote() for a in self.actors], timeout=_READY_TIMEOUT_S)
        except Exception as e:  # a bundle may fail to load in any way: one resource error names it
            self.close()
            raise ToolError(ErrorCode.resource, f"bundle actors did not start: {type(e).__name__}: {str(e)[:300]}",
                            hint="check the bundle loads in a plain task (bcer run) first") from e

    def serves(self, tool: str, params: dict[str, Any]) -> bool:
        folder = self.bundles.get(tool)
        given = params.get("bundle_dir")
        return folder is not None and isinstance(given, str) and str(Path(given).resolve()) == folder

    def submit(self, spec: dict[str, Any], args: list[Any], num_returns: int) -> list[Any]:
        """Round-robin over the actors; each queues what it cannot run at once."""
        actor = self.actors[next(self._next)]
        refs = actor.run_node.options(num_returns=num_returns).remote(spec, *args)
        return list(refs) if num_returns > 1 else [refs]

    def stats(self) -> list[dict[str, Any]]:
        import ray

        return ray.get([a.stats.remote() for a in self.actors])

    def close(self) -> None:
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # already gone
                pass
        self.actors = []
        self.reserved_gpus = 0.0


def bundle_server_factory(bundles: Mapping[str, str], concurrency: int | None = None) -> Any:
    """A zero-argument factory for ``CohortConfig.model_server``: the pool on a cluster with GPUs,
    None (every node a task, on its CPU path) where there is none."""

    def make() -> BundleActorPool | None:
        import ray

        if not bundles or not ray.cluster_resources().get("GPU"):
            log.info("no GPU in the cluster: bundle tools run as tasks on their CPU path")
            return None
        return BundleActorPool(bundles, concurrency=concurrency or 1)

    return make


__all__ = ["BundleActor", "BundleActorPool", "bundle_server_factory"]
