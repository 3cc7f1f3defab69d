"""Run by test_kill in its own process (a driver joining the test's Ray cluster): a small cohort
the test interrupts (SIGINT) or kills (SIGKILL) at points it holds the cases at; the test then
resumes it."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
# files in a case's input folder that hold its node a / node b while they exist: the test decides
# which cases are held where, and releases them by deleting the file (no race against a timer)
HOLD_A, HOLD_B = "HOLD_a", "HOLD_b"


def cohort_cases(data: Path):
    from bcer.contracts import Case, SequenceRef

    return [Case(id=d.name, root=str(d), sequences={"T1": SequenceRef(path=str(d / "t1.nii.gz"))})
            for d in sorted(data.iterdir())]


def plan():
    from bcer.contracts import PlanSketch

    return PlanSketch(goal="slow chain", steps=[
        {"id": "a", "tool": "xtoy.step", "args": {"img": "@seq.T1", "add": 1, "hold_file": HOLD_A}},
        {"id": "b", "tool": "xtoy.step", "args": {"img": "@node.a.image", "add": 2, "hold_file": HOLD_B}},
        {"id": "m", "tool": "xtoy.measure", "args": {"img": "@node.b.image"}}])


def main(data: Path, out: Path, cache: Path, address: str) -> None:
    import importlib

    import bcer.engine.tables as tables
    from bcer.engine.cohort import CohortConfig, run_cohort
    from bcer.engine.planning import StaticPlanner

    importlib.import_module("tests.engine._exec_tools")
    tables.FLUSH_EVERY_S = 0.5  # write table parts every half second
    # joins the test's cluster, as `bcer cohort --address` does: killing this driver leaves it up
    # fused cases here, node-by-node ones in the test's resume: a killed fused run resumes unfused
    run_cohort(cohort_cases(data), CohortConfig(out=out, planner=StaticPlanner(plan()), max_in_flight=2,
                                                cache=cache, address=address, fuse="always"))


if __name__ == "__main__":
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test dumps our stacks if we hang
    # Ctrl-C as in a terminal: a process started from a background job (CI, nohup) inherits SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler; the test's SIGINT needs one
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
