"""Engine tests: the toy tools the executor tests plan with are registered here, once (the
driver's registry; Ray workers import them by module name, as any user tool)."""
from __future__ import annotations

import tests.engine._exec_tools  # noqa: F401  (registers xtoy.*)
