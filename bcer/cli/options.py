"""The options several `bcer` commands share, declared once (typer ``Annotated`` aliases).

A command takes one as ``cache: Cache = None``; the flag name, its metavar and its help text
live here, so ``plan``, ``run``, ``cohort``, ``bench`` and ``demo`` cannot drift apart. The
options that set a run's ``StudyOptions`` form one group (``GROUP``): a command takes its share
with ``@study_options(...)`` and receives the StudyOptions they build. Every
option names a metavar (``DIR``, ``ID``, ``N``): typer would otherwise print Python type names.
"""
from __future__ import annotations

import functools
import inspect
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Optional

import typer

if TYPE_CHECKING:
    from ..options import StudyOptions

# the same names as bcer.agents.specs (tests/test_cli_help.py checks they agree); listed here so
# `bcer --help` does not import the actors package
PLANNERS = ("offline", "llm", "llm,offline")
REFLECTORS = ("tier1", "tier1,llm")


def _one_of(choices: tuple[str, ...], what: str) -> Callable[[Optional[str]], Optional[str]]:
    """A typer callback checking one choice through the one choice parser (did-you-mean on a typo)."""
    def check(value: Optional[str]) -> Optional[str]:
        from ..contracts.errors import ToolError, parse_choices

        if value is not None:
            try:
                parse_choices([",".join(p.strip() for p in value.split(","))], choices, what, what, every=None)
            except ToolError as e:
                raise typer.BadParameter(f"{e.message}; {e.hint}") from None
        return value
    return check


def task_ids() -> list[str]:
    from ..contracts import list_contracts

    return list_contracts()


def layout_names() -> list[str]:
    """Layout module names, without importing them (each module's NAME is its file name)."""
    folder = Path(__file__).parents[1] / "datasets" / "layouts"
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
Planner = Annotated[str, typer.Option(
    "--planner", metavar="[" + "|".join(PLANNERS) + "]", callback=_one_of(PLANNERS, "planner"),
    help="planner: the offline planner, the LLM planner, or the LLM planner with the offline planner as fallback")]
LLM = Annotated[Optional[str], typer.Option("--llm", metavar="SPEC", help=_LLM_HELP)]
LLMRecord = Annotated[Optional[Path], typer.Option(
    "--llm-record", metavar="FILE", help="append every LLM call (prompt, answer, digests) to this JSONL")]
Reflector = Annotated[str, typer.Option(
    "--reflector", metavar="[" + "|".join(REFLECTORS) + "]", callback=_one_of(REFLECTORS, "reflector tiers"),
    help="repair tiers (tier1,llm: an LLM tier behind tier 1)")]
R4 = Annotated[bool, typer.Option("--r4/--no-r4", help="review report deliverables with the R4 loop")]
Memory = Annotated[Optional[Path], typer.Option(
    "--memory", metavar="DIR", help="exemplar-memory folder (shared across cohorts)")]
# output
Report = Annotated[bool, typer.Option("--report/--no-report", help="write the HTML pages (OUT/report)")]
Derivatives = Annotated[bool, typer.Option(
    "--derivatives/--no-derivatives",
    help="also write the BIDS derivative tree, OUT/predictions and DICOM SEG/SR (docs/outputs.md)")]
Audit = Annotated[bool, typer.Option(
    "--audit", help="keep every case's full audit in its folder (trace, plan, workflow, row, CSV twins); "
                    "by default a case that succeeds keeps its deliverables, provenance.json and _DONE")]
Json = Annotated[bool, typer.Option("--json", help="print the result as JSON instead of tables")]


# -- the study option group: the options that become one StudyOptions ------------------------------
# CLI parameter -> (its option type above, its default, the StudyOptions field it sets). A
# command takes the ones it offers with ``@study_options(...)`` and receives one StudyOptions
# (``opts``); the flag, its help, its default and its field are written only here.
GROUP: dict[str, tuple[Any, Any, str]] = {
    "task": (Task, None, "task"), "goal": (Goal, None, "goal"), "plan_file": (PlanFile, None, "plan"),
    "out": (Out, Path("bcer_out"), "out"), "layout": (Layout, None, "layout"), "seq": (Seq, None, "seq"),
    "case_id": (CaseId, None, "case_ids"), "exclude": (Exclude, None, "exclude"), "limit": (Limit, None, "limit"),
    "set_": (Set, None, "params"), "address": (Address, None, "address"),
    "max_in_flight": (MaxInFlight, None, "max_in_flight"), "cache": (Cache, None, "cache"),
    "node_timeout": (NodeTimeout, None, "node_timeout_s"), "gpu_concurrency": (GpuConcurrency, None, "gpu_concurrency"),
    "model_actors": (ModelActors, False, "model_actors"), "bundle": (Bundle, None, "bundles"),
    "model_dir": (ModelDir, None, "model_dirs"), "r4": (R4, True, "r4"), "memory": (Memory, None, "memory"),
    "planner": (Planner, "offline", "planner"), "llm": (LLM, None, "llm"), "llm_record": (LLMRecord, None, "llm_record"),
    "reflector": (Reflector, "tier1", "reflector"), "derivatives": (Derivatives, True, "derivatives"),
    "audit": (Audit, False, "audit"),
}
# the shares of the commands: plan plans; run adds where and how; cohort adds the case selection
PLANNING = ("task", "goal", "plan_file", "layout", "seq", "set_", "bundle", "model_dir", "planner", "llm", "llm_record")
RUNNING = ("out", "address", "cache", "node_timeout", "reflector")
PER_CASE = ("gpu_concurrency", "model_actors", "r4", "memory", "audit")
COHORT = ("case_id", "exclude", "limit", "max_in_flight", "derivatives")


def _parse(name: str, value: Any) -> Any:
    """A CLI value as its StudyOptions field takes it (``KEY=VALUE`` lists become dicts)."""
    if value is None or name not in ("seq", "set_", "bundle", "model_dir"):
        return value
    if name == "seq":
        from ..datasets.layouts.flat import parse_mapping

        return parse_mapping(value) if value else None
    if name == "set_":
        from ..overrides import parse_sets  # checked against each tool's params model

        return parse_sets(value) if value else None
    if name == "bundle":
        from ..agents.planners.bundles import parse_bundle_args

        return parse_bundle_args(value) if value else None
    return tuple(str(p) for p in value)


def to_study_options(values: dict[str, Any]) -> "StudyOptions":
    """The StudyOptions of a command's group values (by CLI parameter name).

    Raises:
        ToolError: a malformed or unknown ``--set``/``--bundle``/``--seq`` value (exit 2).
    """
    from ..options import StudyOptions

    fields = {GROUP[n][2]: _parse(n, v) for n, v in values.items()}
    # an option left unset (None) on a field that is never None keeps the field's default
    fields = {k: v for k, v in fields.items() if v is not None or StudyOptions.model_fields[k].default is None}
    return StudyOptions.build(**fields)


def study_options(*names: str, **defaults: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the group's options ``names`` and hand it one StudyOptions as ``opts``.

    ``defaults`` overrides a group default for this command (``out=Path("bench_out")``). A
    malformed value is a typed error: printed, exit code 2, before anything runs.
    """
    unknown = [n for n in [*names, *defaults] if n not in GROUP]
    assert not unknown, f"not in the study option group: {unknown}"

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        shared = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, annotation=GROUP[n][0],
                                    default=defaults.get(n, GROUP[n][1])) for n in GROUP if n in names]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own.parameters.values()]
        at = next(i for i, p in enumerate(params) if p.name == "opts")  # the group goes where ``opts`` stands

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            from ..contracts import ToolError
            from .views import fail

            # a command called from another (demo -> bench) may leave some out: the group's default
            group = {n: values.pop(n, defaults.get(n, GROUP[n][1])) for n in names}
            try:
                opts = to_study_options(group)
            except ToolError as e:
                fail(e)
            return command(opts=opts, **values)

        # typer reads this signature: the group's options (in GROUP's order) where ``opts`` stands
        signature = own.replace(parameters=[*params[:at], *shared, *params[at + 1:]])
        run.__signature__ = signature  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in signature.parameters.values()}
        return run
    return wrap
