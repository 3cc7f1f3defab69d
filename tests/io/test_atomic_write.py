"""Deliverables are written atomically with the permissions of any file the user writes, and JSON
files are strict JSON."""
from __future__ import annotations

import itertools
import json
import os
import stat
import threading

import numpy as np

from bcer.io import nifti, write_json
from bcer.io.nifti import atomic_write_bytes


def test_an_atomic_write_follows_the_umask_not_mkstemps_0600(tmp_path):
    umask = os.umask(0)
    os.umask(umask)
    path = atomic_write_bytes(tmp_path / "sub" / "stats.json", b"{}", b"\n")
    assert path.read_bytes() == b"{}\n"
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives the user under the same umask
    assert stat.S_IMODE(path.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == 0o666 & ~umask
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_a_temp_name_left_by_a_killed_process_is_stepped_over(tmp_path, monkeypatch):
    monkeypatch.setattr(nifti, "_TMP_SEQ", itertools.count())
    stale = tmp_path / f".out.json.{os.getpid()}.{threading.get_ident()}.0.tmp"
    stale.write_bytes(b"half a file")  # as a process with this pid left it when killed
    nifti.atomic_write_bytes(tmp_path / "out.json", b"{}")
    assert (tmp_path / "out.json").read_bytes() == b"{}"
    assert stale.read_bytes() == b"half a file"  # someone else's file is never opened


def test_json_files_are_strict_json_with_numpy_values(tmp_path):
    def no_constants(name):
        raise ValueError(f"not JSON: {name}")

    path = write_json({"ef": np.float64("nan"), "n": np.int64(3), "v": np.arange(2), "inf": float("inf"),
                       1: (0.5, np.float32(1.5))}, tmp_path / "t.json")
    assert json.loads(path.read_text(), parse_constant=no_constants) == {
        "ef": None, "n": 3, "v": [0, 1], "inf": None, "1": [0.5, 1.5]}
