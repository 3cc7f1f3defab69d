"""The R4 loop on one report: Route, Retrieve, draft k, Reflect (best of k), Repair (<= T passes).

Returns the final draft with everything that happened as event records, so the engine can
write them into the case trace (``r4_route``, ``r4_retrieve``, ``r4_draft``, ``r4_reflect``,
``r4_repair``, ``llm_call``).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from ...tools.report.evidence import Evidence
from ...tools.report.prose import Draft
from .drafter import Drafter, TemplateDrafter
from .issues import Issue, count_by_type, penalty
from .opinion import LLMSecondOpinion
from .critic import reflect
from .fixer import LLMWordingTier, repair
from .router import Route, route

log = logging.getLogger(__name__)


@dataclass
class R4Config:
    k: int = 3
    max_passes: int = 2
    retrieve_k: int = 3
    decimals: int = 1


@dataclass
class R4Outcome:
    draft: Draft
    route: Route
    exemplars: list[dict[str, Any]]
    draft_penalties: list[int]
    chosen: int
    initial_issues: list[Issue]
    final_issues: list[Issue]
    repairs: int
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """clean: the fresh critique of the final text finds no material issue; else unresolved."""
        return "unresolved" if any(i.material for i in self.final_issues) else "clean"

    def unresolved(self, limit: int = 10) -> list[dict[str, Any]]:
        return [{"type": i.type, "section": i.section, "sentence": i.sentence, "entity": i.entity,
                 "message": i.message} for i in self.final_issues if i.material][:limit]

    def summary(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "unresolved": self.unresolved(), "route": self.route.to_dict(),
                "exemplars": [e["record"]["id"] for e in self.exemplars],
                "exemplar_scores": [round(e["score"], 4) for e in self.exemplars],
                "draft_penalties": self.draft_penalties, "chosen": self.chosen,
                "initial_issues": count_by_type(self.initial_issues), "initial_penalty": penalty(self.initial_issues),
                "final_issues": count_by_type(self.final_issues), "final_penalty": penalty(self.final_issues),
                "material_issues": sum(i.material for i in self.final_issues), "repairs": self.repairs,
                "source": self.draft.source}


def _event(kind: str, message: str, **data: Any) -> dict[str, Any]:
    return {"kind": kind, "message": message, "data": data, "time": time.time()}


class R4Loop:
    """Args: drafter (template or LLM), retrieve (``fn(route, text, exclude_case) -> hits`` or
    None), wording (an LLMWordingTier or None), config, opinion (an LLMSecondOpinion asked about
    the sentences the rules cannot read, or None)."""

    def __init__(self, drafter: Drafter | None = None, retrieve: Any = None, wording: LLMWordingTier | None = None,
                 config: R4Config | None = None, opinion: LLMSecondOpinion | None = None):
        self.drafter = drafter or TemplateDrafter()
        self.retrieve, self.wording, self.cfg, self.opinion = retrieve, wording, config or R4Config(), opinion

    def _critique(self, draft: Draft, ev: Evidence, events: list[dict[str, Any]]) -> list[Issue]:
        """The rules' issues, with the LLM's validated second opinion on unreadable sentences."""
        issues = reflect(draft, ev, self.cfg.decimals)
        if self.opinion is not None:
            issues, call = self.opinion.review(draft, ev, issues)
            if call:
                events.append(_event("llm_call", "R4 second opinion", **call))
        return issues

    def run(self, ev: Evidence, *, task: str, case: str = "", history: str = "",
            seed: Draft | None = None) -> R4Outcome:
        d, events = self.cfg.decimals, []
        r = route(ev, task, history=history, has_llm=self.drafter.name == "llm", k=self.cfg.k,
                  retrieve_k=self.cfg.retrieve_k)
        events.append(_event("r4_route", r.why, **r.to_dict()))
        hits: list[dict[str, Any]] = []
        if self.retrieve is not None:
            t0 = time.perf_counter()
            hits = self.retrieve(r, ev.profile_text(history), case) or []
            events.append(_event("r4_retrieve", f"{len(hits)} exemplar(s)", ids=[h["record"]["id"] for h in hits],
                                 scores=[round(h["score"], 4) for h in hits], scope=r.scope,
                                 latency_ms=round(1e3 * (time.perf_counter() - t0), 2)))
        drafts, calls = self.drafter.drafts(ev, r, hits, d)
        events += [_event("llm_call", "R4 drafter", **c) for c in calls]
        if seed is not None and self.drafter.name == "template" and all(x.findings != seed.findings for x in drafts):
            drafts.insert(0, seed)
        scored = [reflect(x, ev, d) for x in drafts]
        pens = [penalty(i) for i in scored]
        for n, (x, iss) in enumerate(zip(drafts, scored)):
            events.append(_event("r4_draft", f"draft {n} ({x.source}): penalty {pens[n]}", index=n, source=x.source,
                                 penalty=pens[n], issues=count_by_type(iss)))
        best = min(range(len(drafts)), key=lambda n: (pens[n], n))
        draft = drafts[best]
        issues = self._critique(draft, ev, events) if self.opinion is not None else scored[best]
        events.append(_event("r4_reflect", f"best of {len(drafts)}: draft {best}, penalty {pens[best]}",
                             chosen=best, penalties=pens, issues=count_by_type(issues),
                             detail=[i.model_dump(mode="json", exclude={"fix"}) for i in issues[:20]]))
        initial, repairs = issues, 0
        for p in range(self.cfg.max_passes):
            if not any(i.material for i in issues):
                break
            draft, applied = repair(draft, ev, issues, d)
            repairs += len(applied)
            after = self._critique(draft, ev, events)
            if self.wording is not None and any(i.material for i in after):
                draft, call = self.wording.rewrite(draft, ev, after, d)
                if call:
                    events.append(_event("llm_call", "R4 wording repair", **call))
                after = self._critique(draft, ev, events)
            events.append(_event("r4_repair", f"pass {p + 1}: {len(applied)} fix(es), penalty {penalty(issues)} -> "
                                 f"{penalty(after)}", passes=p + 1, applied=[
                                     {"type": i.type, "section": i.section, "sentence": i.sentence, "op": i.fix.op,
                                      "entity": i.entity} for i in applied],
                                 penalty_before=penalty(issues), penalty_after=penalty(after),
                                 remaining=count_by_type(after)))
            issues = after
        final = self._critique(draft, ev, events)  # the verdict: a full, fresh critique of the final text
        events.append(_event("r4_reflect", f"final critique: {penalty(final)} penalty, "
                             f"{sum(i.material for i in final)} material issue(s)", final=True,
                             issues=count_by_type(final),
                             detail=[i.model_dump(mode="json", exclude={"fix"}) for i in final[:20]]))
        return R4Outcome(draft, r, hits, pens, best, initial, final, repairs, events)


__all__ = ["R4Config", "R4Loop", "R4Outcome"]
