"""A case: its input root, sequences (lazily loaded), metadata and optional ground truth."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .artifacts import ArtifactKind
from .sequences import canonical_sequence


class SequenceRef(BaseModel):
    """Where a sequence lives and how to read it; loaded only when a node needs it.

    ``format``: nifti | nifti_frames | dicom | fastmri_h5 | cmrx_mat | npz.
    ``options``: format specifics (e.g. the frame files of an ACDC case, the h5 key).
    """

    model_config = ConfigDict(extra="forbid")
    path: str
    format: str = "nifti"
    kind: ArtifactKind = ArtifactKind.image
    options: dict[str, Any] = Field(default_factory=dict)


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
    root: str
    domain: str = "unknown"
    sequences: dict[str, SequenceRef] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    ground_truth: dict[str, Any] | None = None
    layout: str | None = None
    # typed errors (ToolError.to_dict()) found while reading a cohort leniently: the case is
    # kept as a row that is rejected with its first issue instead of stopping the whole read
    issues: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def root_path(self) -> Path:
        return Path(self.root)

    def sequence_key(self, name: str) -> str | None:
        """The key of ``sequences`` that the sequence ``name`` means, or None.

        An exact key wins; otherwise both sides go through the one alias table
        (:func:`bcer.contracts.sequences.canonical_sequence`), so ``t1ce`` finds ``T1c``.

        >>> Case(id="c", root=".", sequences={"T1c": SequenceRef(path="a.nii")}).sequence_key("t1ce")
        'T1c'
        """
        if name in self.sequences:
            return name
        want = canonical_sequence(name) or name
        return next((k for k in self.sequences if (canonical_sequence(k) or k) == want), None)
