"""Exemplar records and their Parquet sidecar (one row per exemplar, beside the FAISS index).

A record is what the R4 Retriever hands a drafter as a few-shot example: the verified report
(findings and impression prose), the evidence profile it was written for (the text that was
embedded), the drafter's sentence plan, tags, and provenance digests of the case it came from.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_JSON_COLS = ("plan", "tags", "merged_cases")


@dataclass
class Exemplar:
    """One verified report in the memory.

    Attributes:
        task: task contract id (retrieval never crosses tasks).
        specialisation: neuro-oncology | prostate | cardiology | general (from the Router).
        profile: evidence profile class: no_finding | single | multifocal | borderline.
        profile_text: the evidence summary that was embedded (and is matched at retrieval).
        report_text: the final report prose (Findings and Impression).
        plan: the drafter's sentence plan (slot names in order), realised again on new evidence.
        label: the classification label of the case.
        tags: anything else searchable (domain, negations, sides, zones, ...).
        case / run: where it came from; evidence_digest / report_digest: sha256 of both.
        support: how many verified cases this exemplar stands for (near-duplicates merge in).
        structure: what must be equal for two reports to be duplicates at all (profile, label,
            each lesion's or compartment's side/zone/category); cosine alone cannot tell a
            left from a right lesion in a templated summary.
    """

    task: str
    profile_text: str
    report_text: str
    specialisation: str = "general"
    profile: str = "single"
    plan: list[str] = field(default_factory=list)
    label: str = ""
    tags: dict[str, Any] = field(default_factory=dict)
    case: str = ""
    run: str = ""
    evidence_digest: str = ""
    report_digest: str = ""
    created: float = field(default_factory=time.time)
    support: int = 1
    merged_cases: list[str] = field(default_factory=list)
    structure: str = ""
    id: str = ""

    def __post_init__(self) -> None:
        if not self.report_digest:
            self.report_digest = hashlib.sha256(self.report_text.encode()).hexdigest()
        if not self.id:
            self.id = hashlib.sha256(f"{self.task}\n{self.case}\n{self.report_digest}".encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Exemplar":
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in d.items() if k in names})


def _row(rec: Exemplar, position: int) -> dict[str, Any]:
    d = rec.to_dict()
    for col in _JSON_COLS:
        d[col] = json.dumps(d[col], sort_keys=True, default=str)
    d["position"] = position
    return d


def write_sidecar(records: list[tuple[Exemplar, int]], path: Path) -> Path:
    """All records (with their index position) as Parquet, written to a temp file and renamed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    rows = [_row(r, pos) for r, pos in records]
    schema = pa.schema([("id", pa.string()), ("task", pa.string()), ("position", pa.int64()),
                        ("specialisation", pa.string()), ("profile", pa.string()), ("profile_text", pa.string()),
                        ("report_text", pa.string()), ("plan", pa.string()), ("label", pa.string()),
                        ("tags", pa.string()), ("case", pa.string()), ("run", pa.string()),
                        ("evidence_digest", pa.string()), ("report_digest", pa.string()),
                        ("created", pa.float64()), ("support", pa.int64()), ("merged_cases", pa.string()),
                        ("structure", pa.string())])
    table = pa.Table.from_pylist(rows, schema=schema)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    pq.write_table(table, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def read_sidecar(path: Path) -> list[tuple[Exemplar, int]]:
    import pyarrow.parquet as pq

    out = []
    for d in pq.read_table(path).to_pylist():
        pos = int(d.pop("position"))
        for col in _JSON_COLS:
            d[col] = json.loads(d[col]) if d.get(col) else ({} if col == "tags" else [])
        out.append((Exemplar.from_dict(d), pos))
    return out


__all__ = ["Exemplar", "read_sidecar", "write_sidecar"]
