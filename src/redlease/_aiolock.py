"""asyncio locks: the threaded lockers behind coroutines.

``RedisLocker`` and ``MemoryLocker`` (as ``redlease.aio.RedisLocker`` and
``redlease.aio.MemoryLocker``) wrap a threaded locker and run each blocking
call on the default executor; ``Lock`` is one acquisition; ``hold`` and
``with_lock`` hold a lock for a block and cancel the block's task when the
lease is lost. The renewals themselves run on the engine's keeper thread,
never on the event loop.

Every call that takes, keeps or gives back a lease goes through ``settled``:
cancelling the coroutine never leaves a call half done. A call cancelled
before its executor thread started it is never made; one already started
is seen through (a waiting acquire stops at its next attempt), and what an
acquire took is released, before the ``CancelledError`` propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from . import lock
from ._abandon import abandonable
from ._config import Duration
from ._engine.family import threaded
from ._errors import NotHeld
from ._lock import DEFAULT_WAIT, LeaseStore, LockerCore, release_after_failure
from ._lockargs import AcquireOptions, acquire_options, check_name

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call on the default executor, so the event loop never waits on it."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


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
    future = loop.run_in_executor(None, call.run)
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


class Lock:
    """One acquisition of a lock, for asyncio: ``await held.release()``.

    Wraps ``redlease.Lock`` with the same guarantees; ``done`` is the
    underlying ``threading.Event`` (set once the lease is found lost while
    auto-renewed).
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: lock.Lock) -> None:
        self._inner = inner

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._inner.name

    @property
    def fencing_token(self) -> int:
        """This acquisition's fencing token, greater than every earlier one of the store."""
        return self._inner.fencing_token

    @property
    def ttl(self) -> float:
        """The lease duration in seconds."""
        return self._inner.ttl

    @property
    def done(self) -> threading.Event:
        """Set once the lease is found lost (auto-renewed locks only)."""
        return self._inner.done

    async def refresh(self) -> None:
        """Extend the lease to a full TTL; ``NotHeld`` once it is not ours.

        Cancelled, it either never sent the refresh or lets it complete
        (within its round trip) before ``CancelledError`` propagates; the
        lock stays this acquisition's to release.
        """
        await settled(self._inner.refresh)

    async def release(self) -> None:
        """Give the lock up; ``NotHeld`` when the lease was already lost.

        Cancelled, the release is still made, and completed (within its
        round trip) before ``CancelledError`` propagates: the lock is not
        held afterwards.
        """
        await settled(self._inner.release, always=True)

    def __repr__(self) -> str:
        return f"<redlease.aio.Lock of {self._inner!r}>"


class _AsyncStore:
    """The asyncio face of a threaded lease store (a locker's, a semaphore's permits)."""

    def __init__(self, inner: LeaseStore) -> None:
        self._inner = inner

    @property
    def _core(self) -> LockerCore:
        """The threaded locker's core (what ``metrics`` attaches to)."""
        return self._inner._core

    @property
    def engine(self) -> str:
        """Which engine serves the locker: ``"native"``, ``"python"`` or ``"memory"``."""
        return self._inner.engine

    async def acquire(
        self,
        name: str,
        *,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = DEFAULT_WAIT,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = False,
        fair: bool = False,
    ) -> Lock:
        """Take the lock ``name``, retrying for up to ``wait``; see ``redlease.Locker.acquire``.

        Cancelling it never leaks a lock, and ``CancelledError`` always
        reaches the caller: an attempt already sent is let finish and what
        it took is released before the error propagates; a waiting acquire
        stops at its next attempt (within ``retry_interval``) and a fair one
        leaves its queue. Once it has raised, nothing is held for it.
        """
        return await self._take(
            check_name(name),
            acquire_options(
                ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew, fair=fair
            ),
        )

    async def _take(self, name: str, options: AcquireOptions) -> Lock:
        """One acquisition with checked arguments, on the executor: every async face's path."""
        return Lock(await settled(self._inner._take, name, options, give_back=_give_back))

    async def try_acquire(
        self, name: str, *, ttl: Duration = lock.DEFAULT_TTL, auto_renew: bool = False
    ) -> Lock:
        """One attempt at the lock ``name``; ``NotAcquired`` when someone else holds it.

        Cancelled, it leaks no lock (as ``acquire``).
        """
        return await self._take(check_name(name), acquire_options(ttl=ttl, auto_renew=auto_renew))

    def hold(
        self,
        name: str,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = DEFAULT_WAIT,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = True,
    ) -> _Hold:
        """``async with locker.hold(name) as held:`` — auto-renewed, released on every path.

        If the lease is lost, the task running the block is cancelled (as
        ``asyncio.timeout`` does) and the block ends with ``NotHeld``. A
        release that finds the lease lost raises ``NotHeld`` even when the
        block succeeded, chained with the block's exception when it raised.

        Cancelled anywhere (while acquiring, in the block or while
        releasing), the task gets its ``CancelledError`` and nothing is left
        held: the release is completed before the error propagates.
        """
        options = functools.partial(
            acquire_options, ttl=ttl, wait=wait, retry_interval=retry_interval,
            auto_renew=auto_renew,
        )
        return _Hold(self, name, options)


class _AsyncLocker(_AsyncStore):
    """The asyncio face of a threaded locker: the same store, the same rules."""

    def __init__(self, inner: lock.Locker) -> None:
        super().__init__(inner)
        self._locker = inner

    async def holder(self, name: str) -> lock.LockHolder | None:
        """Who holds the lock ``name`` now (None: nobody); see ``redlease.Locker.holder``."""
        return await off_loop(self._locker.holder, name)

    async def held(self) -> list[tuple[str, lock.LockHolder]]:
        """Every lock held now, sorted by name. See ``redlease.Locker.held``."""
        return await off_loop(self._locker.held)

    def semaphore(self, name: str, permits: int) -> Semaphore:
        """At most ``permits`` holders of ``name`` at once; see ``redlease.Semaphore``."""
        inner = self._inner.semaphore(name, permits)  # type: ignore[attr-defined]
        return Semaphore(inner, _AsyncStore(inner._core))

    async def close(self) -> None:
        """Free the locker's own connections. Release its locks first."""
        await off_loop(self._locker.close)

    async def __aenter__(self) -> _AsyncLocker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Semaphore:
    """``redlease.Semaphore`` for asyncio: permits are ``redlease.aio.Lock`` objects."""

    def __init__(self, inner: lock.Semaphore, permits: _AsyncStore) -> None:
        self._inner = inner
        self._permits = permits

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._inner.name

    @property
    def permits(self) -> int:
        """How many holders it admits at once."""
        return self._inner.permits

    async def acquire(
        self,
        *,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = DEFAULT_WAIT,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = False,
        fair: bool = False,
    ) -> Lock:
        """Take a permit, waiting up to ``wait``; cancelling it leaks no permit (as ``acquire``)."""
        return await self._permits._take(
            self.name,
            acquire_options(
                ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew, fair=fair
            ),
        )

    async def try_acquire(
        self, *, ttl: Duration = lock.DEFAULT_TTL, auto_renew: bool = False
    ) -> Lock:
        """One attempt at a permit; ``NotAcquired`` when all are taken. Cancel-safe."""
        return await self._permits._take(self.name, acquire_options(ttl=ttl, auto_renew=auto_renew))

    def hold(
        self,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = DEFAULT_WAIT,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = True,
    ) -> _Hold:
        """``async with sem.hold() as permit:`` — auto-renewed, released on every path.

        Cancelled anywhere, it leaves no permit held (as ``RedisLocker.hold``).
        """
        options = functools.partial(
            acquire_options, ttl=ttl, wait=wait, retry_interval=retry_interval,
            auto_renew=auto_renew,
        )
        return _Hold(self._permits, self.name, options)

    async def holders(self) -> list[lock.LockHolder]:
        """Who holds the live permits, soonest to expire first."""
        return await off_loop(self._inner.holders)

    def __repr__(self) -> str:
        return f"<redlease.aio.Semaphore {self.name!r} permits={self.permits}>"


def _give_back(held: lock.Lock) -> None:
    """Release a lock taken for a caller that was cancelled meanwhile."""
    # Nobody is left to tell: a lease whose release fails ends with its TTL.
    with contextlib.suppress(Exception):
        held.release()


class RedisLocker(_AsyncLocker):
    """``redlease.RedisLocker`` for asyncio: ``client`` is a ``redis.asyncio.Redis``.

    Same keys, scripts and guarantees; the watchdog of an auto-renewed lock
    runs on the engine's keeper thread (native on the native engine), so a
    blocked event loop cannot cost the lease.
    """

    def __init__(
        self,
        client: Any,
        prefix: str = lock.DEFAULT_PREFIX,
        engine: str | None = "auto",
        holder: str | None = None,
        *,
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
    ) -> None:
        super().__init__(
            lock.RedisLocker(
                threaded(client, asyncio=True),
                prefix=prefix,
                engine=engine,
                holder=holder,
                min_replicas=min_replicas,
                replica_timeout=replica_timeout,
            )
        )


class MemoryLocker(_AsyncLocker):
    """``redlease.MemoryLocker`` for asyncio: in-process only, same semantics."""

    def __init__(self, *, holder: str | None = None) -> None:
        super().__init__(lock.MemoryLocker(holder=holder))


class _Hold:
    """The context manager ``hold`` returns."""

    def __init__(
        self, locker: _AsyncStore, name: str, options: Callable[[], AcquireOptions]
    ) -> None:
        # Checked on entry, as the threaded ``hold`` checks its arguments.
        self._locker = locker
        self._name = name
        self._options = options
        self._held: Lock | None = None
        self._task: asyncio.Task[Any] | None = None
        self._exited = threading.Event()
        self._cancelled_for_loss = False

    async def __aenter__(self) -> Lock:
        held = await self._locker._take(check_name(self._name), self._options())
        self._held = held
        self._task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        threading.Thread(
            target=self._watch, args=(held.done, loop), name="redlease-aio-hold", daemon=True
        ).start()
        return held

    def _watch(self, done: threading.Event, loop: asyncio.AbstractEventLoop) -> None:
        while not self._exited.is_set():
            if done.wait(0.05):
                if not self._exited.is_set():
                    loop.call_soon_threadsafe(self._cancel_for_loss)
                return

    def _cancel_for_loss(self) -> None:
        if self._task is not None and not self._exited.is_set():
            self._cancelled_for_loss = True
            self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._exited.set()
        held = self._held
        assert held is not None
        lost = self._cancelled_for_loss and isinstance(exc, asyncio.CancelledError)
        if lost and self._task is not None and sys.version_info >= (3, 11):
            self._task.uncancel()
        if exc is None:
            await held.release()
            return
        if lost:
            with contextlib.suppress(NotHeld):
                await held.release()
            raise NotHeld(
                f"lock {held.name!r} (fencing token {held.fencing_token}) was lost while held; "
                "the block was cancelled"
            ) from exc
        await settled(release_after_failure, held._inner, exc, always=True)


async def with_lock(
    locker: _AsyncLocker,
    name: str,
    fn: Callable[[Lock], Awaitable[T]],
    *,
    ttl: Duration = lock.DEFAULT_TTL,
    wait: Duration = DEFAULT_WAIT,
    retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = True,
) -> T:
    """Run ``await fn(held)`` holding the lock ``name``; the guarantees of ``hold``."""
    async with locker.hold(
        name, ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
    ) as held:
        return await fn(held)
