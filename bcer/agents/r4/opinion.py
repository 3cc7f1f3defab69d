"""A second opinion from the LLM tier on sentences the rules cannot read.

A sentence the critic finds ungrounded ("states nothing the evidence holds") may still say
something true in words the lexicon lacks. The LLM is asked which evidence facts or findings
each such sentence states; every claim is validated against the evidence like any other
statement: a fact must exist and its value must be written in the sentence (within the
printed precision), a finding must exist with the polarity claimed, and its name must occur
in the sentence. Only a sentence whose every claim holds, and with at least one, is cleared;
a claim that disagrees with the evidence becomes a contradiction or negation issue; an answer
that does not parse changes nothing.
"""
from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...tools.report.evidence import Evidence
from ...tools.report.prose import Draft, num
from .issues import Fix, Issue

UNGROUNDED = "states nothing the evidence holds"  # the rules' words for what they could not read


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    index: int = Field(description="the sentence's number in the list given")
    fact: str | None = Field(None, description="an evidence fact id the sentence states")
    value: float | None = Field(None, description="the value the sentence gives that fact, in the fact's unit")
    finding: str | None = Field(None, description="a finding (concept) name the sentence states")
    present: bool | None = Field(None, description="whether the sentence says the finding is present")


class Opinion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    claims: list[Claim]


def _numbers(s: str) -> list[tuple[float, float]]:
    out = []
    for m in re.finditer(r"\d+(?:\.\d+)?", s):
        d = len(m.group(0).split(".")[1]) if "." in m.group(0) else 0
        out.append((float(m.group(0)), 0.5 * 10 ** -d + 1e-9))
    return out


def _check(c: Claim, sentence: str, ev: Evidence) -> str:
    """ok | wrong | invalid (unknown fact or finding, or not what the sentence says)."""
    if c.fact is not None:
        f = ev.facts.get(c.fact)
        if f is None or c.value is None or not any(abs(v - c.value) <= t for v, t in _numbers(sentence)):
            return "invalid"  # a value the sentence does not write is the LLM's, not the report's
        return "ok" if abs(c.value - f.value) <= max(0.5, 0.01 * abs(f.value)) else "wrong"
    if c.finding is not None and c.present is not None:
        concept = ev.concepts.get(c.finding)
        stem = c.finding.split()[-1][:5].lower()
        if concept is None or stem not in sentence.lower():
            return "invalid"
        return "ok" if concept.present == c.present else "wrong"
    return "invalid"


class LLMSecondOpinion:
    """Args: backend (an ``LLMBackend``), max_tokens."""

    def __init__(self, backend: Any, max_tokens: int = 400):
        self.backend, self.max_tokens = backend, max_tokens

    def review(self, draft: Draft, ev: Evidence, issues: list[Issue]) -> tuple[list[Issue], dict[str, Any] | None]:
        """The issues with the LLM's validated opinion on every ungrounded sentence applied."""
        unread = [i for i in issues if i.type == "unsupported" and i.message.endswith(UNGROUNDED) and i.sentence >= 0]
        other = {(i.section, i.sentence) for i in issues if i not in unread}
        where = list(dict.fromkeys((i.section, i.sentence) for i in unread if (i.section, i.sentence) not in other))
        if not where:
            return issues, None
        text = {(s, n): t for s, n, t in draft.sentences()}
        lines = [text[w] for w in where]
        facts = "\n".join(f"- {f.id}: {f.key} ({f.entity}) = {num(f).split(' `')[0]}" for f in ev.facts.values()
                          if f.role in ("measure", "count", "slice", "score"))
        found = "\n".join(f"- {c.key}: {'present' if c.present else 'absent'}" for c in ev.concepts.values())
        messages = [{"role": "system", "content": "You read radiology report sentences. For each numbered sentence "
                     "list the evidence facts (by id, with the value the sentence gives) or findings (by name, "
                     "with the polarity the sentence states) it asserts. Answer JSON only."},
                    {"role": "user", "content": f"Facts:\n{facts}\n\nFindings:\n{found}\n\nSentences:\n"
                     + "\n".join(f"{k}. {s}" for k, s in enumerate(lines))}]
        reply = self.backend.complete(messages, json_schema=Opinion.model_json_schema(), n=1, temperature=0.0,
                                      max_tokens=self.max_tokens)
        data = reply.event_data()
        try:
            op = Opinion.model_validate_json(reply.texts[0])
        except (ValidationError, IndexError, ValueError) as e:
            data["rejected"] = f"schema: {str(e)[:200]}"
            return issues, data
        verdicts: dict[int, list[tuple[Claim, str]]] = {}
        for c in op.claims:
            if 0 <= c.index < len(lines):
                verdicts.setdefault(c.index, []).append((c, _check(c, lines[c.index], ev)))
        out, cleared, flagged = [i for i in issues if (i.section, i.sentence) not in where], 0, 0
        for k, w in enumerate(where):
            mine = [i for i in unread if (i.section, i.sentence) == w]
            got = verdicts.get(k, [])
            if got and all(v == "ok" for _, v in got):
                cleared += 1
                continue
            wrong = [(c, v) for c, v in got if v == "wrong"]
            if wrong and all(v != "invalid" for _, v in got):
                out.append(_wrong(mine[0], wrong[0][0], ev))
                flagged += 1
            else:
                out += mine
        data.update(asked=len(where), cleared=cleared, flagged=flagged,
                    claims=json.loads(op.model_dump_json())["claims"][:20])
        return out, data


def _wrong(issue: Issue, c: Claim, ev: Evidence) -> Issue:
    if c.fact is not None:
        f = ev.facts[c.fact]
        return issue.model_copy(update={"type": "contradiction", "entity": f.entity, "evidence_ids": [f.id],
                                        "found": c.value, "expected": f.value, "fix": Fix(op="delete_sentence"),
                                        "message": f"(second opinion) {f.key} is {num(f)}, the sentence says "
                                                   f"{c.value}"})
    concept = ev.concepts[c.finding]
    return issue.model_copy(update={"type": "negation", "entity": c.finding, "evidence_ids": list(concept.evidence),
                                    "found": c.present, "expected": concept.present, "fix": Fix(op="delete_sentence"),
                                    "message": f"(second opinion) {c.finding} is "
                                               f"{'present' if concept.present else 'absent'}"})


__all__ = ["Claim", "LLMSecondOpinion", "Opinion", "UNGROUNDED"]
