"""The in-process lock store behind ``MemoryLocker``, and its lease keeper.

``MemoryStore`` plays the part the Lua scripts play for ``RedisLocker``: the
same acquire / refresh / release rules (ownership token, TTL expiry on the
monotonic clock, one fencing counter for every name), applied under one mutex
instead of inside Redis. ``MemoryKeeper`` renews one in-memory lease from its
own thread and follows the state machine of ``_engine.Keeper``, so a lock
treats both lockers alike.
"""

from __future__ import annotations

import threading
import time

from ._engine import ACTIVE, ENDED, IDLE, LOST


class MemoryStore:
    """Leases by name, with ownership tokens and a global fencing counter. Thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        # name -> (owner, fencing token, expiry on the monotonic clock)
        self._leases: dict[str, tuple[str, int, float]] = {}
        self._fencing = 0

    def _live(self, name: str, now: float) -> tuple[str, int, float] | None:
        lease = self._leases.get(name)
        if lease is not None and lease[2] <= now:
            del self._leases[name]
            self._cond.notify_all()
            return None
        return lease

    def acquire(self, name: str, owner: str, ttl: float) -> tuple[int, float]:
        """``(fencing token, ttl)`` when granted, ``(0, remaining lease)`` when held by another."""
        with self._cond:
            now = time.monotonic()
            lease = self._live(name, now)
            if lease is None:
                self._fencing += 1
                self._leases[name] = (owner, self._fencing, now + ttl)
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
            self._cond.notify_all()
            return True

    def wait_for_release(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking early when any lease is released."""
        with self._cond:
            self._cond.wait(timeout)

    def expire(self, name: str) -> None:
        """End a lease at once, whoever holds it, as if its TTL had run out."""
        with self._cond:
            if self._leases.pop(name, None) is not None:
                self._cond.notify_all()


class MemoryKeeper:
    """Renews one ``MemoryStore`` lease every ``interval`` on its own thread.

    Follows the state machine of ``_engine.Keeper`` (IDLE, ACTIVE, LOST,
    ENDED): a refresh answering False ends the term as LOST, and so does a
    thread starved past the lease (the store has expired it by then).
    """

    def __init__(
        self, store: MemoryStore, name: str, owner: str, *, interval: float, ttl: float
    ) -> None:
        self._store = store
        self._name = name
        self._owner = owner
        self._interval = interval
        self._ttl = ttl
        self._cond = threading.Condition()
        self._state = IDLE
        self._token = 0
        self._closed = False
        self._woken = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def token(self) -> int:
        return self._token

    @property
    def state(self) -> int:
        return self._state

    def begin(self, token: int, acquired_at: float) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("keeper is closed")
            self._token = token
            self._state = ACTIVE
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="redlease-memory-renewer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        self.notify()

    def end(self) -> None:
        with self._cond:
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._cond.notify_all()
        self.notify()

    def wait(self, timeout: float | None) -> bool:
        woken = self._woken.wait(timeout)
        self._woken.clear()
        return woken

    def notify(self) -> None:
        self._woken.set()

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._cond.notify_all()
            thread = self._thread
        self.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        next_at = time.monotonic()
        while True:
            with self._cond:
                while not self._closed and self._state != ACTIVE:
                    self._cond.wait()
                if self._closed:
                    return
                delay = next_at - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
            renewed = self._store.refresh(self._name, self._owner, self._ttl)
            with self._cond:
                if self._state != ACTIVE:
                    continue
                if not renewed:
                    self._token = 0
                    self._state = LOST
                    self._cond.notify_all()
                    self.notify()
                    continue
            # Absolute deadlines, but a starved thread does not burst to catch up.
            next_at = max(next_at + self._interval, time.monotonic())
