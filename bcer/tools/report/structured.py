"""Structured reports (``report.structured``): radiology-style prose where every number is traceable.

The report reads like a radiology report (Findings in prose per compartment, chamber or
lesion; a bulleted Impression) and keeps the audit appendices (each measurement table once,
lesion boxes, the decision rules). Every number is written by one function
(``prose.num``) that follows it with its evidence link `` `[node.field.key]` ``: the
node and output field it came from (``meta["origin"]`` set by the executor, else the port
name) and the key inside that artifact; ``Report.evidence`` lists them in order of
appearance. This tool writes the deterministic template draft; the R4 loop
(``bcer.agents.r4``) may replace it with a reflected and repaired draft.
"""
from __future__ import annotations

import logging
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...contracts.artifacts import Classification, Findings, Report, Table
from ...contracts.errors import ErrorCode, ToolError
from ..registry import tool
from .evidence import build_evidence
from .prose import realise
from .render import render_report

log = logging.getLogger(__name__)

Domain = Literal["auto", "brain", "cardiac", "prostate", "general"]


class ReportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    title: str = Field("", max_length=200, description="report title; empty: from the domain")
    domain: Domain = Field("auto", description="organ/domain of the report; auto: from the inputs")
    decimals: int = Field(1, ge=0, le=4, description="decimals of non-integer numbers in the text")


@tool("report.structured", version="2.0", milestone="report", resources={"num_cpus": 1, "memory_mb": 256},
      output="report")
def structured(params: ReportParams, measurements: Table | None = None, features: Table | None = None,
               classification: Classification | None = None, findings: Findings | None = None) -> Report:
    """A radiology-style report: Findings and Impression in prose, then the measurement tables
    (each once, even when one table is bound to both ports), lesion boxes and decision rules.

    Returns:
        Report whose ``evidence`` lists ``{value, raw, unit, node, field, key, id}`` for each
        number in the text, in order of appearance; ``structured`` holds the findings and
        impression sentences, boxes, plan, profile and the tables.

    Raises:
        ToolError: ``input_missing`` when no input is given.
    """
    if measurements is None and features is None and classification is None and findings is None:
        raise ToolError(ErrorCode.input_missing, "report.structured needs at least one of measurements, "
                        "features, classification, findings", arg="measurements")
    ev = build_evidence(measurements, features, classification, findings, params.domain)
    draft = realise(ev, decimals=params.decimals)
    text, structured_out, evidence = render_report(ev, draft, params.title, params.decimals)
    return Report(text, structured_out, evidence,
                  meta={"method": "template draft per domain; numbers only through the evidence writer",
                        "n_numbers": len(evidence), "profile": ev.profile(), "evidence_digest": ev.digest()})
