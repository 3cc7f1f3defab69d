"""The options several `bcer` commands share, declared once (typer ``Annotated`` aliases).

A command takes one as ``cache: Cache = None``; the flag name and help text live here, so
``plan``, ``run``, ``cohort``, ``bench`` and ``demo`` cannot drift apart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

_SEQ_HELP = ("map a sequence to files (flat NIfTI folders: T1=*_t1.nii.gz, the case id is what * matches) "
             "or to a channel (nnU-Net: T2w=0); repeat per sequence")
_LLM_HELP = ("LLM backend: http://HOST:PORT/v1 or http://HOST:PORT/v1#MODEL | vllm:MODEL or vllm:MODEL@TP | "
             "local or local:DIR | replay:FILE")

# what to run
Goal = Annotated[Optional[str], typer.Option(help="goal text")]
Task = Annotated[Optional[str], typer.Option(help="task contract id")]
PlanFile = Annotated[Optional[Path], typer.Option("--plan", help="plan sketch JSON (skips the planner)")]
Layout = Annotated[Optional[str], typer.Option(help="dataset layout (default: detect)")]
Seq = Annotated[Optional[list[str]], typer.Option("--seq", help=_SEQ_HELP)]
# where and how
Address = Annotated[Optional[str], typer.Option(help="Ray address (default: local cluster)")]
Cache = Annotated[Optional[Path], typer.Option(
    "--cache", help="node cache folder: reruns and changed plans reuse every node whose inputs did not change")]
NodeTimeout = Annotated[Optional[float], typer.Option(
    "--node-timeout", help="time limit of every node in seconds (default: each tool's own)")]
Bundle = Annotated[Optional[list[str]], typer.Option(
    "--bundle", help="run TOOL with the MONAI bundle in DIR (e.g. seg.brain_tumor=models/brats); repeat per tool")]
ModelDir = Annotated[Optional[list[Path]], typer.Option(
    "--model-dir", help="read-only folder of model bundles (relative --bundle folders are looked up here); "
    "repeatable")]
# the controller: planner, LLM, repair, report review
Planner = Annotated[str, typer.Option("--planner", help="offline | llm | llm,offline (LLM Brain, offline fallback)")]
LLM = Annotated[Optional[str], typer.Option("--llm", help=_LLM_HELP)]
LLMRecord = Annotated[Optional[Path], typer.Option(
    "--llm-record", help="append every LLM call (prompt, answer, digests) to this JSONL")]
Reflector = Annotated[str, typer.Option("--reflector", help="tier1 | tier1,llm (an LLM repair tier behind tier 1)")]
R4 = Annotated[str, typer.Option("--r4", help="R4 review of report deliverables: on | off")]
Memory = Annotated[Optional[Path], typer.Option("--memory", help="exemplar-memory folder (shared across cohorts)")]
# output
Report = Annotated[bool, typer.Option("--report/--no-report", help="write the HTML pages (OUT/report)")]
