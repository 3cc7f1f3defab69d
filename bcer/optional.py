"""Optional dependencies through one door (cupy, vllm, faiss, bundle packages).

``optional_import`` returns ``(module, available)``; the module is a stand-in that raises a
typed ``resource`` error only when used, so the core imports without the extras.
"""
from __future__ import annotations

import importlib
import logging
from functools import lru_cache
from typing import Any

from .contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)


class _Missing:
    def __init__(self, name: str, extra: str, reason: str):
        self._name, self._extra, self._reason = name, extra, reason

    def __getattr__(self, attr: str) -> Any:
        raise ToolError(ErrorCode.resource, f"optional package {self._name!r} is not available "
                        f"({self._reason})", hint=f"pip install 'bcer[{self._extra}]'")

    def __bool__(self) -> bool:
        return False


def optional_import(name: str, extra: str = "gpu") -> tuple[Any, bool]:
    try:
        return importlib.import_module(name), True
    except Exception as e:  # ImportError, or CUDA libraries missing at import time
        return _Missing(name, extra, f"{type(e).__name__}: {e}"), False


@lru_cache(maxsize=1)
def cuda_available() -> bool:
    """True when this process can run CUDA work (torch or cupy)."""
    torch, ok = optional_import("torch")
    if ok and torch.cuda.is_available():
        return True
    cp, ok = optional_import("cupy")
    try:
        return bool(ok and cp.cuda.runtime.getDeviceCount() > 0)
    except Exception:  # cupy raises its own CUDA error types (no driver, no device)
        return False
