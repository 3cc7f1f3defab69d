"""The sandbox: a case reads only its input root (and its own outputs) and writes only its
output folder (DESIGN "Sandbox").

Every path that reaches a tool goes through :meth:`Sandbox.check_read` or
:meth:`Sandbox.check_write`: relative paths are taken relative to the input root (read) or
the output folder (write), symlinks are resolved, and the result must lie inside the allowed
root. Rejected outright, before any resolution: ``..`` components (even ones that would land
inside), ``~`` home expansion, URLs (``scheme://``), NUL bytes, backslashes, empty paths,
unresolved tokens (``@...``) and non-path values. Every rejection is a ``ToolError`` with
code ``sandbox`` naming the path.

Which params are paths (:meth:`Sandbox.check_args`): a field annotated ``Path`` (also
``Path | None``, ``list[Path]``) in the tool's params model, and any param whose name ends in a
``path``/``dir``/``file``/``folder``/``root`` word (``out_dir``, ``mask_file``, ``paths``; not
``file_format``) holding a string (or a list of strings). A path param is a *write* path when its name starts with ``out``/``output``/
``save``/``dest``/``write``; otherwise it is a read path. ``None`` and ``""`` mean "unset" and
are not checked.

The check runs when the executor submits a node; it does not guard against a file being
swapped for a symlink later (tools open only the resolved path they are given).
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..contracts.errors import ErrorCode, ToolError

log = logging.getLogger(__name__)

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(//|/)")
_PATH_WORDS = {"path", "paths", "dir", "dirs", "directory", "file", "files", "filename", "filepath",
               "folder", "root"}
_WRITE_WORDS = {"out", "output", "outputs", "save", "dest", "destination", "write"}


def _deny(path: Any, why: str, **context: Any) -> ToolError:
    return ToolError(ErrorCode.sandbox, f"path {path!r} rejected: {why}",
                     hint="use a path inside the case's input root (read) or output folder (write)",
                     path=repr(path), **context)


def _is_path_type(annotation: Any) -> bool:
    if annotation is None:
        return False
    if isinstance(annotation, type) and issubclass(annotation, os.PathLike):
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        return any(_is_path_type(a) for a in typing.get_args(annotation) if a is not Ellipsis)
    return False


def _name_is_path(name: str) -> bool:
    # the LAST word decides: ``out_dir``/``mask_file`` are paths, ``file_format`` is not
    return name.lower().split("_")[-1] in _PATH_WORDS


def _name_is_write(name: str) -> bool:
    return name.lower().split("_")[0] in _WRITE_WORDS


class Sandbox:
    """Path checks for one case.

    Args:
        input_root: the case's input folder (readable).
        output_dir: the case's output folder (writable, readable); it need not exist yet.
        read_roots: further read-only folders that are not case data but tools may read
            (e.g. a local MONAI bundle folder passed as ``bundle_dir``); none by default.

    >>> box = Sandbox("/data/c1", "/out/c1")                       # doctest: +SKIP
    >>> box.check_write("seg.nii.gz")                              # doctest: +SKIP
    PosixPath('/out/c1/seg.nii.gz')
    """

    def __init__(self, input_root: str | os.PathLike, output_dir: str | os.PathLike,
                 read_roots: Iterable[str | os.PathLike] = ()):
        self.input_root = Path(os.path.realpath(os.path.expanduser(input_root)))
        self.output_dir = Path(os.path.realpath(os.path.expanduser(output_dir)))
        self.read_roots = tuple(_resolved_root(os.fspath(r)) for r in read_roots)
        # the roots as text: a check compares strings (two Path objects per check cost a tiny
        # case more than its tool)
        self._read = tuple(map(str, (self.input_root, self.output_dir, *self.read_roots)))
        self._write = (str(self.output_dir),)

    def check_read(self, path: Any, *, arg: str | None = None) -> Path:
        """The resolved path, if it lies in the input root, the output folder or a read root.

        Raises:
            ToolError: ``sandbox``, naming the path (and ``arg`` when given).
        """
        return self._check(path, self._read, "read", arg)

    def check_write(self, path: Any, *, arg: str | None = None) -> Path:
        """The resolved path, if it lies in the output folder.

        Raises:
            ToolError: ``sandbox``, naming the path (and ``arg`` when given).
        """
        return self._check(path, self._write, "write", arg)

    def _check(self, path: Any, roots: tuple[str, ...], mode: str, arg: str | None) -> Path:
        text = self._screen(path, arg)
        try:  # Path.resolve(strict=False) without the Path objects: realpath, then stat for loops
            resolved = os.path.realpath(text if os.path.isabs(text) else os.path.join(roots[0], text))
            _raise_on_loop(resolved)
        except (OSError, RuntimeError, ValueError) as e:  # symlink loops, names too long
            raise _deny(path, f"cannot be resolved ({type(e).__name__})", arg=arg) from None
        if not any(resolved == r or resolved.startswith(r.rstrip(os.sep) + os.sep) for r in roots):
            where = " or ".join(roots)
            raise _deny(path, f"resolves to {resolved}, outside {where} ({mode})", arg=arg)
        return Path(resolved)

    @staticmethod
    def _screen(path: Any, arg: str | None) -> str:
        """Reject what must never be resolved at all; return the path as text."""
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str):
            raise _deny(path, f"not a path ({type(path).__name__})", arg=arg)
        checks = [
            (path.strip() == "", "empty path"),
            ("\x00" in path, "NUL byte"),
            (path.startswith("@"), "unresolved reference token"),
            (path.startswith("~"), "home-directory expansion"),
            (bool(_URL.match(path)), "URLs are not files"),
            ("\\" in path, "backslash separators"),
            (".." in path.split("/"), "'..' component"),
        ]
        for bad, why in checks:
            if bad:
                raise _deny(path, why, arg=arg)
        return path

    def check_args(self, params: dict[str, Any], model: type[BaseModel] | None = None) -> dict[str, Any]:
        """Check every path param (see the module docstring for which ones) and return
        ``params`` with those values replaced by their resolved paths (as strings).

        Args:
            params: the node's params, tokens already resolved.
            model: the tool's params model, whose ``Path`` annotations mark path params.

        Raises:
            ToolError: ``sandbox`` for the first offending path, naming param and path.
        """
        fields = model.model_fields if model is not None else {}
        out = dict(params)
        for name, value in params.items():
            typed = name in fields and _is_path_type(fields[name].annotation)
            if value is None or value == "" or not (typed or _name_is_path(name)):  # "" = unset
                continue
            if not typed and not _is_pathish(value):
                continue  # e.g. ``n_files: 3``: a count, not a path
            check = self.check_write if _name_is_write(name) else self.check_read
            if isinstance(value, (list, tuple)):
                out[name] = [str(check(v, arg=name)) for v in value]
            else:
                out[name] = str(check(value, arg=name))
        return out


@functools.lru_cache(maxsize=64)
def _raise_on_loop(resolved: str) -> None:
    """realpath does not fail on a symlink loop (it returns the loop's name): stat does."""
    try:
        os.stat(resolved)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise
        # missing is fine here: a write path need not exist yet


def _resolved_root(path: str) -> Path:
    """Read-only roots (bcer's assets, model folders) are the same for every case of a run:
    resolved once, not per case."""
    return Path(path).expanduser().resolve()


def _is_pathish(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return bool(value) and all(isinstance(v, (str, os.PathLike)) for v in value)
    return isinstance(value, (str, os.PathLike))


__all__ = ["Sandbox"]
