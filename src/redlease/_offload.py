"""The bridge between coroutines and the threaded core: blocking calls off the event loop,
calls that survive cancellation, and how a waiting ``acquire`` learns that its caller gave
it up (an asyncio task cancelled).

The asyncio lockers run the threaded locker's ``acquire`` on a worker thread;
when the awaiting task is cancelled they set a flag, and the acquire loop
(``_locks.lock.LeaseStore._acquire``) checks it after each pause: it stops without
another attempt, and a fair waiter leaves its queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from contextvars import copy_context
from typing import Any, TypeVar

T = TypeVar("T")


class AcquireAbandoned(Exception):
    """A waiting ``acquire`` stopped before its next attempt: its caller gave up on it."""


_abandoned = threading.local()


@contextlib.contextmanager
def abandonable(flag: threading.Event) -> Iterator[None]:
    """Inside the block, a waiting ``acquire`` on this thread ends once ``flag`` is set.

    It raises ``AcquireAbandoned`` after the pause in which ``flag`` was set,
    without another attempt, and a fair waiter leaves its queue. The asyncio
    lockers use this so that a cancelled acquire stops within one retry
    interval instead of waiting out its window.
    """
    _abandoned.flag = flag
    try:
        yield
    finally:
        _abandoned.flag = None


def check_abandoned() -> None:
    """Raise ``AcquireAbandoned`` when this thread's caller gave the acquire up."""
    flag = getattr(_abandoned, "flag", None)
    if flag is not None and flag.is_set():
        raise AcquireAbandoned("the caller gave this acquire up")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call on the default executor, so the event loop never waits on it.

    The call sees the coroutine's context variables (as ``asyncio.to_thread``'s
    does): a span current in the task is current there too.
    """
    call = functools.partial(fn, *args)
    return await asyncio.get_running_loop().run_in_executor(None, copy_context().run, call)


async def outlast(future: asyncio.Future[Any]) -> bool:
    """Wait until ``future`` is done, whatever cancellations arrive meanwhile.

    ``future`` itself is never cancelled. Returns True when this coroutine
    was cancelled while waiting: the caller raises ``CancelledError`` then,
    once its own cleanup is done, so the cancellation is never lost.
    """
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait((future,))
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


# A settled call's states: queued on the executor, running, done, never to run.
_QUEUED, _RUNNING, _DONE, _SKIPPED = range(4)


class _Call:
    """One blocking locker call for a coroutine, on an executor thread, never left half done.

    ``abandon()`` (the coroutine was cancelled) stops a call still queued
    from ever running, unless it must run (a release); a running call goes
    on to its end (a waiting acquire stops at its next attempt:
    ``abandonable``) and its thread gives back
    what it returned (``give_back``), so a lease taken for a caller that is
    gone is released even if the event loop never runs again.
    """

    __slots__ = ("_abandoned", "_fn", "_give_back", "_mutex", "_state")

    def __init__(self, fn: Callable[[], Any], give_back: Callable[[Any], None] | None) -> None:
        self._fn = fn
        self._give_back = give_back
        self._mutex = threading.Lock()
        self._state = _QUEUED
        self._abandoned = threading.Event()

    def run(self) -> Any:
        with self._mutex:
            if self._state == _SKIPPED:
                return None
            self._state = _RUNNING
        try:
            with abandonable(self._abandoned):
                result = self._fn()
        except BaseException:
            with self._mutex:
                self._state = _DONE
            raise
        with self._mutex:
            self._state = _DONE
            # Abandoned from now on, the coroutine gives back itself (it sees _DONE).
            abandoned = self._abandoned.is_set()
        if abandoned and self._give_back is not None:
            self._give_back(result)
        return result

    def abandon(self, skip: bool) -> int:
        """The caller is gone: the state the call was in (queued and ``skip``: it never runs)."""
        with self._mutex:
            state = self._state
            if state == _QUEUED and skip:
                self._state = _SKIPPED
            else:
                self._abandoned.set()
            return state


async def settled(
    fn: Callable[..., T],
    *args: Any,
    give_back: Callable[[T], None] | None = None,
    always: bool = False,
) -> T:
    """``await off_loop(fn, *args)`` for calls that change what is held: safe to cancel.

    Cancelled before its executor thread started the call, the call is never
    made (unless ``always``: a release is made all the same) and
    ``CancelledError`` propagates at once. Cancelled later, the call is seen
    through first (a release or refresh completes, within its round trip; a
    waiting acquire stops at its next attempt), then ``give_back(result)``
    undoes what it returned, and only then does ``CancelledError``
    propagate, also when more cancellations arrive meanwhile. Nothing is
    ever sent twice.
    """
    loop = asyncio.get_running_loop()
    call = _Call(functools.partial(fn, *args), give_back)
    future = loop.run_in_executor(None, copy_context().run, call.run)  # as off_loop's
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        state = call.abandon(skip=not always)
        if state == _QUEUED and not always:
            raise  # never sent
        await outlast(future)
        succeeded = not future.cancelled() and future.exception() is None
        if succeeded and state == _DONE and give_back is not None:
            # It ended before the cancellation reached this coroutine: its
            # thread did not know the caller was gone, so give back here.
            await outlast(loop.run_in_executor(None, give_back, future.result()))
        raise
