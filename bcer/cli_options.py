"""The options several `bcer` commands share, declared once (typer ``Annotated`` aliases).

A command takes one as ``cache: Cache = None``; the flag name, its metavar and its help text
live here, so ``plan``, ``run``, ``cohort``, ``bench`` and ``demo`` cannot drift apart. Every
option names a metavar (``DIR``, ``ID``, ``N``): typer would otherwise print Python type names.
"""
from __future__ import annotations

import pkgutil
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer

# the same names as bcer.agents.specs (tests/test_cli_help.py checks they agree); listed here so
# `bcer --help` does not import the actors package
PLANNERS = ("offline", "llm", "llm,offline")
REFLECTORS = ("tier1", "tier1,llm")


def task_ids() -> list[str]:
    from .contracts import list_contracts

    return list_contracts()


def layout_names() -> list[str]:
    """Layout module names, without importing them (each module's NAME is its file name)."""
    folder = Path(__file__).parent / "datasets" / "layouts"
    return sorted(m.name for m in pkgutil.iter_modules([str(folder)]) if not m.name.startswith("_"))


_TASK_HELP = "task: " + " | ".join(task_ids()) + ", or a task YAML file"
_SEQ_HELP = ("map a sequence to files (flat NIfTI folders: T1=*_t1.nii.gz, the case id is what * matches) "
             "or to a channel (nnU-Net: T2w=0); repeat per sequence")
_LLM_HELP = ("LLM backend: http://HOST:PORT/v1 or http://HOST:PORT/v1#MODEL | vllm:MODEL or vllm:MODEL@TP | "
             "local or local:DIR | replay:FILE")
_SET_HELP = ("set a tool parameter, checked against the tool's bounds before anything runs "
             "(e.g. denoise.nlm.h_factor=0.9); repeatable; `bcer tools TOOL` lists them")

# the input: one name per concept on every command
Data = Annotated[Optional[Path], typer.Option(
    "--data", metavar="DIR", help="dataset folder (any supported layout) or one case folder")]
DataRequired = Annotated[Path, typer.Option("--data", metavar="DIR", help="dataset folder (any supported layout)")]
OldCase = Annotated[Optional[Path], typer.Option("--case", hidden=True, help="old name of --data")]
Goal = Annotated[Optional[str], typer.Option(metavar="TEXT", help="goal text (instead of or beside --task)")]
Task = Annotated[Optional[str], typer.Option("--task", metavar="ID", help=_TASK_HELP)]
Tasks = Annotated[Optional[list[str]], typer.Option(
    "--task", metavar="ID", help="task to benchmark (repeatable; default: every task): " + " | ".join(task_ids()))]
PlanFile = Annotated[Optional[Path], typer.Option("--plan", metavar="FILE", help="plan sketch JSON (skips the planner)")]
Layout = Annotated[Optional[str], typer.Option(
    metavar="NAME", help="dataset layout: " + " | ".join(layout_names()) + " (default: detected)")]
Seq = Annotated[Optional[list[str]], typer.Option("--seq", metavar="SEQ=PATTERN", help=_SEQ_HELP)]
CaseId = Annotated[Optional[list[str]], typer.Option(
    "--case-id", metavar="ID", help="run only this case (repeatable)")]
Exclude = Annotated[Optional[list[str]], typer.Option(
    "--exclude", metavar="ID", help="skip this case (repeatable)")]
Limit = Annotated[Optional[int], typer.Option(metavar="N", min=1, help="the first N cases only (after --case-id/--exclude)")]
Set = Annotated[Optional[list[str]], typer.Option("--set", metavar="TOOL.PARAM=VALUE", help=_SET_HELP)]
# where and how
Out = Annotated[Path, typer.Option("--out", metavar="DIR", help="output folder; a rerun on it resumes")]
Address = Annotated[Optional[str], typer.Option(
    metavar="ADDR", help="Ray cluster address, e.g. ray://HEAD:10001 or auto (default: RAY_ADDRESS or a local cluster)")]
Cache = Annotated[Optional[Path], typer.Option(
    "--cache", metavar="DIR",
    help="node cache folder: reruns and changed plans reuse every node whose inputs did not change")]
NodeTimeout = Annotated[Optional[float], typer.Option(
    "--node-timeout", metavar="SECONDS", help="time limit of every node (default: each tool's own)")]
MaxInFlight = Annotated[Optional[int], typer.Option(
    "--max-in-flight", metavar="N", min=1, help="cases running at once (default: 8 per CPU)")]
GpuConcurrency = Annotated[Optional[int], typer.Option(
    "--gpu-concurrency", metavar="K", min=1, help="at most K nodes per GPU at once")]
ModelActors = Annotated[bool, typer.Option(
    "--model-actors/--no-model-actors", help="serve --bundle tools from one model actor per GPU")]
Bundle = Annotated[Optional[list[str]], typer.Option(
    "--bundle", metavar="TOOL=DIR",
    help="run TOOL with the MONAI bundle in DIR (e.g. seg.brain_tumor=models/brats); repeat per tool")]
ModelDir = Annotated[Optional[list[Path]], typer.Option(
    "--model-dir", metavar="DIR",
    help="read-only folder of model bundles (relative --bundle folders are looked up here); repeatable")]
# the controller: planner, LLM, repair, report review
Planner = Annotated[Literal[PLANNERS], typer.Option(
    "--planner", metavar="[" + "|".join(PLANNERS) + "]", help="planner: the offline planner, the LLM planner, "
    "or the LLM planner with the offline planner as fallback")]
LLM = Annotated[Optional[str], typer.Option("--llm", metavar="SPEC", help=_LLM_HELP)]
LLMRecord = Annotated[Optional[Path], typer.Option(
    "--llm-record", metavar="FILE", help="append every LLM call (prompt, answer, digests) to this JSONL")]
Reflector = Annotated[Literal[REFLECTORS], typer.Option(
    "--reflector", metavar="[" + "|".join(REFLECTORS) + "]", help="repair tiers (tier1,llm: an LLM tier behind tier 1)")]
R4 = Annotated[bool, typer.Option("--r4/--no-r4", help="review report deliverables with the R4 loop")]
Memory = Annotated[Optional[Path], typer.Option(
    "--memory", metavar="DIR", help="exemplar-memory folder (shared across cohorts)")]
# output
Report = Annotated[bool, typer.Option("--report/--no-report", help="write the HTML pages (OUT/report)")]
Derivatives = Annotated[bool, typer.Option(
    "--derivatives/--no-derivatives",
    help="also write the BIDS derivative tree, OUT/predictions and DICOM SEG/SR (docs/outputs.md)")]
Json = Annotated[bool, typer.Option("--json", help="print the result as JSON instead of tables")]
