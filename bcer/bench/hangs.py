"""The runtime fault of the controller ablation (:mod:`bcer.bench.faults`): one tool call of an
armed (case, step) hangs once, in this process or in a Ray worker.

The driver arms a case while the cluster runs (:class:`HangSwitch`); workers learn the armed set
from a file named in ``BCER_FAULT_HANGS`` through a ``worker_process_setup_hook``
(:func:`ray_runtime_env`) that makes every registered tool ask :func:`should_hang` first.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

HANG_ENV = "BCER_FAULT_HANGS"


class HangSwitch:
    """Arms "the first call of step S of case C hangs" for in-process calls and Ray workers.

    The armed set lives in a JSON file (path in ``BCER_FAULT_HANGS`` for workers), so the
    driver can arm a case while the cluster runs; "first call only" is a sentinel file made
    with ``O_EXCL``, so exactly one attempt hangs however many workers retry.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.file = self.folder / "hangs.json"
        self._lock = threading.Lock()
        if not self.file.exists():
            self._write({})

    def _write(self, armed: dict[str, str]) -> None:
        tmp = self.file.with_suffix(".tmp")
        tmp.write_text(json.dumps(armed))
        os.replace(tmp, self.file)

    def arm(self, case_id: str, step: str) -> None:
        with self._lock:
            armed = json.loads(self.file.read_text())
            armed[f"{case_id}:{step}"] = str(self.folder / f"hung-{case_id}-{step}")
            self._write(armed)


def should_hang(case_id: str, step: str, file: str | Path | None = None) -> bool:
    """True exactly once for an armed (case, step): the caller then hangs."""
    file = file or os.environ.get(HANG_ENV)
    if not file or not os.path.exists(file):
        return False
    try:
        sentinel = json.loads(Path(file).read_text()).get(f"{case_id}:{step}")
    except (OSError, ValueError):
        return False
    if not sentinel:
        return False
    try:
        os.close(os.open(sentinel, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


HANG_S = 3600.0


def hang(cancel: threading.Event | None = None, seconds: float = HANG_S) -> None:
    """Block like a stuck call (until cancelled or ``seconds`` pass)."""
    log.warning("fault injection: a tool call hangs")
    (cancel or threading.Event()).wait(seconds)


def install_worker_hangs() -> None:
    """Ray ``worker_process_setup_hook``: every registered tool first asks :func:`should_hang`
    with the case and node read from the running task's name (``case/node/tool``)."""
    import functools

    from ..tools import registry as reg

    reg.load_all()
    for name, entry in list(reg.REGISTRY.items()):
        if getattr(entry.fn, "_bcer_hang_wrapped", False):
            continue

        def wrap(fn: Callable) -> Callable:
            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    import ray

                    # the engine names node tasks ``case/node/tool`` (engine.placement.task_name)
                    case_id, node, _ = (ray.get_runtime_context().get_task_name() or "").split("/", 2)
                except Exception:  # not inside a named Ray task (any error): no hang
                    return fn(*args, **kwargs)
                if should_hang(case_id, node):
                    hang()
                return fn(*args, **kwargs)

            wrapper._bcer_hang_wrapped = True  # type: ignore[attr-defined]
            return wrapper

        reg.REGISTRY[name] = reg.RegisteredTool(entry.spec, wrap(entry.fn), entry.params_model, entry.multi_output)


def ray_runtime_env(switch: HangSwitch) -> dict[str, Any]:
    """The runtime_env that makes Ray workers honour ``switch``."""
    return {"worker_process_setup_hook": f"{__name__}.install_worker_hangs",
            "env_vars": {HANG_ENV: str(switch.file)}}


__all__ = ["HANG_ENV", "HANG_S", "HangSwitch", "hang", "install_worker_hangs", "ray_runtime_env", "should_hang"]
