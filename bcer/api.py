"""The Python API: run one case or a study, get pyarrow tables back.

>>> import bcer
>>> result = bcer.Study("data/brats", task="brain_grade", out="out").run()   # doctest: +SKIP
>>> result.cases.to_pandas()[["case", "status", "sr", "tcr"]]                # doctest: +SKIP
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Iterable

from .contracts import Case, ErrorCode, PlanSketch, TaskContract, ToolError, load_contract
from .options import StudyOptions

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


class Study:
    """A cohort run: cases (a folder or a list of Case) and the options it runs with.

    Args:
        data: dataset folder (any supported layout) or a list of ``Case``.
        options: a :class:`~bcer.options.StudyOptions` (task, goal, plan, out, planner, cache, ...;
            its docstring lists them all); None: the defaults.
        settings: any StudyOptions field by name (``task="segment_brain"``, ``out="out"``), set
            on top of ``options``.

    Raises:
        TypeError: a setting that is not a StudyOptions field.
        ToolError: ``schema``, a setting of the wrong type or out of bounds.
    """

    def __init__(self, data: str | Path | list[Case], options: StudyOptions | None = None, **settings: Any):
        self.data = data
        self.options = StudyOptions.build(options, **settings)

    def __getattr__(self, name: str) -> Any:
        # ``study.out``, ``study.task``: the settings read as they did when they were the Study's own fields
        if name != "options" and name in StudyOptions.model_fields:
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        data = f"[{len(self.data)} cases]" if isinstance(self.data, (list, tuple)) else repr(str(self.data))
        return f"Study({data}, task={self.options.task!r}, out={str(self.options.out)!r})"

    def replace(self, data: str | Path | list[Case] | None = None, **settings: Any) -> "Study":
        """A copy with other data and/or settings (checked as in the constructor)."""
        return Study(self.data if data is None else data, self.options.changed(**settings))

    def cases(self) -> list[Case]:
        """The cases to run: ``case_ids`` (in their order), less ``exclude``, then ``limit``."""
        o = self.options
        cases = (list(self.data) if isinstance(self.data, (list, tuple))
                 else load_cases(self.data, o.layout, o.seq))
        cases = select_cases(cases, o.case_ids, o.exclude)
        return cases[: o.limit] if o.limit else cases

    def config(self, planner: Any = None):
        """The CohortConfig this study runs with (its repairer pool is built by ``run``).
        ``planner``: the run's planner (``run`` passes its controller's); default: the options'
        ``planner`` when it is an object, else the offline planner."""
        from .agents.planners.bundles import bundle_read_roots, resolve_bundles
        from .engine.cohort import CohortConfig

        o = self.options
        contract = _contract(o.task)
        if contract is None and o.goal is None and o.plan is None:
            raise ToolError(ErrorCode.schema, "a Study needs a task, a goal or a plan")
        bundles = resolve_bundles(o.bundles, o.model_dirs)
        if planner is None and not isinstance(o.planner, str):
            planner = o.planner
        chosen = make_planner(o.plan, planner, bundles)
        if o.params:
            from .overrides import ParamSetter, check_params

            chosen = ParamSetter(chosen, check_params(o.params))
        return CohortConfig(out=o.out, planner=chosen,
                            contract=contract, goal=o.goal, max_in_flight=o.max_in_flight,
                            address=o.address, seed=o.seed,
                            model_dirs=bundle_read_roots(bundles, o.model_dirs),
                            cache=o.cache, node_timeout_s=o.node_timeout_s,
                            reviewer=report_reviewer(contract, o.r4, o.memory, o.r4_llm),
                            gpu_concurrency=o.gpu_concurrency, model_server=self._model_server(bundles),
                            derivatives=o.derivatives, audit=o.audit)

    def _model_server(self, bundles: dict[str, str]) -> Any:
        """A factory of the bundle actor pool (built once Ray is up), or None."""
        o = self.options
        if not (o.model_actors and bundles):
            return None
        from .agents.model_server import bundle_server_factory

        return bundle_server_factory(bundles, o.gpu_concurrency)

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

        o = self.options
        cases = self.cases()
        with _controller(o.planner, o.llm, o.reflector, o.llm_record, o.address) as ctl:
            cfg = self.config(ctl.planner)
            own = o.repairer is None
            cfg.repairer = make_repairer(cfg.run_id, ctl.tiers) if own else o.repairer
            try:
                if not progress:
                    return run_cohort(cases, cfg, on_case_done=on_case_done, hooks=hooks)
                from .progress import run_with_progress

                user_done, user_hooks = on_case_done, list(hooks)

                def go(on_case_done: Callable, hooks: list):
                    return run_cohort(cases, cfg, on_case_done=_both(on_case_done, user_done),
                                      hooks=[*hooks, *user_hooks])
                return run_with_progress(go, len(cases), o.address, console)
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


def run_case(case: Case | str | Path, options: StudyOptions | None = None, *, progress: bool = False,
             **settings: Any) -> "CaseResult":
    """Run one case.

    Args:
        case: a ``Case``, a case folder, or a dataset folder holding one case.
        options: the :class:`~bcer.options.StudyOptions` to run with; ``settings`` (any of its
            fields by name: ``task=``, ``out=``, ``cache=``, ...) are set on top.
        progress: draw a progress bar (as ``Study.run``).

    Returns:
        A :class:`CaseResult` (``.status``, ``.row``, ``.cases``/``.events`` tables,
        ``.to_dict()`` for the row as a plain dict).
    """
    opts = StudyOptions.build(options, **settings).changed(max_in_flight=1)
    cases = [case] if isinstance(case, Case) else load_cases(case, opts.layout, opts.seq)
    if len(cases) != 1:
        raise ToolError(ErrorCode.schema, f"{case} holds {len(cases)} cases; use Study for a cohort")
    return CaseResult(Study(cases, opts).run(progress=progress))


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


def plan_case(case: Case | str | Path, options: StudyOptions | None = None, *, events: list | None = None,
              **settings: Any):
    """Plan and compile without running: returns (sketch, workflow, revisions).

    ``options``/``settings`` as for :func:`run_case`; planning reads ``task``, ``goal``, ``plan``,
    ``layout``, ``seq``, ``planner``, ``llm``, ``llm_record``, ``bundles``, ``model_dirs`` and
    ``params``. Planning events (LLM calls, rejected plans, fallbacks) are appended to ``events``
    when a list is given."""
    from .agents.planners.bundles import resolve_bundles
    from .engine.planning import plan_and_compile

    o = StudyOptions.build(options, **settings)
    cases = [case] if isinstance(case, Case) else load_cases(case, o.layout, o.seq)
    contract = _contract(o.task)
    with _controller(o.planner, o.llm, "tier1", o.llm_record, None) as ctl:
        chosen = make_planner(o.plan, ctl.planner, resolve_bundles(o.bundles, o.model_dirs))
        if o.params:
            from .overrides import ParamSetter, check_params

            chosen = ParamSetter(chosen, check_params(o.params))
        try:
            return plan_and_compile(chosen, o.goal or (contract.goal if contract else ""), cases[0], contract)
        finally:
            pop = getattr(chosen, "pop_events", None)
            if pop is not None and events is not None:
                events.extend(pop(cases[0].id))
