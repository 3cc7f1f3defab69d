"""The machinery of plausibility checks: the table of named checks, what a check reads, and
the runner that turns a contract's ``plausibility:`` section into results.

A check is a function ``(Inputs, params) -> Verdict`` registered under a name with a pydantic
params model whose defaults are its limits (a contract may override them). Checks read only
written deliverables (and the case's input sequences or metadata), never in-memory objects,
so they judge exactly what a user receives. A check never raises: a file it cannot read, a
field it cannot find, a bug in the check itself all become a failed result with the reason.
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from ...contracts.case import Case
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.task import PlausibilityCheck, TaskContract

log = logging.getLogger(__name__)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Verdict:
    """What a check found. ``ok`` None: not applicable (nothing to judge; says why)."""

    ok: bool | None
    value: float | None
    limit: str
    message: str


@dataclass(frozen=True)
class CheckResult:
    """One row of a case's ``plausibility`` list."""

    check: str
    deliverable: str
    ok: bool | None
    value: float | None
    limit: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CheckDef:
    name: str
    fn: Callable[["Inputs", Any], Verdict]
    params: type[BaseModel]

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()


CHECKS: dict[str, CheckDef] = {}


def check(name: str, params: type[BaseModel] = NoParams) -> Callable:
    """Register a check under ``name``; its params model's defaults are its limits."""
    def deco(fn: Callable[["Inputs", Any], Verdict]) -> Callable:
        if name in CHECKS:
            raise ToolError(ErrorCode.schema, f"plausibility check {name!r} registered twice",
                            hint="give one of the two checks another name")
        CHECKS[name] = CheckDef(name, fn, params)
        return fn
    return deco


class Unavailable(Exception):
    """A check's input is missing or unreadable (the check fails, naming it)."""


SequenceSource = Callable[[str], Any]
"""Sequence key -> the artifact the case's tools received (or None: read the file)."""


class FileCache:
    """Deliverables and sequences read once per case, shared by its checks.

    ``loaded`` gives the input sequences already in memory (the engine's object store): the
    checks then judge the very arrays the tools saw, without decoding the files again.
    """

    def __init__(self, loaded: SequenceSource | None = None) -> None:
        self._items: dict[tuple[str, str], Any] = {}
        self.loaded = loaded

    def get(self, key: tuple[str, str], load: Callable[[], Any]) -> Any:
        if key not in self._items:
            self._items[key] = load()
        return self._items[key]


@dataclass(frozen=True)
class Volume:
    """A NIfTI deliverable or input sequence: voxels, affine, voxel size (mm)."""

    data: np.ndarray
    affine: np.ndarray

    @property
    def spacing(self) -> np.ndarray:
        return np.sqrt((self.affine[:3, :3] ** 2).sum(axis=0))

    @property
    def voxel_ml(self) -> float:
        return float(np.prod(self.spacing)) / 1000.0


class Inputs:
    """What one check may read: its deliverable, the deliverables it ``uses`` by role, the
    case's input sequences and metadata."""

    def __init__(self, spec: PlausibilityCheck, case: Case, case_dir: Path, files: dict[str, Path],
                 cache: FileCache):
        self.spec, self.case, self.case_dir, self.files, self.cache = spec, case, Path(case_dir), files, cache

    def has(self, role: str) -> bool:
        return role == "deliverable" or role in self.spec.uses

    def path(self, role: str = "deliverable") -> Path:
        name = self.spec.deliverable if role == "deliverable" else self.spec.uses.get(role)
        if name is None:
            raise Unavailable(f"the contract gives this check no {role!r} deliverable")
        path = self.files.get(name)
        if path is None or not path.is_file():
            raise Unavailable(f"deliverable {name!r} was not written")
        return path

    def nifti(self, role: str = "deliverable") -> Volume:
        path = self.path(role)
        return self.cache.get(("nifti", str(path)), lambda: _read_nifti(path))

    def json(self, role: str = "deliverable") -> dict[str, Any]:
        path = self.path(role)
        if path.suffix != ".json":  # tables and reports keep their JSON beside the primary file
            path = path.with_name(path.name.split(".")[0] + ".json")
        return self.cache.get(("json", str(path)), lambda: _read_json(path))

    def row(self, role: str = "deliverable") -> dict[str, Any]:
        rows = self.json(role).get("rows") or []
        if not rows or not isinstance(rows[0], dict):
            raise Unavailable(f"table {self.path(role).name} has no rows")
        return rows[0]

    def sequence(self, names: list[str] | str) -> Volume:
        """The first of ``names`` (aliases allowed) the case has, loaded through bcer's readers."""
        key = find_sequence(self.case, [names] if isinstance(names, str) else names)
        if key is None:
            raise Unavailable(f"case has none of the sequences {names}; has {sorted(self.case.sequences)}")
        ref = self.case.sequences[key]
        return self.cache.get(("seq", key), lambda: _loaded_sequence(self.cache.loaded, key) or _read_sequence(ref))


def find_sequence(case: Case, names: list[str]) -> str | None:
    """The case's key for the first of ``names`` it has (:meth:`Case.sequence_key`), or None."""
    return next((key for name in names if (key := case.sequence_key(name)) is not None), None)


def _read_nifti(path: Path) -> Volume:
    import nibabel as nib

    try:
        img = nib.load(str(path))
        return Volume(np.asarray(img.dataobj), np.asarray(img.affine, dtype=np.float64))
    except Exception as e:  # truncated, not NIfTI, unreadable: the check fails with the reason
        raise Unavailable(f"cannot read {path.name}: {type(e).__name__}: {e}") from e


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Unavailable(f"cannot read {path.name}: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise Unavailable(f"{path.name} is not a JSON object")
    return data


def _loaded_sequence(loaded: SequenceSource | None, key: str) -> Volume | None:
    art = loaded(key) if loaded is not None else None
    if art is None:
        return None
    return Volume(np.asarray(art.data), np.asarray(art.affine, dtype=np.float64))


def _read_sequence(ref: Any) -> Volume:
    from ...io import load_sequence

    try:
        art = load_sequence(ref)
    except ToolError as e:
        raise Unavailable(f"cannot read input {Path(ref.path).name}: {e.code.value}: {e.message}") from e
    return Volume(np.asarray(art.data), np.asarray(art.affine, dtype=np.float64))


# ---- helpers shared by checks -------------------------------------------------------------------

def number(value: Any, what: str) -> float:
    """A finite float, or Unavailable naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise Unavailable(f"{what} is {value!r}, not a finite number")
    return float(value)


def in_range(value: float, lo: float, hi: float, what: str, unit: str) -> Verdict:
    limit = f"{lo:g}–{hi:g} {unit}"
    ok = lo <= value <= hi
    return Verdict(ok, value, limit, f"{what} = {value:.4g} {unit}" + ("" if ok else f", outside {limit}"))


def world_to_voxel(affine: np.ndarray, points: np.ndarray) -> np.ndarray:
    """World (mm) points (N, 3) -> continuous voxel indices (N, 3) of the grid ``affine``."""
    inv = np.linalg.inv(affine)
    return points @ inv[:3, :3].T + inv[:3, 3]


def voxel_to_world(affine: np.ndarray, ijk: np.ndarray) -> np.ndarray:
    return np.asarray(ijk, np.float64) @ affine[:3, :3].T + affine[:3, 3]


def sample_nearest(vol: Volume, points: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Values of ``vol`` (3-D) at world points, nearest voxel; ``fill`` outside the grid."""
    ijk = np.rint(world_to_voxel(vol.affine, points)).astype(np.int64)
    shape = np.asarray(vol.data.shape[:3])
    inside = np.all((ijk >= 0) & (ijk < shape), axis=1)
    out = np.full(len(points), fill, dtype=np.float64)
    i = ijk[inside]
    out[inside] = vol.data[i[:, 0], i[:, 1], i[:, 2]]
    return out


def grid_points(vol: Volume, where: np.ndarray | None = None) -> np.ndarray:
    """World coordinates of the voxel centres of ``vol`` (all, or where ``where`` is true)."""
    ijk = np.argwhere(where) if where is not None else np.indices(vol.data.shape[:3]).reshape(3, -1).T
    return voxel_to_world(vol.affine, ijk)


_PIRADS = re.compile(r"PI-?RADS\s*([1-5])\b", re.IGNORECASE)


def pirads_category(label: Any) -> int | None:
    m = _PIRADS.search(str(label))
    return int(m.group(1)) if m else None


# ---- running ------------------------------------------------------------------------------------

def resolve(spec: PlausibilityCheck) -> tuple[CheckDef, BaseModel]:
    """The check and its params for one contract entry.

    Raises:
        ToolError: ``schema`` for an unknown check or params its model rejects.
    """
    cdef = CHECKS.get(spec.check)
    if cdef is None:
        from ...contracts.errors import did_you_mean

        raise ToolError(ErrorCode.schema, f"unknown plausibility check {spec.check!r}",
                        did_you_mean(spec.check, sorted(CHECKS)), check=spec.check)
    try:
        return cdef, cdef.params.model_validate(spec.params)
    except ValidationError as e:
        raise ToolError(ErrorCode.schema, f"bad params for plausibility check {spec.check!r}: {e}",
                        check=spec.check) from e


def run_check(spec: PlausibilityCheck, case: Case, case_dir: Path, files: dict[str, Path],
              cache: FileCache | None = None) -> CheckResult:
    """Run one check; never raises (an unreadable input or a crash is a failed result)."""
    try:
        cdef, params = resolve(spec)
        verdict = cdef.fn(Inputs(spec, case, case_dir, files, cache or FileCache()), params)
    except (Unavailable, ToolError) as e:
        verdict = Verdict(False, None, "", f"cannot evaluate: {getattr(e, 'message', e)}")
    except Exception as e:  # a bug in a check must not take the case (or the cohort) down
        log.exception("plausibility check %s crashed on case %s", spec.check, case.id)
        verdict = Verdict(False, None, "", f"check crashed: {type(e).__name__}: {e}")
    ok = None if verdict.ok is None else bool(verdict.ok)  # numpy bools do not serialise
    value = None if verdict.value is None or not np.isfinite(verdict.value) else float(verdict.value)
    return CheckResult(spec.check, spec.deliverable, ok, value, str(verdict.limit), str(verdict.message))


def run_checks(contract: TaskContract, case: Case, case_dir: str | Path,
               validations: dict[str, tuple[bool, str]] | None = None,
               loaded: SequenceSource | None = None) -> list[CheckResult]:
    """Every plausibility check of ``contract`` over the case's written deliverables.

    Args:
        validations: the contract validators' verdict per deliverable; a check whose
            deliverables did not validate is not run (``ok`` None, says which).
        loaded: input sequences already in memory, by key (else each is read from its file).
    """
    case_dir = Path(case_dir)
    files = {d.name: case_dir / d.file for d in contract.deliverables}
    cache, out = FileCache(loaded), []
    for spec in contract.plausibility:
        needed = [spec.deliverable, *spec.uses.values()]
        invalid = [n for n in needed if validations is not None and not validations.get(n, (False, ""))[0]]
        if invalid:
            out.append(CheckResult(spec.check, spec.deliverable, None, None, "",
                                   f"not run: deliverable(s) {invalid} did not validate"))
            continue
        out.append(run_check(spec, case, case_dir, files, cache))
    return out


def failed(results: list[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.ok is False]


def summary_message(results: list[CheckResult]) -> str:
    """``plausibility check 'X' failed on D: <message>`` (+ how many more failed)."""
    bad = failed(results)
    if not bad:
        return ""
    first = bad[0]
    more = f"; {len(bad) - 1} more failed: {', '.join(r.check for r in bad[1:])}" if len(bad) > 1 else ""
    limit = f" (limit {first.limit})" if first.limit else ""
    return f"plausibility check {first.check!r} failed on {first.deliverable}: {first.message}{limit}{more}"
