"""One driver event loop over ``ray.wait`` on every watched ObjectRef, for any number of cases.

Owners (one per case in flight) ``watch`` the refs they wait for with a tag; one ``poll``
waits for the first ready ref (or, with many in flight, briefly for a quarter of them),
fetches their values in one ``ray.get`` and hands each ``(tag, value, exc)`` to its owner, upstream results first
(so a node's failure is seen before the void results of its descendants). An owner whose
handler raises is told so through ``owner.crash(exc)``; nothing escapes the loop. No thread
per case: the cost per event is a dict lookup and the owner's handler.

Owners may also watch a ``concurrent.futures.Future`` (driver-side work that must not hold
the loop, e.g. a report review): it is dispatched like a ref once done, checked at least
every ``_FUTURE_TICK_S`` while any is pending.
"""
from __future__ import annotations

import logging
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Protocol

log = logging.getLogger(__name__)
_FUTURE_TICK_S = 0.02
# A poll may wait this long for a quarter of the watched refs before taking what is ready
# (and, if that many are, every other ready one): with many tiny tasks in flight one poll
# then serves several results, where a ray.wait per result cost the driver about as much as
# handling a tiny case's result; a long task's result waits at most this much longer.
_BATCH_WAIT_S = 0.005


class Owner(Protocol):
    def dispatch(self, tag: tuple, value: Any, exc: BaseException | None) -> None: ...

    def crash(self, exc: BaseException) -> None: ...

    def order(self, tag: tuple) -> int: ...


class EventLoop:
    """Refs watched by owners; :meth:`poll` dispatches the ready ones."""

    def __init__(self) -> None:
        self.waiting: dict[Any, tuple[Any, tuple]] = {}
        self.futures: dict[Future, tuple[Any, tuple]] = {}

    def watch(self, ref: Any, owner: Any, tag: tuple) -> None:
        if isinstance(ref, Future):
            self.futures[ref] = (owner, tag)
        else:
            self.waiting[ref] = (owner, tag)

    def unwatch(self, ref: Any) -> None:
        if isinstance(ref, Future):
            self.futures.pop(ref, None)
        else:
            self.waiting.pop(ref, None)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.futures)

    def poll(self, timeout: float) -> int:
        """Wait up to ``timeout`` s for results; dispatch them all. Returns how many."""
        n = self._poll_refs(min(timeout, _FUTURE_TICK_S) if self.futures else timeout) if self.waiting else 0
        if self.futures:
            if not self.waiting and not n:
                wait(list(self.futures), timeout=timeout, return_when=FIRST_COMPLETED)
            n += self._poll_futures()
        return n

    def _poll_futures(self) -> int:
        done = [f for f in self.futures if f.done()]
        items = [(f, *self.futures.pop(f)) for f in done]
        values = []
        for f in done:
            try:
                exc = f.exception()
            except BaseException as e:  # cancelled
                exc = e
            values.append((None if exc is not None else f.result(), exc))
        self._dispatch(items, values)
        return len(items)

    def _poll_refs(self, timeout: float) -> int:
        import ray

        refs = list(self.waiting)
        want = len(refs) // 4
        ready: list = []
        if want > 1:
            ready, rest = ray.wait(refs, num_returns=want, timeout=min(timeout, _BATCH_WAIT_S), fetch_local=True)
            if len(ready) == want and rest:  # the batch filled: take whatever else is ready too
                more, _ = ray.wait(rest, num_returns=len(rest), timeout=0, fetch_local=True)
                ready.extend(more)
        if not ready:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=True)
        if not ready:
            return 0
        items = [(ref, *self.waiting.pop(ref)) for ref in ready]
        self._dispatch(items, _get_all([ref for ref, _, _ in items]))
        return len(items)

    def _dispatch(self, items: list[tuple[Any, Any, tuple]], values: list[tuple[Any, BaseException | None]]) -> None:
        order = sorted(range(len(items)), key=lambda i: (id(items[i][1]), _order(items[i][1], items[i][2])))
        for i in order:
            _, owner, tag = items[i]
            value, exc = values[i]
            try:
                owner.dispatch(tag, value, exc)
            except Exception as e:  # the promise: a bug in one case's handling fails that case only
                log.exception("handling %s crashed", tag)
                try:
                    owner.crash(e)
                except Exception:  # the crash handler's own bug must not stop the loop
                    log.exception("crash handler of %r failed", owner)

    def cancel_all(self) -> None:
        """Cancel every watched task (Ctrl-C); best effort."""
        import ray

        for ref in list(self.waiting):
            try:
                ray.cancel(ref, force=False)
            except Exception:  # actor calls and finished tasks cannot be cancelled: fine
                pass
        self.waiting.clear()
        for fut in list(self.futures):
            fut.cancel()
        self.futures.clear()


def _order(owner: Any, tag: tuple) -> int:
    try:
        return owner.order(tag)
    except Exception:  # order is a hint: a buggy owner must not stop the loop
        return 0


def _get_all(refs: list[Any]) -> list[tuple[Any, BaseException | None]]:
    """Values of ready refs in one call; per ref only when some of them raise."""
    import ray

    try:
        return [(v, None) for v in ray.get(refs)]
    except Exception:  # any task error: fetch one by one to find which refs raised
        out: list[tuple[Any, BaseException | None]] = []
        for ref in refs:
            try:
                out.append((ray.get(ref), None))
            except Exception as e:  # a task Ray gave up on, a cancelled one, a dead actor
                out.append((None, e))
        return out


__all__ = ["EventLoop", "Owner"]
