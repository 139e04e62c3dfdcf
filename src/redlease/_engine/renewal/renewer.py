"""The Python renewer: one Python thread that renews every lease of its owner on time.

Shared by the Python engine (a script on a connection; leases due together on
one server in one call, ``batch``) and ``MemoryLocker`` (in memory): one ``Lease`` class holds the
state machine, deadline, schedule and bookkeeping, and every lease waits in one
``Renewer``'s timer heap. It needs the GIL, the limitation the native one removes.
"""

from __future__ import annotations

import bisect
import contextlib
import heapq
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.exceptions import NoScriptError

from ..contract.interface import (
    ACTIVE,
    ENDED,
    IDLE,
    LATENESS_BUCKETS,
    LATENESS_SAMPLES,
    LOST,
    MIN_STEP,
)
from ..rules.replies import is_failover_reply, unexpected
from ..rules.timing import RENEW_BATCH_WINDOW, RENEW_RETRY_FLOOR

_MAX_PENDING_ERRORS = 256


Renew = Callable[[float], Any]
"""One renewal bounded by the given seconds: returns 1 (renewed) or 0 (lost), or raises."""


class Lease:
    """The Keeper protocol for one lease, renewed by a ``Renewer`` (see ``_engine.Keeper``).

    What a renewal is comes from ``renew``: a script on a connection for the
    Python engine, an in-memory refresh for ``MemoryLocker``. ``on_close``
    frees what ``renew`` uses. With ``command`` and ``batch`` the renewer may
    renew this lease together with others due at the same time on the same
    ``batch`` (one connection, or one Cluster's nodes): ``command`` is what
    ``batch`` makes of it (the Python engine's ``batch.Renewal``); ``batch``
    renews many in one round trip and returns each one's reply (an error
    reply in its place), or raises when the connection failed (so did every
    renewal of the batch). A NOSCRIPT left in a lease's place sends it on
    its own ``renew`` at once.
    """

    def __init__(
        self,
        renewer: Renewer,
        renew: Renew,
        *,
        interval: float,
        ttl: float,
        on_close: Callable[[], object] | None = None,
        on_begin: Callable[[int], object] | None = None,
        command: Any = None,
        batch: Callable[[list[Any], float], list[Any]] | None = None,
    ) -> None:
        self._renewer = renewer
        self.command = command
        self.batch = batch
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
        self._lateness: deque[float] = deque(maxlen=LATENESS_SAMPLES)
        # Cumulative figures for metrics (read at scrape time, never reset).
        self._late_hist = [0] * (len(LATENESS_BUCKETS) + 1)
        self._late_sum = 0.0
        self._late_count = 0
        self._renewals = 0
        self._renewed_at = 0.0
        self._wakeup = threading.Event()
        # The wake-up pipe is made by the first fileno(): a keeper nobody
        # selects on (most of them, with many leases) costs no descriptor.
        self._rfd = self._wfd = -1
        _live_leases.add(self)

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

    def _start_term(self, token: int, acquired_at: float) -> None:
        """A new term (under ``self._cond``): renew at once, deadline from ``acquired_at``."""
        if self._closed:
            raise RuntimeError("keeper is closed")
        if token < 1:
            raise ValueError("token must be >= 1")
        if self._on_begin is not None:
            # Before the token shows: whoever sees the term may act on it at
            # once (a switch notice must already know where it began).
            self._on_begin(token)
        self._generation += 1
        self._deadline = acquired_at + self._ttl
        self._next = time.monotonic()
        self._token = token
        self._state = ACTIVE

    def begin(self, token: int, acquired_at: float) -> None:
        with self._cond:
            self._start_term(token, acquired_at)
            generation = self._generation
        self._renewer.schedule(self, self._next, generation)
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
                while self._rfd >= 0 and os.read(self._rfd, 64):
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
            if self._wfd >= 0:
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

    def lateness_count(self) -> int:
        with self._cond:
            return self._late_count

    @property
    def renewals(self) -> int:
        return self._renewals

    @property
    def renewed_at(self) -> float:
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        return self._renewed_at

    def lateness_totals(self) -> tuple[list[int], float]:
        with self._cond:
            return list(self._late_hist), self._late_sum

    def fileno(self) -> int:
        """The pipe's read end while open; -1 once closed (its number may be reused)."""
        with self._cond:
            if self._closed:
                return -1
            if self._rfd < 0:
                self._rfd, self._wfd = os.pipe()
                os.set_blocking(self._rfd, False)
                os.set_blocking(self._wfd, False)
                if self._wakeup.is_set():
                    os.write(self._wfd, b"\x01")
            return self._rfd

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
        # Every thread in wait() returns, and later calls return at once.
        self._wakeup.set()
        if self._on_close is not None:
            self._on_close()
        with self._cond:
            for fd in (self._rfd, self._wfd):
                if fd < 0:
                    continue
                with contextlib.suppress(OSError):
                    os.close(fd)
        _live_leases.discard(self)

    def _record_lateness(self, late: float) -> None:
        # Caller holds the condition.
        self._lateness.append(late)
        self._late_count += 1
        # bisect_left: a sample equal to a bound belongs to that bucket (le).
        self._late_hist[bisect.bisect_left(LATENESS_BUCKETS, late)] += 1
        self._late_sum += late

    def _next_slot(self, scheduled: float, floor: float = 0.0) -> float:
        # On schedule: the next absolute deadline. Behind schedule (a slow or
        # failed round trip): go again at once, or after ``floor`` (a failed
        # renewal waits RENEW_RETRY_FLOOR); the lease deadline bounds us.
        # The native keeper follows the same rule.
        return max(scheduled + self._interval, time.monotonic() + floor)

    def _lose(self) -> None:
        # Caller holds the condition. The token goes first so that readers on
        # other threads stop using it before anything else happens.
        self._token = 0
        self._state = LOST
        self._generation += 1
        self.notify()

    def _apply(
        self, generation: int, scheduled: float, sent: float, reply: Any, error: Exception | None
    ) -> bool:
        """One renewal's outcome (a reply, or the error that replaced it), under ``self._cond``.

        True while the term goes on; False when it was lost or had already
        ended (a renewal of an older term changes nothing).
        """
        if generation != self._generation:
            return False
        if error is not None:
            self._errors.append(error)
            if is_failover_reply(error):
                # The server is no longer the master the lease was granted
                # on: waiting for the deadline would lead on a lease a
                # failover may already have lost.
                self._lose()
                return False
            self._next = self._next_slot(scheduled, RENEW_RETRY_FLOOR)
            self.notify()
        elif reply == 1:
            self._renewals += 1
            self._renewed_at = sent
            self._deadline = sent + self._ttl
            self._next = self._next_slot(scheduled)
        elif reply == 0:
            self._lose()
            return False
        else:
            # As natively: only 0 says the lease is gone; a reply the renewal
            # cannot give is a failed renewal, tolerated until the deadline.
            self._errors.append(unexpected("renew", "flag", reply))
            self._next = self._next_slot(scheduled, RENEW_RETRY_FLOOR)
            self.notify()
        return True

    def _tick(self) -> None:
        """One step on the host thread: a renewal when due, a loss at the deadline."""
        due = self._prepare()
        if due is None:
            return
        generation, scheduled, deadline, sent = due
        renew = self._renew
        try:
            if renew is None:
                raise RuntimeError("keeper is closed")
            reply = renew(max(min(self._interval, deadline - sent), MIN_STEP))
        except Exception as exc:  # any failure at all is a failed renewal
            self._finish(generation, scheduled, sent, None, exc)
            return
        self._finish(generation, scheduled, sent, reply, None)

    def _prepare(self, early: float = 0.0) -> tuple[int, float, float, float] | None:
        """``(generation, scheduled, deadline, sent)`` when a renewal is due now, else None.

        A term past its deadline is lost here; one not yet due is put back.
        The lateness of the renewal about to be sent is recorded.
        """
        with self._cond:
            if self._closed or self._state != ACTIVE:
                return None
            now = time.monotonic()
            if now >= self._deadline:
                self._lose()
                return None
            generation = self._generation
            if now + early < self._next:
                self._renewer.schedule(self, min(self._next, self._deadline), generation)
                return None
            scheduled = self._next
            self._record_lateness(max(now - scheduled, 0.0))
            return generation, scheduled, self._deadline, now

    def _finish(
        self, generation: int, scheduled: float, sent: float, reply: Any, error: Exception | None
    ) -> None:
        """Apply one renewal's outcome, then schedule the next while the term goes on."""
        with self._cond:
            if self._apply(generation, scheduled, sent, reply, error):
                self._renewer.schedule(self, min(self._next, self._deadline), generation)

    def _after_fork_in_child(self) -> None:
        # The renewal thread does not exist in the child, and the lease is the
        # parent's: the child must never renew or release it.
        self._cond = threading.Condition()
        self._closed = True
        self._token = 0
        if self._state == ACTIVE:
            self._state = ENDED
        self._renew = self._on_close = None


_live_leases: weakref.WeakSet[Lease] = weakref.WeakSet()


class Renewer:
    """One Python thread that renews every ``Lease`` of its owner (an engine, a locker).

    Leases wait in a timer heap and the thread renews each when it falls
    due; those due together on one connection (the same ``batch``) go in one
    round trip (many in one script call: see ``batch``). Each lease keeps its
    own deadline, token and state machine. The thread starts with the first
    term and lives until ``stop()`` (the owner's close, or its collection).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, int, Lease]] = []
        self._seq = 0
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        _live_hosts.add(self)

    def stop(self, join_timeout: float | None = None) -> None:
        """Stop and join the thread (the engine is closed or gone). Idempotent.

        From the garbage collector the join is bounded (``join_timeout``): the
        collector may run on a thread holding what the renewer needs to finish.
        In a forked child (a finalizer may run before the fork handlers) it does
        nothing: the thread is the parent's.
        """
        if os.getpid() != self._pid:
            return
        with self._cond:
            self._stopped = True
            self._heap.clear()
            thread, self._thread = self._thread, None
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout)

    def schedule(self, keeper: Lease, when: float, generation: int) -> None:
        with self._cond:
            if self._stopped:
                raise RuntimeError("the renewer is stopped (its engine or locker was closed)")
            self._seq += 1
            heapq.heappush(self._heap, (when, self._seq, generation, keeper))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="redlease-renewer", daemon=True
                )
                self._thread.start()
            elif self._heap[0][3] is keeper:
                self._cond.notify()

    def _main(self) -> None:
        # Taken and renewed in methods of their own, and let go here: nothing of a
        # lease stays referenced while the thread waits (its engine would live on).
        while (taken := self._next_due()) is not None:
            self._renew(*taken)
            del taken

    def _next_due(self) -> tuple[int, Lease, list[Lease]] | None:
        """Wait for the next lease due: ``(generation, lease, batch)``; None once stopped."""
        with self._cond:
            while True:
                if self._stopped:
                    return None
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    break
                self._cond.wait(self._heap[0][0] - now if self._heap else None)
            _when, _seq, generation, keeper = heapq.heappop(self._heap)
            batch: list[Lease] = []
            if keeper.batch is not None and keeper._generation == generation:
                # Everything else due now on the same connection goes with it.
                batch.append(keeper)
                until = now + RENEW_BATCH_WINDOW
                while self._heap and self._heap[0][0] <= until and len(batch) < BATCH_MAX:
                    other = self._heap[0]
                    if other[3].batch != keeper.batch:
                        break
                    heapq.heappop(self._heap)
                    if other[3]._generation == other[2]:
                        batch.append(other[3])
            return generation, keeper, batch

    def _renew(self, generation: int, keeper: Lease, batch: list[Lease]) -> None:
        try:
            if batch:
                _tick_batch(batch)
            elif keeper._generation == generation:
                keeper._tick()
        except BaseException:  # this thread enforces the deadlines: no term outlives a failed tick
            victims: list[Lease] = [*batch] if batch else [keeper]
            for lost in victims:
                with lost._cond:
                    if lost._state == ACTIVE:
                        lost._lose()

    def _after_fork_in_child(self) -> None:
        self._cond = threading.Condition()
        self._heap = []
        self._thread = None


BATCH_MAX = 512


def _tick_batch(keepers: list[Lease]) -> None:
    """Renew ``keepers`` (all on one ``batch``) together: one round trip per server."""
    due: list[tuple[Lease, tuple[int, float, float, float]]] = []
    for keeper in keepers:
        prepared = keeper._prepare(RENEW_BATCH_WINDOW)
        if prepared is not None:
            due.append((keeper, prepared))
    if not due:
        return
    timeout = max(min(min(k._interval, d[2] - d[3]) for k, d in due), MIN_STEP)
    try:
        send = due[0][0].batch
        assert send is not None
        replies = send([k.command for k, _ in due], timeout)
    except Exception as exc:  # the connection failed: so did every renewal on it
        for keeper, (generation, scheduled, _deadline, sent) in due:
            keeper._finish(generation, scheduled, sent, None, exc)
        return
    for (keeper, (generation, scheduled, deadline, sent)), reply in zip(due, replies, strict=True):
        if isinstance(reply, NoScriptError):
            renew = keeper._renew
            try:
                if renew is None:
                    raise RuntimeError("keeper is closed")
                reply = renew(max(min(keeper._interval, deadline - time.monotonic()), MIN_STEP))
            except Exception as exc:
                keeper._finish(generation, scheduled, sent, None, exc)
                continue
        if isinstance(reply, Exception):
            keeper._finish(generation, scheduled, sent, None, reply)
        else:
            keeper._finish(generation, scheduled, sent, reply, None)


_live_hosts: weakref.WeakSet[Renewer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # No renewal thread exists in a forked child; the leases are the parent's.
    for host in list(_live_hosts):
        host._after_fork_in_child()
    for lease in list(_live_leases):
        lease._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
