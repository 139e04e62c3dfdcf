"""The asyncio ``Partitions`` (``redlease.aio.Partitions``): the same member, for coroutines.

The member's core (``member.Member``) runs as for ``redlease.Partitions``:
its run on the process's driver, its callbacks on a thread of its own, its
leases on the engine's one renewer, so a blocked event loop can neither
delay a renewal nor a hand-over's release. What differs is the face:
``start``, ``stop``, ``assignment`` and ``members`` are coroutines (their
round trips run off the event loop), ``fencer(p)`` hands out
``redlease.aio.Fencer`` objects, and a callback may be a coroutine
function: it runs on the event loop the member was started from, while the
member's callback thread waits for it (bounded by the TTL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from .._offload import off_loop, settled
from .._on_exit import AwaitsStopOnExit
from .aioelector import Elector, Fencer
from .partitions import PartitionsShell
from .partnames import Callback
from .sharewatch import timed_out, wait_deadline

AsyncCallback = Callable[..., "Awaitable[object] | object"]


class Partitions(PartitionsShell[AsyncCallback, AsyncCallback], AwaitsStopOnExit):
    """One member of a partitioned group, for asyncio (see ``redlease.Partitions``).

    Arguments, validation, guarantees and callbacks are those of
    ``redlease.Partitions``; ``client`` is a ``redis.asyncio.Redis`` (or
    ``RedisCluster``, or valkey's). ``on_assigned``, ``on_revoked`` and the
    observer's ``on_error`` may be coroutine functions: each call runs on
    the event loop that ran ``start()``, one at a time and in order, and the
    member waits for it to finish before it goes on (an ``on_revoked``
    finishes before the partition is released). One that takes longer than
    the TTL is cancelled, and a ``TimeoutError`` goes to ``on_error``.
    Plain functions run on the member's callback thread, as in the threaded
    member.
    """

    __slots__ = ("_callback_tasks", "_loop")

    _face = "aio.Partitions"
    _asyncio = True
    _elector = Elector

    def _shell_init(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._callback_tasks: set[asyncio.Task[Any]] = set()

    # -- running ------------------------------------------------------------------------------

    async def start(self) -> Partitions:
        """Join the group and start the member (on the process's driver); returns this member.

        ``ConfigError`` when the group's live members share another partition
        set, ``RuntimeError`` when already running. Coroutine callbacks run on
        this event loop from now on. Cancelled once the member has started,
        it is stopped again before ``CancelledError`` propagates.
        """
        self._loop = asyncio.get_running_loop()
        await settled(self._core.start, give_back=lambda _: self._core.stop(None))
        return self

    async def stop(self, timeout: float | None = None) -> None:
        """End the run: ``on_revoked(p, "stopped")`` for each partition held, every lease
        released and the group left, before this returns (see ``redlease.Partitions.stop``).

        From one of this member's own coroutine callbacks it returns at once,
        and the run ends as soon as that callback returns. Cancelled, it
        still waits for the run to end before ``CancelledError`` propagates.
        """
        if asyncio.current_task() in self._callback_tasks:
            self._core.request_stop()
            return
        await settled(self._core.stop, timeout, always=True)

    async def __aenter__(self) -> Partitions:
        if not self._core.running:
            await self.start()
        return self


    # -- what it holds ------------------------------------------------------------------------

    def owned(self) -> dict[str, int]:
        """``{partition: token}`` this member holds now, proven (``{}`` when not running)."""
        return self._core.owned()

    async def wait_owned(self, timeout: float | None = None) -> dict[str, int]:
        """Wait until this member holds its balanced share, then return ``owned()``.

        As ``redlease.Partitions.wait_owned`` (the share, ``TimeoutError``,
        ``ConfigError``, ``RuntimeError`` when not running), without blocking
        the event loop: the member's run wakes this coroutine at each
        look it takes at the group. Cancelled, it leaves nothing waiting and
        ``CancelledError`` propagates.
        """
        core = self._core
        deadline = wait_deadline(timeout, "wait_owned")
        what = core.described()
        loop = asyncio.get_running_loop()
        changed = asyncio.Event()

        def wake() -> None:  # on the driver thread, or the one that ends the run
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(changed.set)

        core.share.watch(wake)
        try:
            while True:
                changed.clear()  # before the look: a change after it still wakes us
                held = core.share.ready(core.owned, what)
                if held is not None:
                    return held
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(timed_out(what, core.share.quota))
                try:
                    await asyncio.wait_for(changed.wait(), None if math.isinf(left) else left)
                except asyncio.TimeoutError:
                    continue  # one more look decides
        finally:
            core.share.unwatch(wake)

    def fencer(self, partition: str) -> Fencer:
        """A ``redlease.aio.Fencer`` with ``partition``'s token while this member holds it;
        inert (token 0) otherwise. ``ConfigError`` for a name not in the set."""
        part = self._core.part(partition)
        return Fencer(part.elector, self._core.token_of(part.name))

    async def assignment(self) -> dict[str, str | None]:
        """``{partition: member id or None}`` as Redis says (one round trip, off the loop)."""
        return await off_loop(self._core.assignment)

    async def members(self) -> list[str]:
        """The live members of the group (sorted ids), as Redis says (one round trip)."""
        return await off_loop(self._core.members)

    # -- coroutine callbacks ------------------------------------------------------------------

    def _bridge(self, callback: Callback | None) -> Callback | None:
        """``callback`` as the callback thread calls it: a coroutine it returns runs on the
        loop."""
        if callback is None:
            return None

        def call(*args: Any) -> object:
            result = callback(*args)
            if inspect.isawaitable(result):
                return self._on_loop(result, getattr(callback, "__name__", "callback"))
            return result

        call.__name__ = getattr(callback, "__name__", "callback")
        return call

    def _on_loop(self, awaitable: Awaitable[object], what: str) -> object:
        """Run ``awaitable`` on the member's event loop and wait for it, at most one TTL."""
        loop = self._loop
        if loop is None or loop.is_closed():
            if inspect.iscoroutine(awaitable):
                awaitable.close()
            raise RuntimeError(
                f"coroutine callback {what} not run: the event loop that started "
                f"aio.Partitions {self._core.config.name!r} is closed"
            )
        future = asyncio.run_coroutine_threadsafe(self._tracked(awaitable), loop)
        bound = self._core.config.ttl
        try:
            return future.result(timeout=bound)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"coroutine callback {what} of aio.Partitions {self._core.config.name!r} did not "
                f"finish within the ttl ({bound:g} s) and was cancelled"
            ) from None

    def _tracked(self, awaitable: Awaitable[object]) -> Coroutine[Any, Any, object]:
        async def run() -> object:
            task = asyncio.current_task()
            if task is not None:
                self._callback_tasks.add(task)
            try:
                return await awaitable
            finally:
                if task is not None:
                    self._callback_tasks.discard(task)

        return run()
