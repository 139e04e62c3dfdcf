"""asyncio locks: the threaded lockers behind coroutines.

``RedisLocker`` and ``MemoryLocker`` (as ``redlease.aio.RedisLocker`` and
``redlease.aio.MemoryLocker``) wrap a threaded locker and run each blocking
call on the default executor; ``Lock`` is one acquisition; ``hold`` and
``with_lock`` hold a lock for a block and cancel the block's task when the
lease is lost. The renewals themselves run on the engine's keeper thread,
never on the event loop.
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
from ._config import Duration
from ._engine.family import threaded
from ._errors import NotHeld
from ._lock import LockerCore, release_after_failure

T = TypeVar("T")


async def off_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking call on the default executor, so the event loop never waits on it."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))


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
        """Extend the lease to a full TTL; ``NotHeld`` once it is not ours."""
        await off_loop(self._inner.refresh)

    async def release(self) -> None:
        """Give the lock up; ``NotHeld`` when the lease was already lost."""
        await off_loop(self._inner.release)

    def __repr__(self) -> str:
        return f"<redlease.aio.Lock of {self._inner!r}>"


class _AsyncLocker:
    """The asyncio face of a threaded locker: the same store, the same rules."""

    def __init__(self, inner: lock.Locker) -> None:
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
        wait: Duration = 0.0,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = False,
        fair: bool = False,
    ) -> Lock:
        """Take the lock ``name``, retrying for up to ``wait``; see ``redlease.Locker.acquire``.

        Cancelling the waiting coroutine never leaks a lock: an acquisition
        that completes after the cancellation is released at once.
        """
        attempt = asyncio.get_running_loop().run_in_executor(
            None,
            functools.partial(
                self._inner.acquire,
                name,
                ttl=ttl,
                wait=wait,
                retry_interval=retry_interval,
                auto_renew=auto_renew,
                fair=fair,
            ),
        )
        try:
            return Lock(await asyncio.shield(attempt))
        except asyncio.CancelledError:
            attempt.add_done_callback(_release_orphan)
            raise

    async def try_acquire(
        self, name: str, *, ttl: Duration = lock.DEFAULT_TTL, auto_renew: bool = False
    ) -> Lock:
        """One attempt at the lock ``name``; ``NotAcquired`` when someone else holds it."""
        return await self.acquire(name, ttl=ttl, wait=0.0, auto_renew=auto_renew)

    def hold(
        self,
        name: str,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = 0.0,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = True,
    ) -> _Hold:
        """``async with locker.hold(name) as held:`` — auto-renewed, released on every path.

        If the lease is lost, the task running the block is cancelled (as
        ``asyncio.timeout`` does) and the block ends with ``NotHeld``. A
        release that finds the lease lost raises ``NotHeld`` even when the
        block succeeded, chained with the block's exception when it raised.
        """
        return _Hold(
            self,
            name,
            dict(ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew),
        )

    async def holder(self, name: str) -> lock.LockHolder | None:
        """Who holds the lock ``name`` now (None: nobody); see ``redlease.Locker.holder``."""
        return await off_loop(self._inner.holder, name)

    async def held(self) -> list[tuple[str, lock.LockHolder]]:
        """Every lock held now, sorted by name. See ``redlease.Locker.held``."""
        return await off_loop(self._inner.held)

    def semaphore(self, name: str, permits: int) -> Semaphore:
        """At most ``permits`` holders of ``name`` at once; see ``redlease.Semaphore``."""
        inner = self._inner.semaphore(name, permits)  # type: ignore[attr-defined]
        return Semaphore(inner, _AsyncLocker(inner._core))

    async def close(self) -> None:
        """Free the locker's own connections. Release its locks first."""
        await off_loop(self._inner.close)

    async def __aenter__(self) -> _AsyncLocker:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Semaphore:
    """``redlease.Semaphore`` for asyncio: permits are ``redlease.aio.Lock`` objects."""

    def __init__(self, inner: lock.Semaphore, permits: _AsyncLocker) -> None:
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
        wait: Duration = 0.0,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = False,
        fair: bool = False,
    ) -> Lock:
        """Take a permit, waiting up to ``wait``; cancelling the wait leaks no permit."""
        return await self._permits.acquire(
            self.name,
            ttl=ttl,
            wait=wait,
            retry_interval=retry_interval,
            auto_renew=auto_renew,
            fair=fair,
        )

    async def try_acquire(
        self, *, ttl: Duration = lock.DEFAULT_TTL, auto_renew: bool = False
    ) -> Lock:
        """One attempt at a permit; ``NotAcquired`` when all are taken."""
        return await self._permits.try_acquire(self.name, ttl=ttl, auto_renew=auto_renew)

    def hold(
        self,
        ttl: Duration = lock.DEFAULT_TTL,
        wait: Duration = 0.0,
        retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
        auto_renew: bool = True,
    ) -> _Hold:
        """``async with sem.hold() as permit:`` — auto-renewed, released on every path."""
        return self._permits.hold(
            self.name, ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
        )

    async def holders(self) -> list[lock.LockHolder]:
        """Who holds the live permits, soonest to expire first."""
        return await off_loop(self._inner.holders)

    def __repr__(self) -> str:
        return f"<redlease.aio.Semaphore {self.name!r} permits={self.permits}>"


def _release_orphan(attempt: asyncio.Future[lock.Lock]) -> None:
    if attempt.cancelled() or attempt.exception() is not None:
        return
    threading.Thread(target=_quiet_release, args=(attempt.result(),), daemon=True).start()


def _quiet_release(held: lock.Lock) -> None:
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

    def __init__(self, locker: _AsyncLocker, name: str, options: dict[str, Any]) -> None:
        self._locker = locker
        self._name = name
        self._options = options
        self._held: Lock | None = None
        self._task: asyncio.Task[Any] | None = None
        self._exited = threading.Event()
        self._cancelled_for_loss = False

    async def __aenter__(self) -> Lock:
        held = await self._locker.acquire(self._name, **self._options)
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
        await off_loop(release_after_failure, held._inner, exc)


async def with_lock(
    locker: _AsyncLocker,
    name: str,
    fn: Callable[[Lock], Awaitable[T]],
    *,
    ttl: Duration = lock.DEFAULT_TTL,
    wait: Duration = 0.0,
    retry_interval: Duration = lock.DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = True,
) -> T:
    """Run ``await fn(held)`` holding the lock ``name``; the guarantees of ``hold``."""
    async with locker.hold(
        name, ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
    ) as held:
        return await fn(held)
