"""What ``bcer data inspect`` reports: the detected layout and, per case, its sequences (from
headers), its ground truth, any problem found while reading it, and the tasks it can run
(every required input of the task's contract present, or an alternative the contract allows).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

from ...contracts.case import Case, SequenceRef
from ...contracts.errors import ToolError
from ...contracts.sequences import canonical_sequence
from ...io import sequence_header

__all__ = ["inspect", "runnable_tasks"]


def _canon(name: str) -> str:
    return canonical_sequence(name) or name


def runnable_tasks(sequences: Iterable[str]) -> list[str]:
    """Task ids whose contract inputs a case with these sequence names covers."""
    from ...contracts.task import list_contracts, load_contract

    have = {_canon(s) for s in sequences}
    out = []
    for task in list_contracts():
        c = load_contract(task)
        alts = {_canon(k): {_canon(a) for a in v} for k, v in c.input_alternatives.items()}
        if all(_canon(i) in have or alts.get(_canon(i), set()) & have for i in c.inputs):
            out.append(c.id)
    return out


def _describe(ref: SequenceRef) -> dict[str, Any]:
    try:
        h = sequence_header(ref)
    except ToolError as e:  # a damaged file is reported on its row, the rest still shown
        return {"path": ref.path, "format": ref.format, "error": str(e)}
    return {"path": ref.path, "format": ref.format, "kind": ref.kind.value, "shape": list(h["shape"]),
            "spacing": [round(float(s), 4) for s in h["spacing"]], "orientation": h["orientation"]}


def _row(case: Case, layout: str) -> dict[str, Any]:
    gt = case.ground_truth or {}
    seqs = {s: _describe(r) for s, r in case.sequences.items()}
    broken = [f"{s}: {d['error']}" for s, d in seqs.items() if "error" in d]
    return {"case": case.id, "layout": layout, "domain": case.domain, "root": case.root,
            "sequences": seqs, "metadata": case.metadata,
            "ground_truth": {"values": sorted(gt.get("values", {})), "labels": sorted(gt.get("labels", {})),
                             "references": sorted(gt.get("references", {}))} if gt else None,
            "tasks": [] if case.issues or broken else runnable_tasks(case.sequences),
            "issues": [i.get("message", "") + (f" ({i['context'].get('file')})" if i.get("context", {}).get("file")
                                               else "") for i in case.issues] + broken}


def inspect(root: str | Path, layout: str | None = None,
            seq: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per case (``case``, ``layout``, ``domain``, ``sequences``, ``ground_truth``,
    ``tasks``, ``issues``); a case that cannot be read is a row with its ``issues`` (and no
    tasks), never a failure of the whole dataset.

    Raises:
        ToolError: when no layout fits ``root`` or the layout finds no case at all.
    """
    from . import detect_layout, read_dataset

    name = layout or detect_layout(root, seq)
    cases = read_dataset(root, layout=name, strict=False, seq=seq)
    return [_row(c, name) for c in cases]
