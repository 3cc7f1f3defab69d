"""Deliverables are written atomically with the permissions of any file the user writes."""
from __future__ import annotations

import os
import stat

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
