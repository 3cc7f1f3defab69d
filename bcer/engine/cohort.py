"""Running many cases at once: bounded cases in flight, one row per case, resume by ``_DONE``.

Each case runs in a driver thread (plan → compile → ``run_case_workflow``); Ray does the
work. A failing case becomes a row with its ErrorCode and message while the others finish.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from ..contracts import Case, ErrorCode, TaskContract, ToolError
from ..contracts.sequences import canonical_sequence
from ..tools.io import write_json
from .planning import Planner, plan_and_compile, write_planner_events

log = logging.getLogger(__name__)
ROW_FILE = "result.json"


@dataclass
class CohortConfig:
    """How a cohort runs. ``goal`` defaults to the contract's goal text."""

    out: Path
    planner: Planner
    contract: TaskContract | None = None
    goal: str | None = None
    max_in_flight: int = 4
    address: str | None = None
    run_id: str = field(default_factory=lambda: time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6])
    seed: int = 0
    max_revisions: int = 2
    resume: bool = True
    model_dirs: tuple[str, ...] = ()  # read-only folders for local model bundles (sandbox)
    reviewer: Any = None  # report reviewer (R4), or a zero-argument factory called once Ray is up
    reflector_tiers: list | None = None  # llm: repair tiers of the pool (None: tier 1 only)

    @property
    def goal_text(self) -> str:
        return self.goal or (self.contract.goal if self.contract else "")


@dataclass
class CohortResult:
    out: Path
    rows: list[dict[str, Any]]
    run_id: str

    @property
    def cases(self):
        """pyarrow Table, one row per case."""
        import pyarrow as pa

        return pa.Table.from_pylist([_flat_row(r) for r in self.rows])

    @property
    def events(self):
        """pyarrow Table of every event of every case."""
        from .trace import events_table

        return events_table(sorted(self.out.glob("*/events.jsonl")))

    def summary(self) -> dict[str, Any]:
        """Counts and means; ``sr`` is delivered AND plausible, ``sr_delivered`` validators only."""
        n = len(self.rows)
        return {"cases": n, "succeeded": sum(r["status"] == "succeeded" for r in self.rows),
                "failed": sum(r["status"] not in ("succeeded",) for r in self.rows),
                "implausible": sum(r["status"] == "implausible" for r in self.rows),
                "resumed": sum(bool(r.get("resumed")) for r in self.rows),
                "sr": sum(r.get("sr") or 0 for r in self.rows) / n if n else 0.0,
                "sr_delivered": sum(_sr_delivered(r) for r in self.rows) / n if n else 0.0,
                "tcr": sum(r.get("tcr") or 0.0 for r in self.rows) / n if n else 0.0}


def _sr_delivered(row: dict[str, Any]) -> int:
    """A row's delivered-SR (rows written before plausibility existed: their ``sr``)."""
    v = row.get("sr_delivered", row.get("sr"))
    return int(v or 0)


def _flat_row(row: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in row.items() if k not in ("measurements", "deliverables", "plausibility")}
    flat["deliverables"] = json.dumps(row.get("deliverables", {}))
    flat["plausibility"] = json.dumps(row.get("plausibility", []))  # mixed value types: JSON text
    for k, v in (row.get("measurements") or {}).items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            flat[f"m_{k}"] = v
    return flat


def admit_case(case: Case, contract: TaskContract | None) -> None:
    """Reject, with a typed reason, a case the contract cannot accept (before any planning)."""
    if case.issues:
        first = case.issues[0]
        raise ToolError(first.get("code", "schema"), first.get("message", "unreadable case"), first.get("hint", ""),
                        **{k: v for k, v in first.get("context", {}).items() if k != "case"}, case=case.id)
    if contract is None:
        return
    if contract is None:
        return
    if contract.domain not in ("any", case.domain) and case.domain != "unknown":
        raise ToolError(ErrorCode.input_missing, f"task {contract.id!r} needs a {contract.domain} case, "
                        f"got a {case.domain} case", case=case.id)
    have = {canonical_sequence(s) or s for s in case.sequences}
    for seq in contract.inputs:
        options = [seq] + contract.input_alternatives.get(seq, [])
        if not any((canonical_sequence(o) or o) in have for o in options):
            raise ToolError(ErrorCode.input_missing, f"task {contract.id!r} needs sequence "
                            f"{' or '.join(options)}; case has {sorted(have)}", case=case.id)


def _error_row(case: Case, cfg: CohortConfig, err: ToolError, status: str, t0: float) -> dict[str, Any]:
    return {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
            "status": status, "sr": 0, "sr_delivered": 0, "tcr": 0.0, "plausibility": [], "error_code": err.code.value,
            "error_message": err.message, "error_node": err.context.get("node"),
            "duration_s": round(time.time() - t0, 3), "repairs": 0, "deliverables": {}, "measurements": {}}


def run_one(case: Case, cfg: CohortConfig, reflector=None, hooks: Iterable = ()) -> dict[str, Any]:
    """Plan, compile and run one case; never raises (a failure is a row)."""
    from .executor import RunContext, run_case_workflow

    t0 = time.time()
    case_dir = cfg.out / case.id
    case_dir.mkdir(parents=True, exist_ok=True)
    try:
        admit_case(case, cfg.contract)
        sketch, workflow, revisions = plan_and_compile(cfg.planner, cfg.goal_text, case, cfg.contract,
                                                       cfg.max_revisions)
    except ToolError as e:
        write_planner_events(cfg.planner, case.id, case_dir, cfg.run_id)  # llm: why no plan
        row = _error_row(case, cfg, e.with_context(case=case.id), "rejected", t0)
        write_json(row, case_dir / ROW_FILE)
        return row
    write_planner_events(cfg.planner, case.id, case_dir, cfg.run_id)  # llm: LLM calls, plan verdicts
    write_json(sketch.model_dump(mode="json"), case_dir / "plan.json")
    ctx = RunContext(run_id=cfg.run_id, output_dir=case_dir, seed=cfg.seed, read_roots=tuple(cfg.model_dirs),
                     reviewer=cfg.reviewer)
    if reflector is not None:
        reflector = reflector.for_case(case.id)
        reflector.reset.remote(case.id)  # a fresh repair budget for this run of the case
    outcome = run_case_workflow(workflow, case, ctx, contract=cfg.contract, reflector=reflector,
                                hooks=list(hooks))
    row = {"case": case.id, "task": cfg.contract.id if cfg.contract else None, "run": cfg.run_id,
           "status": outcome.status, "sr": getattr(outcome, "sr", int(outcome.status == "succeeded")),
           "sr_delivered": getattr(outcome, "sr_delivered", None),
           "tcr": getattr(outcome, "tcr", float(outcome.status == "succeeded")),
           "plausibility": list(getattr(outcome, "plausibility", [])),
           "error_code": (outcome.error or {}).get("code"), "error_message": (outcome.error or {}).get("message"),
           "error_node": (outcome.error or {}).get("node"), "duration_s": round(time.time() - t0, 3),
           "repairs": outcome.repairs, "plan_revisions": revisions, "planner": cfg.planner.name,
           "deliverables": {k: str(Path(v).relative_to(cfg.out)) if Path(v).is_absolute() else str(v)
                            for k, v in outcome.deliverables.items()},
           "measurements": outcome.measurements}
    write_json(row, case_dir / ROW_FILE)
    return row


def _resumed_row(case: Case, cfg: CohortConfig) -> dict[str, Any] | None:
    case_dir = cfg.out / case.id
    if not (cfg.resume and (case_dir / "_DONE").exists() and (case_dir / ROW_FILE).exists()):
        return None
    row = json.loads((case_dir / ROW_FILE).read_text())
    row["resumed"] = True
    return row


def run_cohort(cases: Iterable[Case], cfg: CohortConfig,
               on_case_done: Callable[[dict[str, Any]], None] | None = None,
               hooks: Iterable = ()) -> CohortResult:
    """Run every case with at most ``cfg.max_in_flight`` cases in flight.

    Cases whose folder already holds ``_DONE`` are skipped (resume) and say so in their row.
    Writes ``cohort.parquet``, ``events.parquet`` and ``dataset_description.json`` under ``cfg.out``.
    """
    from .cluster import ensure_ray

    cfg.out = Path(cfg.out).resolve()
    cfg.out.mkdir(parents=True, exist_ok=True)
    cases = list(cases)
    rows: list[dict[str, Any]] = []
    todo = []
    for case in cases:
        prev = _resumed_row(case, cfg)
        if prev is not None:
            log.info("case %s already done (_DONE present): skipped", case.id)
            rows.append(prev)
            if on_case_done:
                on_case_done(prev)
        else:
            todo.append(case)
    if todo:
        ensure_ray(cfg.address)
        from ..tools.registry import load_all

        load_all()  # before the case threads start planning
        reflector = _reflector(cfg.run_id, 2 if cfg.max_in_flight > 2 else 1, cfg.reflector_tiers)
        from .review import release_reviewer, resolve_reviewer

        factory, cfg.reviewer = cfg.reviewer, resolve_reviewer(cfg.reviewer)
        try:
            with ThreadPoolExecutor(max_workers=max(1, cfg.max_in_flight), thread_name_prefix="bcer-case") as pool:
                futures = {pool.submit(run_one, c, cfg, reflector, hooks): c for c in todo}
                for fut in as_completed(futures):
                    row = fut.result()
                    rows.append(row)
                    if on_case_done:
                        on_case_done(row)
        finally:
            _release(reflector)
            release_reviewer(cfg.reviewer)
            cfg.reviewer = factory
    order = {c.id: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order.get(r["case"], len(order)))
    result = CohortResult(cfg.out, rows, cfg.run_id)
    write_cohort_outputs(result, cfg)
    return result


def _reflector(run_id: str, size: int = 2, tiers: list | None = None):
    """A small pool shared by the cases of the cohort (tier 2 holds an LLM client).
    Named by run, so cohorts running side by side (one per task in ``bcer bench``) never share
    a repair budget for cases that have the same id."""
    from ..actors.reflector import ReflectorPool

    return ReflectorPool(size, prefix=f"bcer_reflector_{run_id}", tiers=tiers)


def _release(pool) -> None:
    import ray

    for member in getattr(pool, "members", []):
        ray.kill(member, no_restart=True)


def write_cohort_outputs(result: CohortResult, cfg: CohortConfig) -> None:
    import pyarrow.parquet as pq

    from .. import __version__

    pq.write_table(result.cases, cfg.out / "cohort.parquet")
    events = result.events
    if events.num_rows:
        pq.write_table(events, cfg.out / "events.parquet")
    write_json({
        "Name": f"bcer derivatives: {cfg.contract.id if cfg.contract else 'custom plan'}",
        "BIDSVersion": "1.9.0", "DatasetType": "derivative",
        "GeneratedBy": [{"Name": "bcer", "Version": __version__,
                         "Description": f"planner={cfg.planner.name}; goal={cfg.goal_text!r}"}],
        "bcer": {"run_id": result.run_id, "task": cfg.contract.id if cfg.contract else None,
                 "n_cases": len(result.rows), "summary": result.summary(),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }, cfg.out / "dataset_description.json")
