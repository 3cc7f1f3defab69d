"""Mapping files for the flat layout: which file is which sequence of which case, for any
folder structure bcer does not know.

CSV or TSV with a header ``case,sequence,path``::

    case,sequence,path
    pat01,T2w,scans/pat01/t2_tra.mha
    pat01,ADC,scans/pat01/adc.mha
    pat01,seg,labels/pat01.nii.gz

or YAML, either the same rows as a list or one mapping per case::

    pat01: {T2w: scans/pat01/t2_tra.mha, ADC: scans/pat01/adc.mha, seg: labels/pat01.nii.gz}

Relative paths are relative to the mapping file's folder. Sequence names go through the one
alias table; ``seg``/``label``/``mask`` name the ground-truth label map. A mapping file is
passed as the dataset itself (``bcer cohort --data cohort.csv``) or sits in the dataset
folder as ``bcer_mapping.csv`` (or ``.tsv``/``.yaml``/``.yml``).
"""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from ...contracts.errors import ErrorCode, ToolError, did_you_mean
from ._common import sanitize_case_id
from ._sequences import is_label_word, known_sequences, sequence_name

SUFFIXES = (".csv", ".tsv", ".yaml", ".yml")
MAPPING_NAMES = tuple(f"bcer_mapping{s}" for s in SUFFIXES)
LABEL = "seg"
_COLUMNS = ("case", "sequence", "path")

__all__ = ["MAPPING_NAMES", "SUFFIXES", "is_mapping_file", "read_mapping"]


def is_mapping_file(path: Path) -> bool:
    return Path(path).is_file() and Path(path).suffix.lower() in SUFFIXES


def _rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(where, row) pairs; ``where`` names the line or entry for error messages."""
    if path.suffix.lower() in (".csv", ".tsv"):
        with path.open(newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
            missing = [c for c in _COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ToolError(ErrorCode.schema, f"mapping file {path.name} lacks column(s) {missing}; "
                                f"it has {reader.fieldnames}", hint="header: case,sequence,path", file=str(path))
            return [(f"line {i}", r) for i, r in enumerate(reader, start=2)]
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ToolError(ErrorCode.schema, f"mapping file {path.name} is not valid YAML: {e}", file=str(path)) from e
    if isinstance(doc, dict):
        return [(f"case {c}", {"case": c, "sequence": s, "path": p})
                for c, seqs in doc.items() for s, p in (seqs or {}).items()]
    if isinstance(doc, list) and all(isinstance(r, dict) for r in doc):
        return [(f"entry {i}", r) for i, r in enumerate(doc, start=1)]
    raise ToolError(ErrorCode.schema, f"mapping file {path.name} is neither a list of rows nor one mapping "
                    "per case", hint="see docs/data.md, 'Any other layout'", file=str(path))


def _target(name: str, where: str, path: Path) -> str:
    if is_label_word(name):
        return LABEL
    canon = sequence_name(name)
    if canon is None:
        raise ToolError(ErrorCode.schema, f"{path.name} {where}: {name!r} is not a sequence name",
                        hint=did_you_mean(name, known_sequences() + [LABEL]), file=str(path))
    return canon


def read_mapping(path: str | Path) -> dict[str, dict[str, Path]]:
    """``{case: {canonical sequence or "seg": absolute file}}`` from a mapping file.

    Raises:
        ToolError: ``schema`` (missing columns, unknown sequence name, one sequence given twice
            for a case, empty file), ``input_missing`` (a listed file that does not exist,
            naming the case, the row and the file).
    """
    path = Path(path)
    out: dict[str, dict[str, Path]] = {}
    for where, row in _rows(path):
        case, seq, file = (str(row.get(k) or "").strip() for k in _COLUMNS)
        if not (case and seq and file):
            raise ToolError(ErrorCode.schema, f"{path.name} {where}: needs case, sequence and path, got {row}",
                            file=str(path))
        cid, target = sanitize_case_id(case), _target(seq, where, path)
        p = Path(file) if Path(file).is_absolute() else (path.parent / file)
        if not p.is_file():
            raise ToolError(ErrorCode.input_missing, f"case {cid}: {seq} file {file} ({path.name} {where}) "
                            "does not exist", hint="paths are relative to the mapping file's folder",
                            case=cid, file=str(p))
        if target in out.setdefault(cid, {}):
            raise ToolError(ErrorCode.schema, f"case {cid} has two files for {target} in {path.name} "
                            f"({out[cid][target].name} and {p.name})", case=cid, file=str(p))
        out[cid][target] = p.resolve()
    if not out:
        raise ToolError(ErrorCode.input_missing, f"mapping file {path.name} lists no files", file=str(path))
    return out
