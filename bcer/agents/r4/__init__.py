"""The R4 report loop (Route, Retrieve, Reflect, Repair) and the reviewer the engine calls.

``R4Reviewer`` implements ``bcer.engine.review.ReportReviewer``: it reviews a report
deliverable (drafts, reflects, repairs) and curates a verified one into the exemplar memory.
"""
from .drafter import LLMDrafter, TemplateDrafter
from .issues import ISSUE_TYPES, WEIGHTS, Fix, Issue, count_by_type, penalty
from .loop import R4Config, R4Loop, R4Outcome
from .opinion import LLMSecondOpinion
from .critic import reflect
from .fixer import LLMWordingTier, apply_fixes, repair
from .router import Route, route

__all__ = ["ISSUE_TYPES", "WEIGHTS", "Fix", "Issue", "LLMDrafter", "LLMSecondOpinion", "LLMWordingTier", "R4Config",
           "R4Loop",
           "R4Outcome", "Route", "TemplateDrafter", "apply_fixes", "count_by_type", "penalty", "reflect", "repair",
           "route"]
