"""The Python keeper: one lease renewed on time from a Python thread.

Shared by the Python engine (renewing with a script on a connection of its
own) and ``MemoryLocker`` (renewing in memory): the state machine, the lease
deadline, the schedule and the bookkeeping are the same for both. It needs
the GIL to run, which is the limitation the native keeper removes.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from .base import ACTIVE, ENDED, IDLE, LATENESS_BUCKETS, LOST, MIN_STEP, is_failover_reply

_LATENESS_SAMPLES = 65536
_MAX_PENDING_ERRORS = 256


Renew = Callable[[float], Any]
"""One renewal bounded by the given seconds: returns 1 (renewed) or 0 (lost), or raises."""


class PythonKeeper:
    """The Keeper protocol on a Python thread (see ``_engine.Keeper``).

    What a renewal is comes from ``renew``: a script on a connection of its
    own for the Python engine, an in-memory refresh for ``MemoryLocker``. The
    state machine, the deadline, the schedule and the bookkeeping are the
    same for both. ``on_close`` frees what ``renew`` uses.
    """

    def __init__(
        self,
        renew: Renew,
        *,
        interval: float,
        ttl: float,
        on_close: Callable[[], object] | None = None,
        on_begin: Callable[[int], object] | None = None,
    ) -> None:
        self._renew: Renew | None = renew
        self._on_close = on_close
        self._on_begin = on_begin
        self._interval = interval
        self._ttl = ttl
        self._cond = threading.Condition()
        self._state = IDLE
        self._token = 0
        self._generation = 0
        self._deadline = 0.0
        self._next = 0.0
        self._closed = False
        self._errors: deque[Exception] = deque(maxlen=_MAX_PENDING_ERRORS)
        self._lateness: deque[float] = deque(maxlen=_LATENESS_SAMPLES)
        # Cumulative figures for metrics (read at scrape time, never reset).
        self._late_hist = [0] * (len(LATENESS_BUCKETS) + 1)
        self._late_sum = 0.0
        self._renewals = 0
        self._wakeup = threading.Event()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._thread: threading.Thread | None = None
        _live_keepers.add(self)

    @property
    def token(self) -> int:
        return self._token

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran (or in a forked child)."""
        return self._closed

    @property
    def state(self) -> int:
        return self._state

    def begin(self, token: int, acquired_at: float) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("keeper is closed")
            if token < 1:
                raise ValueError("token must be >= 1")
            self._generation += 1
            self._deadline = acquired_at + self._ttl
            self._next = time.monotonic()
            self._token = token
            self._state = ACTIVE
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="redlease-renewer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        if self._on_begin is not None:
            self._on_begin(token)
        self.notify()  # a state change, like every other

    def end(self) -> None:
        with self._cond:
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._generation += 1
            self._cond.notify_all()
        self.notify()

    def lose(self, error: Exception) -> None:
        """End an ACTIVE term as LOST now, reporting ``error`` (e.g. the master was switched)."""
        with self._cond:
            if self._state == ACTIVE:
                self._errors.append(error)
                self._lose()
                self._cond.notify_all()

    def wait(self, timeout: float | None) -> bool:
        if self._closed:
            return True
        woken = self._wakeup.wait(timeout)
        # Under the lock, so close() cannot close the pipe (and the number be
        # reused by another file) between the check and the reads.
        with self._cond:
            if self._closed:
                return True
            self._wakeup.clear()
            try:
                while os.read(self._rfd, 64):
                    pass
            except (BlockingIOError, OSError):
                pass
        return woken

    def notify(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._wakeup.set()
            # EAGAIN: a wake-up is already pending.
            with contextlib.suppress(OSError):
                os.write(self._wfd, b"\x01")

    def pop_errors(self) -> list[Exception]:
        with self._cond:
            errors = list(self._errors)
            self._errors.clear()
        return errors

    def lateness(self) -> list[float]:
        with self._cond:
            return list(self._lateness)

    @property
    def renewals(self) -> int:
        return self._renewals

    def lateness_totals(self) -> tuple[list[int], float]:
        with self._cond:
            return list(self._late_hist), self._late_sum

    def fileno(self) -> int:
        """The pipe's read end while open; -1 once closed (its number may be reused)."""
        return -1 if self._closed else self._rfd

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._generation += 1
            self._cond.notify_all()
            thread = self._thread
        # Every thread in wait() returns, and later calls return at once.
        self._wakeup.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._on_close is not None:
            self._on_close()
        with self._cond:
            for fd in (self._rfd, self._wfd):
                with contextlib.suppress(OSError):
                    os.close(fd)
        _live_keepers.discard(self)

    def _record_lateness(self, late: float) -> None:
        # Caller holds the condition.
        self._lateness.append(late)
        # bisect_left: a sample equal to a bound belongs to that bucket (le).
        self._late_hist[bisect.bisect_left(LATENESS_BUCKETS, late)] += 1
        self._late_sum += late

    def _next_slot(self, scheduled: float) -> float:
        # On schedule: the next absolute deadline. Behind schedule (a slow or
        # failed round trip): go again at once; the lease deadline bounds us.
        # The native keeper follows the same rule.
        return max(scheduled + self._interval, time.monotonic())

    def _lose(self) -> None:
        # Caller holds the condition. The token goes first so that readers on
        # other threads stop using it before anything else happens.
        self._token = 0
        self._state = LOST
        self._generation += 1
        self.notify()

    def _main(self) -> None:
        try:
            self._loop()
        except BaseException:
            # This thread also enforces the lease deadline: if it dies, the
            # term must not outlive it with a token nobody keeps valid.
            with self._cond:
                if self._state == ACTIVE:
                    self._lose()
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._state != ACTIVE:
                    self._cond.wait()
                if self._closed:
                    return
                now = time.monotonic()
                if now >= self._deadline:
                    self._lose()
                    continue
                if now < self._next:
                    self._cond.wait(min(self._next, self._deadline) - now)
                    continue
                generation = self._generation
                scheduled = self._next
                deadline = self._deadline
            sent = time.monotonic()
            with self._cond:
                self._record_lateness(sent - scheduled)
            renew = self._renew
            try:
                if renew is None:
                    raise RuntimeError("keeper is closed")
                reply = renew(max(min(self._interval, deadline - sent), MIN_STEP))
            except Exception as exc:  # any failure at all is a failed renewal
                with self._cond:
                    if generation == self._generation:
                        self._errors.append(exc)
                        if is_failover_reply(exc):
                            # The server is no longer the master the lease was
                            # granted on: waiting for the deadline would lead on
                            # a lease a failover may already have lost.
                            self._lose()
                            continue
                        self._next = self._next_slot(scheduled)
                        self.notify()
                continue
            with self._cond:
                if generation != self._generation:
                    continue
                if reply == 1:
                    self._renewals += 1
                    self._deadline = sent + self._ttl
                    self._next = self._next_slot(scheduled)
                elif reply == 0:
                    self._lose()
                else:
                    # Like the native keeper: only 0 says the lease is gone;
                    # anything else is a failed renewal, tolerated until the deadline.
                    self._errors.append(
                        ResponseError("unexpected reply to a renewal (expected 1 or 0)")
                    )
                    self._next = self._next_slot(scheduled)
                    self.notify()

    def _after_fork_in_child(self) -> None:
        # The renewal thread does not exist in the child, and the lease is the
        # parent's: the child must never renew or release it.
        self._cond = threading.Condition()
        self._closed = True
        self._token = 0
        if self._state == ACTIVE:
            self._state = ENDED
        self._thread = None
        self._renew = self._on_close = None


_live_keepers: weakref.WeakSet[PythonKeeper] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for keeper in list(_live_keepers):
        keeper._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)
