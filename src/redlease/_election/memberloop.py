"""A member's run, driven: its steps on the process's driver, its callbacks on a thread of its own.

``MemberLoop`` is what the process's driver (``_engine.driver``) steps for
one started ``Member``, as it steps an election's run: each step is one look
at the group (``Member.step``), or, before the next look is due, a check of
what the member holds; the step says when the next one is due (the next
poll, a backoff, the moment a lease stops being proven). A notice, a stop,
a fenced write answered READONLY poke it; the heartbeat is watched, so its
loss is a step at once. A member without callbacks has no thread at all.

A member with callbacks (``on_assigned``, ``on_revoked``, an observer's
``on_error``) has one ``CallbackThread``: each callback is queued there and
runs in order, never on the driver (a slow one stalls this member's
callbacks and nobody else's) and never on the caller's thread. A hand-over
runs there whole: ``on_revoked``, then the release, so a partition is let
go only after its callback returned; until it is done the member takes and
hands over nothing more. The end of the run (``Member.leave``: revoke,
release, leave) runs there too, after every callback queued before it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .._engine import ACTIVE, NoticeSubscription, driver
from . import election
from .sharewatch import ShareWatch

_SOON = 0.005
"""The least wait between two steps of one member (seconds)."""


class Member(Protocol):
    """What the loop steps: ``member.Member``'s side of it."""

    heartbeat: Any
    notices: NoticeSubscription
    noticed: bool
    stopping: bool
    pending: list[Exception]
    poll: float
    share: ShareWatch

    def step(self) -> float:
        """One look at the group; when the next is due."""
        ...

    def check_held(self) -> None: ...

    def first_end(self) -> float: ...

    def backoff(self) -> float: ...

    def report(self, exc: Exception) -> None: ...

    def leave(self) -> None: ...

    def loop_ended(self, loop: MemberLoop) -> None:
        """``loop``'s run is over: the member can start again."""
        ...


class CallbackThread:
    """One thread that runs a member's jobs (callbacks, hand-overs, its end) in order."""

    __slots__ = ("_closed", "_cond", "_jobs", "thread")

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._jobs: deque[Callable[[], object]] = deque()
        self._closed = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def run(self, job: Callable[[], object]) -> None:
        """Run ``job`` after every job queued before it (at once when called from a job)."""
        if threading.current_thread() is self.thread:
            job()
            return
        with self._cond:
            if self._closed:
                return  # the run is over: nothing of it runs any more
            self._jobs.append(job)
            self._cond.notify()

    def close(self) -> None:
        """The thread ends after the job it runs (or at once when idle); later jobs are dropped."""
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify()

    def _main(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._closed:
                    self._cond.wait()
                if self._closed and not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                job()
            except BaseException:  # a job's own errors are told where they happen
                logging.getLogger("redlease").warning("a member's job failed", exc_info=True)


class MemberLoop:
    """One started member, as the driver steps it (see the module doc). Made per ``start()``."""

    __slots__ = (
        "__weakref__",
        "born",
        "busy",
        "done",
        "ended",
        "ending",
        "joined",
        "keeper",
        "member",
        "until",
        "worker",
    )

    def __init__(self, member: Member, name: str, callbacks: bool) -> None:
        self.member = member
        self.born = election.generation()  # a forked child's copy is no run (``Member.loop``)
        # Held by a step, and by the run's end: one of them at a time.
        self.busy = threading.Lock()
        self.done = threading.Event()
        self.ended = False
        self.ending = False  # the end is queued on the callback thread
        self.joined = False  # the heartbeat held after the last look: its loss is news
        self.until = 0.0  # when the next look at the group is due
        self.keeper: Any = None  # the heartbeat, watched (set by ``start``)
        self.worker = (
            CallbackThread(f"redlease-partitions-{name}") if callbacks else None
        )

    def start(self, heartbeat: Any) -> None:
        self.keeper = heartbeat
        if self.worker is not None:
            self.worker.thread.start()
        drv = driver()
        drv.watch(self)
        drv.poke(self)

    def abandon(self) -> None:
        """A start that failed: nothing of the run is left (the member cleans up the rest)."""
        self.ended = True
        if self.worker is not None:
            self.worker.close()
        self.done.set()

    def later(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the callback thread, in order; at once without one."""
        worker = self.worker
        if worker is None:
            job()
        else:
            worker.run(job)

    @property
    def over(self) -> bool:
        """Ended, or a forked child's copy of the parent's run (which must never act)."""
        return self.ended or self.born != election.generation()

    def poke(self) -> None:
        if not self.over:
            driver().poke(self)

    # -- on the driver thread -----------------------------------------------------------------

    def check(self) -> bool:
        """The heartbeat's keeper reported something: a loss is a look at once."""
        if self.over:
            return True
        if self.joined and self.keeper.state != ACTIVE:
            driver().poke(self)
        return False

    def step(self) -> float | None:
        if not self.busy.acquire(blocking=False):
            return None  # the run is ending on another thread
        try:
            return self._step()
        except BaseException as exc:  # never the driver's end: the member looks again later
            member = self.member
            if isinstance(exc, Exception):
                member.report(exc)
            else:
                logging.getLogger("redlease").warning("a member's step failed", exc_info=True)
            self.until = member.backoff()
            return self.until
        finally:
            self.busy.release()

    def _step(self) -> float | None:
        member = self.member
        if self.over:
            return None
        if member.stopping:
            self._end()
            return None
        pending, member.pending = member.pending, []
        for exc in pending:
            member.report(exc)
        heartbeat = member.heartbeat
        assert heartbeat is not None  # kept until the run's end
        member.notices.deliver()
        now = time.monotonic()
        if member.noticed or now >= self.until or (self.joined and heartbeat.state != ACTIVE):
            try:
                self.until = member.step()
            except Exception as exc:  # never the run's end: the leases are still ours
                member.report(exc)
                self.until = member.backoff()
            self.joined = heartbeat.state == ACTIVE
        else:
            # Before the next look: a lease that stops being proven is reported now.
            member.check_held()
        now = time.monotonic()
        return max(min(self.until, now + member.poll, member.first_end()), now + _SOON)

    def _end(self) -> None:
        """Stopping, ``busy`` held: the end, here or queued after every callback."""
        if self.worker is None:
            self.finish()
        elif not self.ending:
            self.ending = True
            self.worker.run(self._end_there)

    def _end_there(self) -> None:
        with self.busy:
            if not self.ended:
                self.finish()

    def finish(self) -> None:
        """The run's end, ``busy`` held: revoke, release and leave (``Member.leave``)."""
        member = self.member
        self.ended = True
        driver().forget(self)
        try:
            member.share.stopped()
            member.leave()
        finally:
            member.loop_ended(self)
            if self.worker is not None:
                self.worker.close()
            self.done.set()

    # -- stop (on the caller's thread) ------------------------------------------------------

    def stop(self, timeout: float | None) -> None:
        """Wait for the run's end (asked for already), at most ``timeout`` seconds.

        Without callbacks the end runs here once a step in progress is done.
        With them it runs on the callback thread after the callbacks queued
        before it; from a callback this returns at once (the run ends when it
        returns).
        """
        worker = self.worker
        if worker is not None and threading.current_thread() is worker.thread:
            return
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        wait = -1 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not self.busy.acquire(timeout=wait):
            return  # a step is in a call: it ends the run once it is back (stopping is set)
        try:
            if not self.ended:
                self._end()
        finally:
            self.busy.release()
        if worker is not None and self.done.wait(
            None if deadline is None else max(deadline - time.monotonic(), 0.0)
        ):
            # Over: its thread is at its end too (no thread left behind by a stopped member).
            worker.thread.join(None if deadline is None else max(deadline - time.monotonic(), 0.0))
