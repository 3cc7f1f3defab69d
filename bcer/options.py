"""The settings of a run, declared once: ``StudyOptions``.

``Study``, ``run_case`` and ``plan_case`` take one (or build one from their keyword arguments),
and the ``bcer`` commands build one from their shared option group (``bcer.cli.options``), so a
setting is named, typed and defaulted in this one place. The engine's ``CohortConfig`` is
built from it in ``bcer.api``.

>>> from bcer.options import StudyOptions
>>> StudyOptions(task="segment_brain", out="out", cache="cache").cache
PosixPath('cache')
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .contracts import ErrorCode, PlanSketch, TaskContract, ToolError


class StudyOptions(BaseModel):
    """How a case or a cohort is planned and run (everything but the data itself).

    Args:
        task: task contract id (``bcer.contracts.list_contracts()``), a task YAML file or a TaskContract.
        goal: goal text (defaults to the contract's).
        plan: a plan sketch (file or object) replayed for every case instead of the planner.
        out: output folder; a rerun on it skips cases with ``_DONE``.
        layout: dataset layout name (None: detected).
        seq: ``{sequence: pattern}`` for flat NIfTI folders (``{"T1": "*_t1.nii.gz"}``) or
            ``{sequence: channel}`` for nnU-Net datasets.
        case_ids: run only these case ids (an unknown id is an error that lists the near ones).
        exclude: skip these case ids.
        limit: the first N cases only (after ``case_ids``/``exclude``).
        address: Ray cluster address (None: RAY_ADDRESS or a local cluster).
        max_in_flight: cases running at once (back-pressure on the object store); None: eight
            per CPU of the cluster (``engine.cohort.default_in_flight``).
        seed: the runtime seed (``@runtime.seed``).
        cache: node cache folder (content-addressed; shared by cohorts; None: no cache).
        node_timeout_s: time limit of every node (default: each tool's own).
        gpu_concurrency: at most K nodes per GPU at once (whole-GPU requests become 1/K).
        model_actors: serve the ``bundles`` tools from one model actor per GPU (each loads its
            bundle once); on a cluster without GPUs they run as tasks on their CPU path.
        bundles: ``{tool: bundle folder}`` (``--bundle seg.brain_tumor=DIR``); a relative folder
            is looked up under ``model_dirs``. The planner fills those tools' ``bundle_dir``.
        model_dirs: folders of local model bundles tools may read (besides bcer's own assets).
        params: ``{tool: {param: value}}`` set on every step of that tool (``--set``), checked
            against the tool's params model before anything runs; recorded in provenance.
        planner: a planner object, or ``"offline"`` | ``"llm"`` | ``"llm,offline"`` (LLM planner,
            offline planner as fallback).
        llm: LLM backend spec (``http://HOST:PORT/v1#MODEL``, ``vllm:MODEL``, ``local``,
            ``replay:FILE``) or object, for an LLM planner and/or reflector tier.
        llm_record: append every LLM call to this JSONL file (replay with ``llm="replay:FILE"``).
        reflector: ``"tier1"`` or ``"tier1,llm"`` (an LLM repair tier behind tier 1); the run's
            Reflector pool is built with those tiers (unless ``repairer`` is given).
        repairer: a repairer pool to use instead of the run's own Reflector pool.
        r4: review report deliverables with the R4 loop (report tasks; default on).
        memory: exemplar-memory folder shared across cohorts (retrieval + curation); None: no memory.
        r4_llm: an ``LLMBackend`` the R4 drafter uses (None: the deterministic template drafter).
        derivatives: also write the standard derivatives at the end (a BIDS derivative tree,
            ``OUT/predictions``, DICOM SEG/SR for DICOM cases; docs/outputs.md).
        audit: keep the full audit of every case in its folder (``events.jsonl``, ``plan.json``,
            ``workflow.json``, ``result.json``, a table's CSV twin). Default: a case that succeeds
            keeps its deliverables, ``provenance.json`` and ``_DONE`` (its row), everything else
            going to the cohort's tables; a case that does not succeed is always audited in full.
    """

    # planners, backends and repairers may be live objects: held as given, never copied
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_assignment=True)

    # what to do
    task: TaskContract | str | Path | None = None
    goal: str | None = None
    plan: PlanSketch | Path | None = None
    out: Path = Path("bcer_out")
    # which cases
    layout: str | None = None
    seq: dict[str, str] | None = None
    case_ids: list[str] | None = None
    exclude: list[str] | None = None
    limit: int | None = Field(None, ge=1)
    # where and how
    address: str | None = None
    max_in_flight: int | None = Field(None, ge=1)
    seed: int = 0
    cache: Path | None = None
    node_timeout_s: float | None = Field(None, gt=0)
    gpu_concurrency: int | None = Field(None, ge=1)
    model_actors: bool = False
    bundles: dict[str, str] | None = None
    model_dirs: tuple[str, ...] = ()
    params: dict[str, dict[str, Any]] | None = None
    # the controller: planner, LLM, repair, report review
    planner: Any = None
    llm: Any = None
    llm_record: Path | None = None
    reflector: str = "tier1"
    repairer: Any = None
    r4: bool | str = True
    memory: Path | None = None
    r4_llm: Any = None
    # outputs
    derivatives: bool = True
    audit: bool = False

    @classmethod
    def build(cls, options: "StudyOptions | None" = None, **settings: Any) -> "StudyOptions":
        """``options`` (or the defaults) with ``settings`` on top: how ``Study(...)``,
        ``run_case(...)`` and ``plan_case(...)`` turn their keyword arguments into one object.

        Raises:
            TypeError: a setting that is not a field (as for any unknown keyword argument).
            ToolError: ``schema``, a value of the wrong type or out of bounds (all of them named).
        """
        unknown = sorted(set(settings) - set(cls.model_fields))
        if unknown:
            from .contracts.errors import did_you_mean

            raise TypeError(f"unknown setting {unknown[0]!r}: {did_you_mean(unknown[0], cls.model_fields)}")
        base = dict(options) if options is not None else {}
        try:
            return cls.model_validate({**base, **_plain(settings)})
        except ValidationError as err:
            bad = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in err.errors())
            raise ToolError(ErrorCode.schema, f"invalid study options: {bad}", arg=str(err.errors()[0]["loc"][0])
                            ) from None

    def changed(self, **settings: Any) -> "StudyOptions":
        """A copy with ``settings`` changed (checked as in :meth:`build`)."""
        return StudyOptions.build(self, **settings)


def _plain(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Paths where the fields keep strings (model dirs, bundle folders): the API has always taken either."""
    out = dict(settings)
    if isinstance(out.get("model_dirs"), Iterable) and not isinstance(out.get("model_dirs"), (str, Path)):
        out["model_dirs"] = tuple(str(p) for p in out["model_dirs"])
    if isinstance(out.get("bundles"), Mapping):
        out["bundles"] = {k: str(v) for k, v in out["bundles"].items()}
    for key in ("case_ids", "exclude"):
        if isinstance(out.get(key), tuple):
            out[key] = list(out[key])
    return out


__all__ = ["StudyOptions"]
