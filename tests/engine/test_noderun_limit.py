"""``noderun.time_limit``: a node's own time limit, enforced in the worker by SIGALRM."""
from __future__ import annotations

import signal
import time

import pytest

from bcer.engine.noderun import _NodeTimeout, time_limit


def test_limit_fires_even_after_a_call_left_sigalrm_blocked() -> None:
    """A worker runs task after task; a tool whose C code blocked SIGALRM and never unblocked
    it (the test tools ``xtoy.stubborn`` and ``xseam.hog`` do) must not take the limit away from
    every later node in that process. Before the fix the alarm stayed pending until the sleep
    ended by itself: the node ran its full 30 s in the suite and was only then called a timeout."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    try:
        with pytest.raises(_NodeTimeout):  # raised at all: the alarm cut the 5-s sleep short
            with time_limit(0.3):
                time.sleep(5.0)
        # what the earlier call left is left as it was
        assert signal.SIGALRM in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def test_no_limit_changes_nothing() -> None:
    handler, mask = signal.getsignal(signal.SIGALRM), signal.pthread_sigmask(signal.SIG_BLOCK, set())
    with time_limit(None):
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGALRM) == handler
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == mask
