"""Task contracts: what a goal must produce, and how its deliverables are validated."""
from __future__ import annotations

from pathlib import Path
from collections.abc import Iterable
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .artifacts import ArtifactKind
from .sequences import canonical_sequence

TASKS_DIR = Path(__file__).parent / "tasks"


class Validator(BaseModel):
    """One check of a written deliverable.

    ``type``: exists | nifti_nonempty | affine_matches_input | json_field | table_rows |
    report_nonempty | report_verified (a reviewed report whose final R4 critique still has a
    material issue fails). ``arg``: the input sequence (affine), JSON field, or minimum rows.
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["exists", "nifti_nonempty", "affine_matches_input", "json_field",
                  "table_rows", "report_nonempty", "report_verified"]
    arg: Any = None


class DeliverableSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    kind: ArtifactKind
    milestone: str
    file: str
    # the producing tool's output port, when it has several of ``kind`` (e.g. ``wt`` of a
    # segmentation that also outputs ``labels``); None: its first output of ``kind``
    field: str | None = None
    validators: list[Validator] = Field(default_factory=lambda: [Validator(type="exists")])


class QualityCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: str
    deliverable: str | None = None
    threshold: float | None = None
    higher_is_better: bool = True


class PlausibilityCheck(BaseModel):
    """One domain check of the written deliverables (``bcer.engine.plausibility`` holds the
    table of named checks, their default limits and their sources).

    ``check``: the check's name. ``deliverable``: the deliverable it judges (named in the
    result). ``uses``: other deliverables it reads, by role (e.g. ``{gland: gland}`` for
    lesions judged against the gland mask). ``params``: limits that replace the check's
    defaults for this task (validated against the check's own params model).
    """

    model_config = ConfigDict(extra="forbid")
    check: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    deliverable: str
    uses: dict[str, str] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)


class TaskContract(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str
    domain: str
    chain: Literal["short", "long"] = "short"
    goal: str
    inputs: list[str] = Field(default_factory=list)
    input_alternatives: dict[str, list[str]] = Field(default_factory=dict)
    allowed_tools: list[str] = Field(default_factory=list)  # empty: any registered tool
    # "tool.port" -> the input sequences that port may bind in this task (e.g. which image is
    # the fixed one of a registration); the compiler rejects any other binding
    roles: dict[str, list[str]] = Field(default_factory=dict)
    milestones: list[str] = Field(default_factory=list)
    deliverables: list[DeliverableSpec] = Field(default_factory=list)
    quality: list[QualityCheck] = Field(default_factory=list)
    # domain checks of the deliverables; a case that fails one is ``implausible`` (SR 0)
    plausibility: list[PlausibilityCheck] = Field(default_factory=list)
    # what the report must state: evidence fact names, for every entity that has them (the R4
    # critic flags a report that omits one); empty: the report tool's defaults per domain
    report_requires: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _plausibility_names_deliverables(self) -> "TaskContract":
        names = {d.name for d in self.deliverables}
        for c in self.plausibility:
            bad = [n for n in (c.deliverable, *c.uses.values()) if n not in names]
            if bad:
                # a pydantic validator must raise ValueError (the caller gets a ValidationError naming the field)
                raise ValueError(f"plausibility check {c.check!r} names unknown deliverable(s) {bad}; "
                                 f"deliverables: {sorted(names)}")
        return self

    def role_problem(self, tool: str, port: str, key: str, have: Iterable[str]) -> tuple[str, list[str]] | None:
        """Whether sequence ``key`` may feed ``tool.port`` in this task, the contract's part of
        the compiler's rule 3b (one rule for the compiler and the LLM Brain's decoding schema):

        - a port the contract gives a role (``roles``) takes one of those sequences;
        - an input's alternative (``input_alternatives``) stands in only when the case (whose
          sequence keys are ``have``) lacks that input.

        Returns (why not, the case's sequence keys that would fit) or None when it fits.
        """
        canon = {_canon(k): k for k in have}
        got = _canon(key)
        roles = self.roles.get(f"{tool}.{port}")
        if roles and got not in {_canon(r) for r in roles}:
            fits = [canon[_canon(r)] for r in roles if _canon(r) in canon]
            return (f"input {port!r} of {tool} takes {' or '.join(roles)} in task {self.id!r}, not @seq.{key}",
                    fits)
        primary = {_canon(i) for i in self.inputs}
        for main, alts in self.input_alternatives.items():
            if got in {_canon(a) for a in alts} and got not in primary and _canon(main) in canon:
                return (f"@seq.{key} is an alternative to the task's input {main}, which the case has",
                        [canon[_canon(main)]])
        return None

    def allows(self, tool: str) -> bool:
        return not self.allowed_tools or any(
            tool == t or (t.endswith(".*") and tool.startswith(t[:-1])) for t in self.allowed_tools)


def _canon(name: str) -> str:
    return canonical_sequence(name) or name


def load_contract(task: str | Path) -> TaskContract:
    """Load a task contract by id (from ``bcer/contracts/tasks``) or from a YAML path."""
    path = Path(task)
    if not path.suffix:
        path = TASKS_DIR / f"{task}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
        raise FileNotFoundError(f"no task contract {task!r}; known: {known}")
    return TaskContract.model_validate(yaml.safe_load(path.read_text()))


def list_contracts() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))
