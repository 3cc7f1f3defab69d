"""Scripted ReAct controllers: one tool call per step, in process, errors as observations.

With the offline planner every arm of the ablation gets the same plan; a ReAct controller
replays it step by step as a ReAct agent would issue it (the planner's sketch stands in for
the agent's thoughts), so the arms differ only in the engine underneath.

What each arm does (all run the same registered tools through ``call_tool``, with the same
per-call timeout, writing deliverables with the engine's writers as soon as a step makes one):

``react``
    Arguments are literals. The agent writes each reference as the literal it stands for: a
    case file by its path (from the case listing it was shown; a name not in the listing as
    ``<case root>/<name>``), an earlier result by the handle its observation returned
    (``<out>/work/<step>.<field>``). Files are opened as given: no alias table, no sandbox.
``react_bind``
    Adds the binder: ``@seq``/``@node``/``@case``/``@runtime`` tokens are resolved by the
    engine's rules (alias table, kinds, the case sandbox on every file read); a literal path
    is accepted only if it is a file of the case.
``react_bind_ref``
    Adds the Reflector (tier 1, the engine's budgets: 2 repairs per step, 5 per case): a
    failed step goes to it first; its patch (retry with new args, insert a tool, skip) is
    applied and the step retried; its halt on ``sandbox``/``input_missing`` is final.

On an error observation every ReAct arm then does what a ReAct agent does with its planner:
it hands the typed error (code, message, hint, step, argument) to the same planner's
``revise`` (at most ``max_revisions`` times per case, like the engine's compile loop) and
re-issues the step from the revised plan; a timeout the planner cannot change is re-issued
unchanged once. When neither helps, the agent stops and the case fails with that error.
There is no compiler: nothing is checked before a step runs, and an omitted or swapped input
surfaces only when (if) a tool complains. Outputs already written stay written.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..contracts import Case, ErrorCode, PlanSketch, PlanStep, TaskContract, ToolError
from ..contracts.errors import did_you_mean
from ..contracts.tokens import Token, ref_name
from ..engine.digest import artifact_digest, canonical_json
from ..engine.trace import TraceWriter
from . import hangs as H

log = logging.getLogger(__name__)


@dataclass
class ArmOutcome:
    """One run of one arm on one case (the row of the ablation is built from this)."""

    status: str  # succeeded | failed | halted | rejected
    error: dict[str, Any] | None = None
    sr: int = 0
    tcr: float = 0.0
    validations: dict[str, tuple[bool, str]] = field(default_factory=dict)
    deliverables: dict[str, str] = field(default_factory=dict)
    repairs: int = 0
    revisions: int = 0
    retries: int = 0
    calls: int = 0
    duration_s: float = 0.0


class Memo:
    """Results of tool calls keyed by (tool, params, input digests): a call with the same
    inputs is not recomputed across the arms and faults of one case (a benchmark shortcut;
    the tools are deterministic, and a hang is injected before the memo is asked)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.hits = self.misses = 0

    @staticmethod
    def key(tool: str, params: dict[str, Any], digests: dict[str, str]) -> str:
        return canonical_json({"t": tool, "p": params, "i": digests}).decode()


@dataclass
class ReActConfig:
    bind: bool = False
    reflector: bool = False
    call_timeout_s: float = 45.0
    max_revisions: int = 2
    max_attempts_per_step: int = 4
    timeout_retries: int = 1


class _Stop(Exception):
    def __init__(self, err: ToolError, halted: bool = False):
        self.err, self.halted = err, halted


class ScriptedReAct:
    """Replays a planner's sketch one tool call at a time (see the module docstring).

    Args:
        planner: ``plan``/``revise`` (the offline planner, an LLM planner, a FaultyPlanner).
        cfg: which arm (binder, Reflector) and its limits.
        memo: shared call results (optional).
        hang_file: the armed-hangs file of a :class:`bcer.bench.faults.HangSwitch`.
    """

    def __init__(self, planner: Any, cfg: ReActConfig, memo: Memo | None = None, hang_file: str | None = None):
        self.planner, self.cfg, self.memo, self.hang_file = planner, cfg, memo, hang_file

    # ---- the run ------------------------------------------------------------------------
    def run(self, case: Case, contract: TaskContract, out_dir: str | Path, run_id: str = "react",
            goal: str | None = None, events: list[dict[str, Any]] = ()) -> ArmOutcome:
        from ..engine.compiler import resolve_registry
        from ..engine.sandbox import Sandbox

        t0 = time.time()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.case, self.contract, self.out = case, contract, out
        self.specs = {n: r.spec for n, r in resolve_registry().items()}
        self.sandbox = Sandbox(case.root, out) if self.cfg.bind else None
        self.store: dict[str, tuple[Any, str]] = {}  # handle or seq key -> (artifact, digest)
        self.results: dict[tuple[str, str], str] = {}  # (step, field) -> kind of what it made
        self.run_id = run_id
        self.milestones: list[str] = []
        self.written: dict[str, str] = {}
        self.calls: list[dict[str, Any]] = []  # every call that returned, for lineage.json
        self.lineage: dict[str, list[dict[str, Any]]] = {}
        self.outcome = ArmOutcome(status="failed")
        self.reflector = None
        if self.cfg.reflector:
            from ..agents.repair.reflector import Reflector

            self.reflector = Reflector()
        with TraceWriter(out, run_id, case.id) as trace:
            self.trace = trace
            for e in events:
                trace.emit(e["kind"], message=e.get("message"), data=e.get("data"))
            try:
                sketch = self.planner.plan(goal or contract.goal, case, contract)
            except ToolError as e:
                return self._end(ArmOutcome("rejected", e.to_dict()), t0)
            (out / "plan.json").write_text(json.dumps(sketch.model_dump(mode="json"), indent=1))
            trace.emit("planned", message=f"{len(sketch.steps)} steps")
            try:
                self._loop(sketch)
                status, err = "succeeded", None
            except _Stop as s:
                status, err = ("halted" if s.halted else "failed"), s.err.to_dict()
            self.outcome.status, self.outcome.error = status, err
            return self._end(self.outcome, t0)

    def _end(self, outcome: ArmOutcome, t0: float) -> ArmOutcome:
        from ..engine.validate import score, validate_deliverables

        checks = validate_deliverables(self.contract, self.out, self.case)
        sr, tcr = score(self.contract, self.milestones, checks)
        outcome.validations, outcome.sr, outcome.tcr = checks, sr, tcr
        if outcome.status == "succeeded" and not sr:
            bad = next((n for n, (ok, _) in checks.items() if not ok), None)
            outcome.status = "failed"
            outcome.error = {"code": ErrorCode.schema.value,
                             "message": f"deliverable {bad!r} failed validation: {checks[bad][1]}" if bad
                             else "milestones not reached"}
        implausible = self._implausible(checks)
        if implausible:  # SR is "delivered and plausible", as the engine scores it
            outcome.sr = 0
            if outcome.status == "succeeded":
                outcome.status, outcome.error = "implausible", {"code": ErrorCode.value_range.value,
                                                                "message": implausible}
        outcome.deliverables = dict(self.written)
        if self.lineage:  # what each deliverable was computed from (bench.compare.lineage reads it)
            (self.out / "lineage.json").write_text(json.dumps(
                {"deliverables": {k: {"chain": v} for k, v in self.lineage.items()}}, indent=1, default=str))
        outcome.duration_s = round(time.time() - t0, 3)
        self.trace.emit("case_finished", message=f"status={outcome.status} sr={sr} tcr={tcr:.3f}",
                        error_code=(outcome.error or {}).get("code"))
        return outcome

    def _implausible(self, checks: dict[str, tuple[bool, str]]) -> str | None:
        """The engine's plausibility checks over the written deliverables, where the engine has
        them (``bcer.engine.plausibility``); the failed checks' summary, or None."""
        if not getattr(self.contract, "plausibility", None):
            return None
        try:
            from ..engine.plausibility import failed, run_checks, summary_message
        except ImportError:
            return None
        results = run_checks(self.contract, self.case, self.out, checks)
        for r in results:
            self.trace.emit("plausibility", message=f"{r.check} on {r.deliverable}: {r.message}", data=r.to_dict())
        return summary_message(results) if failed(results) else None

    def _loop(self, sketch: PlanSketch) -> None:
        done: dict[str, str] = {}  # step id -> signature of the call that produced its outputs
        attempts: dict[str, int] = {}
        timeouts: dict[str, int] = {}
        for _ in range(256):
            step = self._next(sketch, done)
            if step is None:
                missing = [s.id for s in sketch.steps if s.id not in done]
                if missing:
                    raise _Stop(ToolError(ErrorCode.input_missing, f"steps {missing} can never run: their "
                                          "inputs name steps that did not run", node=missing[0]))
                return
            attempts[step.id] = attempts.get(step.id, 0) + 1
            try:
                self._run_step(step, attempts[step.id])
                done[step.id] = _sig(step)
            except ToolError as err:
                err.with_context(step=step.id, node=step.id, tool=step.tool)
                self.trace.emit("failed", node=step.id, tool=step.tool, attempt=attempts[step.id],
                                error_code=err.code.value, message=err.message)
                if attempts[step.id] >= self.cfg.max_attempts_per_step:
                    raise _Stop(err)
                sketch = self._on_error(sketch, step, err, timeouts)
                done = {s: sig for s, sig in done.items() if (st := sketch.step(s)) is not None and _sig(st) == sig}
        raise _Stop(ToolError(ErrorCode.internal, "step budget exhausted"))

    def _next(self, sketch: PlanSketch, done: dict[str, str]) -> PlanStep | None:
        ids = {s.id for s in sketch.steps}
        for s in sketch.steps:
            if s.id in done:
                continue
            deps = {n for v in s.args.values() if (n := ref_name(v, "node"))} | set(s.after)
            if all(d in done or d not in ids for d in deps):
                return s
        return None

    # ---- error observations -------------------------------------------------------------
    def _on_error(self, sketch: PlanSketch, step: PlanStep, err: ToolError, timeouts: dict[str, int]) -> PlanSketch:
        if self.reflector is not None:
            verdict, failure = self._reflect(sketch, step, err)
            if verdict is not None and hasattr(verdict, "inputs"):
                return self._apply_patch(sketch, step, verdict)
            if verdict is not None and _halts_at_once(failure):  # the safety halt is final
                raise _Stop(err.with_context(halt_reason=verdict.reason), halted=True)
        if self.outcome.revisions < self.cfg.max_revisions:
            try:
                revised = self.planner.revise(sketch, [err], self.case, self.contract)
            except ToolError as e:
                log.info("planner could not revise: %s", e)
                revised = None
            if revised is not None and revised.model_dump() != sketch.model_dump():
                self.outcome.revisions += 1
                self.trace.emit("plan_accepted", node=step.id, message=f"revision {self.outcome.revisions} "
                                f"after {err.code.value}")
                return revised
        if err.code is ErrorCode.timeout and timeouts.get(step.id, 0) < self.cfg.timeout_retries:
            timeouts[step.id] = timeouts.get(step.id, 0) + 1
            self.outcome.retries += 1
            self.trace.emit("retried", node=step.id, tool=step.tool, message="re-issued after a timeout")
            return sketch
        raise _Stop(err)

    def _workflow(self, sketch: PlanSketch):
        from ..contracts.workflow import Node, Workflow

        nodes, edges = [], set()
        for s in sketch.steps:
            spec = self.specs.get(s.tool)
            if spec is None:
                continue
            ports = {p.name for p in spec.inputs}
            inputs = {k: v for k, v in s.args.items() if k in ports and isinstance(v, str)}
            params = {k: v for k, v in s.args.items() if k not in ports}
            nodes.append(Node(id=s.id, tool=s.tool, version=spec.version, inputs=inputs, params=params,
                              outputs=[p.name for p in spec.outputs], resources=spec.resources.model_copy(),
                              gpu=spec.gpu, milestone=spec.milestone, after=list(s.after)))
            edges.update((n, s.id) for v in inputs.values() if (n := ref_name(v, "node")))
        ids = {n.id for n in nodes}
        return Workflow(case_id=self.case.id, task=self.contract.id, goal=sketch.goal, nodes=nodes,
                        edges=sorted(e for e in edges if e[0] in ids and e[1] in ids))

    def _reflect(self, sketch: PlanSketch, step: PlanStep, err: ToolError) -> Any:
        from ..agents.repair.reflector import Failure

        wf = self._workflow(sketch)
        try:
            node = wf.node(step.id)
        except KeyError:
            return None, None
        avail = {str(Token.seq(k)): r.kind.value for k, r in self.case.sequences.items()}
        avail.update({str(Token.node(s, f)): kind for (s, f), kind in self.results.items()})
        bound = {}
        for port, tok in node.inputs.items():
            if tok in avail:
                bound[port] = avail[tok]
        failure = Failure(case_id=self.case.id, node=node, error=err.to_dict(), attempt=1, available=avail,
                          bound_kinds=bound, has_gpu=False)
        return self.reflector.repair(failure, wf, self.case, self.contract), failure

    def _apply_patch(self, sketch: PlanSketch, step: PlanStep, patch: Any) -> PlanSketch:
        sketch = sketch.model_copy(deep=True)
        target = sketch.step(step.id)
        self.outcome.repairs += 1
        self.trace.emit("repaired", node=step.id, tool=step.tool, patch=patch.model_dump(mode="json"),
                        message=patch.reason)
        if patch.action == "skip":
            sketch.steps = [s for s in sketch.steps if s.id != step.id]
            return sketch
        if patch.action == "insert" and patch.insert is not None:
            new = patch.insert
            sketch.steps.insert(sketch.steps.index(target),
                                PlanStep(id=new.id, tool=new.tool, args={**new.inputs, **new.params},
                                         why=f"inserted by repair of {step.id}"))
        target.args = {**patch.inputs, **patch.params}
        return sketch

    # ---- one call -----------------------------------------------------------------------
    def _run_step(self, step: PlanStep, attempt: int) -> None:
        from ..engine.binder import resolve_params, runtime_values
        from ..tools.registry import get_tool

        reg = get_tool(step.tool)
        ports = {p.name for p in reg.spec.inputs}
        unknown_ports = [k for k, v in step.args.items() if k in ports and not isinstance(v, str)]
        if unknown_ports:
            raise ToolError(ErrorCode.schema, f"input {unknown_ports[0]!r} is not a reference", arg=unknown_ports[0])
        runtime = runtime_values(self.out, "cpu", 0, self.run_id)
        raw_params = {k: v for k, v in step.args.items() if k not in ports}
        params = resolve_params(raw_params, self.case, runtime)
        if self.sandbox is not None:
            params = self.sandbox.check_args(params, reg.params_model)
        inputs, digests = {}, {}
        for port, value in step.args.items():
            if port in ports:
                art, dig = self._bind_input(port, value)
                inputs[port], digests[port] = art, dig
        self.trace.emit("started", node=step.id, tool=step.tool, attempt=attempt)
        t0 = time.time()
        result = self._call(step, reg, inputs, params, digests)
        self.outcome.calls += 1
        self.trace.emit("succeeded", node=step.id, tool=step.tool, attempt=attempt, duration_s=time.time() - t0)
        made = {}
        for p in reg.spec.outputs:
            art = result[p.name]
            made[p.name] = artifact_digest(art)
            self.store[str(self.out / "work" / f"{step.id}.{p.name}")] = (art, made[p.name])
            self.results[(step.id, p.name)] = p.kind.value
        self.calls.append({"node": step.id, "tool": step.tool, "params": _full_params(step.tool, params),
                           "input_digests": dict(digests), "output_digests": made})
        if reg.spec.milestone and reg.spec.milestone not in self.milestones:
            self.milestones.append(reg.spec.milestone)
        self._write_deliverables(step, result)

    def _call(self, step: PlanStep, reg: Any, inputs: dict[str, Any], params: dict[str, Any],
              digests: dict[str, str]) -> dict[str, Any]:
        from ..tools.registry import call_tool, validate_params

        cancel = threading.Event()
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                if H.should_hang(self.case.id, step.id, self.hang_file):
                    H.hang(cancel)
                    if cancel.is_set():
                        return
                key = None
                if self.memo is not None:
                    p = validate_params(step.tool, params).model_dump(mode="json")
                    key = Memo.key(step.tool, p, digests)
                    if key in self.memo.data:
                        self.memo.hits += 1
                        box["value"] = self.memo.data[key]
                        return
                    self.memo.misses += 1
                try:
                    value: Any = call_tool(step.tool, inputs, params, device="cpu")
                except ToolError as e:
                    value = e
                if key is not None:
                    self.memo.data[key] = value
                box["value"] = value
            except BaseException as e:  # noqa: BLE001 - reported as the step's error
                box["value"] = ToolError(ErrorCode.internal, f"{type(e).__name__}: {e}")

        th = threading.Thread(target=work, daemon=True, name=f"react-{step.id}")
        th.start()
        th.join(self.cfg.call_timeout_s)
        if th.is_alive():
            cancel.set()
            raise ToolError(ErrorCode.timeout, f"{step.tool} did not answer within {self.cfg.call_timeout_s:.0f} s",
                            hint="retry, or check the tool", tool=step.tool)
        value = box.get("value")
        if isinstance(value, ToolError):
            raise ToolError(value.code, value.message, value.hint, **value.context)
        return value

    # ---- inputs: literals (react) or tokens through the binder --------------------------
    def _bind_input(self, port: str, value: str) -> tuple[Any, str]:
        if not self.cfg.bind:
            return self._open_literal(port, self._render(value))
        if isinstance(value, str) and value.startswith("@"):
            return self._bind_token(port, value)
        return self._bind_literal(port, value)

    def _render(self, value: str) -> str:
        """What a ReAct agent writes for a reference: the path/handle it stands for."""
        tok = Token.try_parse(value)
        if tok is not None and tok.scope == "seq":
            if tok.name in self.case.sequences:
                from ..engine.binder import resolved_ref

                return resolved_ref(self.case, tok.name).path
            return str(Path(self.case.root) / tok.name)
        if tok is not None and tok.scope == "node":
            return str(self.out / "work" / f"{tok.name}.{tok.field}")
        return value

    def _open_literal(self, port: str, path: str) -> tuple[Any, str]:
        """react: open what the agent wrote, as it wrote it (no alias table, no sandbox)."""
        if path in self.store:
            return self.store[path]
        from ..engine.binder import resolved_ref

        for key in self.case.sequences:
            ref = resolved_ref(self.case, key)
            if ref.path == path:
                return self._load(key, ref, port)
        if Path(path).exists():
            raise ToolError(ErrorCode.schema, f"{path} is not a file the tools can read as an input",
                            arg=port, file=path)
        raise ToolError(ErrorCode.input_missing, f"no such file or result: {path}", arg=port, file=path)

    def _load(self, key: str, ref: Any, port: str) -> tuple[Any, str]:
        from ..io import load_sequence

        if key in self.store:
            return self.store[key]
        if not Path(ref.path).exists():
            raise ToolError(ErrorCode.input_missing, f"file not found: {ref.path}", arg=port, file=ref.path)
        try:
            art = load_sequence(ref)
        except ToolError as e:
            raise e.with_context(arg=port)
        except (OSError, ValueError) as e:
            code = ErrorCode.input_missing if isinstance(e, FileNotFoundError) else ErrorCode.schema
            raise ToolError(code, f"cannot read {ref.path}: {type(e).__name__}: {e}", arg=port, file=ref.path) from e
        self.store[key] = (art, artifact_digest(art))
        return self.store[key]

    def _bind_token(self, port: str, token: str) -> tuple[Any, str]:
        """react_bind: the engine's binding rules for one input token."""
        from ..engine.binder import resolved_ref, sequence_key
        from ..engine.tokens import parse_token

        tok = parse_token(token)
        if tok.scope == "seq":
            key = sequence_key(self.case, tok.name)
            if key is None:
                raise ToolError(ErrorCode.bad_reference, f"case {self.case.id} has no sequence {tok.name!r}",
                                did_you_mean(tok.name, self.case.sequences), arg=port, token=token)
            ref = resolved_ref(self.case, key)
            self.sandbox.check_read(ref.path, arg=port)
            if not Path(ref.path).exists():
                raise ToolError(ErrorCode.input_missing, f"sequence {key} of case {self.case.id} is listed but "
                                f"{ref.path} does not exist", arg=port, file=ref.path)
            return self._load(key, ref, port)
        if tok.scope == "node":
            handle = str(self.out / "work" / f"{tok.name}.{tok.field}")
            if handle in self.store and len(tok.path) == 1:
                return self.store[handle]
            made = sorted("@node." + h.rsplit("/", 1)[-1] for h in self.store if "/work/" in h)
            raise ToolError(ErrorCode.bad_reference, f"{token} names no result of an earlier step",
                            did_you_mean(token, made), arg=port, token=token)
        raise ToolError(ErrorCode.bad_reference, f"input {port!r} needs an artifact, not {token}", arg=port,
                        token=token)

    def _bind_literal(self, port: str, path: str) -> tuple[Any, str]:
        """react_bind: a literal path is accepted only inside the case and only if it is one of
        the case's files (then it binds like its ``@seq`` token)."""
        from ..engine.binder import resolved_ref

        if not isinstance(path, str):
            raise ToolError(ErrorCode.schema, f"input {port!r} takes a reference, got {path!r}", arg=port)
        real = self.sandbox.check_read(path, arg=port)
        for key in self.case.sequences:
            if Path(resolved_ref(self.case, key).path).resolve() == real:
                return self._bind_token(port, str(Token.seq(key)))
        raise ToolError(ErrorCode.bad_reference, f"{path} is not a file of case {self.case.id}",
                        f"case inputs: {sorted(str(Token.seq(k)) for k in self.case.sequences)}", arg=port, file=path)

    # ---- deliverables ---------------------------------------------------------------------
    def _write_deliverables(self, step: PlanStep, result: dict[str, Any]) -> None:
        from ..contracts.artifacts import kind_of
        from ..engine import outputs as out

        spec = self.specs[step.tool]
        for d in self.contract.deliverables:
            if spec.milestone != d.milestone:
                continue
            ports = [p for p in spec.outputs if p.kind == d.kind]
            if not ports:
                continue
            port = next((p for p in ports if p.name == d.field), ports[0])
            art = result[port.name]
            name = d.file if Path(d.file).suffix else out.default_file(d.file, kind_of(art))
            files = out.write_artifact(art, self.out / name)
            self.written[d.name] = str(files[0])
            self.lineage[d.name] = _ancestry(self.calls)
            self.trace.emit("deliverable", node=step.id, tool=step.tool, message=files[0].name)


def _full_params(tool: str, params: dict[str, Any]) -> dict[str, Any]:
    """Params with the tool's defaults filled in (as the engine's provenance records them)."""
    from ..tools.registry import validate_params

    try:
        return validate_params(tool, params).model_dump(mode="json")
    except ToolError:
        return dict(params)


def _ancestry(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last call and every earlier call whose outputs it (transitively) consumed, in call order."""
    need = set(calls[-1]["input_digests"].values())
    chain = [calls[-1]]
    for c in reversed(calls[:-1]):
        if need & set(c["output_digests"].values()):
            chain.append(c)
            need |= set(c["input_digests"].values())
    return chain[::-1]


def _sig(step: PlanStep) -> str:
    return json.dumps({"tool": step.tool, "args": step.args}, sort_keys=True, default=str)


def _halts_at_once(failure: Any) -> bool:
    from ..agents.repair.reflector import halts_at_once

    return failure is not None and halts_at_once(failure)


__all__ = ["ArmOutcome", "Memo", "ReActConfig", "ScriptedReAct"]
