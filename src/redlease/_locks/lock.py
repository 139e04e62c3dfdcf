"""The lock itself and what every locker shares: ``Lock``, ``LeaseStore``, ``Locker``.

The public module is ``redlease.lock``; the lockers (``RedisLocker``,
``MemoryLocker``) live in ``redislocker`` and ``memory``.
``release_after_failure`` is the internal API
the asyncio shell shares with ``Locker.hold``. The watchdog of an
auto-renewed lock lives in ``watchdog``.

What a lock guarantees, and what it does not, is told in ``redlease.lock``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import secrets
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._engine import Keeper, driver, renew_interval
from .._errors import NotAcquired, NotHeld
from .._log import Events
from .._offload import check_abandoned
from .._on_exit import ClosesOnExit
from .args import (
    DEFAULT_RETRY_INTERVAL,
    DEFAULT_WAIT,
    LOCK_DEFAULT_TTL,
    AcquireOptions,
    Options,
    acquire_options,
    attempt_options,
    check_name,
    hold_options,
    takes,
)
from .fair import PlaceKeeping, place_ms
from .holders import LockHolder
from .stats import WaitStats
from .watchdog import Watchdog, stop_renewing

T = TypeVar("T")
_LockerT = TypeVar("_LockerT", bound="Locker")

__all__ = [
    "DEFAULT_RETRY_INTERVAL",
    "DEFAULT_WAIT",
    "LOCK_DEFAULT_TTL",
    "LeaseStore",
    "Lock",
    "Locker",
    "LockerCore",
    "release_after_failure",
]

# Waiting acquirers poll a little early, at random, so they do not move in step.
_RETRY_JITTER = 0.1


def _add_note(exc: BaseException, note: str) -> None:
    add_note = getattr(exc, "add_note", None)  # Python 3.11+
    if add_note is not None:
        add_note(note)


# -- the lock --------------------------------------------------------------------


class Lock:
    """One acquisition of a lock: its name, its fencing token, and the means to end it.

    Made by a locker's ``acquire``/``try_acquire``/``hold``, never directly.
    ``release()`` and ``refresh()`` act only while the lease is still this
    acquisition's (its random ownership token is checked atomically by the
    store), so a holder whose lease expired can never delete or extend a
    successor's lock: it gets ``NotHeld`` instead, the signal that mutual
    exclusion may have been violated in the meantime. An auto-renewed lock
    that is dropped without ``release()`` stops being renewed when it is
    garbage-collected, so its lease still ends within one TTL. A forked child
    inherits the object but not the lease: there both raise ``NotHeld``
    without touching the store. Thread-safe.
    """

    def __init__(
        self,
        locker: LeaseStore,
        name: str,
        owner: str,
        fencing_token: int,
        ttl_ms: int,
    ) -> None:
        self._locker = locker
        self._name = name
        self._owner = owner
        self._fencing_token = fencing_token
        self._ttl_ms = ttl_ms
        self._pid = os.getpid()
        self._mutex = threading.Lock()
        self._released = False
        self._keeper: Keeper | None = None
        self._auto_renew = False
        self._watcher: Watchdog | None = None
        self._abandon: weakref.finalize[Any, Any] | None = None
        self._stopping = threading.Event()
        self._events = locker._core.events.child("lock", name)
        self._events.acquired(fencing_token)
        self.done = threading.Event()
        """Set once the lease is found lost while auto-renewed (never set without auto_renew).

        Work in progress should stop when it is set: another holder may be in.
        """

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._name

    @property
    def fencing_token(self) -> int:
        """This acquisition's fencing token (>= 1).

        Strictly greater than every token handed out before it by the same
        store (one counter for every name of a Redis prefix, or of one
        MemoryLocker), so a resource that remembers the highest token it has
        seen can reject a delayed writer whose lease is stale.
        """
        return self._fencing_token

    @property
    def ttl(self) -> float:
        """The lease duration in seconds, as applied (whole milliseconds)."""
        return self._ttl_ms / 1000

    @property
    def auto_renew(self) -> bool:
        """Whether a watchdog refreshes this lease every TTL/3."""
        return self._auto_renew

    def refresh(self) -> None:
        """Extend the lease to a full TTL from now.

        Raises ``NotHeld`` when the lease expired, was released or was taken
        over; a successor's lock is never touched. Backend errors propagate
        (redis-py's exceptions) and leave the lease as it was.
        """
        self._check_process()
        with self._mutex:
            if self._released:
                raise NotHeld(f"lock {self._name!r} was already released")
            if not self._locker._refresh(self._name, self._owner, self._ttl_ms):
                self._found_lost()
                raise NotHeld(
                    f"lock {self._name!r} (fencing token {self._fencing_token}) is no longer "
                    "held: its lease expired or another owner took it"
                )

    def release(self) -> None:
        """Stop auto-renewal and give the lock up.

        Raises ``NotHeld`` when the lease had already expired, been released
        or been taken over (a successor's lock is left untouched), which
        means the work done under it may not have been exclusive. A backend
        error propagates with auto-renewal already stopped: the lease then
        ends on its own within one TTL, and calling ``release()`` again is
        safe (a repeated release of a lock this acquisition already deleted
        still succeeds).
        """
        self._check_process()
        with self._mutex:
            if self._released:
                raise NotHeld(f"lock {self._name!r} was already released")
            self._stop_watchdog()
            deleted = self._locker._release(self._name, self._owner)
            self._released = True
            self._events.released("released" if deleted else "lost")
            if not deleted:
                self._found_lost()
                raise NotHeld(
                    f"lock {self._name!r} (fencing token {self._fencing_token}) was no longer "
                    "held at release: its lease expired or another owner took it"
                )

    def _found_lost(self) -> None:
        # Loss found by a caller rather than by the watchdog is still loss.
        if self._auto_renew:
            self.done.set()

    def _check_process(self) -> None:
        # A forked child inherits the object, not the lease: releasing it from
        # the child would end the parent's exclusive section behind its back.
        if os.getpid() != self._pid:
            raise NotHeld(
                f"lock {self._name!r} is held by process {self._pid}, not by this forked child"
            )

    def _start_watchdog(self, keeper: Keeper, acquired_at: float) -> None:
        self._keeper = keeper
        self._auto_renew = True
        keeper.begin(self._fencing_token, acquired_at)
        self._events.keeper_opened(keeper)
        self._watcher = Watchdog(keeper, self.done, self._stopping, self._events)
        driver().watch(self._watcher)
        self._abandon = weakref.finalize(self, stop_renewing, keeper, self._stopping, self._pid)

    def _stop_watchdog(self) -> None:
        keeper, watcher = self._keeper, self._watcher
        self._keeper = self._watcher = None
        if keeper is None:
            return
        if self._abandon is not None:
            self._abandon.detach()
        self._stopping.set()
        keeper.end()
        keeper.notify()
        if watcher is not None:
            driver().unwatch(watcher)
        keeper.close()
        self._events.keeper_closed(keeper)

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self.done.is_set() else "held")
        return (
            f"<redlease.Lock {self._name!r} fencing_token={self._fencing_token} "
            f"ttl={self.ttl} {state}>"
        )


# -- lockers ---------------------------------------------------------------------


class LockerCore:
    """What a locker shares with its shells (``aio``) and ``metrics``: where its locks report.

    Reached through the shells' one documented internal attribute, ``_core``
    (an ``Election`` for electors, this for lockers).
    """

    __slots__ = ("events", "waits")

    def __init__(self, events: Events) -> None:
        self.events = events
        self.waits = WaitStats()  # how long its acquisitions waited, per name


class LeaseStore(ABC):
    """A store of fenced leases and the acquisitions it grants: a locker's, or a semaphore's.

    ``acquire``, ``try_acquire`` and ``hold`` on top of the store's narrow
    operations (``_attempt``, ``_leave``, ``_refresh``, ``_release``,
    ``_keeper``, ...), each one atomic. A semaphore's permits are such a
    store; a ``Locker`` is one that can also say who holds what.
    """

    @property
    @abstractmethod
    def engine(self) -> str:
        """Which engine serves the store: ``"native"``, ``"python"`` or ``"memory"``."""

    @functools.cached_property
    def _core(self) -> LockerCore:
        """The store's core, the one internal attribute its shells and metrics use."""
        return LockerCore(
            Events("locker", getattr(self, "prefix", type(self).__name__), engine=self.engine)
        )

    @takes(acquire_options)
    def acquire(self, name: str, options: Options) -> Lock:
        """Take the lock ``name``, retrying for up to ``wait`` seconds.

        Tries at once, then every ``retry_interval`` (a little earlier, at
        random, and no later than the holder's lease expiry) until the wait
        window ends; ``wait=0`` is a single attempt, ``math.inf`` waits until
        acquired. Raises ``NotAcquired`` when the lock is still held by
        someone else at the end. Backend errors fail closed: they propagate
        as redis-py's exceptions and nothing is acquired.

        ``auto_renew=True`` starts a watchdog that refreshes the lease every
        TTL/3 (on the native engine from a native thread that never waits for
        the GIL) and sets ``Lock.done`` once the lease is found lost; it
        needs ``ttl >= MIN_AUTO_RENEW_TTL`` (else ``AutoRenewTTLTooShort``).
        The lease is counted from just before the request was sent. Invalid
        settings raise ``ConfigError`` naming the rule.

        ``fair=True`` serves one name's fair waiters in the order they began
        waiting (``fair``): a waiter whose thread is late (GIL, CPU) keeps its
        place, one that gives up leaves at once, one that dies within max(3 x
        ``retry_interval``, 100 ms). Acquirers without ``fair`` do not queue.
        """
        return self._take(check_name(name), options())

    @takes(attempt_options)
    def try_acquire(self, name: str, options: Options) -> Lock:
        """One attempt at the lock ``name``; ``NotAcquired`` when someone else holds it.

        For work where "another replica is already doing it" is a normal
        outcome (a cron tick). Otherwise as ``acquire`` with no wait.
        """
        return self._take(check_name(name), options())

    @takes(hold_options)
    @contextlib.contextmanager
    def hold(self, name: str, options: Options) -> Iterator[Lock]:
        """Hold the lock ``name`` for the body of a ``with`` block; the recommended form.

        Acquires as ``acquire`` does, with auto-renewal on unless
        ``auto_renew=False``, so the body may outlive the TTL; ``held.done``
        is set if the lease is lost meanwhile. The lock is released on every
        way out of the block, exceptions included. A release reporting
        ``NotHeld`` is raised even when the body succeeded, because the body
        can no longer be trusted to have run exclusively; when the body
        raised, ``NotHeld`` is raised from the body's exception. Two cases
        keep the body's exception instead, with the release problem added as
        a note: a ``KeyboardInterrupt``/``SystemExit`` body (an interrupt is
        never swallowed), and a backend error on release (the lease then
        expires on its own within one TTL).
        """
        name = check_name(name)
        with self._holding(name, options()) as held:
            yield held

    def _take(self, name: str, options: AcquireOptions) -> Lock:
        """One acquisition of ``name`` (checked) with ``options`` (checked): every face's path."""
        return self._acquire(
            name, options.ttl_ms, options.window, options.interval, options.auto_renew,
            options.fair,
        )

    @contextlib.contextmanager
    def _holding(self, name: str, options: AcquireOptions) -> Iterator[Lock]:
        """``hold``'s body: acquire, yield, release on every way out (see ``Locker.hold``)."""
        held = self._take(name, options)
        try:
            yield held
        except BaseException as body_exc:
            release_after_failure(held, body_exc)
            raise
        held.release()

    def _acquire(
        self,
        name: str,
        ttl_ms: int,
        window: float,
        interval: float,
        auto_renew: bool,
        fair: bool = False,
    ) -> Lock:
        owner = secrets.token_hex(16)
        began = time.monotonic()
        deadline = began + window
        waits, taken = self._core.waits, False
        queue_ms = place_ms(interval) if fair else 0  # the renewer keeps it too (_fair)
        place = PlaceKeeping(functools.partial(self._place_keeper, name, owner, queue_ms))
        waiting: contextlib.AbstractContextManager[Callable[[float], None]]
        waiting = contextlib.nullcontext(self._pause)
        if window > 0:
            waiting = self._waiting(name, owner if fair else None)
        granted = False
        try:
            with waiting as pause, place:
                while True:
                    sent = time.monotonic()
                    token, remaining = self._attempt(name, owner, ttl_ms, queue_ms, began)
                    if token > 0:
                        granted = True
                        waits.record(name, sent - began, True, taken)
                        self._core.events.waited(name, began, True)
                        return self._grant(name, owner, token, ttl_ms, sent, auto_renew)
                    taken = True
                    left = deadline - time.monotonic()
                    if left <= 0:
                        waits.record(name, time.monotonic() - began, False, True)
                        self._core.events.waited(name, began, False)
                        waited = f" after waiting {window} s" if window > 0 else ""
                        raise NotAcquired(self._taken(name) + waited)
                    if fair:
                        place.kept(sent)
                    delay = interval * (1.0 - _RETRY_JITTER * random.random())
                    if 0 < remaining < delay:
                        delay = remaining
                    pause(min(delay, left))
                    check_abandoned()  # an asyncio caller cancelled: stop waiting
        finally:
            if fair and not granted:
                with contextlib.suppress(Exception):
                    self._leave(name, owner)  # else its place ends with its lease

    def _grant(
        self, name: str, owner: str, token: int, ttl_ms: int, sent: float, auto_renew: bool
    ) -> Lock:
        held = Lock(self, name, owner, token, ttl_ms)
        if auto_renew:
            ttl = ttl_ms / 1000
            try:
                held._start_watchdog(self._keeper(name, owner, ttl_ms, renew_interval(ttl)), sent)
            except BaseException:
                with contextlib.suppress(Exception):
                    held.release()
                raise
        return held

    # The store's four operations, each one atomic.

    @abstractmethod
    def _attempt(
        self, name: str, owner: str, ttl_ms: int, queue_ms: int = 0, began: float | None = None
    ) -> tuple[int, float]:
        """``(token, 0)`` when acquired, else ``(0, seconds left on the holder's lease)``.

        ``queue_ms`` > 0: a fair attempt, which holds ``owner``'s place in the
        name's queue for that long and is granted only in its turn, a new place dated
        from ``began`` (when ``owner`` began waiting, ``time.monotonic()``; None: now).
        """

    @abstractmethod
    def _leave(self, name: str, owner: str) -> None:
        """A fair waiter ``owner`` gave up: its place in ``name``'s queue goes at once."""

    def _place_keeper(self, name: str, owner: str, life_ms: int) -> Keeper | None:
        """A keeper of fair waiter ``owner``'s place for ``life_ms`` (None: attempts only)."""
        return None

    @abstractmethod
    def _refresh(self, name: str, owner: str, ttl_ms: int) -> bool:
        """Extend ``owner``'s lease; False when it is not ``owner``'s."""

    @abstractmethod
    def _release(self, name: str, owner: str) -> bool:
        """Delete ``owner``'s lease; False when it is not ``owner``'s."""

    @abstractmethod
    def _keeper(self, name: str, owner: str, ttl_ms: int, interval: float) -> Keeper:
        """A keeper that refreshes ``owner``'s lease every ``interval`` seconds."""

    def _pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def _taken(self, name: str) -> str:
        """What ``NotAcquired`` says when ``name`` could not be had."""
        return f"lock {name!r} is held by another owner"

    def _waiting(
        self, name: str, waiter: str | None = None
    ) -> contextlib.AbstractContextManager[Callable[[float], None]]:
        """For one waiting ``acquire`` of ``name``: the pause between its attempts.

        ``waiter``: a fair waiter's id, whose pause may end on its turn rather
        than on every release.

        A locker whose store announces releases returns a pause that ends
        early on the announcement; the default just sleeps (``_pause``).
        """
        return contextlib.nullcontext(self._pause)


class Locker(LeaseStore, ClosesOnExit):
    """What every locker offers: ``acquire``, ``try_acquire`` and ``hold``.

    Accept a ``Locker`` where code needs a lock and let the deployment decide
    which one (see ``default_locker``). Both implementations follow the same
    rules: a lease expires ``ttl`` after acquisition or the last refresh;
    only the acquisition holding the random ownership token can refresh or
    release it; every acquisition gets a fencing token greater than all
    earlier ones of the same store.
    """

    def holder(self, name: str) -> LockHolder | None:
        """Who holds the lock ``name`` now, as the store says; None when nobody does. One read."""
        return self._holder(check_name(name))

    def held(self) -> list[tuple[str, LockHolder]]:
        """Every lock held now, and each live semaphore permit under its semaphore's name,
        as ``(name, LockHolder)`` sorted by name (then token): for operators."""
        return sorted(self._held(), key=lambda item: (item[0], item[1].fencing_token))

    def force_release(self, name: str) -> bool:
        """Take the lock ``name`` from its holder now, for an operator; False when none held it.

        The holder is fenced out at once: the lock is gone (its refresh and
        release raise ``NotHeld``, an auto-renewed one is found lost) and the
        fencing counter moves past its token, so every later token is greater.
        Waiters are told at once, as on a release.
        """
        return self._force_release(check_name(name))[1] is not None

    def close(self) -> None:  # lockers without connections have nothing to free
        """Free the locker's own resources (connections). Release its locks first."""

    def __enter__(self: _LockerT) -> _LockerT:
        return self


    @abstractmethod
    def _holder(self, name: str) -> LockHolder | None:
        """The live lease of ``name`` (label, token, TTL), read atomically; None without one."""

    @abstractmethod
    def _held(self) -> list[tuple[str, LockHolder]]:
        """Every live lease, by name, in any order."""

    @abstractmethod
    def _force_release(self, name: str) -> tuple[int, str | None]:
        """End ``name``'s lease whoever holds it: ``(fencing counter now, holder or None)``."""


def release_after_failure(held: Lock, body_exc: BaseException) -> None:
    """Release after the body raised ``body_exc``; raise ``NotHeld`` from it when lost."""
    try:
        held.release()
    except NotHeld as lost:
        if isinstance(body_exc, Exception):
            raise lost from body_exc
        _add_note(body_exc, f"redlease: {lost}")
    except Exception as err:
        _add_note(body_exc, f"redlease: releasing lock {held.name!r} failed: {err!r}")

