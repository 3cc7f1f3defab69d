"""The report fixer (R4's Repair step): applies the critic's fixes to text AND boxes, then completes what is
missing, all from the evidence (deterministic tier); an optional LLM tier rewrites wording
that no evidence-settled fix covers, accepted only when reflection says it got better."""
from __future__ import annotations

import json
import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from ...tools.report.evidence import Evidence
from ...tools.report.prose import Box, Draft
from .issues import Issue, penalty
from .critic import reflect

log = logging.getLogger(__name__)


def _sentence_edit(text: str, issues: list[Issue]) -> tuple[str | None, list[Issue]]:
    """The new sentence (None: deleted) and the issues whose fix was applied."""
    whole = [i for i in issues if i.fix.op == "replace_sentence" and i.fix.text]
    if whole:
        return whole[0].fix.text, whole[:1]
    dels = [i for i in issues if i.fix.op in ("delete_sentence", "replace_sentence")]
    if dels:
        return None, dels[:1]
    applied, last_start = [], len(text) + 1
    for i in sorted((i for i in issues if i.fix.op == "replace" and i.span), key=lambda i: -i.span[0]):
        a, b = i.span
        if b > last_start:  # overlaps an edit already made
            continue
        text = text[:a] + i.fix.text + text[b:]
        last_start = a
        applied.append(i)
    return text, applied


def apply_fixes(draft: Draft, issues: list[Issue]) -> tuple[Draft, list[Issue]]:
    """A new draft with every applicable fix applied; returns it and the issues it fixed."""
    new = draft.model_copy(deep=True)
    applied: list[Issue] = []
    for section in ("findings", "impression"):
        sentences: list[str | None] = list(getattr(new, section))
        for idx in range(len(sentences)):
            mine = [i for i in issues if i.section == section and i.sentence == idx]
            if mine:
                sentences[idx], done = _sentence_edit(sentences[idx], mine)
                applied += done
        kept: list[str] = []
        for s in sentences:  # a replacement may restate a sentence the draft already has
            if s is not None and s not in kept:
                kept.append(s)
        setattr(new, section, kept)
    for i in issues:
        if i.fix.op == "insert":
            target = getattr(new, i.section if i.section in ("findings", "impression") else "findings")
            added = [s for s in i.fix.sentences if s not in new.findings and s not in new.impression]
            target.extend(added)
            if added:
                applied.append(i)
        elif i.fix.op == "set_box":
            new.boxes = [b for b in new.boxes if b.lesion != i.entity]
            if i.fix.box is not None:
                new.boxes.append(Box(lesion=i.entity, box_voxel=i.fix.box))
            applied.append(i)
    return new, applied


def repair(draft: Draft, ev: Evidence, issues: list[Issue], decimals: int = 1) -> tuple[Draft, list[Issue]]:
    """Deterministic tier: apply the fixes, then insert whatever the edits left missing."""
    new, applied = apply_fixes(draft, issues)
    gaps = [i for i in reflect(new, ev, decimals) if i.type == "missing"]
    if gaps:
        new, more = apply_fixes(new, gaps)
        applied += more
    return new, applied


class _Wording(BaseModel):
    model_config = ConfigDict(extra="forbid")
    findings: list[str]
    impression: list[str]


class LLMWordingTier:
    """Asks an LLM (``LLMBackend``) to rewrite the sentences that still carry issues, keeping
    every evidence link; the answer is validated (pydantic) and kept only if its penalty is
    lower. Returns (draft, reply event data or None)."""

    def __init__(self, backend: Any, max_tokens: int = 700):
        self.backend, self.max_tokens = backend, max_tokens

    def rewrite(self, draft: Draft, ev: Evidence, issues: list[Issue],
                decimals: int = 1) -> tuple[Draft, dict[str, Any] | None]:
        from ...tools.report.prose import num

        facts = "\n".join(f"- {f.key} ({f.entity}): {num(f, decimals)}" for f in ev.facts.values() if f.required)
        problems = "\n".join(f"- {i.type} in {i.section} sentence {i.sentence}: {i.message}" for i in issues)
        messages = [{"role": "system", "content": "You correct radiology report drafts. Keep every number exactly "
                     "as given, each followed by its evidence link in backticks. Answer JSON only."},
                    {"role": "user", "content": f"Evidence:\n{facts}\n\nDraft:\n" + json.dumps(
                        {"findings": draft.findings, "impression": draft.impression}, indent=1)
                     + f"\n\nProblems:\n{problems}\n\nReturn the corrected findings and impression sentences."}]
        reply = self.backend.complete(messages, json_schema=_Wording.model_json_schema(), n=1, temperature=0.0,
                                      max_tokens=self.max_tokens)
        data = reply.event_data()
        try:
            w = _Wording.model_validate_json(reply.texts[0])
        except (ValidationError, IndexError, ValueError) as e:
            data["rejected"] = f"schema: {str(e)[:200]}"
            return draft, data
        cand = draft.model_copy(update={"findings": w.findings, "impression": w.impression, "source": draft.source + "+llm"})
        before, after = penalty(issues), penalty(reflect(cand, ev, decimals))
        data.update(penalty_before=before, penalty_after=after, accepted=after < before)
        return (cand if after < before else draft), data


__all__ = ["LLMWordingTier", "apply_fixes", "repair"]
