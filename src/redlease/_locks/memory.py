"""``MemoryLocker`` and its in-process store.

``MemoryStore`` plays the part the Lua scripts play for ``RedisLocker``: the
same acquire / refresh / release rules (ownership token, TTL expiry on the
monotonic clock, one fencing counter for every name), for locks and for
semaphores' permits, applied under one mutex instead of inside Redis. Its
leases are kept by the Python engine's renewer, renewing in memory, so a
lock treats both lockers alike.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable

from .._engine import Keeper, Lease, Renewer, renew_interval
from .args import check_name
from .holders import LockHolder, check_label, label
from .lock import LeaseStore, Locker, LockerCore
from .semaphore import Semaphore, check_permits, mismatch

Permit = tuple[int, float, str]
"""A live permit: its fencing token, its expiry (monotonic), its holder's label."""


class MemoryStore:
    """Leases by name, with ownership tokens and a global fencing counter. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # name -> (owner, fencing token, expiry on the monotonic clock)
        self._leases: dict[str, tuple[str, int, float]] = {}
        self._labels: dict[str, str] = {}  # name -> the holder's label, for people
        # fair waiting: (kind, name) -> waiter -> (arrival, place lives until)
        self._queues: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
        # semaphore name -> (its permits, owner -> Permit)
        self._sems: dict[str, tuple[int, dict[str, Permit]]] = {}
        self._fencing = 0

    def _live(self, name: str, now: float) -> tuple[str, int, float] | None:
        lease = self._leases.get(name)
        if lease is not None and lease[2] <= now:
            del self._leases[name]
            self._labels.pop(name, None)
            self._cond.notify_all()
            return None
        return lease

    def acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        label: str = "",
        queue: float = 0.0,
        began: float | None = None,
    ) -> tuple[int, float]:
        """``(fencing token, ttl)`` when granted, ``(0, remaining lease)`` when held by another.

        ``label`` says who holds it, for people (``holder``); ownership is
        ``owner``. ``queue`` > 0: a fair attempt (see ``turn``), whose place
        lives that many seconds; ``began``: when ``owner`` began waiting.
        """
        with self._cond:
            now = time.monotonic()
            lease = self._live(name, now)
            if lease is not None and lease[0] == owner:
                # A repeated request from the same acquisition: same token, fresh TTL.
                self._leases[name] = (owner, lease[1], now + ttl)
                return lease[1], ttl
            turn = not queue or self.turn(("key", name), owner, queue, 1, now, began)
            if lease is not None:
                return 0, lease[2] - now
            if not turn:
                return 0, 0.0
            self.leave(("key", name), owner)
            self._fencing += 1
            self._leases[name] = (owner, self._fencing, now + ttl)
            self._labels[name] = label
            return self._fencing, ttl

    def turn(
        self,
        queue: tuple[str, str],
        waiter: str,
        alive: float,
        slots: int,
        now: float,
        began: float | None = None,
    ) -> bool:
        """Under the mutex: hold ``waiter``'s place in ``queue`` for ``alive`` seconds more;
        whether it is among the first ``slots`` (arrival order, dead places dropped).

        A new place's arrival is ``began``, when the waiter began waiting (as
        queue.lua dates places on Redis), or ``now``.
        """
        places = self._queues.setdefault(queue, {})
        for gone in [w for w, (_, until) in places.items() if until <= now]:
            del places[gone]
        if waiter in places:
            arrived = places[waiter][0]
        else:
            arrived = now if began is None else min(began, now)
        places[waiter] = (arrived, now + alive)
        ahead = sum(1 for w, (at, _) in places.items() if (at, w) < (arrived, waiter))
        return ahead < slots

    def keep(self, queue: tuple[str, str], waiter: str, alive: float) -> bool:
        """``waiter``'s live place in ``queue`` held ``alive`` seconds more; False when
        it is gone (served, left, or lapsed: only an attempt takes a place again)."""
        with self._cond:
            now = time.monotonic()
            place = self._queues.get(queue, {}).get(waiter)
            if place is None or place[1] <= now:
                return False
            self._queues[queue][waiter] = (place[0], now + alive)
            return True

    def leave(self, queue: tuple[str, str], waiter: str) -> None:
        """``waiter``'s place in ``queue`` goes (it was served, or it gave up)."""
        with self._cond:
            places = self._queues.get(queue)
            if places is not None and places.pop(waiter, None) is not None:
                if not places:
                    del self._queues[queue]
                self._cond.notify_all()

    def refresh(self, name: str, owner: str, ttl: float) -> bool:
        """Extend the lease by ``ttl`` from now; False when it is not ``owner``'s any more."""
        with self._cond:
            now = time.monotonic()
            lease = self._live(name, now)
            if lease is None or lease[0] != owner:
                return False
            self._leases[name] = (owner, lease[1], now + ttl)
            return True

    def release(self, name: str, owner: str) -> bool:
        """Drop the lease; False when it is not ``owner``'s any more (a successor's is kept)."""
        with self._cond:
            lease = self._live(name, time.monotonic())
            if lease is None or lease[0] != owner:
                return False
            del self._leases[name]
            self._labels.pop(name, None)
            self._cond.notify_all()
            return True

    def holder(self, name: str) -> LockHolder | None:
        """The live lease of ``name`` (label, token, TTL left), or None."""
        with self._cond:
            now = time.monotonic()
            lease = self._live(name, now)
            if lease is None:
                return None
            return LockHolder(self._labels.get(name, ""), lease[1], _ms_left(lease[2], now))

    def held(self) -> list[tuple[str, LockHolder]]:
        """Every live lease, by name: locks, and each semaphore's live permits."""
        with self._cond:
            now = time.monotonic()
            live = [(name, self._live(name, now)) for name in list(self._leases)]
            found = [
                (name, LockHolder(self._labels.get(name, ""), lease[1], _ms_left(lease[2], now)))
                for name, lease in live
                if lease is not None
            ]
            for name in list(self._sems):
                found += [(name, who) for who in self.sem_holders(name)]
            return found

    def _permits(self, name: str, now: float) -> tuple[int, dict[str, Permit]] | None:
        """The semaphore ``name`` with its expired permits dropped; None when none is live."""
        entry = self._sems.get(name)
        if entry is None:
            return None
        held = entry[1]
        for owner in [o for o, permit in held.items() if permit[1] <= now]:
            del held[owner]
            self._cond.notify_all()
        if not held:
            del self._sems[name]
            return None
        return entry

    def sem_acquire(
        self,
        name: str,
        owner: str,
        ttl: float,
        permits: int,
        label: str,
        queue: float = 0.0,
        began: float | None = None,
    ) -> tuple[int, float]:
        """A permit of ``name``: ``(token, ttl)``, or ``(0, time until one frees)``."""
        with self._cond:
            now = time.monotonic()
            entry = self._permits(name, now)
            if entry is not None and entry[0] != permits:
                raise mismatch(name, permits, entry[0])
            held = entry[1] if entry is not None else {}
            if owner in held:  # a repeated request of the same acquisition
                token = held[owner][0]
            else:
                free = permits - len(held)
                turn = not queue or self.turn(("sem", name), owner, queue, free, now, began)
                if free <= 0:
                    return 0, min(permit[1] for permit in held.values()) - now
                if not turn:
                    return 0, 0.0
                self.leave(("sem", name), owner)
                self._fencing += 1
                token = self._fencing
            held[owner] = (token, now + ttl, label)
            self._sems[name] = (permits, held)
            return token, ttl

    def sem_refresh(self, name: str, owner: str, ttl: float) -> bool:
        with self._cond:
            now = time.monotonic()
            entry = self._permits(name, now)
            if entry is None or owner not in entry[1]:
                return False
            token, _, who = entry[1][owner]
            entry[1][owner] = (token, now + ttl, who)
            return True

    def sem_release(self, name: str, owner: str) -> bool:
        with self._cond:
            entry = self._permits(name, time.monotonic())
            if entry is None or entry[1].pop(owner, None) is None:
                return False
            if not entry[1]:
                del self._sems[name]
            self._cond.notify_all()
            return True

    def sem_holders(self, name: str) -> list[LockHolder]:
        with self._cond:
            now = time.monotonic()
            entry = self._permits(name, now)
            permits = sorted(entry[1].values(), key=lambda p: p[1]) if entry is not None else []
            return [LockHolder(who, token, _ms_left(expiry, now)) for token, expiry, who in permits]

    def wait_for_release(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when any lease is released."""
        with self._cond:
            self._cond.wait(timeout)

    def force_release(self, name: str) -> tuple[int, str | None]:
        """Take ``name`` from its holder: ``(the fencing counter now, the holder or None)``.

        With a holder, the lease is dropped and the counter moved past its
        token (every later token is greater); without one, nothing changes.
        """
        with self._cond:
            lease = self._live(name, time.monotonic())
            if lease is None:
                return self._fencing, None
            label = self._labels.pop(name, None) or lease[0]
            del self._leases[name]
            self._fencing += 1
            self._cond.notify_all()
            return self._fencing, label

    def expire(self, name: str) -> None:
        """End a lease at once, whoever holds it, as if its TTL had run out."""
        with self._cond:
            self._labels.pop(name, None)
            if self._leases.pop(name, None) is not None:
                self._cond.notify_all()


def _ms_left(expiry: float, now: float) -> int:
    """Whole milliseconds left until ``expiry`` (at least 1: the lease is live)."""
    return max(1, int((expiry - now) * 1000))


class MemoryLocker(Locker):
    """Locks for the threads of one process, with the same semantics as ``RedisLocker``.

    TTL expiry (on the monotonic clock), ownership tokens, one fencing
    counter for every name, waiting, auto-renewal, the holder labels
    (``holder=``, ``holder(name)``, ``held()``) and semaphores all behave as
    they do on Redis, so code moves between the two unchanged. It guards
    nothing across processes: use it for development, tests and
    single-process deployments. Thread-safe.
    """

    def __init__(self, *, holder: str | None = None) -> None:
        self._label = check_label(holder)
        self._store = MemoryStore()
        # One thread renews every auto-renewed lock of this locker, in memory.
        self._renewer = Renewer()
        weakref.finalize(self, self._renewer.stop, 1.0)

    @property
    def engine(self) -> str:
        """Always ``"memory"``."""
        return "memory"

    def semaphore(self, name: str, permits: int) -> Semaphore:
        """At most ``permits`` holders of ``name`` at once (see ``RedisLocker.semaphore``)."""
        permits = check_permits(permits)
        store = _MemoryPermits(self, permits)
        return Semaphore(
            store, check_name(name), permits, functools.partial(self._store.sem_holders, name)
        )

    def _attempt(
        self, name: str, owner: str, ttl_ms: int, queue_ms: int = 0, began: float | None = None
    ) -> tuple[int, float]:
        who, queue = label(self._label), queue_ms / 1000
        token, remaining = self._store.acquire(
            name, owner, ttl_ms / 1000, who, queue, began
        )
        return (token, 0.0) if token > 0 else (0, remaining)

    def _leave(self, name: str, owner: str) -> None:
        self._store.leave(("key", name), owner)

    def _place_keeper(self, name: str, owner: str, life_ms: int) -> Keeper | None:
        return self._queue_keeper(("key", name), owner, life_ms)

    def _queue_keeper(self, queue: tuple[str, str], owner: str, life_ms: int) -> Keeper:
        # The renewer's thread holds a fair waiter's place, as on Redis (_fair).
        store, life = self._store, life_ms / 1000
        return self._lease(lambda: store.keep(queue, owner, life), life_ms, renew_interval(life))

    def _holder(self, name: str) -> LockHolder | None:
        return self._store.holder(name)

    def _force_release(self, name: str) -> tuple[int, str | None]:
        return self._store.force_release(name)

    def _held(self) -> list[tuple[str, LockHolder]]:
        return self._store.held()

    def _refresh(self, name: str, owner: str, ttl_ms: int) -> bool:
        return self._store.refresh(name, owner, ttl_ms / 1000)

    def _release(self, name: str, owner: str) -> bool:
        return self._store.release(name, owner)

    def _keeper(self, name: str, owner: str, ttl_ms: int, interval: float) -> Keeper:
        store = self._store
        return self._lease(lambda: store.refresh(name, owner, ttl_ms / 1000), ttl_ms, interval)

    def _lease(self, renew: Callable[[], bool], ttl_ms: int, interval: float) -> Keeper:
        # The same lease and renewer as the Python engine's, renewing in memory.
        ttl = ttl_ms / 1000
        return Lease(self._renewer, lambda _timeout: int(renew()), interval=interval, ttl=ttl)

    def _pause(self, seconds: float) -> None:
        # Wake as soon as any lock is released instead of sleeping the interval out.
        self._store.wait_for_release(seconds)

    def __repr__(self) -> str:
        return "<redlease.MemoryLocker>"


class _MemoryPermits(LeaseStore):
    """The permits of one ``MemoryLocker`` semaphore count: the store a ``Semaphore`` wraps."""

    def __init__(self, locker: MemoryLocker, permits: int) -> None:
        self._locker = locker
        self._store = locker._store
        self._permits = permits

    @property
    def engine(self) -> str:
        return "memory"

    @property
    def _core(self) -> LockerCore:
        return self._locker._core

    def _attempt(
        self, name: str, owner: str, ttl_ms: int, queue_ms: int = 0, began: float | None = None
    ) -> tuple[int, float]:
        who, queue = label(self._locker._label), queue_ms / 1000
        token, remaining = self._store.sem_acquire(
            name, owner, ttl_ms / 1000, self._permits, who, queue, began
        )
        return (token, 0.0) if token > 0 else (0, remaining)

    def _leave(self, name: str, owner: str) -> None:
        self._store.leave(("sem", name), owner)

    def _place_keeper(self, name: str, owner: str, life_ms: int) -> Keeper | None:
        return self._locker._queue_keeper(("sem", name), owner, life_ms)

    def _refresh(self, name: str, owner: str, ttl_ms: int) -> bool:
        return self._store.sem_refresh(name, owner, ttl_ms / 1000)

    def _release(self, name: str, owner: str) -> bool:
        return self._store.sem_release(name, owner)

    def _keeper(self, name: str, owner: str, ttl_ms: int, interval: float) -> Keeper:
        return self._locker._lease(
            lambda: self._store.sem_refresh(name, owner, ttl_ms / 1000), ttl_ms, interval
        )

    def _pause(self, seconds: float) -> None:
        self._store.wait_for_release(seconds)

    def _taken(self, name: str) -> str:
        return f"all {self._permits} permits of semaphore {name!r} are taken"
