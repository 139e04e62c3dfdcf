"""The in-process lock store behind ``MemoryLocker``.

``MemoryStore`` plays the part the Lua scripts play for ``RedisLocker``: the
same acquire / refresh / release rules (ownership token, TTL expiry on the
monotonic clock, one fencing counter for every name), applied under one mutex
instead of inside Redis. Its leases are kept by the Python engine's keeper,
renewing in memory, so a lock treats both lockers alike.
"""

from __future__ import annotations

import threading
import time

from ._holders import LockHolder


class MemoryStore:
    """Leases by name, with ownership tokens and a global fencing counter. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # name -> (owner, fencing token, expiry on the monotonic clock)
        self._leases: dict[str, tuple[str, int, float]] = {}
        self._labels: dict[str, str] = {}  # name -> the holder's label, for people
        self._fencing = 0

    def _live(self, name: str, now: float) -> tuple[str, int, float] | None:
        lease = self._leases.get(name)
        if lease is not None and lease[2] <= now:
            del self._leases[name]
            self._labels.pop(name, None)
            self._cond.notify_all()
            return None
        return lease

    def acquire(self, name: str, owner: str, ttl: float, label: str = "") -> tuple[int, float]:
        """``(fencing token, ttl)`` when granted, ``(0, remaining lease)`` when held by another.

        ``label`` says who holds it, for people (``holder``); ownership is ``owner``.
        """
        with self._cond:
            now = time.monotonic()
            lease = self._live(name, now)
            if lease is None:
                self._fencing += 1
                self._leases[name] = (owner, self._fencing, now + ttl)
                self._labels[name] = label
                return self._fencing, ttl
            if lease[0] == owner:
                # A repeated request from the same acquisition: same token, fresh TTL.
                self._leases[name] = (owner, lease[1], now + ttl)
                return lease[1], ttl
            return 0, lease[2] - now

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
        """Every live lease, by name."""
        with self._cond:
            now = time.monotonic()
            live = [(name, self._live(name, now)) for name in list(self._leases)]
            return [
                (name, LockHolder(self._labels.get(name, ""), lease[1], _ms_left(lease[2], now)))
                for name, lease in live
                if lease is not None
            ]

    def wait_for_release(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when any lease is released."""
        with self._cond:
            self._cond.wait(timeout)

    def expire(self, name: str) -> None:
        """End a lease at once, whoever holds it, as if its TTL had run out."""
        with self._cond:
            self._labels.pop(name, None)
            if self._leases.pop(name, None) is not None:
                self._cond.notify_all()


def _ms_left(expiry: float, now: float) -> int:
    """Whole milliseconds left until ``expiry`` (at least 1: the lease is live)."""
    return max(1, int((expiry - now) * 1000))
