"""R4 drafters: k drafts of report text and lesion boxes.

``TemplateDrafter`` is deterministic and offline: the default plan realised on the evidence,
plus the plan of each retrieved exemplar realised on this case's evidence (so a verified
exemplar's structure is reused, its numbers never). ``LLMDrafter`` asks an ``LLMBackend``
for k schema-constrained drafts with the retrieved exemplars as few-shot examples; each
answer is validated with pydantic, an invalid one is dropped (and counted), and when none is
valid the template draft stands in.
"""
from __future__ import annotations

import json
import logging
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from ...tools.report.evidence import Evidence
from ...tools.report.prose import Box, Draft, num, realise, unit_text
from .router import Route

log = logging.getLogger(__name__)


class Drafter(Protocol):
    name: str

    def drafts(self, ev: Evidence, route: Route, exemplars: list[dict[str, Any]],
               decimals: int = 1) -> tuple[list[Draft], list[dict[str, Any]]]:
        """(drafts, event data of the calls made)."""
        ...


class TemplateDrafter:
    name = "template"

    def drafts(self, ev: Evidence, route: Route, exemplars: list[dict[str, Any]],
               decimals: int = 1) -> tuple[list[Draft], list[dict[str, Any]]]:
        out = [realise(ev, decimals=decimals)]
        for ex in exemplars:
            if len(out) >= route.k:
                break
            d = realise(ev, ex["record"].get("plan") or [], decimals, source=f"exemplar:{ex['record']['id']}")
            if all(d.findings != o.findings or d.impression != o.impression for o in out):
                out.append(d)
        return out, []


# Bounds a grammar can enforce, so constrained decoding always closes the JSON within max_tokens
# (an unbounded string lets a small model run on until the answer is cut off and invalid) and
# never answers with nothing (empty lists are valid JSON but no report).
Sentence = Annotated[str, StringConstraints(min_length=3, max_length=600)]  # evidence links make them long


class LLMDraft(BaseModel):
    """What an LLM drafter must return (its JSON schema constrains decoding)."""

    model_config = ConfigDict(extra="forbid")
    findings: list[Sentence] = Field(min_length=1, max_length=12,
                                     description="Findings sentences; each number followed by its evidence link")
    impression: list[Sentence] = Field(min_length=1, max_length=4, description="Impression sentences")
    boxes: list[Box] = Field(default_factory=list, max_length=8, description="one voxel box per lesion")


def evidence_prompt(ev: Evidence, decimals: int = 1) -> str:
    lines = ["Measurements (write each number exactly like this, with its link):"]
    lines += [f"- {f.entity} {f.name}: {num(f, decimals)}" for f in ev.facts.values() if f.required]
    for e in ev.lesions():
        lines.append(f"- lesion `{e.id}`: side {e.side}, zone {e.zone}, PI-RADS {e.category}, box_voxel {e.box_voxel}")
    if ev.domain == "brain" and ev.side:
        lines.append(f"- tumour side: {ev.side}")
    for c in ev.concepts.values():
        lines.append(f"- {c.key}: {'present' if c.present else 'absent'}")
    if ev.label:
        lines.append(f"- conclusion: `{ev.label}`")
    return "\n".join(lines)


class LLMDrafter:
    """k drafts from an ``LLMBackend`` (``n=k`` in one call, temperature > 0 for diversity)."""

    name = "llm"

    def __init__(self, backend: Any, temperature: float = 0.7, max_tokens: int = 2400, seed: int | None = 0):
        self.backend, self.temperature, self.max_tokens, self.seed = backend, temperature, max_tokens, seed
        self.fallback = TemplateDrafter()

    def messages(self, ev: Evidence, route: Route, exemplars: list[dict[str, Any]], decimals: int = 1) -> list[dict]:
        system = (f"You are a {route.specialisation} radiologist writing a structured MRI report. State only what "
                  "the evidence gives. Follow every number by its evidence link in backticks exactly as given, "
                  "e.g. 12.3 mL `[node.field.key]`. Write lesion ids in backticks. Findings: prose sentences per "
                  "compartment, chamber or lesion. Impression: the conclusion label in backticks. Answer with JSON "
                  "only: {\"findings\": [...], \"impression\": [...], \"boxes\": [{\"lesion\": id, \"box_voxel\": "
                  "[[i0, j0, k0], [i1, j1, k1]]}]}.")
        msgs = [{"role": "system", "content": system}]
        for ex in exemplars:  # few-shot: a verified report of a similar case (its own numbers, not ours)
            rec = ex["record"]
            msgs.append({"role": "user", "content": f"Evidence summary: {rec['profile_text']}\nWrite the report."})
            shown = rec.get("tags", {}).get("draft") or {"report": rec["report_text"]}
            msgs.append({"role": "assistant", "content": json.dumps(shown)})
        msgs.append({"role": "user", "content": evidence_prompt(ev, decimals) + "\nWrite the report as JSON."})
        return msgs

    def drafts(self, ev: Evidence, route: Route, exemplars: list[dict[str, Any]],
               decimals: int = 1) -> tuple[list[Draft], list[dict[str, Any]]]:
        reply = self.backend.complete(self.messages(ev, route, exemplars, decimals),
                                      json_schema=LLMDraft.model_json_schema(), n=route.k,
                                      temperature=self.temperature if route.k > 1 else 0.0,
                                      max_tokens=self.max_tokens, seed=self.seed)
        data = reply.event_data()
        out, bad = [], 0
        for text in reply.texts:
            try:
                d = LLMDraft.model_validate_json(_json_part(text))
            except (ValidationError, ValueError):
                bad += 1
                continue
            out.append(Draft(findings=d.findings, impression=d.impression, boxes=d.boxes, source="llm"))
        data.update(valid=len(out), invalid=bad)
        if not out:
            log.warning("LLM drafter: no valid draft of %d; template draft used", len(reply.texts))
            out, _ = self.fallback.drafts(ev, route, exemplars, decimals)
            data["fallback"] = "template"
        return out, [data]


def _json_part(text: str) -> str:
    """The JSON object in a completion (a model may wrap it in a code fence)."""
    a, b = text.find("{"), text.rfind("}")
    if a < 0 or b < a:
        raise ValueError("no JSON object")  # internal: the caller counts the draft invalid, as for bad JSON
    json.loads(text[a:b + 1])
    return text[a:b + 1]


__all__ = ["Drafter", "LLMDraft", "LLMDrafter", "TemplateDrafter", "evidence_prompt", "unit_text"]
