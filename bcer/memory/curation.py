"""What the memory accepts: only verified reports, near-duplicates merged, per-task caps.

A report is *verified* when its case passed its contract and the R4 Reflector left no
material issue in it. A candidate of the same task and the same structure (profile, label, each
lesion's or compartment's side, zone and category) whose embedding is within ``dup_cosine``
of an existing exemplar merges into it (its support count grows, the case is listed), so
a cohort of near-identical normal studies does not flood retrieval with copies. When a task
holds ``per_task_cap`` exemplars new ones are refused (kept records stay stable, so retrieval
stays reproducible; merging still counts support).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Action = Literal["add", "merge", "reject"]


@dataclass(frozen=True)
class CurationPolicy:
    dup_cosine: float = 0.97
    per_task_cap: int = 50_000
    max_material_issues: int = 0


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    similar_id: str | None = None
    similarity: float | None = None


def decide(policy: CurationPolicy, *, verified: bool, material_issues: int, task_size: int,
           nearest_id: str | None, nearest_cosine: float | None) -> Decision:
    """The curation verdict for one candidate (pure: the store applies it)."""
    if not verified:
        return Decision("reject", "case not validated")
    if material_issues > policy.max_material_issues:
        return Decision("reject", f"{material_issues} material issue(s) left after repair")
    if nearest_id is not None and nearest_cosine is not None and nearest_cosine >= policy.dup_cosine:
        return Decision("merge", f"near-duplicate (cosine {nearest_cosine:.3f} >= {policy.dup_cosine})",
                        nearest_id, nearest_cosine)
    if task_size >= policy.per_task_cap:
        return Decision("reject", f"task cap reached ({policy.per_task_cap})", nearest_id, nearest_cosine)
    return Decision("add", "verified", nearest_id, nearest_cosine)


__all__ = ["CurationPolicy", "Decision", "decide"]
