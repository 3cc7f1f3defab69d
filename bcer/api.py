"""The Python API: run one case or a study, get pyarrow tables back.

>>> import bcer
>>> result = bcer.Study("data/brats", task="brain_grade", out="out").run()   # doctest: +SKIP
>>> result.cases.to_pandas()[["case", "status", "sr", "tcr"]]                # doctest: +SKIP
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from .contracts import Case, ErrorCode, PlanSketch, TaskContract, ToolError, load_contract

log = logging.getLogger(__name__)


def load_cases(path: str | Path, layout: str | None = None, seq: dict[str, str] | None = None) -> list[Case]:
    """Cases of a dataset folder (layout detected or named), or the one case a case folder holds.
    ``seq`` maps sequence names to file patterns (flat folders) or channels (nnU-Net)."""
    from .datasets import read_dataset
    from .datasets.layouts import detect_layout

    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"no such file or folder: {path}", file=str(path))
    try:
        return read_dataset(path, layout, seq=seq)
    except ToolError as err:
        if layout is None and not seq and path.is_dir() and path.parent != path:
            try:
                parent_layout = detect_layout(path.parent)
            except ToolError:
                raise err from None
            cases = [c for c in read_dataset(path.parent, parent_layout)
                     if Path(c.root).resolve() == path.resolve() or c.id == path.name]
            if cases:
                return cases
        raise


def make_planner(plan: str | Path | PlanSketch | None = None, planner: Any = None,
                 bundles: dict[str, str] | None = None):
    """A sketch file/object replays as a StaticPlanner (it wins over a planner: the controller
    always supplies one); otherwise the given or default planner. With ``bundles`` ({tool:
    folder}, resolved) the planner's steps of those tools get their ``bundle_dir``."""
    from .engine.planning import StaticPlanner

    if isinstance(plan, PlanSketch):
        planner = StaticPlanner(plan)
    elif plan is not None:
        planner = StaticPlanner.from_file(plan)
    elif planner is None:
        from .agents.planners.offline import OfflinePlanner

        planner = OfflinePlanner()
    if bundles:
        from .agents.planners.bundles import BundleBinder

        planner = BundleBinder(planner, bundles)
    return planner


def report_reviewer(contract: TaskContract | None, r4: bool | str = True, memory: str | Path | None = None,
                    llm: Any = None) -> Any:
    """A factory of the R4 reviewer for a task that writes a report (None when ``r4`` is off or
    the contract has no report deliverable). Built lazily, once Ray is up, by the cohort."""
    if str(r4).lower() in ("false", "off", "0", "no"):
        return None
    if contract is not None and not any(d.kind == "report" for d in contract.deliverables):
        return None

    def build():
        from .agents.r4.reviewer import make_reviewer

        return make_reviewer(str(memory) if memory else None, llm=llm)
    return build


def _contract(task: str | TaskContract | None) -> TaskContract | None:
    if task is None or isinstance(task, TaskContract):
        return task
    return load_contract(task)


def make_repairer(run_id: str, tiers: list | None = None) -> Any:
    """THE repairer pool of one run (Reflector actors, started on first failure); ``tiers``:
    the repair tiers (``Controller.tiers``; None: tier 1 only)."""
    from .agents.repair.reflector import reflector_pool

    return reflector_pool(run_id, tiers=tiers) if tiers else reflector_pool(run_id)


@dataclass
class Study:
    """A cohort run: cases (a folder or a list of Case), a task and/or goal, an output folder.

    Args:
        data: dataset folder (any supported layout) or a list of ``Case``.
        task: task contract id (see ``bcer.contracts.list_contracts()``) or a TaskContract.
        goal: goal text (defaults to the contract's).
        plan: a plan sketch (file or object) replayed for every case instead of the Brain.
        out: output folder; a rerun on it skips cases with ``_DONE``.
        address: Ray cluster address (None: RAY_ADDRESS or a local cluster).
        max_in_flight: cases running at once (back-pressure on the object store); None: eight
            per CPU of the cluster (``engine.cohort.default_in_flight``).
        model_dirs: folders of local model bundles tools may read (besides bcer's own assets).
        cache: node cache folder (content-addressed; shared by cohorts; None: no cache).
        node_timeout_s: time limit of every node (default: each tool's own).
        repairer: a repairer pool to use instead of the run's own Reflector pool.
        bundles: ``{tool: bundle folder}`` (``--bundle seg.brain_tumor=DIR``); a relative folder
            is looked up under ``model_dirs``. The planner fills those tools' ``bundle_dir``.
        seq: ``{sequence: pattern}`` for flat NIfTI folders (``{"T1": "*_t1.nii.gz"}``) or
            ``{sequence: channel}`` for nnU-Net datasets.
        r4: review report deliverables with the R4 loop (report tasks; default on).
        memory: exemplar-memory folder shared across cohorts (retrieval + curation); None: no memory.
        r4_llm: an ``LLMBackend`` the R4 drafter uses (None: the deterministic template drafter).
        planner: a planner object, or ``"offline"`` | ``"llm"`` | ``"llm,offline"`` (LLM planner,
            offline planner as fallback).
        llm: LLM backend spec (``http://HOST:PORT/v1#MODEL``, ``vllm:MODEL``, ``local``,
            ``replay:FILE``) or object, for an LLM planner and/or reflector tier.
        llm_record: append every LLM call to this JSONL file (replay with ``llm="replay:FILE"``).
        reflector: ``"tier1"`` or ``"tier1,llm"`` (an LLM repair tier behind tier 1); the run's
            Reflector pool is built with those tiers (unless ``repairer`` is given).
        gpu_concurrency: at most K nodes per GPU at once (whole-GPU requests become 1/K).
        case_ids: run only these case ids (an unknown id is an error that lists the near ones).
        exclude: skip these case ids.
        params: ``{tool: {param: value}}`` set on every step of that tool (``--set``), checked
            against the tool's params model before anything runs; recorded in provenance.
        model_actors: serve the ``bundles`` tools from one model actor per GPU (each loads its
            bundle once); on a cluster without GPUs they run as tasks on their CPU path.
        derivatives: also write the standard derivatives at the end (a BIDS derivative tree,
            ``OUT/predictions``, DICOM SEG/SR for DICOM cases; docs/outputs.md).
    """

    data: str | Path | list[Case]
    task: str | TaskContract | None = None
    goal: str | None = None
    plan: str | Path | PlanSketch | None = None
    out: str | Path = "bcer_out"
    layout: str | None = None
    address: str | None = None
    max_in_flight: int | None = None
    planner: Any = None
    seed: int = 0
    limit: int | None = None
    model_dirs: tuple[str, ...] = ()
    cache: str | Path | None = None
    node_timeout_s: float | None = None
    repairer: Any = None
    bundles: dict[str, str] | None = None
    seq: dict[str, str] | None = None
    r4: bool | str = True
    memory: str | Path | None = None
    r4_llm: Any = None
    llm: Any = None
    llm_record: str | Path | None = None
    reflector: str = "tier1"
    gpu_concurrency: int | None = None
    model_actors: bool = False
    case_ids: tuple[str, ...] | list[str] | None = None
    exclude: tuple[str, ...] | list[str] | None = None
    params: dict[str, dict[str, Any]] | None = None
    derivatives: bool = True

    def cases(self) -> list[Case]:
        """The cases to run: ``case_ids`` (in their order), less ``exclude``, then ``limit``."""
        cases = (list(self.data) if isinstance(self.data, (list, tuple))
                 else load_cases(self.data, self.layout, self.seq))
        cases = select_cases(cases, self.case_ids, self.exclude)
        return cases[: self.limit] if self.limit else cases

    def config(self, planner: Any = None):
        """The CohortConfig this study runs with (its repairer pool is built by ``run``).
        ``planner``: the run's planner (``run`` passes its controller's); default: ``self.planner``
        when it is an object, else the offline planner."""
        from .agents.planners.bundles import bundle_read_roots, resolve_bundles
        from .engine.cohort import CohortConfig

        contract = _contract(self.task)
        if contract is None and self.goal is None and self.plan is None:
            raise ToolError(ErrorCode.schema, "a Study needs a task, a goal or a plan")
        bundles = resolve_bundles(self.bundles, self.model_dirs)
        if planner is None and not isinstance(self.planner, str):
            planner = self.planner
        chosen = make_planner(self.plan, planner, bundles)
        if self.params:
            from .overrides import ParamSetter, check_params

            chosen = ParamSetter(chosen, check_params(self.params))
        return CohortConfig(out=Path(self.out), planner=chosen,
                            contract=contract, goal=self.goal, max_in_flight=self.max_in_flight,
                            address=self.address, seed=self.seed,
                            model_dirs=bundle_read_roots(bundles, self.model_dirs),
                            cache=Path(self.cache) if self.cache else None, node_timeout_s=self.node_timeout_s,
                            reviewer=report_reviewer(contract, self.r4, self.memory, self.r4_llm),
                            gpu_concurrency=self.gpu_concurrency, model_server=self._model_server(bundles),
                            derivatives=self.derivatives)

    def _model_server(self, bundles: dict[str, str]) -> Any:
        """A factory of the bundle actor pool (built once Ray is up), or None."""
        if not (self.model_actors and bundles):
            return None
        from .agents.model_server import bundle_server_factory

        return bundle_server_factory(bundles, self.gpu_concurrency)

    def run(self, on_case_done: Callable[[dict], None] | None = None, hooks: Iterable = (),
            progress: bool = False, console: Any = None):
        """Run every case.

        Args:
            on_case_done: called with each case's row as it finishes.
            hooks: executor hooks (``bcer.engine.trace``).
            progress: draw a progress bar with the running nodes of each case in flight (rich:
                a terminal or a notebook); ``on_case_done`` and ``hooks`` still see every case.
            console: the ``rich.console.Console`` to draw on (default: a new one).

        Returns:
            A CohortResult (``.rows``; ``.cases`` and ``.events`` are pyarrow Tables).
        """
        from .engine.cohort import run_cohort

        cases = self.cases()
        with _controller(self.planner, self.llm, self.reflector, self.llm_record, self.address) as ctl:
            cfg = self.config(ctl.planner)
            own = self.repairer is None
            cfg.repairer = make_repairer(cfg.run_id, ctl.tiers) if own else self.repairer
            try:
                if not progress:
                    return run_cohort(cases, cfg, on_case_done=on_case_done, hooks=hooks)
                from .progress import run_with_progress

                user_done, user_hooks = on_case_done, list(hooks)

                def go(on_case_done: Callable, hooks: list):
                    return run_cohort(cases, cfg, on_case_done=_both(on_case_done, user_done),
                                      hooks=[*hooks, *user_hooks])
                return run_with_progress(go, len(cases), self.address, console)
            finally:
                if own:
                    cfg.repairer.close()


def _both(first: Callable, second: Callable | None) -> Callable:
    def call(row: dict) -> None:
        first(row)
        if second is not None:
            second(row)
    return call


def select_cases(cases: list[Case], case_ids: Iterable[str] | None = None,
                 exclude: Iterable[str] | None = None) -> list[Case]:
    """``case_ids`` in the order given (all cases when None), less ``exclude``.

    Raises:
        ToolError: ``input_missing`` for an id the dataset does not hold (near ids in the hint).
    """
    from .contracts.errors import did_you_mean

    by_id = {c.id: c for c in cases}
    for cid in [*(case_ids or ()), *(exclude or ())]:
        if cid not in by_id:
            raise ToolError(ErrorCode.input_missing, f"no case {cid!r} in the dataset ({len(cases)} cases)",
                            hint=did_you_mean(cid, by_id) or "`bcer data inspect` lists the case ids", case=cid)
    chosen = [by_id[c] for c in dict.fromkeys(case_ids)] if case_ids else list(cases)
    drop = set(exclude or ())
    return [c for c in chosen if c.id not in drop]


def _controller(planner: Any, llm: Any, reflector: str, llm_record: str | Path | None, address: str | None):
    """llm: the planner/reflector/backend of a run from specs; a planner object is used as given."""
    from .agents.specs import Controller

    spec = planner if isinstance(planner, str) or planner is None else "offline"
    ctl = Controller(spec or "offline", llm=llm, reflector_spec=reflector, llm_record=llm_record, address=address)
    if planner is not None and not isinstance(planner, str):
        ctl.planner = planner
    return ctl


def run_case(case: Case | str | Path, *, task: str | TaskContract | None = None, goal: str | None = None,
             plan: str | Path | PlanSketch | None = None, out: str | Path = "bcer_out",
             address: str | None = None, layout: str | None = None, bundles: dict[str, str] | None = None,
             model_dirs: tuple[str, ...] = (), seq: dict[str, str] | None = None, r4: bool | str = True,
             memory: str | Path | None = None, planner: Any = None, llm: Any = None,
             llm_record: str | Path | None = None, reflector: str = "tier1", cache: str | Path | None = None,
             node_timeout_s: float | None = None, params: dict[str, dict[str, Any]] | None = None,
             gpu_concurrency: int | None = None, progress: bool = False) -> "CaseResult":
    """Run one case. The keyword arguments are as for :class:`Study` and ``Study.run``.

    Returns:
        A :class:`CaseResult` (``.status``, ``.row``, ``.cases``/``.events`` tables,
        ``.to_dict()`` for the row as a plain dict).
    """
    cases = [case] if isinstance(case, Case) else load_cases(case, layout, seq)
    if len(cases) != 1:
        raise ToolError(ErrorCode.schema, f"{case} holds {len(cases)} cases; use Study for a cohort")
    result = Study(cases, task=task, goal=goal, plan=plan, out=out, address=address, max_in_flight=1,
                   bundles=bundles, model_dirs=model_dirs, r4=r4, memory=memory,
                   planner=planner, llm=llm, llm_record=llm_record, reflector=reflector,
                   cache=cache, node_timeout_s=node_timeout_s, params=params,
                   gpu_concurrency=gpu_concurrency).run(progress=progress)
    return CaseResult(result)


class CaseResult:
    """One case's result: the study's result (tables, output folder) narrowed to its one row.

    ``result["status"]`` and ``result.get(...)`` read the row, as the plain dict this used to be.
    """

    def __init__(self, cohort: Any):
        self.cohort = cohort
        self.row: dict[str, Any] = cohort.rows[0]

    status = property(lambda self: self.row["status"])
    case = property(lambda self: self.row["case"])
    ok = property(lambda self: self.row["status"] == "succeeded")
    cases = property(lambda self: self.cohort.cases, doc="pyarrow Table of the one row")
    events = property(lambda self: self.cohort.events, doc="pyarrow Table of the case's events")
    out = property(lambda self: Path(self.cohort.out) / self.row["case"], doc="the case's output folder")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.row)

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.row.get(key, default)

    def __repr__(self) -> str:
        return f"CaseResult(case={self.case!r}, status={self.status!r}, sr={self.row.get('sr')!r})"


def build_pages(out: str | Path, **options: Any):
    """Write the static HTML pages of a cohort or bench output folder under ``OUT/report``.

    Args:
        out: the output folder of ``Study.run``, ``run_case``, ``bcer cohort`` or ``bcer bench``.
        options: ``max_case_pages`` (default 500, failures first), ``case_pages`` (bool).

    Returns:
        Stats with ``.index`` (the page to open), ``.case_pages``, ``.bytes``, ``.problems``.
    """
    from .pages import build_report

    return build_report(Path(out), **options)


def plan_case(case: Case | str | Path, *, task: str | TaskContract | None = None, goal: str | None = None,
              plan: str | Path | PlanSketch | None = None, layout: str | None = None, planner: Any = None,
              bundles: dict[str, str] | None = None, model_dirs: tuple[str, ...] = (),
              seq: dict[str, str] | None = None, llm: Any = None, llm_record: str | Path | None = None,
              events: list | None = None, params: dict[str, dict[str, Any]] | None = None):
    """Plan and compile without running: returns (sketch, workflow, revisions).
    ``planner``/``llm``/``llm_record``/``params`` as for :class:`Study`; planning events (LLM calls,
    rejected plans, fallbacks) are appended to ``events`` when a list is given."""
    from .agents.planners.bundles import resolve_bundles
    from .engine.planning import plan_and_compile

    cases = [case] if isinstance(case, Case) else load_cases(case, layout, seq)
    contract = _contract(task)
    with _controller(planner, llm, "tier1", llm_record, None) as ctl:
        chosen = make_planner(plan, ctl.planner, resolve_bundles(bundles, model_dirs))
        if params:
            from .overrides import ParamSetter, check_params

            chosen = ParamSetter(chosen, check_params(params))
        try:
            return plan_and_compile(chosen, goal or (contract.goal if contract else ""), cases[0], contract)
        finally:
            pop = getattr(chosen, "pop_events", None)
            if pop is not None and events is not None:
                events.extend(pop(cases[0].id))
