"""Typed report issues, their penalty weights, and the suggested fix each one carries."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

IssueType = Literal["laterality", "negation", "unsupported", "contradiction", "missing", "localization"]
ISSUE_TYPES: tuple[str, ...] = ("laterality", "negation", "unsupported", "contradiction", "missing", "localization")
# the R4 reference weights: an omission or a wrong number/category costs more than the rest
WEIGHTS: dict[str, int] = {"missing": 3, "contradiction": 3, "laterality": 2, "negation": 2, "unsupported": 2,
                           "localization": 2}


class Fix(BaseModel):
    """What the Repairer should do: ``replace`` a span, ``replace_sentence``, ``delete_sentence``,
    ``insert`` sentences into a section, or ``set_box`` of a lesion."""

    model_config = ConfigDict(extra="forbid")
    op: Literal["replace", "replace_sentence", "delete_sentence", "insert", "set_box", "none"]
    text: str = ""
    sentences: list[str] = Field(default_factory=list)
    box: list[list[int]] | None = None


class Issue(BaseModel):
    """One problem of a draft, located: section and sentence index (-1: the whole section),
    ``span`` (start, end) inside that sentence, the evidence it was checked against."""

    model_config = ConfigDict(extra="forbid")
    type: IssueType
    section: Literal["findings", "impression", "boxes", "report"]
    sentence: int = -1
    span: tuple[int, int] | None = None
    entity: str = ""
    evidence_ids: list[str] = Field(default_factory=list)
    found: Any = None
    expected: Any = None
    message: str = ""
    fix: Fix = Field(default_factory=lambda: Fix(op="none"))
    material: bool = True

    @property
    def weight(self) -> int:
        return WEIGHTS[self.type]

    def key(self) -> tuple:
        return (self.type, self.section, self.sentence, self.span, self.entity)


def penalty(issues: list[Issue]) -> int:
    """Weighted penalty of a draft (missing 3, contradiction 3, others 2)."""
    return sum(i.weight for i in issues if i.material)


def count_by_type(issues: list[Issue]) -> dict[str, int]:
    out = {t: 0 for t in ISSUE_TYPES}
    for i in issues:
        out[i.type] += 1
    return out


__all__ = ["Fix", "ISSUE_TYPES", "Issue", "IssueType", "WEIGHTS", "count_by_type", "penalty"]
