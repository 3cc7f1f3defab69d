"""The offline planner: the default planner. Deterministic, no model.

It reads the goal text, the case's sequences and metadata, and (when given) the task
contract, and emits a :class:`PlanSketch` by chaining *registered* tools backwards by port
kinds, from each wanted deliverable to the case's available inputs:

1. **What is wanted.** With a contract: its deliverables (kind + milestone), then every
   contract milestone no deliverable covers. Without one: milestones read from goal
   keywords ("grade this glioma" -> classification, "HGG or LGG?" -> classification,
   "segment the tumour" -> segmentation, ...).
2. **How to get it.** A wanted artifact is made by a tool whose ``spec.milestone`` and
   output kind match; each required input port is, recursively, a case sequence of its
   kind or the output of another tool. Ports named after a sequence (``t1c``, ``adc``,
   ``cine``) take that sequence (through ``canonical_sequence``), or, when the case lacks
   it, a kind-changing derivation (cine k-space -> reconstructed cine). The chain with the
   fewest new steps wins; steps already planned are shared, not repeated.
3. **Finishing touches.** Optional ports are bound when the plan or the case holds an
   artifact of the same name (``transform``, ``zones``, ``phases``, ``t2w``); a tool
   without required inputs (a report) gathers every artifact of its port kinds. Params
   named after case metadata (``height_cm`` <- ``@case.height``, ``spacing`` <- the
   case's ``target_spacing`` for that sequence) are bound.

Nothing is per task: a newly registered tool with new ports makes new plans possible.
A goal the case cannot support (a glioma grade asked of a cardiac cine) raises a typed
``ToolError`` naming what is missing, never a wrong plan.
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...contracts import ArtifactKind, Case, ErrorCode, PlanSketch, PlanStep, TaskContract, ToolError, ToolSpec
from ...contracts.sequences import canonical_sequence
from ...contracts.tokens import Token, ref_name

log = logging.getLogger(__name__)

MAX_DEPTH = 5
# Generic ports that name the reference grid of a pair: they take the preferred sequence.
ANCHOR_PORTS = ("fixed", "reference", "target", "template")
MILESTONE_WORDS: dict[str, tuple[str, ...]] = {
    "reconstruction": ("reconstruct", "recon ", "k-space", "kspace", "undersampled", "raw data"),
    "denoising": ("denois", "noise", "noisy"),
    "super_resolution": ("super-res", "superres", "super res", "upsampl", "resolution", "spacing",
                         "thin slice", "thin-slice", "isotropic"),
    "registration": ("regist", "align"),
    "bias_correction": ("bias", " n4", "inhomogeneit"),
    "segmentation": ("segment", "delineat", "contour", "label map", "outline"),
    "phase_detection": ("ed/es", "end-diastol", "end-systol", "end diastol", "end systol", "cardiac phase"),
    "quantification": ("quantif", "measur", "volume", "feature", "ejection", " ef ", "lvef",
                       "function", "radiomic"),
    "detection": ("detect", "lesion", "finding"),
    "classification": ("classif", "grade", "grading", "hgg", "lgg", "pi-rads", "pirads", "diagnos",
                       "pathology", "acdc group", "categor"),
    "report": ("report", "summar", "write-up", "write up"),
    "qa": ("overlay", "montage", "snapshot", "quality control"),
}
DOMAIN_WORDS: dict[str, tuple[str, ...]] = {
    "brain": ("brain", "glioma", "tumour", "tumor", "hgg", "lgg", "brats", "glioblastoma"),
    "cardiac": ("cardiac", "heart", "ventric", "ejection", "lvef", "myocard", "acdc"),
    "prostate": ("prostate", "pi-rads", "pirads", "psa"),
}
_STOP = {"the", "and", "this", "that", "with", "from", "into", "onto", "for", "its", "then", "each",
         "image", "images", "volume", "volumes", "input", "output", "case", "tool", "given", "per"}


def _words(text: str) -> set[str]:
    text = text.lower().replace("pi-rads", "pirads").replace("k-space", "kspace")
    return {w for w in re.findall(r"[a-z][a-z0-9]+", text) if len(w) >= 3 and w not in _STOP}


def _related(a: str, b: str) -> bool:
    """Same word up to an inflection ("grade"/"grading", "tumour"/"tumor")."""
    n = min(len(a), len(b), 5)
    return n >= 3 and a[:n] == b[:n]


def _says(text: str, word: str) -> bool:
    """``word`` starts a word of ``text`` ("upsample" does not say "psa"); a trailing space
    in ``word`` asks for the whole word ("ef " is not "efficient")."""
    pat = r"(?<![a-z0-9])" + re.escape(word.strip()) + (r"(?![a-z0-9])" if word.endswith(" ") else "")
    return re.search(pat, text) is not None


def goal_milestones(goal: str) -> list[str]:
    """Milestones a goal text asks for, in the order of :data:`MILESTONE_WORDS`."""
    text = goal.lower()
    return [m for m, words in MILESTONE_WORDS.items() if any(_says(text, w) for w in words)]


def goal_domain(goal: str) -> str | None:
    """The one domain the goal names, or None (none or several)."""
    text = goal.lower()
    hits = [d for d, words in DOMAIN_WORDS.items() if any(_says(text, w) for w in words)]
    return hits[0] if len(hits) == 1 else None


def tool_domains(spec: ToolSpec) -> set[str]:
    """Domains a tool's name ties it to (``seg.cardiac`` -> cardiac); empty: any domain."""
    tokens = re.split(r"[._]", spec.name.lower())
    return {d for d, words in DOMAIN_WORDS.items() if any(_related(t, w.strip()) for t in tokens for w in words)}


@dataclass(frozen=True)
class _Opt:
    """One way to obtain an artifact: a case sequence, or a tool over sub-options."""

    kind: ArtifactKind
    identity: str | None  # canonical sequence this artifact is (a version of); None: derived
    seq: str | None = None  # case sequence key
    tool: str | None = None
    inputs: tuple[tuple[str, "_Opt"], ...] = ()
    field: str = ""

    @property
    def sig(self) -> tuple:
        if self.seq is not None:
            return ("seq", self.seq)
        return ("tool", self.tool, tuple((p, o.sig) for p, o in self.inputs))

    def tool_sigs(self) -> set[tuple]:
        if self.tool is None:
            return set()
        out = {self.sig}
        for _, o in self.inputs:
            out |= o.tool_sigs()
        return out


@dataclass
class _Builder:
    """Plan state for one sketch: steps, their signatures, and what the search knows."""

    case: Case
    contract: TaskContract | None
    goal: str
    specs: dict[str, ToolSpec]
    steps: list[PlanStep] = field(default_factory=list)
    by_sig: dict[tuple, str] = field(default_factory=dict)
    why_not: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.goal_words = _words(self.goal)
        self.canon = {k: canonical_sequence(k) or k for k in self.case.sequences}
        order: list[str] = []
        if self.contract is not None:
            for s in self.contract.inputs:
                order += [s] + list(self.contract.input_alternatives.get(s, []))
        order = [canonical_sequence(s) or s for s in order] + list(self.canon.values())
        self.pref = {c: i for i, c in reversed(list(enumerate(order)))}
        self.allowed_order = list(self.contract.allowed_tools) if self.contract else []

    # ---- ranking ------------------------------------------------------------------------
    def _tool_rank(self, spec: ToolSpec) -> tuple:
        name_words = set(re.split(r"[._]", spec.name.lower()))
        desc_words = _words(spec.description)
        score = 2 * sum(any(_related(g, t) for t in name_words) for g in self.goal_words)
        score += sum(any(_related(g, t) for t in desc_words) for g in self.goal_words if len(g) >= 4)
        idx = next((i for i, pat in enumerate(self.allowed_order)
                    if spec.name == pat or (pat.endswith(".*") and spec.name.startswith(pat[:-1]))),
                   len(self.allowed_order))
        return (-score, idx, spec.name)

    def _cost(self, opt: _Opt) -> int:
        return len(opt.tool_sigs() - set(self.by_sig))

    def producers(self, kind: ArtifactKind | None, milestone: str | None) -> list[ToolSpec]:
        out = [s for s in self.specs.values()
               if (milestone is None or s.milestone == milestone)
               and (kind is None or any(p.kind == kind for p in s.outputs))]
        return sorted(out, key=self._tool_rank)

    # ---- search -------------------------------------------------------------------------
    def _seq_options(self, kind: ArtifactKind, identity: str | None, exclude: set[str]) -> list[_Opt]:
        keys = [k for k, ref in self.case.sequences.items() if ref.kind == kind
                and (identity is None or self.canon[k] == identity) and self.canon[k] not in exclude]
        keys.sort(key=lambda k: self.pref.get(self.canon[k], len(self.pref)))
        return [_Opt(kind, self.canon[k], seq=k) for k in keys]

    def resolve(self, kind: ArtifactKind | None, port: str | None, identity: str | None,
                milestone: str | None = None, prefer_field: str | None = None, depth: int = 0,
                visiting: frozenset[str] = frozenset(), exclude: frozenset[str] = frozenset()) -> _Opt | None:
        """Cheapest way to an artifact of ``kind`` (any kind when None) for ``port``."""
        if milestone is None and kind is not None:
            seqs = self._seq_options(kind, identity, set(exclude))
            if seqs:  # a sequence costs nothing: no tool chain can beat it
                return seqs[0]
        if depth >= MAX_DEPTH:
            return None
        options = []
        for spec in self.producers(kind, milestone):
            if spec.name in visiting:
                continue
            opt = self._tool_option(spec, kind, port, identity, prefer_field, depth, visiting | {spec.name})
            if opt is not None:
                options.append(opt)
        if not options:
            return None
        return min(options, key=lambda o: (self._cost(o), options.index(o)))

    def _tool_option(self, spec: ToolSpec, kind: ArtifactKind | None, port: str | None, identity: str | None,
                     prefer_field: str | None, depth: int, visiting: frozenset[str]) -> _Opt | None:
        outs = [p for p in spec.outputs if kind is None or p.kind == kind]
        out = next((p for p in outs if p.name in (port, prefer_field)), outs[0])
        used: set[str] = set()
        inputs: list[tuple[str, _Opt]] = []
        if spec.inputs and not any(p.required for p in spec.inputs):
            return self._gatherer_option(spec, out, depth, visiting)
        ordered = sorted((p for p in spec.inputs if p.required), key=lambda p: p.name not in ANCHOR_PORTS)
        for p in ordered:
            canon = canonical_sequence(p.name)
            want = canon if canon else (identity if p.kind == out.kind else None)
            sub = self.resolve(p.kind, p.name, want, depth=depth + 1, visiting=visiting,
                               exclude=frozenset(used) if not canon else frozenset())
            if sub is None and canon and canon not in self.canon.values():
                sub = self.resolve(p.kind, p.name, None, depth=depth + 1, visiting=visiting, exclude=frozenset(used))
                sub = sub if sub is not None and sub.identity is None else None  # derived, never another sequence
            if sub is None:
                self.why_not.append(f"{spec.name} needs {p.name} ({p.kind.value})")
                return None
            if sub.identity:
                used.add(sub.identity)
            inputs.append((p.name, sub))
        inputs.sort(key=lambda x: [q.name for q in spec.inputs].index(x[0]))
        same = [o for n, o in inputs if o.kind == out.kind]
        ident = same[0].identity if same else None
        if identity is not None and ident != identity and not (ident is None and identity not in self.canon.values()):
            return None
        return _Opt(out.kind, ident, tool=spec.name, inputs=tuple(inputs), field=out.name)

    def _gatherer_option(self, spec: ToolSpec, out: Any, depth: int, visiting: frozenset[str]) -> _Opt | None:
        """A tool whose inputs are all optional (a report, a classifier taking either of two
        inputs) needs at least one: the cheapest to obtain; the rest are bound later if planned."""
        subs = []
        for p in spec.inputs:
            canon = canonical_sequence(p.name)
            sub = self.resolve(p.kind, p.name, canon, depth=depth + 1, visiting=visiting)
            if sub is not None:
                subs.append((self._cost(sub), len(subs), p.name, sub))
        if not subs:
            self.why_not.append(f"{spec.name} needs one of {[p.name for p in spec.inputs]}")
            return None
        _, _, name, sub = min(subs, key=lambda x: x[:2])
        return _Opt(out.kind, None, tool=spec.name, inputs=((name, sub),), field=out.name)

    # ---- materialising ------------------------------------------------------------------
    def _new_id(self, tool: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", tool)
        taken = {s.id for s in self.steps}
        sid, i = base, 2
        while sid in taken:
            sid, i = f"{base}_{i}", i + 1
        return sid

    def token(self, opt: _Opt, why: str) -> str:
        """Add the steps of ``opt`` (sharing planned ones); the token that names its artifact."""
        if opt.seq is not None:
            return str(Token.seq(opt.seq))
        sid = self.by_sig.get(opt.sig)
        if sid is None:
            args = {p: self.token(o, f"{p} of {opt.tool}") for p, o in opt.inputs}
            sid = self._new_id(opt.tool)
            self.steps.append(PlanStep(id=sid, tool=opt.tool, args=args, why=why))
            self.by_sig[opt.sig] = sid
        return str(Token.node(sid, opt.field))

    def adopt(self, sketch: PlanSketch) -> None:
        """Start from an existing sketch (revision): its steps are shared by signature."""
        for step in sketch.steps:
            if step.tool not in self.specs:
                continue
            self.steps.append(step.model_copy(deep=True))
            self.by_sig[self._sig_of(step)] = step.id

    def _sig_of(self, step: PlanStep) -> tuple:
        spec = self.specs[step.tool]
        ins = []
        for p in spec.inputs:
            tok = step.args.get(p.name)
            if p.required and isinstance(tok, str):
                ins.append((p.name, self._sig_of_token(tok)))
        return ("tool", step.tool, tuple(ins))

    def _sig_of_token(self, tok: str) -> tuple:
        ref = Token.try_parse(tok)
        if ref is None or ref.scope not in ("seq", "node"):  # a literal (e.g. a path): no producer
            return ("?", tok)
        if ref.scope == "seq":
            return ("seq", ref.name)
        step = next((s for s in self.steps if s.id == ref.name), None)
        return self._sig_of(step) if step is not None and step.tool in self.specs else ("?", tok)


def _registry(registry: Mapping[str, Any] | None) -> dict[str, ToolSpec]:
    if registry is None:
        from ...tools.registry import REGISTRY, load_all

        load_all()
        registry = REGISTRY
    return {name: getattr(reg, "spec", reg) for name, reg in registry.items()}


def _plannable(spec: ToolSpec) -> bool:
    """Tools a plan can use unaided: no required param (io.* need a path) and a milestone."""
    return spec.milestone is not None and not spec.params_schema.get("required")


def plannable_tools(case: Case, contract: TaskContract | None = None,
                    registry: Mapping[str, Any] | None = None) -> dict[str, ToolSpec]:
    """Tools a planner may put in a plan for this case: plannable, allowed by the contract, and
    of the case's domain (or domain-free). Shared by the offline and the LLM planner."""
    return {n: s for n, s in _registry(registry).items()
            if _plannable(s) and (contract is None or contract.allows(n))
            and (case.domain in ("unknown", "") or not tool_domains(s) or case.domain in tool_domains(s))}


class OfflinePlanner:
    """The default planner (``name = "offline"``): backward chaining over ToolSpecs.

    Args:
        registry: ``{tool name: RegisteredTool or ToolSpec}``; default: every registered tool.

    >>> brain = OfflinePlanner()
    >>> sketch = brain.plan("grade this glioma", case)          # doctest: +SKIP
    >>> [s.tool for s in sketch.steps]                          # doctest: +SKIP
    ['seg.brain_tumor', 'classify.glioma_grade']
    """

    name = "offline"
    deterministic = True  # same goal, contract and case signature -> same plan (the engine reuses it)

    def __init__(self, registry: Mapping[str, Any] | None = None):
        self._registry = registry

    # ---- public -------------------------------------------------------------------------
    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        """A sketch reaching every wanted deliverable/milestone from the case's inputs.

        Raises:
            ToolError: ``input_missing`` when the case cannot support the goal (wrong
                domain, missing sequence, no tool chain), ``schema`` when the goal names
                nothing plannable.
        """
        b = self._builder(goal, case, contract)
        self._check_domain(goal, case, contract)
        for kind, milestone, name, fld in self._wanted(goal, contract, b):
            self._add(b, kind, milestone, name, fld)
        return self._finish(b, goal, case, contract)

    def revise(self, sketch: PlanSketch, errors: list[ToolError], case: Case,
               contract: TaskContract | None = None) -> PlanSketch | None:
        """Fix what the compiler (or a tool, as an observation) reported: drop bad args (the
        compiler refills param defaults), drop steps with unknown/disallowed tools, re-derive
        every unbound input port as :meth:`plan` would (a misspelt, swapped, omitted or
        literal reference is replaced by the binding the planner's own rules give, never a
        guess by spelling), and add steps for missing milestones/deliverables. None when
        nothing could be changed (the re-derived plan is the one that failed)."""
        b = self._builder(sketch.goal, case, contract)
        drop_steps = {e.context.get("step") for e in errors if e.context.get("arg") == "tool"}
        kept = PlanSketch(goal=sketch.goal, domain=sketch.domain,
                          steps=[s for s in sketch.steps if s.id not in drop_steps])
        b.adopt(kept)
        blocked: set[tuple[str, str]] = set()
        for e in errors:
            step = next((s for s in b.steps if s.id == e.context.get("step")), None)
            arg = e.context.get("arg")
            if step is not None and arg in step.args:
                log.info("revise: step %s drops arg %s (%s)", step.id, arg, e.code.value)
                del step.args[arg]
                spec = b.specs.get(step.tool)
                if spec is None or spec.input(arg) is None:  # a param: back to its default
                    blocked.add((step.id, arg))
        if drop_steps:  # references to dropped steps are now dangling
            for step in b.steps:
                step.args = {k: v for k, v in step.args.items()
                             if ref_name(v, "node") not in drop_steps}
        try:
            self._bind_required(b)
            for kind, milestone, name, fld in self._wanted(sketch.goal, contract, b):
                self._add(b, kind, milestone, name, fld)
            revised = self._finish(b, sketch.goal, case, contract, blocked)
        except ToolError as e:
            log.info("revise: cannot repair the plan of case %s: %s", case.id, e.message)
            return None
        return None if revised == sketch else revised

    def finish(self, sketch: PlanSketch, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        """Step 3 (finishing touches) on any sketch: optional ports and metadata-named params
        bound by the rules :meth:`plan` uses; nothing set in ``sketch`` is changed. The LLM
        Brain completes a decoded plan with it (choices it has no reason to ask a model)."""
        b = self._builder(sketch.goal, case, contract)
        b.adopt(sketch)
        return self._finish(b, sketch.goal, case, contract)

    def ranking(self, goal: str, case: Case, contract: TaskContract | None = None
                ) -> tuple[Any, dict[str, int]]:
        """(tool rank key, canonical sequence -> preference): how :meth:`plan` orders options."""
        b = self._builder(goal, case, contract)
        return b._tool_rank, dict(b.pref)

    # ---- steps ----------------------------------------------------------------------------
    def _builder(self, goal: str, case: Case, contract: TaskContract | None) -> _Builder:
        return _Builder(case, contract, goal, plannable_tools(case, contract, self._registry))

    @staticmethod
    def _check_domain(goal: str, case: Case, contract: TaskContract | None) -> None:
        if contract is not None:  # the contract's domain rules; its goal text may name any organ
            want = contract.domain if contract.domain != "any" else None
        else:
            want = goal_domain(goal)
        if want and case.domain not in ("unknown", "", want):
            raise ToolError(ErrorCode.input_missing, f"the goal is about a {want} case, but case {case.id!r} is "
                            f"a {case.domain} case (sequences {sorted(case.sequences)})",
                            "give a case of that domain, or a goal this case can answer", case=case.id,
                            goal=goal)

    @staticmethod
    def _wanted(goal: str, contract: TaskContract | None, b: _Builder
                ) -> list[tuple[ArtifactKind | None, str, str, str | None]]:
        """(kind, milestone, name, field) of every wanted artifact, deliverables first."""
        if contract is not None:
            out = [(d.kind, d.milestone, d.name, d.field) for d in contract.deliverables]
            covered = {d.milestone for d in contract.deliverables}
            return out + [(None, m, m, None) for m in contract.milestones if m not in covered]
        found = goal_milestones(goal)
        if not found:
            raise ToolError(ErrorCode.schema, f"cannot tell what the goal asks for: {goal!r}",
                            "name an outcome, e.g. segment, register, denoise, reconstruct, grade, "
                            "measure, detect lesions, report", goal=goal)
        return [(None, m, m, None) for m in found]

    def _add(self, b: _Builder, kind: ArtifactKind | None, milestone: str, name: str, fld: str | None) -> None:
        if any(b.specs[s.tool].milestone == milestone and (kind is None or any(
                p.kind == kind for p in b.specs[s.tool].outputs)) for s in b.steps if s.tool in b.specs):
            return  # already produced by a planned step
        b.why_not.clear()
        opt = b.resolve(kind, fld, None, milestone=milestone, prefer_field=fld)
        if opt is None:
            tools = [s.name for s in b.producers(kind, milestone)]
            why = "; ".join(dict.fromkeys(b.why_not)) or "no registered tool reaches it"
            raise ToolError(ErrorCode.input_missing,
                            f"case {b.case.id!r} ({b.case.domain}; sequences {sorted(b.case.sequences)}) cannot "
                            f"reach {name!r} ({kind.value + ' at ' if kind else ''}milestone {milestone!r}): "
                            f"{why}", f"tools for {milestone}: {tools}" if tools else
                            "register a tool for that milestone", case=b.case.id, milestone=milestone)
        b.token(opt, f"{'deliverable' if kind else 'milestone'} {name}")

    def _finish(self, b: _Builder, goal: str, case: Case, contract: TaskContract | None,
                blocked: set[tuple[str, str]] = frozenset()) -> PlanSketch:
        """Bind optional ports and metadata params (never an arg a revision just dropped)."""
        self._bind_optional(b, blocked)
        for step in b.steps:
            if step.tool in b.specs:
                self._bind_params(b, step, case, {a for s, a in blocked if s == step.id})
        known = case.domain if case.domain not in ("", "unknown") else None
        if contract is not None and contract.domain != "any":
            domain = contract.domain
        else:  # a task for any organ (e.g. ``recon``): the case's own domain, from its header
            domain = known or goal_domain(goal) or "general"
        return PlanSketch(goal=goal, domain=domain, steps=b.steps)

    @staticmethod
    def _bind_required(b: _Builder) -> None:
        """Bind every unset required input port by the rules :meth:`plan` chains with: a port
        named after a sequence takes it, an anchor port (``fixed``...) the preferred sequence,
        the others the cheapest source of their kind not already used by the step."""
        for step in list(b.steps):
            spec = b.specs.get(step.tool)
            if spec is None:
                continue
            unset = sorted((p for p in spec.inputs if p.required and p.name not in step.args),
                           key=lambda p: p.name not in ANCHOR_PORTS)
            for port in unset:
                used = {b.canon.get(n, n) for v in step.args.values() if (n := ref_name(v, "seq")) is not None}
                canon = canonical_sequence(port.name)
                below = OfflinePlanner._downstream(b, step.id)
                opt = b.resolve(port.kind, port.name, canon, exclude=frozenset() if canon else frozenset(used),
                                visiting=frozenset({step.tool}))
                if opt is None or (opt.tool is not None and b.by_sig.get(opt.sig) in below):
                    b.why_not.append(f"{step.tool} needs {port.name} ({port.kind.value})")
                    continue
                step.args[port.name] = b.token(opt, f"{port.name} of {step.tool}")
                log.info("revise: step %s re-binds %s to %s", step.id, port.name, step.args[port.name])

    # ---- optional ports and params ------------------------------------------------------
    @staticmethod
    def _downstream(b: _Builder, sid: str) -> set[str]:
        below, grew = {sid}, True
        while grew:
            grew = False
            for s in b.steps:
                if s.id not in below and any(ref_name(v, "node") in below for v in s.args.values()):
                    below.add(s.id)
                    grew = True
        return below

    def _bind_optional(self, b: _Builder, blocked: set[tuple[str, str]]) -> None:
        for step in list(b.steps):
            spec = b.specs.get(step.tool)
            if spec is None:
                continue
            aggregator = not any(p.required for p in spec.inputs)
            below = self._downstream(b, step.id)
            taken = {v for v in step.args.values() if isinstance(v, str)}  # list params are not bindings
            for by_kind in (False, True):  # same-name sources first, then (sinks only) by kind
                for port in spec.inputs:
                    if port.required or port.name in step.args or (step.id, port.name) in blocked:
                        continue
                    tok = self._optional_source(b, port.name, port.kind, below, taken, aggregator and by_kind)
                    if tok is not None:
                        step.args[port.name] = tok
                        taken.add(tok)
                        below = self._downstream(b, step.id)

    @staticmethod
    def _optional_source(b: _Builder, port: str, kind: ArtifactKind, below: set[str], taken: set,
                         aggregator: bool) -> str | None:
        canon = canonical_sequence(port)
        if canon:
            key = next((k for k, c in b.canon.items() if c == canon and b.case.sequences[k].kind == kind), None)
            if key is not None:
                return str(Token.seq(key))
        made = [(s.id, p.name) for s in b.steps if s.id not in below and s.tool in b.specs
                for p in b.specs[s.tool].outputs if p.kind == kind]
        named = [str(Token.node(sid, f)) for sid, f in made if f == port]
        if named:
            return named[-1]
        if aggregator:  # a sink that gathers evidence: the latest artifact of the kind not yet used
            free = [t for sid, f in made if (t := str(Token.node(sid, f))) not in taken]
            return free[-1] if free else None
        return None

    @staticmethod
    def _bind_params(b: _Builder, step: PlanStep, case: Case, blocked: set[str]) -> None:
        spec = b.specs[step.tool]
        source = next((n for p in spec.inputs if (n := ref_name(step.args.get(p.name), "seq")) is not None), None)
        for param in spec.param_names:
            if param in step.args or param in blocked:
                continue
            key = next((k for k in case.metadata
                        if param == k or param.startswith(f"{k}_") or k == f"target_{param}"), None)
            if key is None:
                continue
            value = case.metadata[key]
            if isinstance(value, dict):  # per-sequence values: the one of this step's input sequence
                canon = canonical_sequence(source) if source else None
                hit = next((v for k, v in value.items() if source and (k == source or canonical_sequence(k) == canon)),
                           None)
                if hit is not None:
                    step.args[param] = hit
            elif value is not None:
                step.args[param] = str(Token.case(key))


__all__ = ["OfflinePlanner", "goal_domain", "goal_milestones", "plannable_tools", "tool_domains"]
