"""In-process vLLM on a Ray actor: one engine per cohort, shared by the Brain and the Reflector.

``VLLMBackend("Qwen/Qwen2.5-7B-Instruct")`` starts (or, by name, joins) one Ray actor that
holds ``vllm.LLM``; ``complete`` sends it the chat and gets ``n`` completions decoded under
``SamplingParams(structured_outputs=StructuredOutputsParams(json=schema), n=n)``. The backend
object only holds the actor handle, so it pickles into Reflector actors and they all talk
to the same engine.

GPUs: with ``tensor_parallel_size=1`` the actor asks for ``num_gpus=1``; with more, a
STRICT_PACK placement group reserves all of them on one node and the actor, scheduled into
it, runs vLLM's multiprocessing executor over the GPUs Ray gave it (vLLM's own Ray executor
does not find an enclosing placement group from the engine subprocess). Before anything is
scheduled the cluster is checked (``ray.cluster_resources()`` and per-node GPUs): a cluster
that cannot hold the engine fails AT ONCE with ``resource``, never a silent pending actor.

vLLM is imported only inside the actor (the optional extra ``bcer[vllm]``: ``vllm>=0.12``);
the driver needs only ray.
"""
from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

from ...contracts.errors import ErrorCode, ToolError
from .base import LLMReply, Message, prompt_digest

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 60.0


class VLLMEngine:
    """What the actor holds: ``vllm.LLM`` and a ``complete`` that returns plain data.

    Usable without Ray too (tests inject a fake ``vllm`` module; a one-GPU script may hold it
    directly).
    """

    def __init__(self, model: str, tensor_parallel_size: int = 1, engine_kwargs: dict[str, Any] | None = None):
        try:
            import vllm
        except ImportError as e:
            raise ToolError(ErrorCode.resource, f"vllm is not installed on this worker ({e})",
                            hint="pip install 'bcer[vllm]' (vllm>=0.12) on the GPU nodes") from None
        kwargs = dict(engine_kwargs or {})
        if tensor_parallel_size > 1:
            kwargs.setdefault("distributed_executor_backend", "mp")
        self.model = model
        self.llm = vllm.LLM(model=model, tensor_parallel_size=tensor_parallel_size, **kwargs)

    def complete(self, messages: list[Message], json_schema: dict[str, Any] | None, n: int, temperature: float,
                 max_tokens: int, seed: int | None) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = StructuredOutputsParams(json=json_schema) if json_schema is not None else None
        params = SamplingParams(n=n, temperature=temperature, max_tokens=max_tokens, seed=seed,
                                structured_outputs=structured)
        t0 = time.perf_counter()
        outputs = self.llm.chat([messages], params, use_tqdm=False)
        out = outputs[0]
        return {"texts": [c.text for c in out.outputs],
                "prompt_tokens": len(out.prompt_token_ids or []),
                "completion_tokens": sum(len(c.token_ids or []) for c in out.outputs),
                "finish_reasons": [c.finish_reason for c in out.outputs],
                "latency_s": time.perf_counter() - t0}

    def ping(self) -> str:
        return self.model


def check_gpus(tensor_parallel_size: int, resources: dict[str, float] | None = None,
               nodes: list[dict[str, Any]] | None = None) -> None:
    """Raise ``resource`` at once when no node of the cluster can hold the engine's GPUs."""
    import ray

    resources = dict(ray.cluster_resources()) if resources is None else resources
    total = float(resources.get("GPU", 0))
    if total < tensor_parallel_size:
        raise ToolError(ErrorCode.resource, f"vLLM needs {tensor_parallel_size} GPU(s) and the Ray cluster has "
                        f"{total:g}", "use an http:// vLLM server, the local CPU model (--llm local), or a "
                        "cluster with GPU nodes", gpus=total)
    nodes = ray.nodes() if nodes is None else nodes
    best = max((float(n.get("Resources", {}).get("GPU", 0)) for n in nodes if n.get("Alive", True)), default=0.0)
    if best < tensor_parallel_size:
        raise ToolError(ErrorCode.resource, f"tensor parallel size {tensor_parallel_size} needs that many GPUs on "
                        f"one node; the largest node has {best:g}", "lower --tensor-parallel-size", gpus=best)


def engine_actor_options(model: str, tensor_parallel_size: int, name: str | None = None,
                  extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """Ray options of the engine actor and the placement group it needs (None for one GPU)."""
    import ray

    opts: dict[str, Any] = {"name": name or engine_name(model, tensor_parallel_size), "get_if_exists": True,
                            "max_concurrency": 1, "num_cpus": 1}
    pg = None
    if tensor_parallel_size == 1:
        opts["num_gpus"] = 1
    else:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = placement_group([{"GPU": tensor_parallel_size, "CPU": 1}], strategy="STRICT_PACK")
        try:
            ray.get(pg.ready(), timeout=READY_TIMEOUT_S)
        except Exception:  # Ray raises GetTimeoutError or a placement error: either way no GPUs
            ray.util.remove_placement_group(pg)
            raise ToolError(ErrorCode.resource, f"{tensor_parallel_size} GPUs on one node did not become free "
                            f"within {READY_TIMEOUT_S:g} s", "free GPUs or lower the tensor parallel size") from None
        opts["num_gpus"] = tensor_parallel_size
        opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                       placement_group_bundle_index=0)
    opts.update(extra or {})
    return opts, pg


def engine_name(model: str, tensor_parallel_size: int) -> str:
    return "bcer-vllm-" + hashlib.sha256(f"{model}|tp{tensor_parallel_size}".encode()).hexdigest()[:10]


class VLLMBackend:
    """The driver-side handle of the engine actor.

    Args:
        model: a model name or local path vLLM can load on the GPU nodes.
        tensor_parallel_size: GPUs per engine (one node).
        engine_kwargs: passed to ``vllm.LLM`` (``max_model_len``, ``gpu_memory_utilization``, ...).
        actor_options: extra Ray actor options (``runtime_env``, ``namespace``, ...).
        call_timeout_s: how long one ``complete`` may take.
    """

    name = "vllm"

    def __init__(self, model: str, tensor_parallel_size: int = 1, engine_kwargs: dict[str, Any] | None = None,
                 actor_options: dict[str, Any] | None = None, call_timeout_s: float = 600.0):
        import ray

        if tensor_parallel_size < 1:
            raise ToolError(ErrorCode.value_range, f"tensor parallel size must be >= 1, got {tensor_parallel_size}",
                            arg="tensor_parallel_size")
        self.model, self.tp, self.call_timeout_s = model, tensor_parallel_size, call_timeout_s
        check_gpus(tensor_parallel_size)
        opts, self._pg = engine_actor_options(model, tensor_parallel_size, extra=actor_options)
        self.actor = ray.remote(VLLMEngine).options(**opts).remote(model, tensor_parallel_size, engine_kwargs)

    @classmethod
    def attach(cls, actor: Any, model: str, tensor_parallel_size: int = 1,
               call_timeout_s: float = 600.0) -> "VLLMBackend":
        """A backend over an engine actor started elsewhere (custom resources, another driver's
        named engine: ``ray.get_actor(engine_name(model, tp))``)."""
        self = cls.__new__(cls)
        self.model, self.tp, self.call_timeout_s, self.actor, self._pg = (model, tensor_parallel_size,
                                                                           call_timeout_s, actor, None)
        return self

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_pg"] = None  # the owner (driver) removes the placement group
        return state

    def complete(self, messages: list[Message], *, json_schema: dict[str, Any] | None = None, n: int = 1,
                 temperature: float = 0.0, max_tokens: int = 1024, seed: int | None = None) -> LLMReply:
        import ray
        import ray.exceptions as rex

        t0 = time.perf_counter()
        try:
            out = ray.get(self.actor.complete.remote(messages, json_schema, n, temperature, max_tokens, seed),
                          timeout=self.call_timeout_s)
        except rex.GetTimeoutError:
            raise ToolError(ErrorCode.timeout, f"the vLLM engine did not answer within {self.call_timeout_s:g} s",
                            model=self.model) from None
        except rex.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, ToolError):
                raise cause from None
            raise ToolError(ErrorCode.internal, f"the vLLM engine failed: {str(e)[:300]}", model=self.model) from None
        except rex.RayActorError as e:
            raise ToolError(ErrorCode.resource, f"the vLLM engine actor died: {str(e)[:300]}", model=self.model) from None
        return LLMReply(texts=out["texts"], backend=self.name, model=self.model,
                        prompt_digest=prompt_digest(messages, json_schema), prompt_tokens=out["prompt_tokens"],
                        completion_tokens=out["completion_tokens"], latency_s=time.perf_counter() - t0,
                        meta={"finish_reasons": out["finish_reasons"], "engine_s": round(out["latency_s"], 4),
                              "tensor_parallel_size": self.tp})

    def close(self) -> None:
        """Kill the engine (frees its GPUs) and its placement group; only the creator calls this."""
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        except Exception:  # already gone
            pass
        if self._pg is not None:
            ray.util.remove_placement_group(self._pg)
            self._pg = None


__all__ = ["VLLMBackend", "VLLMEngine", "engine_actor_options", "check_gpus", "engine_name"]
