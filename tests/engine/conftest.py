"""Engine tests: the toy tools the executor tests plan with are registered here, once (the
driver's registry; Ray workers import them by module name, as any user tool), and the
preamble of the tests that drive one ``CaseRun`` by hand."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

import tests.engine._exec_tools  # noqa: F401  (registers xtoy.*)


@pytest.fixture
def case_run(ray_local) -> Callable[..., tuple[Any, Any, Any, Any]]:
    """``make(plan, case, out, run_id, repairer=False) -> (run, driver, trace, ctx)``: a CaseRun of
    the compiled ``plan`` (not started) writing to ``out/<case id>``, the driver whose loop it is
    on (``driver.add(run); driver.run()`` runs it) and its trace."""
    from bcer.engine.case.run import CaseRun
    from bcer.engine.compiler import compile_plan
    from bcer.engine.executor import RunContext
    from bcer.engine.driver import TICK_S, Driver
    from bcer.engine.trace import TraceWriter

    def make(plan: Any, case: Any, out: Path, run_id: str, repairer: Any = False) -> tuple[Any, Any, Any, Any]:
        ctx = RunContext(run_id=run_id, output_dir=Path(out) / case.id)
        driver = Driver(dict(ray_local.cluster_resources()), housekeeping_s=TICK_S)
        trace = TraceWriter(ctx.output_dir, ctx.run_id, case.id)
        run = CaseRun(compile_plan(plan, case), case, ctx, None, repairer, [], trace, driver.loop, driver.cluster)
        return run, driver, trace, ctx

    return make
