"""BraTS 2023 and later: ``BraTS-GLI-00000-000/BraTS-GLI-00000-000-{t1n,t1c,t2w,t2f,seg}.nii.gz``.

The collections (GLI adult glioma, MEN meningioma, MET metastases, PED paediatric, SSA
sub-Saharan Africa glioma, and any later ``BraTS-<XXX>-`` prefix) share one file scheme:
``t1n`` native T1, ``t1c`` contrast T1, ``t2w`` T2 (the brain T2, not the prostate T2w),
``t2f`` FLAIR, ``seg`` the tumour label map.

Labels differ from BraTS 2018-2021 (``brats`` layout: 1 necrotic core, 2 oedema, 4
enhancing): here 1 is the non-enhancing tumour core (NETC), 2 the surrounding FLAIR
hyperintensity (SNFH) and 3 the enhancing tumour (ET); BraTS 2024 post-treatment glioma adds
4, the resection cavity, which is no tumour. The ground-truth ref carries these names, and
``region_values`` turns the names into the BraTS regions (WT, TC, ET), so one scorer reads
either convention. The written files keep the dataset's own values.

Phantom cohorts written here keep a ``bcer_truth.json`` sidecar per case (bcer's phantom
truth), like the ``brats`` layout.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ...contracts.artifacts import Mask
from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ErrorCode, ToolError
from ..phantom import Phantom
from ._common import read_each, read_truth, ref_for, sanitize_case_id, validate_case_shapes, write_truth, write_volume

log = logging.getLogger(__name__)

NAME = "brats2023"
FILE_KEYS = {"T1": "t1n", "T1c": "t1c", "T2": "t2w", "FLAIR": "t2f"}
SEG_LABELS = {1: "necrotic_core", 2: "oedema", 3: "enhancing", 4: "resection_cavity"}
# names of the BraTS evaluation regions (label names, either convention): WT is every tumour
# label, TC the core without oedema, ET the enhancing part; a resection cavity is in none
REGIONS = {"wt": ("necrotic_core", "oedema", "enhancing"), "tc": ("necrotic_core", "enhancing"),
           "et": ("enhancing",)}
CASE_RX = re.compile(r"BraTS-[A-Za-z]+-\d+-\d+")
_TO_2023 = {1: 1, 2: 2, 4: 3}  # bcer's phantom labels (BraTS 2018 values) -> 2023 values

__all__ = ["NAME", "FILE_KEYS", "SEG_LABELS", "REGIONS", "compartment", "detect", "read", "write",
           "region_values", "labels_for_name"]


def compartment(name: str) -> str | None:
    """bcer's compartment name for a label name as datasets write it (``NETC``, ``non-enhancing
    tumor``, ``edema``, ``SNFH``, ``enhancing tumour``, ``ET``); None for a resection cavity,
    background or a name that says no compartment."""
    key = re.sub(r"[\s_\-]+", " ", str(name).strip().lower())
    if key in REGIONS["wt"]:
        return key
    words = set(key.split())
    if "cavity" in key or "background" in key:
        return None
    if re.search(r"non ?enhanc|necro|cyst", key) or words & {"netc", "ncr", "net", "cc"}:
        return "necrotic_core"  # the non-enhancing core (BraTS TC without ET)
    if "enhanc" in key or words & {"et"}:
        return "enhancing"
    if re.search(r"o?edema|hyperintens", key) or words & {"snfh", "ed"}:
        return "oedema"
    return None


def region_values(labels: Mapping[int, str], region: str) -> tuple[int, ...]:
    """Label values of BraTS region ``wt``/``tc``/``et`` in a label table that names its
    values (``{1: "necrotic_core", 2: "oedema", 3: "enhancing"}`` gives ET = (3,); MSD's
    ``{1: "edema", 2: "non-enhancing tumor", 3: "enhancing tumour"}`` gives TC = (2, 3))."""
    names = REGIONS[region]
    return tuple(sorted(int(v) for v, n in labels.items() if compartment(n) in names))


def labels_for_name(name: str) -> dict[int, str] | None:
    """The 2023 label table for a file or folder named like a BraTS 2023+ case, else None."""
    return dict(SEG_LABELS) if CASE_RX.match(Path(name).name) else None


def _find(d: Path, key: str) -> Path | None:
    for ext in (".nii.gz", ".nii"):
        p = d / f"{d.name}-{key}{ext}"
        if p.exists():
            return p
    return None


def _is_case_dir(d: Path) -> bool:
    return d.is_dir() and bool(CASE_RX.fullmatch(d.name)) and any(
        _find(d, k) is not None for k in (*FILE_KEYS.values(), "seg"))


def case_dirs(root: Path) -> list[Path]:
    """Case folders directly under ``root`` (or ``root`` itself when it is one)."""
    root = Path(root)
    if _is_case_dir(root):
        return [root]
    return sorted(d for d in root.iterdir() if _is_case_dir(d))


def detect(root: Path) -> bool:
    root = Path(root)
    return root.is_dir() and bool(case_dirs(root))


def _read_case(d: Path) -> Case:
    sequences = {}
    missing = []
    for seq, key in FILE_KEYS.items():
        p = _find(d, key)
        if p is None:
            missing.append(f"{d.name}-{key}.nii.gz")
        else:
            sequences[seq] = ref_for(p.resolve(), kind="image")
    if not sequences:
        raise ToolError(ErrorCode.input_missing, f"case {d.name} has none of {missing}", case=d.name, file=str(d))
    if missing:
        log.info("case %s lacks %s", d.name, missing)
    truth = read_truth(d)
    metadata, gt = {}, None
    if truth is not None:
        metadata = dict(truth["metadata"])
        gt = {k: truth[k] for k in ("values", "labels", "references")}
    elif (seg := _find(d, "seg")) is not None:
        gt = {"values": {}, "references": {},
              "labels": {"seg": ref_for(seg.resolve(), kind="mask", labels=SEG_LABELS).model_dump(mode="json")}}
    case = Case(id=sanitize_case_id(d.name), root=str(d.resolve()), domain="brain", sequences=sequences,
                metadata=metadata, ground_truth=gt, layout=NAME)
    validate_case_shapes(case)
    return case


def read(root: Path) -> list[Case]:
    """Every BraTS 2023+ case under ``root`` as a lazy Case (headers checked, arrays not loaded).

    Raises:
        ToolError: ``input_missing`` (no case folder, or a case with none of the four
            contrasts), ``schema`` (unreadable header), ``shape`` (files of a case on
            different grids, naming both files).
    """
    root = Path(root)
    dirs = case_dirs(root) if root.is_dir() else []
    if not dirs:
        raise ToolError(ErrorCode.input_missing, f"no BraTS 2023 case folders under {root}", file=str(root),
                        hint="expected BraTS-GLI-00000-000/BraTS-GLI-00000-000-t1n.nii.gz ...")
    return read_each(dirs, _read_case, lambda d: d.name, lambda d: d, domain="brain", layout=NAME)


# ---- writing (phantom cohorts) ------------------------------------------------------------
def _folder_name(case_id: str, i: int) -> str:
    cid = sanitize_case_id(case_id)
    return cid if CASE_RX.fullmatch(cid) else f"BraTS-GLI-{i:05d}-000"


def _seg_2023(mask: Mask) -> Mask:
    data = np.zeros_like(np.asarray(mask.data))
    for old, new in _TO_2023.items():
        data[np.asarray(mask.data) == old] = new
    return Mask(data, np.asarray(mask.affine).copy(), dict(mask.meta),
                labels={_TO_2023[v]: n for v, n in mask.labels.items() if v in _TO_2023})


def _write_case(p: Phantom, out: Path, name: str) -> None:
    d = out / name
    for seq, key in FILE_KEYS.items():
        if seq not in p.sequences:
            raise ToolError(ErrorCode.input_missing, f"phantom {p.case_id} has no {seq} for BraTS 2023",
                            hint=f"BraTS needs {sorted(FILE_KEYS)}", case=p.case_id)
        write_volume(p.sequences[seq], d / f"{name}-{key}.nii.gz")
    labels: dict[str, SequenceRef] = {}
    for lname, mask in p.labels.items():
        if lname == "seg":
            labels[lname] = write_volume(_seg_2023(mask), d / f"{name}-seg.nii.gz")
        else:  # extra label maps under names a reader of real data ignores
            labels[lname] = write_volume(mask, d / "bcer_truth" / f"{lname}.nii.gz")
    refs = {s: write_volume(img, d / "bcer_truth" / f"ref_{s}.nii.gz") for s, img in p.references.items()}
    write_truth(d, p, labels, refs)


def write(phantoms: Iterable[Phantom], out: Path) -> list[Case]:
    """Write phantoms as BraTS 2023 case folders (``BraTS-GLI-<n>-000`` unless the case id
    already is such a name; the seg in 2023 values); returns the read-back Cases in order."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for i, p in enumerate(phantoms):
        names.append(_folder_name(p.case_id, i))
        _write_case(p, out, names[-1])
    by_id = {c.id: c for c in read(out)}
    return [by_id[n] for n in names]
