"""Local model bundles chosen by the user (``--bundle TOOL=DIR``, ``--model-dir DIR``) and the
planner wrapper that puts them into plans.

``resolve_bundles`` checks, before any case runs, that each tool exists and takes a
``bundle_dir`` and that each folder holds a bundle (configs and a model); a relative folder
is looked up under the model dirs. ``BundleBinder`` wraps any planner (the offline planner, an
LLM planner, a replayed sketch): every step of a tool with a chosen bundle gets its
``bundle_dir`` unless the plan set one itself. The engine's sandbox must be told the folders
are readable (``read_roots``), see :func:`bundle_read_roots`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable, Mapping

from ...contracts import Case, ErrorCode, PlanSketch, TaskContract, ToolError
from ...contracts.errors import did_you_mean

log = logging.getLogger(__name__)
PARAM = "bundle_dir"


def parse_bundle_args(items: Iterable[str]) -> dict[str, str]:
    """``["seg.brain_tumor=DIR", ...]`` as ``{"seg.brain_tumor": "DIR"}``.

    Raises:
        ToolError: ``schema`` for an item that is not TOOL=DIR or a tool named twice.
    """
    out: dict[str, str] = {}
    for item in items:
        tool, sep, folder = str(item).partition("=")
        tool, folder = tool.strip(), folder.strip()
        if not sep or not tool or not folder:
            raise ToolError(ErrorCode.schema, f"--bundle {item!r} is not TOOL=DIR",
                            hint="e.g. --bundle seg.brain_tumor=models/brats_mri_segmentation", arg="bundle")
        if tool in out:
            raise ToolError(ErrorCode.schema, f"--bundle names {tool} twice", arg="bundle")
        out[tool] = folder
    return out


def _locate(folder: str, model_dirs: Iterable[str | Path]) -> Path:
    p = Path(folder).expanduser()
    if p.is_absolute() or p.exists():
        return p
    for root in model_dirs:
        if (Path(root).expanduser() / p).exists():
            return Path(root).expanduser() / p
    return p


def resolve_bundles(bundles: Mapping[str, str] | None, model_dirs: Iterable[str | Path] = ()) -> dict[str, str]:
    """{tool: absolute bundle folder}, checked.

    Raises:
        ToolError: ``schema`` for an unknown tool or one without ``bundle_dir``;
            ``input_missing`` for a folder without configs or model (searched as given,
            then under each model dir).
    """
    from ...tools.registry import REGISTRY, load_all
    from ...tools.seg.bundle import check_bundle_dir

    if not bundles:
        return {}
    load_all()
    model_dirs = list(model_dirs)
    for d in model_dirs:
        if not Path(d).expanduser().is_dir():
            raise ToolError(ErrorCode.input_missing, f"model dir {d} does not exist", file=str(d), arg="model_dir")
    takers = sorted(n for n, r in REGISTRY.items() if PARAM in r.spec.param_names)
    out = {}
    for tool, folder in bundles.items():
        if tool not in REGISTRY:
            raise ToolError(ErrorCode.schema, f"--bundle {tool}=...: no tool {tool!r}", hint=did_you_mean(tool, takers),
                            arg="bundle")
        if tool not in takers:
            raise ToolError(ErrorCode.schema, f"--bundle {tool}=...: {tool} takes no bundle",
                            hint=f"tools with {PARAM}: {takers}", arg="bundle")
        out[tool] = str(check_bundle_dir(_locate(folder, model_dirs)))
    return out


def bundle_read_roots(bundles: Mapping[str, str], model_dirs: Iterable[str | Path] = ()) -> tuple[str, ...]:
    """Folders a case's sandbox must let tools read: the model dirs and each bundle folder."""
    roots = [str(Path(d).expanduser().resolve()) for d in model_dirs] + [str(Path(b).resolve()) for b in bundles.values()]
    return tuple(dict.fromkeys(roots))


class BundleBinder:
    """A planner that plans with ``inner`` and fills ``bundle_dir`` of the chosen tools.

    >>> planner = BundleBinder(OfflinePlanner(), {"seg.brain_tumor": "/models/brats"})   # doctest: +SKIP
    """

    def __init__(self, inner: Any, bundles: Mapping[str, str]):
        self.inner = inner
        self.bundles = dict(bundles)
        self.name = getattr(inner, "name", "planner")

    def __getattr__(self, name: str) -> Any:
        """Everything else of the wrapped planner (``deterministic``, ``pop_events``, ...)."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _bind(self, sketch: PlanSketch) -> PlanSketch:
        for step in sketch.steps:
            folder = self.bundles.get(step.tool)
            if folder is not None and PARAM not in step.args:
                step.args[PARAM] = folder
                log.info("step %s (%s) runs bundle %s", step.id, step.tool, folder)
        return sketch

    def plan(self, goal: str, case: Case, contract: TaskContract | None = None) -> PlanSketch:
        return self._bind(self.inner.plan(goal, case, contract))

    def revise(self, sketch: PlanSketch, errors: list[ToolError], case: Case,
               contract: TaskContract | None = None) -> PlanSketch | None:
        revised = self.inner.revise(sketch, errors, case, contract)
        return None if revised is None else self._bind(revised)


__all__ = ["BundleBinder", "bundle_read_roots", "parse_bundle_args", "resolve_bundles"]
