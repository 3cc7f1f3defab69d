"""Report tools (``report.*``): ``structured`` writes the report; the parts it shares with the R4
agents are the evidence a report may state (``evidence``), the deterministic sentence templates
(``prose``), the vocabulary (``lexicon``), the header (``header``) and the Markdown rendering with
an evidence link on every number (``render``). Pure: no Ray, no engine."""
from .evidence import Entity, Evidence, Fact, build_evidence
from .prose import Draft, default_plan, realise
from .render import cited_ids, render_report

__all__ = ["Draft", "Entity", "Evidence", "Fact", "build_evidence", "cited_ids", "default_plan", "realise",
           "render_report"]
