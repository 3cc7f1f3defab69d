"""Build docs/results.md from benchmarks/results/*.json: one table per result file, grouped by
the benchmark that wrote it, with its date, the commit that recorded it and the machine.

Every number on the page is copied from a JSON file, so the page cannot drift from the
measurements; rerun after adding or replacing a result file:

    python scripts/results_page.py

Text after the line ``<!-- end of generated tables -->`` in docs/results.md is kept.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
END = "<!-- end of generated tables -->"
MAX_ROWS = 24  # measures per file; the JSON holds the rest
# keys that hold the measurements, looked at first; load averages and notes are not results
FIRST = ("summary", "totals", "table", "by_arm", "tasks", "results", "by_k", "memory_off", "memory_on", "sizes",
         "ratio", "speedup", "tools", "accuracy")
SKIP = re.compile(r"load|note|what|command|rule|how_|why|verdict|history|uptime|python|created|commit|machine|"
                  r"environment|cpu_count|cpus$|host|^rows|^cases$|case_ids|changed|tried|arm_docs|fault_classes|"
                  r"faults_injected|cells|^raw|_docs|family_note|look$|config", re.I)
GROUPS = [("Task benchmark (`bcer bench`)", r"^bench_"), ("Controller ablation", r"^ablation"),
          ("Engine overhead and scale", r"^(engine_overhead|wide_cohort|scale_|pipeline|parallel)"),
          ("Plausibility checks on correct runs", r"^plausibility"),
          ("Cardiac phantom families", r"^cardiac"), ("Prostate phantom families", r"^(prostate|heldout|randomised)"),
          ("Brain and k-space families", r"^brain_kspace"), ("Reports: R4 and the exemplar memory", r"^(r4_|memory)"),
          ("LLM planner", r"^llm"), ("GPU", r"^gpu"), ("Tools, reconstruction, data, bundles, pages", r".")]


def git_last(path: Path) -> tuple[str, str]:
    """(short commit, date) of the last commit that touched ``path``; ("", "") when untracked."""
    out = subprocess.run(["git", "log", "-1", "--format=%h %cs", "--", str(path)], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    return (out[0], out[1]) if len(out) == 2 else ("", "")


def machine_of(d: dict[str, Any]) -> str:
    for key in ("machine", "device_name", "environment", "host"):
        v = d.get(key)
        if isinstance(v, str):
            return v
        if isinstance(v, dict):
            parts = [f"{k} {v[k]}" for k in ("cpu_count", "cpus", "gpu", "device", "torch", "platform") if k in v]
            if parts:
                return ", ".join(map(str, parts))
    for key in ("cpus", "cpu_count", "ray_num_cpus"):
        if isinstance(d.get(key), (int, float)):
            return f"{d[key]:g} CPUs"
    cluster = (d.get("config") or {}).get("cluster") if isinstance(d.get("config"), dict) else None
    if isinstance(cluster, dict) and "CPU" in cluster:
        return f"{cluster['CPU']:g} CPUs, {cluster.get('GPU', 0):g} GPUs (Ray cluster)"
    return "not recorded"


def leaves(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, Any]]:
    """Scalar leaves (numbers, booleans, short text) under ``obj``, dotted names."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if SKIP.search(str(k)) and depth == 0:
                continue
            yield from leaves(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, list):
        if len(obj) <= 4 and all(isinstance(x, (int, float)) for x in obj):
            yield prefix, ", ".join(_fmt(x) for x in obj)
    elif isinstance(obj, bool) or isinstance(obj, (int, float)):
        yield prefix, obj
    elif isinstance(obj, str) and len(obj) <= 40 and depth > 0:
        yield prefix, obj


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def measures(d: dict[str, Any]) -> list[tuple[str, Any]]:
    ordered = [k for k in FIRST if k in d] + [k for k in d if k not in FIRST]
    out: list[tuple[str, Any]] = []
    for k in ordered:
        if SKIP.search(k):
            continue
        out.extend(leaves({k: d[k]}))
        if len(out) >= MAX_ROWS:
            break
    return out[:MAX_ROWS]


NOISE = re.compile(r"\.(n|threshold|higher_is_better|task|chain|failures|met)$|load_(avg|after|before|average)")


def bench_table(d: dict[str, Any]) -> str:
    """``bcer bench`` files: one row per task, quality means with the threshold met (✓) or not (✗)."""
    rows = []
    for tid, t in d["tasks"].items():
        qual = "; ".join(f"{k} {_fmt(q['mean']) if q.get('mean') is not None else '-'}"
                         f"{'' if q.get('met') is None else (' ✓' if q['met'] else ' ✗')}"
                         for k, q in (t.get("quality") or {}).items())
        rows.append(f"| {tid} | {t.get('cases')} | {_fmt(t.get('sr_delivered', t.get('sr')))} | {_fmt(t.get('sr'))} | "
                    f"{_fmt(t.get('tcr'))} | {qual} | {_fmt(t.get('median_case_s'))} |")
    return ("\n| task | cases | SR (delivered) | SR (plausible) | TCR | quality mean (✓ threshold met) | "
            "median s/case |\n|---|---|---|---|---|---|---|\n" + "\n".join(rows) +
            f"\n\nTotal wall time {_fmt(d.get('total_wall_s'))} s (synthesis {_fmt(d.get('synth_s'))} s).\n")


def section(path: Path) -> str:
    d = json.loads(path.read_text())
    if not isinstance(d, dict):
        d = {"values": d}
    commit, date = git_last(path)
    commit = d.get("commit") or d.get("code_commit_measured") or commit
    date = str(d.get("created") or date)[:10] or "not recorded"
    rows = [(k, v) for k, v in measures(d) if not NOISE.search(k)]
    head = (f"### `{path.name}`\n\ndate {date} · commit `{str(commit)[:7] or 'uncommitted'}` · "
            f"machine: {machine_of(d)}\n")
    if path.stem.startswith("bench_") and isinstance(d.get("tasks"), dict):
        return head + bench_table(d)
    if not rows:
        return head + "\nNo scalar summary in this file; read the JSON.\n"
    body = "\n".join(f"| `{name}` | {_fmt(value)} |" for name, value in rows)
    more = "" if len(rows) < MAX_ROWS else f"\n\nFirst {MAX_ROWS} measures; the file holds the rest.\n"
    return head + "\n| measure | value |\n|---|---|\n" + body + more


def build() -> str:
    files = sorted(RESULTS.glob("*.json"))
    seen: set[Path] = set()
    parts = ["# Results\n",
             "Every table below is copied from a JSON file in `benchmarks/results/` by `scripts/results_page.py` "
             "(rerun it after a new measurement). Unless a table says otherwise, the numbers come from bcer's own "
             "synthetic phantoms, not from real scans, on a shared 2-CPU machine; the machine line says what "
             "the file recorded. The scripts that write the files are in `benchmarks/` and each file's "
             "`command` or `config` field says how it was run.\n"]
    for title, pattern in GROUPS:
        group = [f for f in files if f not in seen and re.search(pattern, f.stem)]
        if not group:
            continue
        seen.update(group)
        parts.append(f"## {title}\n")
        parts.extend(section(f) for f in group)
    return "\n".join(parts) + f"\n{END}\n"


def main() -> None:
    kept = ""
    if PAGE.exists() and END in PAGE.read_text():
        kept = PAGE.read_text().split(END, 1)[1].lstrip("\n")
    PAGE.write_text(build() + ("\n" + kept if kept else ""))
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
