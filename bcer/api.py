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


def load_cases(path: str | Path, layout: str | None = None) -> list[Case]:
    """Cases of a dataset folder (layout detected or named), or the one case a case folder holds."""
    from .datasets import read_dataset
    from .datasets.layouts import detect_layout

    path = Path(path)
    if not path.exists():
        raise ToolError(ErrorCode.input_missing, f"no such file or folder: {path}", file=str(path))
    try:
        return read_dataset(path, layout)
    except ToolError as err:
        if layout is None and path.is_dir() and path.parent != path:
            try:
                parent_layout = detect_layout(path.parent)
            except ToolError:
                raise err from None
            cases = [c for c in read_dataset(path.parent, parent_layout)
                     if Path(c.root).resolve() == path.resolve() or c.id == path.name]
            if cases:
                return cases
        raise


def make_planner(plan: str | Path | PlanSketch | None = None, planner: Any = None):
    """A sketch file/object replays as a StaticPlanner; otherwise the given or default planner."""
    from .engine.planning import StaticPlanner

    if planner is not None:
        return planner
    if isinstance(plan, PlanSketch):
        return StaticPlanner(plan)
    if plan is not None:
        return StaticPlanner.from_file(plan)
    from .actors.brain import OfflineBrain

    return OfflineBrain()


def _contract(task: str | TaskContract | None) -> TaskContract | None:
    if task is None or isinstance(task, TaskContract):
        return task
    return load_contract(task)


def make_repairer(run_id: str) -> Any:
    """THE repairer pool of one run (Reflector actors, started on first failure)."""
    from .actors.reflector import reflector_pool

    return reflector_pool(run_id)


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

    def cases(self) -> list[Case]:
        cases = list(self.data) if isinstance(self.data, (list, tuple)) else load_cases(self.data, self.layout)
        return cases[: self.limit] if self.limit else cases

    def config(self):
        """The CohortConfig this study runs with (its repairer pool is built by ``run``)."""
        from .engine.cohort import CohortConfig

        contract = _contract(self.task)
        if contract is None and self.goal is None and self.plan is None:
            raise ToolError(ErrorCode.schema, "a Study needs a task, a goal or a plan")
        return CohortConfig(out=Path(self.out), planner=make_planner(self.plan, self.planner),
                            contract=contract, goal=self.goal, max_in_flight=self.max_in_flight,
                            address=self.address, seed=self.seed, model_dirs=tuple(map(str, self.model_dirs)),
                            cache=Path(self.cache) if self.cache else None, node_timeout_s=self.node_timeout_s)

    def run(self, on_case_done: Callable[[dict], None] | None = None, hooks: Iterable = ()):
        """Run every case; returns a CohortResult (``.cases`` and ``.events`` are pyarrow Tables)."""
        from .engine.cohort import run_cohort

        cfg = self.config()
        own = self.repairer is None
        cfg.repairer = make_repairer(cfg.run_id) if own else self.repairer
        try:
            return run_cohort(self.cases(), cfg, on_case_done=on_case_done, hooks=hooks)
        finally:
            if own:
                cfg.repairer.close()


def run_case(case: Case | str | Path, *, task: str | TaskContract | None = None, goal: str | None = None,
             plan: str | Path | PlanSketch | None = None, out: str | Path = "bcer_out",
             address: str | None = None, layout: str | None = None, cache: str | Path | None = None,
             node_timeout_s: float | None = None) -> dict[str, Any]:
    """Run one case; returns its row (status, sr, tcr, deliverables, measurements, error)."""
    cases = [case] if isinstance(case, Case) else load_cases(case, layout)
    if len(cases) != 1:
        raise ToolError(ErrorCode.schema, f"{case} holds {len(cases)} cases; use Study for a cohort")
    result = Study(cases, task=task, goal=goal, plan=plan, out=out, address=address, max_in_flight=1,
                   cache=cache, node_timeout_s=node_timeout_s).run()
    return result.rows[0]


def plan_case(case: Case | str | Path, *, task: str | TaskContract | None = None, goal: str | None = None,
              plan: str | Path | PlanSketch | None = None, layout: str | None = None, planner: Any = None):
    """Plan and compile without running: returns (sketch, workflow, revisions)."""
    from .engine.planning import plan_and_compile

    cases = [case] if isinstance(case, Case) else load_cases(case, layout)
    contract = _contract(task)
    return plan_and_compile(make_planner(plan, planner), goal or (contract.goal if contract else ""),
                            cases[0], contract)
