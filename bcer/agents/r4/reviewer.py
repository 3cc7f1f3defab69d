"""``R4Reviewer``: the engine's ``ReportReviewer`` (``bcer.engine.review``) built on the R4 loop
and the exemplar memory actor.

``review`` rebuilds the Evidence from the report node's inputs, runs the loop (the tool's own
draft competes with the k drafts) and renders the final report; its ``meta["r4"]`` records
route, exemplars, per-draft penalties, issues before and after, repairs. ``curate`` adds a
verified report (case validated, no material issue left) to the memory with its evidence
profile, plan and tags.
"""
from __future__ import annotations

import logging
from typing import Any

from ...contracts.artifacts import Report
from ...contracts.task import load_contract
from ...engine.review import CurateRequest, ReviewRequest, ReviewResult
from ...memory import Exemplar
from ...tools.report import build_evidence, render_report
from ...tools.report.evidence import _PHASE_DOUBT as PHASE_DOUBT_FACTS
from ...tools.report.prose import Box, Draft
from ..memory_actor import MemoryClient
from .drafter import LLMDrafter, TemplateDrafter
from .loop import R4Config, R4Loop
from .opinion import LLMSecondOpinion
from .fixer import LLMWordingTier
from .router import Route

log = logging.getLogger(__name__)
_PORTS = ("measurements", "features", "classification", "findings")


def prose_text(structured: dict[str, Any]) -> str:
    return ("Findings:\n" + "\n".join(structured.get("findings", [])) + "\nImpression:\n"
            + "\n".join(f"- {s}" for s in structured.get("impression", [])))


def structure_key(structured: dict[str, Any]) -> str:
    """Profile, label and each lesion's side/zone/category (brain: the tumour side)."""
    parts = [structured.get("profile", ""), structured.get("label", "")]
    parts += [f"{x.get('id')}:{x.get('side')}:{x.get('zone')}:{x.get('category')}" for x in structured.get("lesions", [])]
    parts += [f"side:{structured.get('side')}"] if structured.get("side") else []
    return "|".join(str(p) for p in parts)


def _contract_requires(task: str | None) -> list[str]:
    if not task:
        return []
    try:
        return list(load_contract(task).report_requires)
    except (FileNotFoundError, ValueError):  # a run without a contract file: the report tool's defaults
        return []


def require(ev: Any, names: list[str]) -> None:
    """Make the contract's list what the report must state (the phase doubt stays required
    where cardiac.ed_es flagged it); an empty list keeps the defaults."""
    if not names:
        return
    want = set(names)
    for f in ev.facts.values():
        if f.role in ("measure", "count", "slice", "score") and f.entity != "rules":
            f.required = f.name in want or (f.required and f.name in PHASE_DOUBT_FACTS)


def critic_flag(unresolved: list[dict[str, Any]]) -> str:
    """The warning a report that still has material issues carries at its top."""
    lines = [f"> **Not verified: the R4 critic found {len(unresolved)} unresolved issue(s) in this report.**"]
    lines += [f"> - {u['type']} ({u['section']}{'' if u['sentence'] < 0 else ' ' + str(u['sentence'] + 1)}): "
              f"{u['message']}" for u in unresolved]
    return "\n".join(lines)


def _seed(report: Report) -> Draft | None:
    s = report.structured or {}
    if not s.get("findings") and not s.get("impression"):
        return None
    try:
        return Draft(findings=list(s.get("findings", [])), impression=list(s.get("impression", [])),
                     boxes=[Box(**b) for b in s.get("boxes", [])], plan=list(s.get("plan", [])), source="tool")
    except Exception:  # an older report layout: the loop drafts its own
        return None


class R4Reviewer:
    """Args: memory (actor handle, MemoryService/ExemplarMemory, MemoryClient or None), llm (an
    ``LLMBackend`` for drafting, or None: template drafter), wording_llm (an ``LLMBackend`` for
    the wording repair tier), config (k, passes, exemplars, decimals)."""

    def __init__(self, memory: Any = None, llm: Any = None, wording_llm: Any = None,
                 config: R4Config | None = None, own_memory: bool = False):
        self.memory = None if memory is None else (memory if isinstance(memory, MemoryClient) else MemoryClient(memory))
        self.llm, self.cfg, self.own_memory = llm, config or R4Config(), own_memory
        self.drafter = LLMDrafter(llm) if llm is not None else TemplateDrafter()
        self.wording = LLMWordingTier(wording_llm) if wording_llm is not None else None
        self.opinion = LLMSecondOpinion(wording_llm) if wording_llm is not None else None

    def _retrieve(self, route: Route, text: str, case: str) -> list[dict[str, Any]]:
        hits = self.memory.search(route.task, text, route.retrieve_k, route.scope.get("profile"), case or None)
        if len(hits) < route.retrieve_k and route.scope.get("profile"):  # widen to the whole task
            seen = {h["record"]["id"] for h in hits}
            more = self.memory.search(route.task, text, route.retrieve_k, None, case or None)
            hits += [h for h in more if h["record"]["id"] not in seen][: route.retrieve_k - len(hits)]
        return hits

    def review(self, request: ReviewRequest) -> ReviewResult:
        p = request.params
        decimals = int(p.get("decimals", self.cfg.decimals))
        ev = build_evidence(**{k: v for k, v in request.inputs.items() if k in _PORTS}, domain=p.get("domain", "auto"))
        require(ev, _contract_requires(request.task))
        cfg = R4Config(self.cfg.k, self.cfg.max_passes, self.cfg.retrieve_k, decimals)
        loop = R4Loop(self.drafter, self._retrieve if self.memory is not None else None, self.wording, cfg,
                      self.opinion)
        out = loop.run(ev, task=request.task or ev.domain, case=request.case_id, history=request.history,
                       seed=_seed(request.report))
        summary = out.summary()
        text, structured, evidence = render_report(ev, out.draft, p.get("title", ""), decimals)
        structured["critic"] = {"verdict": out.verdict, "material_issues": summary["material_issues"],
                                "unresolved": out.unresolved()}
        if out.verdict != "clean":  # never delivered as clean: the page says so where a reader signs
            text = critic_flag(out.unresolved()) + "\n\n" + text
        meta = dict(request.report.meta, r4=summary, profile_text=ev.profile_text(request.history),
                    evidence_digest=ev.digest(), n_numbers=len(evidence),
                    method="R4: route, retrieve, k drafts, reflect (best of k), repair")
        return ReviewResult(Report(text, structured, evidence, meta), out.events, summary)

    def curate(self, request: CurateRequest) -> dict[str, Any] | None:
        if self.memory is None:
            return None
        r4 = request.report.meta.get("r4")
        if r4 is None:
            return {"action": "rejected", "reason": "report was not reviewed"}
        s = request.report.structured
        rec = Exemplar(task=request.task or s.get("domain", "general"), profile_text=request.report.meta["profile_text"],
                       report_text=prose_text(s), specialisation=r4["route"]["specialisation"],
                       profile=s.get("profile", ""), plan=list(s.get("plan", [])), label=s.get("label", ""),
                       tags={"domain": s.get("domain"), "draft": {"findings": s.get("findings", []),
                                                                  "impression": s.get("impression", [])},
                             "lesions": [{k: x.get(k) for k in ("id", "side", "zone", "category")}
                                         for x in s.get("lesions", [])], "source": s.get("source")},
                       structure=structure_key(s), case=request.case_id, run=request.run_id,
                       evidence_digest=request.report.meta.get("evidence_digest", ""))
        return self.memory.add(rec.to_dict(), request.verified, int(r4["material_issues"]))

    def close(self) -> None:
        if self.memory is not None and self.own_memory:
            try:
                self.memory.close()
            except Exception:  # best-effort cleanup: a memory backend may raise anything
                log.exception("closing the exemplar memory failed")


def make_reviewer(memory_dir: str | None = None, *, llm: Any = None, wording_llm: Any = None,
                  config: R4Config | None = None, embedder: str = "minilm") -> R4Reviewer:
    """The reviewer a cohort uses: with ``memory_dir``, the shared memory actor of that folder
    (created if needed, closed (checkpointed) when the cohort ends); without, no memory. The
    drafting LLM (if any) also serves the wording repair tier unless another is given."""
    memory = None
    if memory_dir:
        from ..memory_actor import memory_actor

        memory = memory_actor(memory_dir, embedder=embedder)
    return R4Reviewer(memory, llm, wording_llm if wording_llm is not None else llm, config,
                      own_memory=memory is not None)


__all__ = ["R4Reviewer", "critic_flag", "make_reviewer", "prose_text"]
