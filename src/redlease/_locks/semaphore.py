"""Semaphores: N holders of one name at once, each holding a permit that is a lock of its own.

``locker.semaphore(name, permits)`` gives a ``Semaphore``; its ``acquire``,
``try_acquire`` and ``hold`` give ``Lock`` objects (permits) with the lock's
semantics: a lease of its own that expires at its TTL, a watchdog on the
locker's renewer, ``release`` / ``refresh`` guarded by a random ownership
token, ``done`` once lost. How many permits are live is decided by the store
in one atomic step (one script on Redis), so at most ``permits`` are live at
any moment; each permit's fencing token comes from the locker's one counter,
so it is greater than every earlier token of every name of the locker. A
release wakes waiting acquirers at once, as a lock's does.

The store's side is a ``LeaseStore`` of permits (``RedisLocker``'s and
``MemoryLocker``'s), which this wraps with the name and the count fixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from .._config import whole_number
from .._errors import ConfigError
from .args import Options, acquire_options, attempt_options, hold_options, takes_unnamed
from .holders import LockHolder
from .lock import LeaseStore, Lock


def check_permits(permits: object) -> int:
    """A semaphore's ``permits`` argument, checked: a whole number of at least 1."""
    return whole_number(permits, "permits", 1, "how many may hold it at once")


def mismatch(name: str, asked: int, live: int) -> ConfigError:
    """The error for asking ``name`` with ``asked`` permits while it has live ones of ``live``."""
    return ConfigError(
        f"semaphore {name!r} has live permits taken with permits={live}; this one asks "
        f"for permits={asked}: every holder of one name must agree on the count"
    )


class Semaphore:
    """At most ``permits`` holders of ``name`` at once; made by ``locker.semaphore``.

    ``acquire`` / ``try_acquire`` / ``hold`` take one permit, as a ``Lock``
    (the same arguments and guarantees as the locker's, without the name);
    ``holders()`` says who holds the live ones. Asking one name with two
    different counts while permits of the first are live is a
    ``ConfigError``. Thread-safe.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        permits: int,
        holders: Callable[[], list[LockHolder]],
    ) -> None:
        self._store = store
        self._name = name
        self._permits = permits
        self._holders = holders

    @property
    def _core(self) -> LeaseStore:
        """The store of its permits: the one internal attribute the asyncio face uses."""
        return self._store

    @property
    def name(self) -> str:
        """The semaphore's name."""
        return self._name

    @property
    def permits(self) -> int:
        """How many holders it admits at once."""
        return self._permits

    @takes_unnamed(acquire_options)
    def acquire(self, options: Options) -> Lock:
        """Take a permit, waiting up to ``wait`` for one to free; see ``Locker.acquire``.

        ``NotAcquired`` when all ``permits`` are still taken at the end.
        ``fair=True``: freed permits go to the fair waiters in arrival order, with
        the lock's rule (a place lives max(3 x ``retry_interval``, 100 ms), kept
        by the renewer too; see ``Locker.acquire``).
        """
        return self._store._take(self._name, options())

    @takes_unnamed(attempt_options)
    def try_acquire(self, options: Options) -> Lock:
        """One attempt at a permit; ``NotAcquired`` when all are taken."""
        return self._store._take(self._name, options())

    @takes_unnamed(hold_options)
    @contextlib.contextmanager
    def hold(self, options: Options) -> Iterator[Lock]:
        """Hold a permit for a ``with`` block: auto-renewed, released on every way out."""
        with self._store._holding(self._name, options()) as permit:
            yield permit

    def holders(self) -> list[LockHolder]:
        """Who holds the live permits, soonest to expire first (one read)."""
        return self._holders()

    def __repr__(self) -> str:
        return f"<redlease.Semaphore {self._name!r} permits={self._permits}>"
