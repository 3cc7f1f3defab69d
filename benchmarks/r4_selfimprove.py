"""R4 self-improvement: a stream of report cases (>= 60, the three report tasks interleaved)
with the exemplar memory on vs off, same drafter: issues per report (chosen draft, before
repair) and after repair per window of 10 cases, memory size over the stream, and how often
the top retrieved exemplar has the same structure as the case (profile, label, sides, zones,
categories), which is what a drafter can reuse.

Curation in the stream is the engine's rule without the contract step (these cases are
built in-process, not run): a final report with no material issue is added.

Read the result with its drafter: the template drafter writes from the evidence and has no
issue to lose, so its memory-on and memory-off issue curves are both flat at 0; only the
retrieval curve moves. A drafter that uses exemplars (``--llm local``: the LLM drafter takes
the retrieved reports as few-shot examples) is what can show a difference in issues.

    python benchmarks/r4_selfimprove.py --llm local --cases 20 --out benchmarks/results/r4_selfimprove.json
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _r4_stream import make_drafter, run_case, stream

from bcer.agents.memory_actor import MemoryClient, MemoryService
from bcer.agents.r4.reviewer import R4Reviewer, prose_text, structure_key
from bcer.memory import Exemplar
from bcer.tools.report import render_report


def _structure(ev, draft) -> str:
    _, s, _ = render_report(ev, draft)
    return structure_key(s)


def run_arm(items, drafter, k: int, memory_dir: str | None, embedder: str) -> list[dict]:
    svc = MemoryService(memory_dir, embedder) if memory_dir else None
    client = MemoryClient(svc) if svc else None
    reviewer = R4Reviewer(client) if client else None
    rows = []
    for n, it in enumerate(items):
        out, row = run_case(it, drafter, k, reviewer._retrieve if reviewer else None)
        _, s, _ = render_report(it["ev"], out.draft)
        key = structure_key(s)
        row["top_exemplar_same_structure"] = bool(out.exemplars) and out.exemplars[0]["record"].get("structure") == key
        if client and not any(i.material for i in out.final_issues):
            rec = Exemplar(task=it["task"], profile_text=it["ev"].profile_text(it["history"]), report_text=prose_text(s),
                           specialisation=out.route.specialisation, profile=s["profile"], plan=s["plan"],
                           label=s["label"], tags={"draft": {"findings": s["findings"], "impression": s["impression"]}},
                           structure=key, case=it["case"], evidence_digest=it["ev"].digest())
            row["curation"] = client.add(rec.to_dict(), True, 0)["action"]
        row["memory_size"] = client.stats()["exemplars"] if client else 0
        rows.append(row)
    if svc:
        svc.close()
    return rows


def windows(rows: list[dict], size: int = 10) -> list[dict]:
    out = []
    for a in range(0, len(rows), size):
        w = rows[a:a + size]
        out.append({"cases": f"{a + 1}-{a + len(w)}", "issues_per_report": round(float(np.mean([r["chosen_issues"] for r in w])), 3),
                    "penalty_per_report": round(float(np.mean([r["chosen_penalty"] for r in w])), 3),
                    "final_issues_per_report": round(float(np.mean([r["final_issues"] for r in w])), 3),
                    "top_exemplar_same_structure": round(float(np.mean([r["top_exemplar_same_structure"] for r in w])), 3),
                    "memory_size_end": w[-1]["memory_size"]})
    return out


NOTE_SI = "template drafter: it writes every report from the evidence, so its issue curves are 0 with and without memory by construction and show nothing about self-improvement; the memory's effect visible here is retrieval (share of cases whose top exemplar has the same structure) as the memory grows. Rerun with --llm local (LLM drafter with retrieved exemplars as few-shot examples) to measure issues."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llm", default="none", help="LLM backend spec for the drafter (none: template drafter)")
    ap.add_argument("--cases", type=int, default=20, help="cases per report task (stream = 3x this)")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--embedder", default="minilm", help="minilm | hash")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/r4_selfimprove.json")
    args = ap.parse_args()
    drafter, name = make_drafter(args.llm)
    t0 = time.time()
    items = stream(args.cases, args.seed)
    res = {"config": {"drafter": name, "stream": len(items), "k": args.k, "embedder": args.embedder, "seed": args.seed,
                      "load_avg": os.getloadavg(), "cpus": os.cpu_count()}}
    with tempfile.TemporaryDirectory(prefix="bcer_selfimprove_") as tmp:
        for arm, mem in (("memory_off", None), ("memory_on", str(Path(tmp) / "mem"))):
            rows = run_arm(items, drafter, args.k, mem, args.embedder)
            res[arm] = {"windows": windows(rows), "rows": rows}
            print(arm, json.dumps(res[arm]["windows"]), flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    if name == "template":
        res["note"] = NOTE_SI
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
