"""Deliverables are written atomically with the permissions of any file the user writes."""
from __future__ import annotations

import itertools
import os
import stat
import threading

from bcer.io import nifti
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
