"""Fault injection for the controller ablation: BCER's eight fault types, deterministic per seed.

A fault is drawn from the planner's clean sketch of a case (so it always hits something the
plan really uses) and then applied identically for every controller arm, at the layer where
such a fault arises in practice:

- **plan** faults corrupt what the planner emitted (one step's arguments); every arm gets the
  same corrupted sketch (:class:`FaultyPlanner`) and its revisions come from the same planner;
- **data** faults corrupt a copy of the case on disk (:func:`corrupt_case`); every arm reads
  the same corrupted copy;
- the **runtime** fault makes one tool call hang once (:class:`bcer.bench.hangs.HangSwitch`), in-process for
  the ReAct arms and inside the Ray worker for the engine.

=====================  ======  ============  =============================================
fault                  layer   recoverable   what is injected
=====================  ======  ============  =============================================
token_mutation         plan    yes           a reference (``@seq.*``/``@node.*``) of one step
                                             gets a typo that resolves to nothing
path_mutation          plan    yes           one case input is given as a literal file path
                                             with a slip (extension, folder, name)
argument_omission      plan    yes           one required input (port or param without
                                             default) is left out of one step
semantic_swap          plan    yes           two inputs with task-defined roles exchanged
                                             (fixed/moving, t1c/flair, adc/dwi), or the task's
                                             primary input replaced by another sequence
space_mismatch         data    yes           one input sequence re-written on another grid or
                                             orientation (world content unchanged)
missing_modality       data    no            the file of a sequence the plan reads is gone
                                             (the case still lists it)
scope_violation        data    no            a sequence file of the case is a symlink to the
                                             same sequence of another case (another patient)
timeout                runtime yes           the tool of one step hangs on its first call
=====================  ======  ============  =============================================

Why recoverable or not: the five plan/space faults and the transient hang leave the data the
task needs intact, so a controller can reach the clean result without guessing (re-deriving a
reference, resampling onto the reference grid, retrying once). A missing modality has no
correct substitute (another sequence is a different analysis) and a scope violation must
never be "repaired" into something that runs (it may be another patient's data): the only
correct outcome is a halt with a typed error (``input_missing`` / ``sandbox``) and no
deliverable.

Every injection returns a :class:`Fault` (JSON-able: what, where, before, after), which the
arms record as a ``fault_injected`` event. A fault type that cannot be expressed on a case
(nothing to swap in a one-input k-space reconstruction) raises :class:`NotApplicable`.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..contracts import Case, PlanSketch, TaskContract
from ..contracts.errors import parse_choices
from ..contracts.sequences import canonical_sequence
from ..contracts.tokens import Token, is_token, ref_name


PLAN, DATA, RUNTIME = "plan", "data", "runtime"


@dataclass(frozen=True)
class FaultClass:
    """One fault type: where it is injected, whether a correct recovery exists, and the
    typed error codes a safe halt must carry (unrecoverable faults only)."""

    name: str
    layer: str
    recoverable: bool
    halt_codes: tuple[str, ...] = ()
    why: str = ""


CATALOGUE: dict[str, FaultClass] = {f.name: f for f in (
    FaultClass("token_mutation", PLAN, True,
               why="the intended artifact exists; only the reference to it is wrong"),
    FaultClass("path_mutation", PLAN, True,
               why="the file exists under its real path; only the literal argument is wrong"),
    FaultClass("argument_omission", PLAN, True,
               why="the left-out input exists and the task determines it"),
    FaultClass("semantic_swap", PLAN, True,
               why="both artifacts exist and the task defines which goes where; no error is raised, "
                   "so only a controller that checks roles notices"),
    FaultClass("space_mismatch", DATA, True,
               why="the data is intact; resampling onto the reference grid makes it usable"),
    FaultClass("missing_modality", DATA, False, ("input_missing",),
               why="the data the task needs does not exist; any substitute is a different analysis"),
    FaultClass("scope_violation", DATA, False, ("sandbox",),
               why="reading outside the case is forbidden (it may be another patient's data); "
                   "nothing may be repaired into running"),
    FaultClass("timeout", RUNTIME, True,
               why="a transient hang (first call only): a bounded retry succeeds"),
)}
FAULT_TYPES: tuple[str, ...] = tuple(CATALOGUE)


class NotApplicable(Exception):
    """The fault type has no target in this case's plan (e.g. nothing to swap)."""


@dataclass
class Fault:
    """One injected fault (JSON-able; recorded in the trace as ``fault_injected``)."""

    type: str
    seed: int
    layer: str
    recoverable: bool
    step: str | None = None
    arg: str | None = None
    before: Any = None
    after: Any = None
    sequence: str | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))


def resolve_faults(faults: str | list[str] | tuple[str, ...]) -> list[str]:
    """``"all"``, ``"a,b"`` or a list -> fault type names, checked.

    Raises:
        ToolError: ``value_range``, naming an unknown fault type.
    """
    return parse_choices(faults, FAULT_TYPES, "fault type", "faults")


def fault_rng(fault_type: str, case_id: str, seed: int) -> random.Random:
    """The one random stream of a (fault, case, seed): injections are reproducible."""
    return random.Random(f"{fault_type}|{case_id}|{seed}")


# ---- helpers over a sketch ----------------------------------------------------------------------
def _specs(registry: Any = None) -> dict[str, Any]:
    from ..engine.compiler import resolve_registry

    return {n: r.spec for n, r in resolve_registry(registry).items()}


def _seq_token_key(case: Case, value: Any) -> str | None:
    """The case's sequence key that a ``@seq`` token means; None for anything else."""
    name = ref_name(value, "seq")
    return case.sequence_key(name) if name is not None else None


def _port_refs(sketch: PlanSketch, specs: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(step, port, token) of every input port bound to a reference, in plan order."""
    out = []
    for s in sketch.steps:
        spec = specs.get(s.tool)
        if spec is None:
            continue
        for p in spec.inputs:
            v = s.args.get(p.name)
            if (tok := Token.try_parse(v)) is not None and tok.scope in ("seq", "node"):
                out.append((s.id, p.name, v))
    return out


def consumed_sequences(sketch: PlanSketch, case: Case, registry: Any = None) -> list[str]:
    """Case sequence keys the plan reads, in order of first use."""
    keys: list[str] = []
    for _, _, tok in _port_refs(sketch, _specs(registry)):
        key = _seq_token_key(case, tok)
        if key and key not in keys:
            keys.append(key)
    return keys


def _outputs(sketch: PlanSketch, specs: dict[str, Any]) -> set[tuple[str, str]]:
    return {(s.id, p.name) for s in sketch.steps if s.tool in specs for p in specs[s.tool].outputs}


def _resolves(token: str, sketch: PlanSketch, case: Case, specs: dict[str, Any]) -> bool:
    tok = Token.try_parse(token)
    if tok is not None and tok.scope == "seq":
        return case.sequence_key(tok.name) is not None
    if tok is not None and tok.scope == "node":
        return (tok.name, tok.field) in _outputs(sketch, specs)
    return False


_NEIGHBOURS = {c: n for c, n in zip("abcdefghijklmnopqrstuvwxyz", "sqxsrdfgujmkjbpoawaryciezt")}


def typo(text: str, rng: random.Random) -> str:
    """One keyboard slip: drop, double, transpose or mistype one character."""
    if len(text) < 2:
        return text + text
    i = rng.randrange(len(text))
    op = rng.choice(("drop", "double", "transpose", "mistype"))
    if op == "drop":
        return text[:i] + text[i + 1:]
    if op == "double":
        return text[:i] + text[i] + text[i:]
    if op == "transpose":
        i = min(i, len(text) - 2)
        return text[:i] + text[i + 1] + text[i] + text[i + 2:]
    c = text[i]
    new = _NEIGHBOURS.get(c.lower(), "x")
    return text[:i] + (new.upper() if c.isupper() else new) + text[i + 1:]


# ---- plan faults ----------------------------------------------------------------------------------
def _token_mutation(sketch: PlanSketch, case: Case, contract: TaskContract | None, rng: random.Random,
                    specs: dict[str, Any]) -> Fault:
    refs = _port_refs(sketch, specs)
    if not refs:
        raise NotApplicable("no step binds a reference")
    for _ in range(50):
        step, port, tok = rng.choice(refs)
        t = Token.parse(tok)  # _port_refs keeps well-formed references only
        if t.scope == "seq" or rng.random() < 0.5:  # @node: id or field
            new = str(Token(t.scope, typo(t.name, rng), t.path))
        else:
            new = str(Token.node(t.name, typo(t.path[0], rng), *t.path[1:]))
        if Token.try_parse(new) is not None and not _resolves(new, sketch, case, specs):
            return Fault("token_mutation", 0, PLAN, True, step=step, arg=port, before=tok, after=new,
                         detail=f"{step}.{port}: {tok} -> {new}")
    raise NotApplicable("no typo of a reference that resolves to nothing")


def _mutate_path(path: str, rng: random.Random) -> str:
    p = Path(path)
    op = rng.choice(("extension", "folder", "name"))
    name = p.name
    if op == "extension":
        if name.endswith(".nii.gz"):
            return str(p.with_name(name[:-3]))  # .nii.gz -> .nii
        if p.suffix:
            return str(p.with_suffix(".hdf5" if p.suffix == ".h5" else ".nii"))
        return str(p.with_name(name + ".nii.gz"))  # a series folder written as if it were a file
    if op == "folder" and p.parent.name:
        return str(p.parent.parent / name)  # one folder level lost
    stem_end = name.find(".") if "." in name else len(name)
    return str(p.with_name(typo(name[:stem_end], rng) + name[stem_end:]))


def _path_mutation(sketch: PlanSketch, case: Case, contract: TaskContract | None, rng: random.Random,
                   specs: dict[str, Any]) -> Fault:
    from ..engine.binder import resolved_ref

    refs = [(s, p, t) for s, p, t in _port_refs(sketch, specs) if _seq_token_key(case, t)]
    if not refs:
        raise NotApplicable("no step reads a case file")
    for _ in range(50):
        step, port, tok = rng.choice(refs)
        real = resolved_ref(case, _seq_token_key(case, tok)).path
        new = _mutate_path(real, rng)
        if new != real and not os.path.exists(new):
            return Fault("path_mutation", 0, PLAN, True, step=step, arg=port, before=tok, after=new,
                         detail=f"{step}.{port}: {tok} given as the literal path {new!r} (real: {real!r})")
    raise NotApplicable("no slip of a path that names nothing")


def _argument_omission(sketch: PlanSketch, case: Case, contract: TaskContract | None, rng: random.Random,
                       specs: dict[str, Any]) -> Fault:
    """A required argument the step sets: a required input port or a param without a default.
    Optional inputs and params with defaults are not targeted: leaving one out is a different,
    valid plan (the tool runs on its default), not a fault any controller could detect."""
    options = []
    for s in sketch.steps:
        spec = specs.get(s.tool)
        if spec is None:
            continue
        ports = {p.name: p for p in spec.inputs}
        required_params = set(spec.params_schema.get("required", []))
        for arg in s.args:
            if (arg in ports and ports[arg].required) or arg in required_params:
                options.append((s.id, arg, s.args[arg]))
    if not options:
        raise NotApplicable("no step has a required argument")
    step, arg, value = rng.choice(options)
    return Fault("argument_omission", 0, PLAN, True, step=step, arg=arg, before=value, after=None,
                 detail=f"{step}: argument {arg!r} ({value!r}) left out")


ANCHOR_PORTS = ("fixed", "reference", "target", "template")


def _identity(port: str) -> str | None:
    return canonical_sequence(port)


def _semantic_swap(sketch: PlanSketch, case: Case, contract: TaskContract | None, rng: random.Random,
                   specs: dict[str, Any]) -> Fault:
    """Two same-kind inputs of a step exchanged where the task defines their roles (a port named
    after a sequence, or the anchor of a registration pair), else the contract's primary input
    of a step replaced by another sequence of the case of the same kind."""
    pairs, subs = [], []
    for s in sketch.steps:
        spec = specs.get(s.tool)
        if spec is None:
            continue
        bound = [(p, s.args[p.name]) for p in spec.inputs if is_token(s.args.get(p.name))]
        for i, (p, a) in enumerate(bound):
            for q, b in bound[i + 1:]:
                roles = _identity(p.name) or _identity(q.name) or p.name in ANCHOR_PORTS or q.name in ANCHOR_PORTS
                if p.kind == q.kind and a != b and roles:
                    pairs.append((s.id, p.name, q.name, a, b))
        primary = [canonical_sequence(x) or x for x in (contract.inputs if contract else [])]
        for p, a in bound:
            key = _seq_token_key(case, a)
            if key is None or (canonical_sequence(key) or key) not in primary or _identity(p.name):
                continue
            others = [k for k, r in case.sequences.items() if k != key and r.kind == case.sequences[key].kind
                      and (canonical_sequence(k) or k) not in primary]
            for k in others:
                subs.append((s.id, p.name, a, str(Token.seq(k))))
    if pairs:
        step, p, q, a, b = rng.choice(pairs)
        return Fault("semantic_swap", 0, PLAN, True, step=step, arg=f"{p},{q}", before=[a, b], after=[b, a],
                     detail=f"{step}: {p}={a} and {q}={b} exchanged")
    if subs:
        step, p, a, b = rng.choice(subs)
        return Fault("semantic_swap", 0, PLAN, True, step=step, arg=p, before=a, after=b,
                     detail=f"{step}.{p}: the task's input {a} replaced by {b}")
    raise NotApplicable("no two inputs with task-defined roles and no alternative sequence to confuse")


PLAN_FAULTS: dict[str, Callable[..., Fault]] = {
    "token_mutation": _token_mutation, "path_mutation": _path_mutation,
    "argument_omission": _argument_omission, "semantic_swap": _semantic_swap,
}


def draw_plan_fault(fault_type: str, sketch: PlanSketch, case: Case, contract: TaskContract | None,
                    seed: int, registry: Any = None) -> Fault:
    """The plan fault of ``fault_type`` for this (case, seed), drawn from the clean sketch.

    Raises:
        NotApplicable: nothing in the sketch to corrupt that way.
    """
    fault = PLAN_FAULTS[fault_type](sketch, case, contract, fault_rng(fault_type, case.id, seed), _specs(registry))
    fault.seed = seed
    return fault


def corrupt_sketch(sketch: PlanSketch, fault: Fault) -> PlanSketch:
    """A copy of ``sketch`` with the plan fault applied."""
    out = sketch.model_copy(deep=True)
    step = out.step(fault.step or "")
    if step is None:
        raise NotApplicable(f"step {fault.step!r} is not in the sketch")
    if fault.type == "argument_omission":
        step.args.pop(fault.arg or "", None)
    elif fault.type == "semantic_swap" and isinstance(fault.after, list):
        p, q = (fault.arg or "").split(",")
        step.args[p], step.args[q] = fault.after
    else:
        step.args[fault.arg or ""] = fault.after
    return out


class FaultyPlanner:
    """A planner whose first sketch carries one plan fault; revisions come from the wrapped
    planner unchanged (the fault is a slip of one answer, not a belief the planner keeps).

    Args:
        inner: any planner (``plan``/``revise``).
        fault_type: one of the plan faults.
        seed: injection seed.
    """

    def __init__(self, inner: Any, fault_type: str, seed: int = 0, registry: Any = None, rng_key: str | None = None):
        if CATALOGUE[fault_type].layer != PLAN:
            # a programming error: callers pick the wrapper by the fault's layer
            raise ValueError(f"{fault_type} is not a plan fault")
        self.inner, self.fault_type, self.seed, self.registry = inner, fault_type, seed, registry
        self.rng_key = rng_key  # draw as for this case id (the same fault in every arm's copy of a case)
        self.name = f"{getattr(inner, 'name', 'planner')}+{fault_type}"
        self.fault: Fault | None = None

    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        sketch = self.inner.plan(goal, case, contract)
        keyed = case.model_copy(update={"id": self.rng_key}) if self.rng_key else case
        self.fault = draw_plan_fault(self.fault_type, sketch, keyed, contract, self.seed, self.registry)
        return corrupt_sketch(sketch, self.fault)

    def revise(self, sketch: PlanSketch, errors: list, case: Case, contract: TaskContract | None = None):
        return self.inner.revise(sketch, errors, case, contract)


# ---- data faults ----------------------------------------------------------------------------------
def _copy_case(case: Case, dest: Path) -> Case:
    """A copy of the files of ``case`` under ``dest`` (the new case root), paths rewritten."""
    from ..engine.binder import resolved_ref

    root = Path(case.root).resolve()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    seqs = {}
    for key in case.sequences:
        ref = resolved_ref(case, key)
        src = Path(ref.path)
        rel = src.resolve().relative_to(root) if src.resolve().is_relative_to(root) else Path(src.name)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target)
        elif src.exists():
            shutil.copy2(src, target)
        frames = [str(dest / Path(f).resolve().relative_to(root)) for f in ref.options.get("frames", [])
                  if Path(f).resolve().is_relative_to(root)]
        for f_src, f_dst in zip(ref.options.get("frames", []), frames):
            Path(f_dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f_src, f_dst)
        options = dict(ref.options, frames=frames) if frames else dict(ref.options)
        seqs[key] = ref.model_copy(update={"path": str(target), "options": options})
    return case.model_copy(update={"root": str(dest), "sequences": seqs}, deep=True)


def _pick_sequence(fault_type: str, consumed: list[str], case: Case, contract: TaskContract | None,
                   rng: random.Random, *, avoid_reference: bool) -> str:
    if not consumed:
        raise NotApplicable("the plan reads no case sequence")
    options = list(consumed)
    if avoid_reference and contract is not None and len(options) > 1:
        ref = next((k for s in contract.inputs for k in options
                    if (canonical_sequence(k) or k) == (canonical_sequence(s) or s)), None)
        options = [k for k in options if k != ref] or options
    return rng.choice(options)


def _moved_volume(data: np.ndarray, affine: np.ndarray, rng: random.Random,
                  slices_last: bool = False) -> tuple[np.ndarray, np.ndarray, str]:
    """The same world content on another voxel grid: flipped/permuted axes, or a wider field of
    view (zero padding). Both keep the voxel lattice, so resampling back is exact. With
    ``slices_last`` (a 2-D multi-slice cine) only the in-plane axes may trade places: every
    converter stores such a stack slice-last, and the cine artifact is defined that way."""
    affine = np.asarray(affine, dtype=np.float64)
    if rng.random() < 0.5:
        axes = [0, 1, 2]
        if rng.random() < 0.5:
            i, j = (0, 1) if slices_last else rng.sample(range(3), 2)
            axes[i], axes[j] = axes[j], axes[i]
        flips = [a for a in range(3) if rng.random() < 0.5] or [rng.randrange(3)]
        moved = np.transpose(data, axes + list(range(3, data.ndim)))
        new_aff = affine.copy()
        new_aff[:3, :3] = affine[:3, :3][:, axes]
        shape = moved.shape
        for a in flips:
            moved = np.flip(moved, axis=a)
            new_aff[:3, 3] = new_aff[:3, 3] + new_aff[:3, a] * (shape[a] - 1)
            new_aff[:3, a] = -new_aff[:3, a]
        return np.ascontiguousarray(moved), new_aff, f"axes {axes} flipped {flips}"
    pads = [(rng.randint(0, 6), rng.randint(1, 6)) for _ in range(3)] + [(0, 0)] * (data.ndim - 3)
    moved = np.pad(data, pads)
    new_aff = affine.copy()
    new_aff[:3, 3] = affine[:3, 3] - affine[:3, :3] @ np.array([p[0] for p in pads[:3]], dtype=np.float64)
    return moved, new_aff, f"field of view padded {pads[:3]}"


def _space_mismatch(case: Case, key: str, rng: random.Random) -> tuple[Case, str]:
    from ..contracts.artifacts import ArtifactKind
    from ..io import load_sequence, write_nifti

    ref = case.sequences[key]
    if ref.kind not in (ArtifactKind.image, ArtifactKind.cine):
        raise NotApplicable(f"{key} is {ref.kind.value} data without an image grid")
    art = load_sequence(ref)
    data, aff, how = _moved_volume(np.asarray(art.data), np.asarray(art.affine), rng,
                                   slices_last=ref.kind is ArtifactKind.cine)
    moved = type(art)(data, aff, dict(art.meta))
    old = Path(ref.path)
    if old.is_dir():
        shutil.rmtree(old)
    elif old.exists():
        old.unlink()
    new = old.parent / (old.name.split(".")[0] + ".nii.gz")
    write_nifti(moved, new)
    seqs = dict(case.sequences)
    seqs[key] = ref.model_copy(update={"path": str(new), "format": "nifti", "options": {}})
    return case.model_copy(update={"sequences": seqs}), how


def corrupt_case(fault_type: str, case: Case, contract: TaskContract | None, consumed: list[str], dest: Path,
                 seed: int, donor: Case | list[Case] | None = None) -> tuple[Case, Fault]:
    """A corrupted copy of ``case`` under ``dest`` and the Fault describing it.

    Args:
        consumed: sequence keys the clean plan reads (the target is one of them).
        donor: other case(s) of the same task: the scope violation links to the same sequence of
            the first that has it (else to this case's own file outside the copy).

    Raises:
        NotApplicable: no target for this fault in this case.
    """
    from ..engine.binder import resolved_ref

    cls = CATALOGUE[fault_type]
    rng = fault_rng(fault_type, case.id, seed)
    key = _pick_sequence(fault_type, consumed, case, contract, rng, avoid_reference=fault_type == "space_mismatch")
    if fault_type == "space_mismatch" and case.sequences[key].kind.value not in ("image", "cine"):
        raise NotApplicable(f"{key} is {case.sequences[key].kind.value} data without an image grid")
    copy = _copy_case(case, dest)
    path = Path(copy.sequences[key].path)
    fault = Fault(fault_type, seed, DATA, cls.recoverable, sequence=key, before=str(resolved_ref(case, key).path))
    if fault_type == "space_mismatch":
        copy, how = _space_mismatch(copy, key, rng)
        fault.after, fault.detail = copy.sequences[key].path, f"{key} re-written on another grid: {how}"
    elif fault_type == "missing_modality":
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        fault.detail = f"{key} is listed but its file is gone"
    elif fault_type == "scope_violation":
        donors = [d for d in (donor if isinstance(donor, list) else [donor]) if d is not None and d.id != case.id]
        other = next((d for d in donors if d.sequence_key(key)), case)  # another patient with that sequence
        okey = other.sequence_key(key) or key
        target = Path(resolved_ref(other, okey).path).resolve()
        shutil.rmtree(path) if path.is_dir() else path.unlink()
        path.symlink_to(target, target_is_directory=target.is_dir())
        fault.after = str(target)
        fault.detail = f"{key} is a symlink to {'case ' + other.id if other is not case else 'a file'} outside the case"
    else:
        # a programming error: callers pick this function by the fault's layer
        raise ValueError(f"{fault_type} is not a data fault")
    return copy, fault


def fault_event_data(fault: Fault) -> dict[str, Any]:
    d = fault.to_dict()
    d["class"] = asdict(CATALOGUE[fault.type])
    d["time"] = time.time()
    return d


__all__ = ["CATALOGUE", "FAULT_TYPES", "Fault", "FaultClass", "FaultyPlanner", "NotApplicable",
           "consumed_sequences", "corrupt_case", "corrupt_sketch", "draw_plan_fault", "fault_rng",
           "resolve_faults", "typo"]
