"""Controller ablation under injected faults: 4 arms x 8 fault types x the nine tasks.

Arms (``bcer.bench.arms``): ``react``, ``react_bind``, ``react_bind_ref`` (scripted ReAct in
process, replaying the planner's sketch one call at a time) and ``bcer`` (the engine on Ray).
Faults (``bcer.bench.faults``): token_mutation, path_mutation, argument_omission,
semantic_swap, space_mismatch, timeout (recoverable); missing_modality, scope_violation
(unrecoverable). Every arm runs every case clean and once per fault; wrong deliverables are
judged against the same arm's clean run.

    .venv/bin/python benchmarks/ablation.py --cases 5 --timeout 60 --tag small5

Writes ``benchmarks/results/ablation_<tag>.json``: config (with the machine's load before and
after), arm and fault descriptions, the per (arm, task, fault) cells, per (arm, fault) and per
arm summaries, and every run's row (status, SR/TCR, error code, wrong deliverables).
The run outputs (cases, traces, deliverables) stay under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
from pathlib import Path

from bcer.bench.ablation import merge_reports, run_ablation

RESULTS = Path(__file__).parent / "results"
_ROW_KEYS = ("arm", "task", "case", "fault", "status", "sr", "tcr", "error_code", "error_message", "error_node",
             "recovered", "safe_halt", "is_wrong", "wrong_deliverables", "plan_differs", "present", "repairs",
             "revisions", "retries", "duration_s", "not_applicable", "clean_ok", "fault_detail")


def dumps(report: dict) -> str:
    """The report as JSON with one line per cell and per run row (diffable, compact)."""
    body = {k: v for k, v in report.items() if k not in ("rows", "cells", "faults_injected")}
    text = json.dumps(body, indent=1, default=str)[:-2]
    for key in ("cells", "faults_injected", "rows"):
        items = ",\n".join("  " + json.dumps(x, default=str) for x in report.get(key, []))
        text += f',\n "{key}": [\n{items}\n ]'
    return text + "\n}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="all")
    ap.add_argument("--arms", default="all")
    ap.add_argument("--faults", default="all")
    ap.add_argument("--cases", type=int, default=5)
    ap.add_argument("--size", default="small")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="per-call / per-node timeout (s)")
    ap.add_argument("--max-in-flight", type=int, default=4)
    ap.add_argument("--out", default=None, help="run outputs (default: a temp folder)")
    ap.add_argument("--tag", default="small5")
    ap.add_argument("--merge", nargs="+", type=Path, default=None,
                    help="combine these result files (disjoint tasks, same arms/faults) into ablation_<tag>.json")
    args = ap.parse_args()
    if args.merge:
        report = merge_reports([json.loads(p.read_text()) for p in args.merge])
        report["command"] = "python benchmarks/ablation.py --tag %s --merge %s" % (
            args.tag, " ".join(p.name for p in args.merge))
        (RESULTS / f"ablation_{args.tag}.json").write_text(dumps(report))
        print(json.dumps(report["by_arm"], indent=1))
        return
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = Path(args.out or tempfile.mkdtemp(prefix="bcer_ablation_"))
    done = [0]

    def progress(row: dict) -> None:
        done[0] += 1
        if done[0] % 25 == 0:
            logging.getLogger("ablation").warning("%d runs done (last: %s %s %s %s)", done[0], row["arm"],
                                                  row["task"], row["fault"], row["status"])

    report = run_ablation(args.tasks, args.arms, args.faults, args.cases, out, size=args.size, seed=args.seed,
                          timeout_s=args.timeout, max_in_flight=args.max_in_flight, on_row=progress)
    report["rows"] = [{k: r.get(k) for k in _ROW_KEYS if k in r} for r in report["rows"]]
    report["config"]["out"] = str(out)
    report["command"] = ("python benchmarks/ablation.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None and k != "out"))
    RESULTS.mkdir(exist_ok=True)
    target = RESULTS / f"ablation_{args.tag}.json"
    target.write_text(dumps(report))
    print(json.dumps(report["by_arm"], indent=1))
    print(f"wrote {target}; run outputs in {out}")


if __name__ == "__main__":
    main()
