"""The R4 Router: report strategy and retrieval scope from task, domain, history and evidence."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ...tools.report.evidence import Evidence

SPECIALISATION = {"brain": "neuro-oncology", "prostate": "prostate", "cardiac": "cardiology"}


@dataclass
class Route:
    """specialisation; profile (no_finding | single | multifocal | borderline); mode (template |
    llm); k drafts; retrieve_k exemplars; scope of retrieval (task, and profile for the
    structure-sensitive profiles); why."""

    task: str
    specialisation: str
    profile: str
    mode: str
    k: int
    retrieve_k: int
    scope: dict[str, Any] = field(default_factory=dict)
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def route(ev: Evidence, task: str, *, history: str = "", has_llm: bool = False, k: int = 3,
          retrieve_k: int = 3) -> Route:
    """No finding: one draft (nothing to choose between). Retrieval is scoped to exemplars of
    the same task and profile (report structure depends on it: every lesion described, the
    threshold stated); the Retriever widens to the whole task when that gives fewer than k."""
    profile = ev.profile()
    spec = SPECIALISATION.get(ev.domain, "general")
    k_eff = 1 if profile == "no_finding" else k
    scope = {"task": task, "profile": profile}  # same profile first; the Retriever widens to the task if short
    why = f"{spec}: {profile}" + (f"; history given ({len(history)} chars)" if history else "")
    return Route(task, spec, profile, "llm" if has_llm else "template", k_eff, retrieve_k, scope, why)


__all__ = ["Route", "SPECIALISATION", "route"]
