"""What ``--planner``, ``--llm``, ``--llm-record`` and ``--reflector`` build.

- planner: ``offline`` (the default, no model), ``llm`` (the LLM planner), ``llm,offline`` (the
  LLM planner, with the offline planner as fallback, recorded in the trace as ``plan_fallback``);
- llm: a backend spec (see ``bcer.agents.llm.factory``); one backend serves the Brain and
  the Reflector's tier 2 of a run (one vLLM engine per cohort);
- reflector: ``tier1`` (deterministic repairs) or ``tier1,llm`` (an LLM tier behind tier 1).

:class:`Controller` holds the three for one run (API, CLI, benchmarks) and closes the backend
when the run ends.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contracts.errors import ErrorCode, ToolError, parse_choices

PLANNERS = ("offline", "llm", "llm,offline")
REFLECTORS = ("tier1", "tier1,llm")


def _parts(spec: str) -> list[str]:
    return [p.strip() for p in spec.split(",") if p.strip()]


def check_planner(spec: str) -> list[str]:
    """The parts of a planner spec (``"llm,offline"`` -> ``["llm", "offline"]``), checked."""
    parts = _parts(spec)
    parse_choices([",".join(parts)], PLANNERS, "planner", "planner", every=None)  # the spec is one choice
    return parts


def check_reflector(spec: str) -> list[str]:
    """The repair tiers of a reflector spec (``"tier1,llm"``), checked."""
    parts = _parts(spec)
    parse_choices([",".join(parts)], REFLECTORS, "reflector tiers", "reflector", every=None)
    return parts


def needs_llm(planner: str = "offline", reflector: str = "tier1") -> bool:
    return "llm" in check_planner(planner) or "llm" in check_reflector(reflector)


@dataclass
class Controller:
    """The planner, the repair tiers and the LLM backend of one run.

    Args:
        planner: ``offline`` | ``llm`` | ``llm,offline``.
        llm: backend spec or object; required when the planner or the reflector uses an LLM.
        reflector: ``tier1`` | ``tier1,llm``.
        llm_record: append every LLM call to this JSONL file (replay it with ``replay:FILE``).
        llm_k: completions per planning round (pass@k).
        llm_options: backend keyword arguments (timeouts, engine kwargs, ...).
        address: the Ray cluster a ``vllm:`` engine starts on (joined here, before the run).
        memo: answer a repeated greedy request from memory (the ablation asks each case's plan
            once per arm and fault).

    >>> with Controller("llm,offline", llm="replay:calls.jsonl") as c:   # doctest: +SKIP
    ...     sketch = c.planner.plan(goal, case, contract)
    """

    planner_spec: str = "offline"
    llm: Any = None
    reflector_spec: str = "tier1"
    llm_record: str | Path | None = None
    llm_k: int = 1
    llm_options: dict[str, Any] = field(default_factory=dict)
    address: str | None = None  # Ray cluster (an in-process vLLM engine is a Ray actor)
    memo: bool = False  # answer repeated greedy requests from memory (llm.record.MemoBackend)
    backend: Any = field(init=False, default=None)
    planner: Any = field(init=False, default=None)
    tiers: list | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        planner, reflector = check_planner(self.planner_spec), check_reflector(self.reflector_spec)
        if "llm" in planner or "llm" in reflector:
            if self.llm is None:
                from .llm.factory import SPECS

                raise ToolError(ErrorCode.value_range, f"planner {self.planner_spec!r} / reflector "
                                f"{self.reflector_spec!r} need an LLM backend", f"--llm {SPECS}", arg="llm")
            from .llm.factory import make_backend

            if isinstance(self.llm, str) and self.llm.startswith("vllm:"):
                from ..engine.cluster import ensure_ray

                ensure_ray(self.address)
            self.backend = make_backend(self.llm, record=self.llm_record, **self.llm_options)
            if self.memo:
                from .llm.record import MemoBackend

                self.backend = MemoBackend(self.backend)
        elif self.llm is not None and not isinstance(self.llm, str):
            self.backend = self.llm  # given but unused: kept so the caller can still close it
        self.planner = self.new_planner()
        if "llm" in reflector:
            from .repair.reflector import Tier1
            from .repair.llm_tier import LLMTier

            self.tiers = [Tier1(), LLMTier(self.backend)]

    def new_planner(self) -> Any:
        """A fresh planner of this spec sharing the one backend (e.g. one per task of a bench,
        so each keeps its own pending events)."""
        from .planners.offline import OfflinePlanner

        parts = check_planner(self.planner_spec)
        if "llm" not in parts:
            return OfflinePlanner()
        from .planners.llm import LLMPlanner

        return LLMPlanner(self.backend, fallback=OfflinePlanner() if "offline" in parts else None, k=self.llm_k)

    def close(self) -> None:
        if self.backend is not None and isinstance(self.llm, str):  # we built it: we release it
            from .llm.factory import close_backend

            close_backend(self.backend)

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Controller", "PLANNERS", "REFLECTORS", "check_planner", "check_reflector", "needs_llm"]
