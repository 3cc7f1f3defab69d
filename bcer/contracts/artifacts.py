"""In-memory artifacts: arrays plus their geometry, so nothing downstream guesses it.

Array conventions (the same everywhere in bcer):
- ``Image.data``: (X, Y, Z) voxel-index order; ``affine`` maps (i, j, k, 1) to RAS+ mm.
- ``Cine.data``: (X, Y, Z, T); frames along the last axis.
- ``KSpace.data``: complex (C, X, Y, Z[, T]) with coils first; Cartesian phase encoding
  along Y (array axis 2 of ``data``); ``mask`` is a boolean (Y,) vector of sampled lines
  (or (X, Y) for 2-D patterns); ``affine`` is the geometry of the full encoded image grid
  (readout oversampling included); ``meta["recon_matrix"]`` ([x, y], ISMRMRD reconSpace) is
  the in-plane matrix the image is reconstructed to, centre-cropped from that grid exactly as
  fastMRI crops ``reconstruction_rss`` (``KSpace.recon_crop``, ``KSpace.recon_affine``).
- ``Mask.data``: integer labels on an image or cine grid; ``labels`` names each value.
Artifacts coming out of Ray's object store are read-only: copy before writing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from .geometry import orientation, spacing, voxel_volume_ml


class ArtifactKind(str, Enum):
    image = "image"
    cine = "cine"
    kspace = "kspace"
    mask = "mask"
    transform = "transform"
    table = "table"
    classification = "classification"
    findings = "findings"
    report = "report"
    value = "value"  # scalars/metadata bound from @case.* or @runtime.*


@dataclass(eq=False)
class _Volume:
    data: np.ndarray
    affine: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def spacing(self) -> tuple[float, float, float]:
        return spacing(self.affine)

    @property
    def orientation(self) -> str:
        return orientation(self.affine)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def voxel_volume_ml(self) -> float:
        return voxel_volume_ml(self.affine)


@dataclass(eq=False)
class Image(_Volume):
    kind = ArtifactKind.image


@dataclass(eq=False)
class Cine(_Volume):
    kind = ArtifactKind.cine

    @property
    def n_frames(self) -> int:
        return int(self.data.shape[-1])

    def frame(self, t: int) -> Image:
        return Image(np.asarray(self.data[..., t]), self.affine, dict(self.meta, frame=t))


@dataclass(eq=False)
class Mask(_Volume):
    labels: dict[int, str] = field(default_factory=dict)
    kind = ArtifactKind.mask

    def volume_ml(self, label: int) -> float:
        return float(np.count_nonzero(self.data == label)) * self.voxel_volume_ml


@dataclass(eq=False)
class KSpace:
    data: np.ndarray
    mask: np.ndarray
    affine: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.kspace

    @property
    def n_coils(self) -> int:
        return int(self.data.shape[0])

    @property
    def image_shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape[1:])

    @property
    def acceleration(self) -> float:
        m = np.asarray(self.mask, dtype=bool)
        return float(m.size) / max(int(m.sum()), 1)

    @property
    def encoded_matrix(self) -> tuple[int, int]:
        return int(self.data.shape[1]), int(self.data.shape[2])

    @property
    def recon_crop(self) -> tuple[int, int, int, int]:
        """(x0, y0, rx, ry): the recon matrix ``meta["recon_matrix"]`` (default: the encoded
        matrix) as a centre crop of the encoded image, as fastMRI does it: offsets
        ``(X - rx) // 2`` and ``(Y - ry) // 2``; when the encoded Y is smaller than the recon
        y (some fastMRI brain FLAIR files) the crop is (Y, Y), as fastMRI's transforms do.

        Raises:
            ValueError: a recon x larger than the encoded X, or a malformed matrix.
        """
        x, y = self.encoded_matrix
        rm = self.meta.get("recon_matrix")
        if rm is None:
            return 0, 0, x, y
        vals = [rm[k] for k in ("x", "y") if k in rm] if isinstance(rm, dict) else list(rm)[:2]
        rx, ry = (int(v) for v in vals)
        if y < ry:
            rx, ry = y, y
        if not (0 < rx <= x and 0 < ry <= y):
            # kept a ValueError (as int() raises on a malformed matrix): every caller (fastMRI reader and
            # writer, recon tools) turns both into a ToolError naming the file or tool
            raise ValueError(f"recon matrix {rx}x{ry} does not fit in the encoded matrix {x}x{y}")
        return (x - rx) // 2, (y - ry) // 2, rx, ry

    @property
    def recon_affine(self) -> np.ndarray:
        """Affine of the recon grid: the encoded grid's, moved to the crop's first voxel."""
        x0, y0, _, _ = self.recon_crop
        a = np.array(self.affine, dtype=np.float64)
        a[:3, 3] = a[:3, :3] @ np.array([x0, y0, 0.0]) + a[:3, 3]
        return a


@dataclass(eq=False)
class Transform:
    """A spatial transform in world coordinates, ITK direction: maps fixed-space points
    (RAS mm) to moving-space points. ``matrix`` is the 4x4 homogeneous form."""

    matrix: np.ndarray
    type: str = "rigid"
    fixed_affine: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.transform

    @classmethod
    def identity(cls) -> "Transform":
        return cls(np.eye(4), "identity")


@dataclass(eq=False)
class Table:
    """Named measurements: ``rows`` of column → value, ``units`` per column."""

    rows: list[dict[str, Any]]
    units: dict[str, str] = field(default_factory=dict)
    name: str = "measurements"
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.table

    def column(self, name: str) -> list[Any]:
        return [r.get(name) for r in self.rows]


@dataclass(eq=False)
class Classification:
    """A label with the rules that decided it and the evidence ids they used."""

    label: str
    rule_trace: list[dict[str, Any]] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.classification


@dataclass(eq=False)
class Finding:
    id: str
    label: str
    box_voxel: tuple[tuple[int, int, int], tuple[int, int, int]]  # inclusive min, exclusive max
    box_world: tuple[tuple[float, float, float], tuple[float, float, float]]
    volume_ml: float = 0.0
    side: str = ""
    zone: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Findings:
    items: list[Finding]
    affine: np.ndarray | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.findings


@dataclass(eq=False)
class Report:
    """A structured report: Markdown ``text`` plus a ``structured`` dict; ``evidence`` maps
    every quoted number to the node and field it came from."""

    text: str
    structured: dict[str, Any] = field(default_factory=dict)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    kind = ArtifactKind.report


ARTIFACT_TYPES: dict[ArtifactKind, type] = {
    ArtifactKind.image: Image,
    ArtifactKind.cine: Cine,
    ArtifactKind.kspace: KSpace,
    ArtifactKind.mask: Mask,
    ArtifactKind.transform: Transform,
    ArtifactKind.table: Table,
    ArtifactKind.classification: Classification,
    ArtifactKind.findings: Findings,
    ArtifactKind.report: Report,
}


def kind_of(obj: Any) -> ArtifactKind:
    """The ArtifactKind of an artifact instance or class; scalars are ``value``."""
    k = getattr(obj, "kind", None)
    return k if isinstance(k, ArtifactKind) else ArtifactKind.value
