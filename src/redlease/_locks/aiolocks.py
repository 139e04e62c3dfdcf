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
import sys
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

from .._config import Duration
from .._engine import threaded
from .._errors import NotHeld
from .._offload import off_loop, settled
from . import args
from .args import AcquireOptions, Options, check_name, face_name, takes, takes_unnamed
from .holders import LockHolder
from .lock import (
    DEFAULT_RETRY_INTERVAL,
    DEFAULT_WAIT,
    LOCK_DEFAULT_TTL,
    LeaseStore,
    Locker,
    LockerCore,
    release_after_failure,
)
from .lock import Lock as ThreadedLock
from .memory import MemoryLocker as ThreadedMemoryLocker
from .redislocker import DEFAULT_PREFIX
from .redislocker import RedisLocker as ThreadedRedisLocker
from .semaphore import Semaphore as ThreadedSemaphore

T = TypeVar("T")


class Lock:
    """One acquisition of a lock, for asyncio: ``await held.release()``.

    Wraps ``redlease.Lock`` with the same guarantees; ``done`` is the
    underlying ``threading.Event`` (set once the lease is found lost while
    auto-renewed).
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: ThreadedLock) -> None:
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

    @takes(args.acquire_options)
    async def acquire(self, name: str, options: Options) -> Lock:
        """Take the lock ``name``, retrying for up to ``wait``; see ``redlease.Locker.acquire``.

        Cancelling it never leaks a lock, and ``CancelledError`` always
        reaches the caller: an attempt already sent is let finish and what
        it took is released before the error propagates; a waiting acquire
        stops at its next attempt (within ``retry_interval``) and a fair one
        leaves its queue. Once it has raised, nothing is held for it.
        """
        return await self._take(check_name(name), options())

    async def _take(self, name: str, options: AcquireOptions) -> Lock:
        """One acquisition with checked arguments, on the executor: every async face's path."""
        return Lock(await settled(self._inner._take, name, options, give_back=_give_back))

    @takes(args.attempt_options)
    async def try_acquire(self, name: str, options: Options) -> Lock:
        """One attempt at the lock ``name``; ``NotAcquired`` when someone else holds it.

        Cancelled, it leaks no lock (as ``acquire``).
        """
        return await self._take(check_name(name), options())

    @takes(args.hold_options)
    def hold(self, name: str, options: Options) -> _Hold:
        """``async with locker.hold(name) as held:`` — auto-renewed, released on every path.

        If the lease is lost, the task running the block is cancelled (as
        ``asyncio.timeout`` does) and the block ends with ``NotHeld``. A
        release that finds the lease lost raises ``NotHeld`` even when the
        block succeeded, chained with the block's exception when it raised.

        Cancelled anywhere (while acquiring, in the block or while
        releasing), the task gets its ``CancelledError`` and nothing is left
        held: the release is completed before the error propagates.
        """
        return _Hold(self, name, options)


class _AsyncLocker(_AsyncStore):
    """The asyncio face of a threaded locker: the same store, the same rules."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Named as the face (``aio.RedisLocker``): a wrong call's TypeError would
        # otherwise name the threaded locker of the same class name.
        super().__init_subclass__(**kwargs)
        init = cls.__dict__.get("__init__")
        if init is not None:
            init.__qualname__ = f"{face_name(cls)}.__init__"

    def __init__(self, inner: Locker) -> None:
        super().__init__(inner)
        self._locker = inner

    async def holder(self, name: str) -> LockHolder | None:
        """Who holds the lock ``name`` now (None: nobody); see ``redlease.Locker.holder``."""
        return await off_loop(self._locker.holder, name)

    async def held(self) -> list[tuple[str, LockHolder]]:
        """Every lock held now, sorted by name. See ``redlease.Locker.held``."""
        return await off_loop(self._locker.held)

    async def force_release(self, name: str) -> bool:
        """Take the lock ``name`` from its holder now; see ``redlease.Locker.force_release``.

        Cancelled before it was sent, it is never sent; once sent, it is seen
        through before ``CancelledError`` propagates.
        """
        return await settled(self._locker.force_release, name)

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

    _face = "aio.Semaphore"

    def __init__(self, inner: ThreadedSemaphore, permits: _AsyncStore) -> None:
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

    @takes_unnamed(args.acquire_options)
    async def acquire(self, options: Options) -> Lock:
        """Take a permit, waiting up to ``wait``; cancelling it leaks no permit (as ``acquire``)."""
        return await self._permits._take(self.name, options())

    @takes_unnamed(args.attempt_options)
    async def try_acquire(self, options: Options) -> Lock:
        """One attempt at a permit; ``NotAcquired`` when all are taken. Cancel-safe."""
        return await self._permits._take(self.name, options())

    @takes_unnamed(args.hold_options)
    def hold(self, options: Options) -> _Hold:
        """``async with sem.hold() as permit:`` — auto-renewed, released on every path.

        Cancelled anywhere, it leaves no permit held (as ``RedisLocker.hold``).
        """
        return _Hold(self._permits, self.name, options)

    async def holders(self) -> list[LockHolder]:
        """Who holds the live permits, soonest to expire first."""
        return await off_loop(self._inner.holders)

    def __repr__(self) -> str:
        return f"<redlease.aio.Semaphore {self.name!r} permits={self.permits}>"


def _give_back(held: ThreadedLock) -> None:
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

    _face = "aio.RedisLocker"

    def __init__(
        self,
        client: Any,
        prefix: str = DEFAULT_PREFIX,
        engine: str | None = "auto",
        holder: str | None = None,
        *,
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
    ) -> None:
        super().__init__(
            ThreadedRedisLocker(
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

    _face = "aio.MemoryLocker"

    def __init__(self, *, holder: str | None = None) -> None:
        super().__init__(ThreadedMemoryLocker(holder=holder))


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
    ttl: Duration = LOCK_DEFAULT_TTL,
    wait: Duration = DEFAULT_WAIT,
    retry_interval: Duration = DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = True,
) -> T:
    """Run ``await fn(held)`` holding the lock ``name``; the guarantees of ``hold``."""
    async with locker.hold(
        name, ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
    ) as held:
        return await fn(held)
