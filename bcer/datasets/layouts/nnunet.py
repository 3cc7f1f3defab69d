"""nnU-Net v2 raw and Medical Segmentation Decathlon (MSD) datasets::

    Dataset005_Prostate/                 (or Task05_Prostate/)
      dataset.json                       channel_names (v2) or modality (v1/MSD), labels
      imagesTr/prostate_00_0000.nii.gz   one file per case and channel (_0000, _0001, ...)
      imagesTr/prostate_00_0001.nii.gz
      labelsTr/prostate_00.nii.gz        ground truth of the training cases
      imagesTs/prostate_03_0000.nii.gz   test cases (no labels)

MSD as downloaded keeps all channels of a case in one 4-D file (``imagesTr/prostate_00.nii.gz``,
channels last); such files are read channel by channel. Channel names map to sequences
through the alias table (``T1w``->T1, ``t1gd``->T1c, ``FLAIR``, ``ADC``; T2/T2w by domain);
``seq`` (the CLI's ``--seq T2w=0`` or ``--seq T2w=MRI``) names a channel the table does not know.

Typed errors: ``schema`` for a missing or malformed dataset.json, a channel name that is no
sequence, or two channels naming one sequence; ``input_missing`` for a case lacking a
channel file; ``shape`` for channels or the label of one case on different grids (nnU-Net
requires one grid per case).
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from ...contracts.artifacts import ArtifactKind, Image, Mask
from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ...contracts.sequences import CANONICAL
from ...io import write_json
from ...io.nifti import read_header
from ..phantom import Phantom
from ._common import (read_each, read_truth, ref_for, sanitize_case_id, validate_case_shapes,
                      write_truth, write_volume)
from ._sequences import domain_of, sequence_name, settle_t2

log = logging.getLogger(__name__)

NAME = "nnunet"
DESCRIPTION = "dataset.json"
TRUTH_DIR = "bcer_truth"
SPLITS = (("imagesTr", "labelsTr", "train"), ("imagesTs", "labelsTs", "test"))
_CHANNEL_FILE = re.compile(r"^(?P<case>.+)_(?P<ch>\d{4})\.nii(\.gz)?$")
_NII = re.compile(r"^(?P<case>.+?)\.nii(\.gz)?$")
_MAIN_LABEL = ("seg", "zones")  # the phantom label map written to labelsTr

__all__ = ["NAME", "detect", "read", "write", "channels_of"]


def detect(root: Path) -> bool:
    root = Path(root)
    return (root / DESCRIPTION).is_file() and any((root / d).is_dir() for d, _, _ in SPLITS)


def _description(root: Path) -> dict[str, Any]:
    path = root / DESCRIPTION
    if not path.is_file():
        raise ToolError(ErrorCode.schema, f"{root} has no dataset.json", hint="nnU-Net/MSD datasets describe "
                        "their channels in dataset.json", file=str(path))
    try:
        desc = json.loads(path.read_text())
    except ValueError as e:
        raise ToolError(ErrorCode.schema, f"dataset.json of {root} is not valid JSON: {e}", file=str(path)) from None
    if not isinstance(desc, dict):
        raise ToolError(ErrorCode.schema, f"dataset.json of {root} must hold an object", file=str(path))
    return desc


def _override(raw: Mapping[int, str], seq: Mapping[str, str] | None) -> dict[int, str]:
    """{channel index: sequence} the ``seq`` option states (by channel index or name)."""
    out: dict[int, str] = {}
    for name, which in (seq or {}).items():
        canon = sequence_name(name)
        idx = next((i for i, n in raw.items() if str(which).strip() in (str(i), f"{i:04d}", str(n))), None)
        if canon is None or idx is None:
            raise ToolError(ErrorCode.schema, f"--seq {name}={which}: " + (f"{name!r} is not a sequence" if canon is None
                            else f"no channel {which!r} in dataset.json ({raw})"), arg="seq")
        out[idx] = canon
    return out


def channels_of(desc: dict[str, Any], where: Path, seq: Mapping[str, str] | None = None
                ) -> tuple[dict[int, str], str]:
    """({channel index: canonical sequence}, domain) from dataset.json's ``channel_names``
    (v2) or ``modality`` (v1/MSD).

    Raises:
        ToolError: ``schema`` for no channel list, unknown names, or two channels with one name.
    """
    raw = desc.get("channel_names") or desc.get("modality")
    if not isinstance(raw, dict) or not raw:
        raise ToolError(ErrorCode.schema, "dataset.json has neither channel_names nor modality", file=str(where))
    try:
        raw = {int(k): str(v) for k, v in raw.items()}
    except ValueError:
        raise ToolError(ErrorCode.schema, f"dataset.json channel keys must be numbers, got {sorted(raw)}",
                        file=str(where)) from None
    forced = _override(raw, seq)
    names = {i: forced.get(i) or sequence_name(n) for i, n in raw.items()}
    unknown = {i: raw[i] for i, n in names.items() if n is None}
    if unknown:
        i, n = next(iter(unknown.items()))
        raise ToolError(ErrorCode.schema, f"dataset.json channel(s) {unknown} name no sequence bcer knows",
                        hint=f"name it: --seq T2w={i} (or --seq T2w={n})", file=str(where), arg="seq")
    if len(set(names.values())) != len(names):
        raise ToolError(ErrorCode.schema, f"dataset.json channels {raw} name one sequence twice ({names})",
                        hint="rename a channel or map it with --seq", file=str(where), arg="seq")
    domain = domain_of(set(names.values()), f"{desc.get('name', '')} {desc.get('description', '')} {where.parent.name}")
    settled = settle_t2({n: i for i, n in names.items()}, domain)
    return {i: n for n, i in settled.items()}, domain


def _label_names(desc: dict[str, Any]) -> dict[str, str]:
    """``{"1": "PZ", ...}`` from v2 (``{"PZ": 1}``; region lists keep their first value) or v1
    (``{"1": "PZ"}``) labels; background left out."""
    labels = desc.get("labels") or {}
    out: dict[str, str] = {}
    for k, v in labels.items():
        if isinstance(v, str) and str(k).isdigit():  # v1/MSD: value -> name
            out[str(int(k))] = v
        elif isinstance(v, (int, list)) and not str(k).isdigit():  # v2: name -> value(s)
            value = v if isinstance(v, int) else (v[0] if v else None)
            if value is not None:
                out[str(int(value))] = str(k)
    return {k: n for k, n in out.items() if k != "0"}


def _case_files(images: Path) -> dict[str, dict[int, Path] | Path]:
    """{case: {channel: file}} for ``_XXXX`` files, or {case: 4-D file} (MSD as downloaded)."""
    cases: dict[str, Any] = {}
    for p in sorted(images.iterdir()):
        m = _CHANNEL_FILE.match(p.name)
        if p.is_file() and m:
            cases.setdefault(m.group("case"), {})
            if not isinstance(cases[m.group("case")], dict):
                raise ToolError(ErrorCode.schema, f"case {m.group('case')} has both a 4-D file and channel files",
                                file=str(p))
            cases[m.group("case")][int(m.group("ch"))] = p
        elif p.is_file() and (m := _NII.match(p.name)) and not p.name.startswith("."):
            if m.group("case") in cases:
                raise ToolError(ErrorCode.schema, f"case {m.group('case')} has both a 4-D file and channel files",
                                file=str(p))
            cases[m.group("case")] = p
    return cases


def _refs(case: str, files: dict[int, Path] | Path, channels: dict[int, str]) -> dict[str, SequenceRef]:
    if isinstance(files, Path):  # MSD: all channels in one file, channels last
        shape = read_header(files)["shape"]
        n = shape[3] if len(shape) == 4 else 1
        if n != len(channels):
            raise ToolError(ErrorCode.shape, f"case {case}: {files.name} holds {n} channel(s), dataset.json names "
                            f"{len(channels)}", case=case, file=str(files))
        opts = (lambda i: {"channel": i}) if len(shape) == 4 else (lambda i: {})
        return {seq: ref_for(files.resolve(), kind="image", **opts(i)) for i, seq in sorted(channels.items())}
    missing = sorted(set(channels) - set(files))
    if missing:
        raise ToolError(ErrorCode.input_missing, f"case {case} lacks channel(s) "
                        f"{', '.join(f'{i:04d} ({channels[i]})' for i in missing)}: no {case}_{missing[0]:04d} file",
                        case=case, file=str(next(iter(files.values()))))
    extra = sorted(set(files) - set(channels))
    if extra:
        raise ToolError(ErrorCode.schema, f"case {case} has channel file(s) {[f'{i:04d}' for i in extra]} that "
                        f"dataset.json does not name", case=case, file=str(files[extra[0]]))
    return {seq: ref_for(files[i].resolve(), kind="cine" if seq == "CINE" else "image")
            for i, seq in sorted(channels.items())}


def _label_file(labels_dir: Path, case: str) -> Path | None:
    return next((labels_dir / f"{case}{e}" for e in (".nii.gz", ".nii") if (labels_dir / f"{case}{e}").is_file()), None)


def _read_case(root: Path, case: str, files: Any, split: str, labels_dir: Path, channels: dict[int, str],
               domain: str, label_names: dict[str, str]) -> Case:
    sequences = _refs(case, files, channels)
    tdir = root / TRUTH_DIR / case
    truth = read_truth(tdir) if tdir.is_dir() else None
    gt, metadata = None, {"split": split}
    if truth is not None:
        metadata.update(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    elif (lab := _label_file(labels_dir, case)) is not None:
        ref = ref_for(lab.resolve(), kind="mask", labels=dict(label_names))
        gt = {"values": {}, "labels": {"seg": ref.model_dump(mode="json")}, "references": {}}
    c = Case(id=sanitize_case_id(case), root=str(root.resolve()), domain=(truth or {}).get("domain") or domain,
             sequences=sequences, metadata=metadata, ground_truth=gt, layout=NAME)
    # a labelsTr map shares the case's grid; phantom truth (sidecar) may live on its own grids
    validate_case_shapes(c, ndim=None, include_labels=truth is None)
    return c


def read(root: Path, seq: Mapping[str, str] | None = None) -> list[Case]:
    """Every case of ``imagesTr`` and ``imagesTs`` (``metadata.split`` = train | test).

    Raises:
        ToolError: see the module docstring.
    """
    root = Path(root)
    desc = _description(root)
    channels, domain = channels_of(desc, root / DESCRIPTION, seq)
    label_names = _label_names(desc)
    items = []
    for images, labels, split in SPLITS:
        if (root / images).is_dir():
            items += [(case, files, split, root / labels) for case, files in
                      _case_files(root / images).items()]
    if not items:
        raise ToolError(ErrorCode.input_missing, f"no images in {root}/imagesTr or imagesTs", file=str(root))
    ids = [sanitize_case_id(c) for c, *_ in items]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ToolError(ErrorCode.schema, f"case {dup} appears in both imagesTr and imagesTs", case=dup, file=str(root))
    return read_each(items, lambda x: _read_case(root, x[0], x[1], x[2], x[3], channels, domain, label_names),
                     lambda x: x[0], lambda x: root, domain=domain, layout=NAME)


# ---- writing (phantom cohorts) ------------------------------------------------------------------
def _on_grid(art: Any, ref: Image, order: int) -> np.ndarray:
    if art.shape == ref.shape and np.allclose(art.affine, ref.affine, atol=1e-4):
        return np.asarray(art.data)
    from ...tools.resample import resample_to  # world-coordinate resampling, affines only

    return resample_to(art, ref, order=order)


def _write_case(p: Phantom, out: Path, names: list[str]) -> str:
    case = sanitize_case_id(p.case_id)
    missing = [s for s in names if s not in p.sequences]
    if missing:
        raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} lacks {missing} for this nnU-Net dataset",
                        case=p.case_id)
    ref = p.sequences[names[0]]
    for i, seq in enumerate(names):  # nnU-Net wants one grid per case: channels go onto the first's
        art = p.sequences[seq]
        write_volume(Image(_on_grid(art, ref, 1).astype(np.float32), ref.affine.copy(), dict(art.meta)),
                     out / "imagesTr" / f"{case}_{i:04d}.nii.gz")
    main = next((p.labels[k] for k in _MAIN_LABEL if k in p.labels), None)
    if main is not None:
        write_volume(Mask(np.rint(_on_grid(main, ref, 0)).astype(np.int16), ref.affine.copy(), {},
                          labels=dict(main.labels)), out / "labelsTr" / f"{case}.nii.gz")
    tdir = out / TRUTH_DIR / case
    labels = {n: write_volume(m, tdir / f"{case}_{n}.nii.gz") for n, m in p.labels.items()}
    refs = {s: write_volume(img, tdir / f"{case}_ref_{s.lower()}.nii.gz") for s, img in p.references.items()}
    write_truth(tdir, p, labels, refs)
    return case


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as an nnU-Net v2 raw dataset (all as training cases); channels are
    resampled onto the first channel's grid, as nnU-Net requires."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written, names, label_names = [], None, {}
    for p in phantoms:
        if names is None:
            names = sorted((s for s, a in p.sequences.items() if getattr(a, "kind", None) == ArtifactKind.image),
                           key=lambda s: CANONICAL.index(s) if s in CANONICAL else len(CANONICAL))
        main = next((p.labels[k] for k in _MAIN_LABEL if k in p.labels), None)
        label_names.update({str(k): v for k, v in (main.labels if main is not None else {}).items()})
        written.append(_write_case(p, out, names or []))
    write_json({"channel_names": {str(i): s for i, s in enumerate(names or [])},
                "labels": {"background": 0, **{n: int(k) for k, n in sorted(label_names.items())}},
                "numTraining": len(written), "file_ending": ".nii.gz", "name": "bcer synthetic phantoms"},
               out / DESCRIPTION)
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in written]
