"""A flat folder of NIfTI files: one file per case and sequence, the case id in the name.

Without a mapping, names must end in a sequence word the alias table knows (or a label
word), separated by ``_``, ``-`` or ``.``::

    BraTS-017_t1.nii.gz  BraTS-017_t1ce.nii.gz  BraTS-017_flair.nii.gz  BraTS-017_seg.nii.gz

With a mapping (``--seq T1=*_t1.nii.gz --seq FLAIR=*_flair.nii.gz``; a pattern may name a
sub-folder, ``t2/*.nii.gz``) each sequence comes from the files its pattern matches and the
case id is what the pattern's wildcards matched (the common stem). A name of ``seg``,
``label`` or ``mask`` maps the ground-truth label map.

Typed errors: ``schema`` for a file two patterns claim, two files for one case and
sequence, or names nothing maps; ``input_missing`` for a case lacking a mapped sequence;
``shape`` for sequences of one case on different grids (prostate ADC/DWI may have their own).

Phantom cohorts written here keep their truth sidecar and label maps under
``bcer_truth/<case>/``, which readers of real data never look at.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...contracts.artifacts import ArtifactKind
from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError, did_you_mean
from ..phantom import Phantom
from .brats2023 import labels_for_name
from ...io.itk import is_itk_file
from ._common import read_each, read_truth, ref_for, sanitize_case_id, validate_case_shapes, write_truth, write_volume
from ._mapping import MAPPING_NAMES, is_mapping_file, read_mapping
from ._sequences import LABEL_WORDS, domain_of, is_label_word, known_sequences, sequence_name, settle_t2

log = logging.getLogger(__name__)

NAME = "flat"
TRUTH_DIR = "bcer_truth"
LABEL = "seg"  # the key a label map gets in Case.ground_truth["labels"]
_NII = re.compile(r"^(?P<stem>.+?)(\.nii(\.gz)?|\.mha|\.nrrd)$")  # NIfTI, MetaImage, NRRD
_SEP = re.compile(r"([_\-.])")
_FILE_KEY = {"T1c": "t1ce"}  # written names: lower-case canonical, BraTS's t1ce for T1c

__all__ = ["NAME", "detect", "read", "write", "parse_mapping"]


def _nifti_files(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_file() and _NII.match(p.name))


def _is_nnunet_folder(root: Path) -> bool:
    return root.name in ("imagesTr", "imagesTs", "labelsTr", "labelsTs") and (root.parent / "dataset.json").is_file()


def detect(root: Path) -> bool:
    root = Path(root)
    if is_mapping_file(root) or any((root / n).is_file() for n in MAPPING_NAMES):
        return True
    return root.is_dir() and not _is_nnunet_folder(root) and bool(_nifti_files(root))


# ---- naming ---------------------------------------------------------------------------------
def _target(name: str) -> str:
    """Canonical sequence or ``seg`` for a mapping name.

    Raises:
        ToolError: ``schema`` for a name that is neither.
    """
    if is_label_word(name):
        return LABEL
    canon = sequence_name(name)
    if canon is None:
        raise ToolError(ErrorCode.schema, f"--seq {name}=...: {name!r} is not a sequence name",
                        hint=did_you_mean(name, known_sequences() + [LABEL]), arg="seq")
    return canon


def parse_mapping(items: Iterable[str]) -> dict[str, str]:
    """``["T1=*_t1.nii.gz", ...]`` (the CLI's ``--seq``) as ``{"T1": "*_t1.nii.gz"}``.

    Raises:
        ToolError: ``schema`` for an item without ``=``, a pattern without a wildcard, or a
            sequence given twice.
    """
    out: dict[str, str] = {}
    for item in items:
        name, sep, pattern = str(item).partition("=")
        name, pattern = name.strip(), pattern.strip()
        if not sep or not name or not pattern:
            raise ToolError(ErrorCode.schema, f"--seq {item!r} is not NAME=PATTERN", hint="e.g. --seq T1=*_t1.nii.gz",
                            arg="seq")
        if name in out:
            raise ToolError(ErrorCode.schema, f"--seq names {name} twice", arg="seq")
        out[name] = pattern
    return out


def _pattern_rx(pattern: str) -> re.Pattern[str]:
    """Regex for a glob pattern whose wildcards capture (``*`` stays within one folder)."""
    if not any(c in pattern for c in "*?"):
        raise ToolError(ErrorCode.schema, f"--seq pattern {pattern!r} has no wildcard: the case id is what "
                        "'*' matches", hint="e.g. --seq T1=*_t1.nii.gz", arg="seq")
    parts = re.split(r"(\*|\?)", pattern)
    rx = "".join("([^/]*)" if p == "*" else "([^/])" if p == "?" else re.escape(p) for p in parts)
    return re.compile(rx + r"\Z")


def _auto_split(stem: str) -> tuple[str, str] | None:
    """(case, sequence word) from a stem ending in a known word; the shortest such ending wins
    (``x_t2_flair`` is FLAIR of case ``x_t2``; ``x_t1_gd`` is T1c of case ``x``)."""
    tokens = _SEP.split(stem)  # words at even positions, separators between them
    for k in range(len(tokens) - 1, 0, -2):
        word, case = "".join(tokens[k:]), "".join(tokens[:k - 1])
        if case and (sequence_name(word) or is_label_word(word)):
            return case, word
    return None


def _case_from_groups(groups: Iterable[str | None], path: Path) -> str:
    """The case id from a pattern's wildcard matches, each distinct match once: in
    ``*/*-t1n.nii.gz`` both wildcards match ``BraTS-GLI-00000-000``, which is one id, not two."""
    return sanitize_case_id("_".join(dict.fromkeys(g for g in groups if g)) or path.name)


def _implied_label(root: Path, targets: Mapping[str, str]) -> str | None:
    """A label pattern beside the mapped ones when none is given: the first pattern with its
    sequence word swapped for a label word (``*/*-t1n.nii.gz`` -> ``*/*-seg.nii.gz``) that
    matches a file."""
    for pattern in targets.values():
        m = re.search(r"([A-Za-z0-9]+)(\.nii(?:\.gz)?|\.mha|\.nrrd)\Z", pattern)
        if m is None or sequence_name(m.group(1)) is None:  # swap only a word that names a sequence
            continue
        for word in sorted(LABEL_WORDS):
            cand = pattern[:m.start(1)] + word + m.group(2)
            if cand not in targets.values() and any(p.is_file() for p in root.glob(cand)):
                return cand
    return None


def _claim(found: dict[str, dict[str, Path]], case: str, target: str, path: Path, how: str) -> None:
    have = found.setdefault(case, {})
    if target in have and have[target] != path:
        raise ToolError(ErrorCode.schema, f"case {case} has two files for {target}: {have[target].name} and "
                        f"{path.name} ({how})", hint="narrow the --seq patterns", case=case, file=str(path))
    have[target] = path


def _auto_files(root: Path) -> tuple[dict[str, dict[str, Path]], dict[str, str]]:
    found: dict[str, dict[str, Path]] = {}
    unknown = []
    for p in _nifti_files(root):
        split = _auto_split(_NII.match(p.name).group("stem"))
        if split is None:
            unknown.append(p.name)
            continue
        case, word = split
        _claim(found, sanitize_case_id(case), _target(word), p, f"names ending in {word!r}")
    if unknown:
        raise ToolError(ErrorCode.schema, f"cannot tell the sequence of {len(unknown)} file(s) in {root} "
                        f"(e.g. {unknown[:3]})", hint="map them: --seq T1=*_t1.nii.gz --seq FLAIR=*_flair.nii.gz, or list them "
                        "in a mapping file bcer_mapping.csv (case,sequence,path)",
                        file=str(root / unknown[0]))
    return found, {}


def _mapped_files(root: Path, mapping: Mapping[str, str]) -> tuple[dict[str, dict[str, Path]], dict[str, str]]:
    targets = {}
    for name, pattern in mapping.items():
        t = _target(name)
        if t in targets:
            raise ToolError(ErrorCode.schema, f"--seq maps {t} twice ({targets[t]!r} and {pattern!r})", arg="seq")
        targets[t] = pattern
    if LABEL not in targets and (implied := _implied_label(root, targets)):
        log.info("flat: label maps from %r (beside the mapped sequences)", implied)
        targets[LABEL] = implied
    claimed: dict[Path, str] = {}
    found: dict[str, dict[str, Path]] = {}
    for t, pattern in targets.items():
        rx = _pattern_rx(pattern)
        for p in sorted(root.glob(pattern)):
            m = rx.match(p.relative_to(root).as_posix())
            if not p.is_file() or m is None:
                continue
            if p in claimed:
                raise ToolError(ErrorCode.schema, f"{p.name} matches both {claimed[p]}={targets[claimed[p]]} and "
                                f"{t}={pattern}", hint="make the --seq patterns exclusive", file=str(p), arg="seq")
            claimed[p] = t
            _claim(found, _case_from_groups(m.groups(), p), t, p, pattern)
    if not found:
        raise ToolError(ErrorCode.input_missing, f"no file in {root} matches {dict(mapping)}", file=str(root), arg="seq")
    return found, targets


# ---- reading ----------------------------------------------------------------------------------
def _ref(path: Path, kind: str, labels: Mapping[int, str] | None = None) -> SequenceRef:
    fmt = "itk" if is_itk_file(path) else "nifti"
    return ref_for(path.resolve(), kind=kind, fmt=fmt, **({"labels": dict(labels)} if labels else {}))


def _truth(root: Path, case: str) -> dict[str, Any] | None:
    d = root / TRUTH_DIR / case
    return read_truth(d) if d.is_dir() else None


def _read_case(root: Path, case: str, files: dict[str, Path], expected: set[str],
               patterns: Mapping[str, str]) -> Case:
    missing = sorted(expected - set(files))
    if missing:
        how = ", ".join(f"{m}: {patterns[m]!r}" if m in patterns else m for m in missing)
        raise ToolError(ErrorCode.input_missing, f"case {case} has no {', '.join(missing)} ({how} matched "
                        f"nothing for it; it has {sorted(set(files) - {LABEL})})", case=case,
                        file=str(next(iter(files.values()))))
    names = {n: p for n, p in files.items() if n != LABEL}
    truth = _truth(root, case)
    domain = (truth or {}).get("domain") or domain_of(set(names))
    names = settle_t2(names, domain)
    sequences = {n: _ref(p, "cine" if n == "CINE" else "image") for n, p in sorted(names.items())}
    gt, metadata = None, {}
    if truth is not None:
        metadata = dict(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    elif LABEL in files:
        # a seg named like a BraTS 2023+ case keeps that table (ET = 3), so scoring reads it right
        named = labels_for_name(files[LABEL].name) or labels_for_name(case) or {}
        gt = {"values": {}, "labels": {LABEL: _ref(files[LABEL], "mask", named).model_dump(mode="json")},
              "references": {}}
    c = Case(id=case, root=str(root.resolve()), domain=domain, sequences=sequences, metadata=metadata,
             ground_truth=gt, layout=NAME)
    grid_bound = None if domain != "prostate" else [n for n in ("ADC", "DWI") if n in sequences]
    validate_case_shapes(c, names=grid_bound, include_labels=domain != "prostate", ndim=None)
    return c


def read(root: Path, seq: Mapping[str, str] | None = None) -> list[Case]:
    """Every case of a flat NIfTI folder, named by file endings or by the ``seq`` mapping
    (``{"T1": "*_t1.nii.gz"}``; see the module docstring).

    Raises:
        ToolError: ``input_missing`` (no files, or a case lacking a sequence), ``schema``
            (ambiguous or unknown names), ``shape`` (grids of one case disagree).
    """
    root = Path(root)
    mapping = root if is_mapping_file(root) else next((root / n for n in MAPPING_NAMES if (root / n).is_file()), None)
    if mapping is not None and not seq:
        root = mapping.parent
        found, patterns = read_mapping(mapping), {}
    elif not root.is_dir():
        raise ToolError(ErrorCode.input_missing, f"no such folder: {root}", file=str(root))
    else:
        found, patterns = _mapped_files(root, seq) if seq else _auto_files(root)
    if not found:
        raise ToolError(ErrorCode.input_missing, f"no NIfTI files in {root}", file=str(root))
    expected = {t for t in patterns if t != LABEL} if patterns else {n for f in found.values() for n in f} - {LABEL}
    return read_each(sorted(found.items()), lambda x: _read_case(root, x[0], x[1], expected, patterns),
                     lambda x: x[0], lambda x: root, layout=NAME)


# ---- writing (phantom cohorts) --------------------------------------------------------------------
def _write_case(p: Phantom, out: Path) -> str:
    case = sanitize_case_id(p.case_id)
    for seq, art in p.sequences.items():
        if getattr(art, "kind", None) not in (ArtifactKind.image, ArtifactKind.cine):
            log.warning("flat writer skips %s of %s (not an image volume)", seq, p.case_id)
            continue
        write_volume(art, out / f"{case}_{_FILE_KEY.get(seq, seq.lower())}.nii.gz")
    tdir = out / TRUTH_DIR / case
    labels: dict[str, SequenceRef] = {n: write_volume(m, tdir / f"{case}_{n}.nii.gz") for n, m in p.labels.items()}
    refs = {s: write_volume(img, tdir / f"{case}_ref_{s.lower()}.nii.gz") for s, img in p.references.items()}
    write_truth(tdir, p, labels, refs)
    return case


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as ``<case>_<seq>.nii.gz`` files under ``out`` (truth under
    ``bcer_truth/``); returns ``read(out)``'s cases for the written ones."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [_write_case(p, out) for p in phantoms]
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in names]
