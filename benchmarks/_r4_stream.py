"""Shared by the R4 pass@k and self-improvement benchmarks: the case stream, the drafter from a
backend spec, and one R4 pass over a case (route, retrieve, k drafts, reflect, repair)."""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcer.agents.r4 import LLMDrafter, R4Config, R4Loop, TemplateDrafter, penalty  # noqa: E402
from bcer.bench.report_inputs import REPORT_TASKS, report_inputs  # noqa: E402
from bcer.tools.report import build_evidence  # noqa: E402


def make_drafter(spec: str | None):
    """``none``/``template``: the deterministic template drafter; anything else is an LLM backend
    spec for ``bcer.agents.llm.make_backend`` (``local``, ``http://...``, ``vllm:MODEL``,
    ``replay:FILE``), built by the llm workstream."""
    if not spec or spec in ("none", "template"):
        return TemplateDrafter(), "template"
    try:
        from bcer.agents.llm import make_backend
    except ImportError as e:
        raise SystemExit(f"--llm {spec}: this tree has no bcer.agents.llm.make_backend ({e}); "
                         "run it after the llm workstream is merged") from e
    backend = make_backend(spec)
    return LLMDrafter(backend), f"llm:{getattr(backend, 'name', spec)}:{getattr(backend, 'model', '')}"


def stream(n_per_task: int, seed: int, tasks=REPORT_TASKS) -> list[dict[str, Any]]:
    """Cases interleaved across the report tasks (brain, prostate, cardiac, brain, ...)."""
    out = []
    for i in range(n_per_task):
        for task in tasks:
            inputs, info = report_inputs(task, i, seed)
            out.append({"task": task, "case": f"{task}:{info['case']}", "ev": build_evidence(**inputs),
                        "history": str(info["metadata"].get("history", "") or "")})
    return out


def run_case(item: dict[str, Any], drafter, k: int, retrieve=None, max_passes: int = 2) -> tuple[Any, dict[str, Any]]:
    t0 = time.perf_counter()
    out = R4Loop(drafter, retrieve, config=R4Config(k=k, max_passes=max_passes)).run(
        item["ev"], task=item["task"], case=item["case"], history=item["history"])
    return out, {"task": item["task"], "case": item["case"], "profile": out.route.profile, "k": out.route.k,
                 "drafts": len(out.draft_penalties), "draft_penalties": out.draft_penalties,
                 "any_draft_clean": min(out.draft_penalties) == 0 if out.draft_penalties else False,
                 "chosen_issues": len(out.initial_issues), "chosen_penalty": penalty(out.initial_issues),
                 "final_issues": len(out.final_issues), "repairs": out.repairs,
                 "exemplars": len(out.exemplars), "s": round(time.perf_counter() - t0, 3),
                 # an LLM drafter's answers: valid ones, and whether the template stood in (then the
                 # issues above are the template's, so pass@k counts only drafts the LLM wrote)
                 **_llm_stats(out)}


def _llm_stats(out) -> dict[str, Any]:
    calls = [e["data"] for e in out.events if e["kind"] == "llm_call" and e["message"] == "R4 drafter"]
    if not calls:
        return {}
    llm_pens = [p for p, src in zip(out.draft_penalties, _sources(out)) if src == "llm"]
    return {"llm_valid": sum(c.get("valid", 0) for c in calls), "llm_invalid": sum(c.get("invalid", 0) for c in calls),
            "llm_fallback": any(c.get("fallback") for c in calls), "any_llm_draft_clean": 0 in llm_pens,
            "llm_draft_penalties": llm_pens, "latency_s": sum(c.get("latency_s") or 0 for c in calls)}


def _sources(out) -> list[str]:
    return [e["data"]["source"] for e in out.events if e["kind"] == "r4_draft"]
