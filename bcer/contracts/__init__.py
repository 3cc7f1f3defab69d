"""Pure data: pydantic models, artifact classes and task contracts. Imports nothing of bcer."""
from .artifacts import (ARTIFACT_TYPES, ArtifactKind, Cine, Classification, Finding, Findings,
                        Image, KSpace, Mask, Report, Table, Transform, kind_of)
from .case import Case, SequenceRef
from .errors import ErrorCode, ToolError
from .event import Event
from .plan import PlanSketch, PlanStep
from .spec import Port, Resources, ToolSpec
from .task import DeliverableSpec, PlausibilityCheck, QualityCheck, TaskContract, Validator, list_contracts, load_contract
from .workflow import Deliverable, Node, Workflow

__all__ = [
    "ARTIFACT_TYPES", "ArtifactKind", "Case", "Cine", "Classification", "Deliverable",
    "DeliverableSpec", "ErrorCode", "Event", "Finding", "Findings", "Image", "KSpace", "Mask",
    "Node", "PlanSketch", "PlanStep", "PlausibilityCheck", "Port", "QualityCheck", "Report", "Resources",
    "SequenceRef", "Table", "TaskContract", "ToolError", "ToolSpec", "Transform", "Validator",
    "Workflow", "kind_of", "list_contracts", "load_contract",
]
