"""Dataset layouts: one module each, exposing ``NAME``, ``detect(root) -> bool``,
``write(phantoms, out) -> list[Case]`` and ``read(root) -> list[Case]``.

Modules are discovered, so adding a layout needs no edit here.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType
from typing import Mapping

from ...contracts.errors import ErrorCode, ToolError, did_you_mean


def layouts() -> dict[str, ModuleType]:
    found = {}
    for m in pkgutil.iter_modules(__path__):
        if not m.name.startswith("_"):
            mod = importlib.import_module(f"{__name__}.{m.name}")
            found[getattr(mod, "NAME", m.name)] = mod
    return found


def get_layout(name: str) -> ModuleType:
    all_ = layouts()
    if name not in all_:
        raise ToolError(ErrorCode.schema, f"unknown dataset layout {name!r}", hint=did_you_mean(name, all_))
    return all_[name]


def detect_layout(root: str | Path, seq: Mapping[str, str] | None = None) -> str:
    """Name of the first layout whose ``detect`` accepts ``root``; with a sequence mapping
    (``--seq``) the layout that takes one: nnunet or dicom when ``root`` is such a dataset,
    else flat; a mapping file (``root`` a .csv/.tsv/.yaml file) is flat."""
    root = Path(root)
    if not root.exists():
        raise ToolError(ErrorCode.input_missing, f"dataset folder not found: {root}", file=str(root))
    if root.is_file():  # a mapping file (case, sequence, path) is a flat dataset
        return "flat"
    if seq:
        for name in ("nnunet", "dicom"):  # channels, or SeriesDescription patterns
            if layouts()[name].detect(root):
                return name
        return "flat"
    # flat (any folder of image files) is the catch-all: every specific layout is asked first
    for name, mod in sorted(layouts().items(), key=lambda kv: (kv[0] == "flat", kv[0])):
        if mod.detect(root):
            return name
    raise ToolError(ErrorCode.schema, f"cannot tell the layout of {root}",
                    hint=f"name it with --layout (known: {sorted(layouts())}); for NIfTI files in "
                    "sub-folders map them with --seq T1=t1/*.nii.gz, or list every file in a mapping file "
                    "(case,sequence,path; docs/data.md)", file=str(root))


def read_layout(name: str, root: str | Path, seq: Mapping[str, str] | None = None):
    """``read`` of layout ``name``, passing the sequence mapping to layouts that take one.

    Raises:
        ToolError: ``schema`` when ``seq`` is given to a layout that names its own sequences.
    """
    mod = get_layout(name)
    if not seq:
        return mod.read(Path(root))
    if "seq" not in inspect.signature(mod.read).parameters:
        takes = sorted(n for n, m in layouts().items() if "seq" in inspect.signature(m.read).parameters)
        raise ToolError(ErrorCode.schema, f"layout {name!r} names its own sequences; --seq applies to {takes}",
                        arg="seq")
    return mod.read(Path(root), seq=dict(seq))


def read_dataset(root: str | Path, layout: str | None = None, strict: bool = False,
                 seq: Mapping[str, str] | None = None):
    """Read every case under ``root`` (layout detected unless named).

    With ``strict=False`` (cohorts) a case that fails its header checks is kept with its typed
    error in ``Case.issues``, so it becomes a rejected row while the others run. ``seq`` maps
    sequence names to file patterns (flat) or channels (nnunet).
    """
    from ._common import lenient_read

    name = layout or detect_layout(root, seq)
    if strict:
        return read_layout(name, root, seq)
    with lenient_read():
        return read_layout(name, root, seq)
