"""The run loop: contend, lead, drain, done — as steps, driven or on the caller's thread.

``RunLoop`` steps one ``Election``'s run: the process's driver steps every
started run (``start()``), and ``run_here`` steps a run on the calling thread
(``Elector.run()``). It reads top to bottom like client-go's leaderelection:
``_contend_step`` (one acquire per step, backoff on errors), ``_begin`` (a
term starts, the leader function gets its thread), ``_hold_reason`` (why a
term ends), ``_end_term`` and ``_after_term`` (release, observer), ``_finish``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .._engine import (
    ACTIVE,
    BATCH,
    NOTICE_CATCH_UP,
    Engine,
    Keeper,
    NoticeSubscription,
    driver,
    execute_batch,
)
from .._log import Events
from .election import Election, LeaderFn, Run, instance_text
from .term import Reason, Term, end_term

# How often a waiting run thread looks at a caller's stop event: a plain
# threading.Event cannot wake anybody, so it is polled at this period.
_STOP_POLL = 0.05


def run_here(election: Election, run: Run, fn: LeaderFn | None) -> None:
    """Run the loop on this thread until ``run`` ends; its error lands in ``run.error``."""
    # The engine's listener: on the native engine a native thread wakes
    # the keeper's eventfd, which the follower sleeps on without the GIL,
    # and the notice itself is delivered here, on the run thread.
    notices = election.engine.notices(election.client).listen(
        election.keys.leader, run.notice, signal=run.keeper
    )
    run.notices = notices
    loop = RunLoop(election, run, fn, driven=False)
    loop.notices = notices
    loop.run_here()


UNSENT: Any = object()
"""``RunLoop.finish_held``'s reply when no release was sent for it: it sends its own."""


class RunLoop:
    """One run's loop, as steps: contend (one acquire per step), lead, drain, done.

    Driven (``start()``): the process's driver steps it — contending is a
    timer, leading a watch on the keeper — and ``stop()`` from another
    thread ends the run right there, on that thread, once any step in
    progress is done; with a leader function it asks the driver and waits,
    as the function must return first. Not driven (``Elector.run()``):
    ``run_here()`` steps it on the calling thread, which waits between steps
    on the keeper (woken by a renewal's news, a notice, a stop, the leader
    function's return).
    """

    CONTEND, LEAD, DRAIN, DONE = range(4)

    __slots__ = (
        "busy",
        "catch_up",
        "driven",
        "election",
        "errors_in_row",
        "fn",
        "follower",
        "keeper",
        "not_before",
        "notices",
        "on_done",
        "phase",
        "prefetched",
        "reason",
        "run",
        "token",
        "worker",
    )

    def __init__(
        self,
        election: Election,
        run: Run,
        fn: LeaderFn | None,
        on_done: Callable[[], object] | None = None,
        *,
        driven: bool = True,
    ) -> None:
        self.election = election
        self.run = run
        self.fn = fn
        self.driven = driven
        # Called (on whichever thread ends the run) once the run is over.
        self.on_done = on_done
        self.keeper = run.keeper
        self.busy = threading.Lock()
        self.phase = self.CONTEND
        self.errors_in_row = 0
        self.follower = False
        self.token = 0
        self.reason: Reason = "stopped"
        self.worker: _LeaderThread | None = None
        # The next acquire's time (a poll, a backoff, the rest after a term):
        # an early step (a poke, a sweep) waits for it unless a release
        # notice arrived meanwhile.
        self.not_before = 0.0
        # After a run's first listen: when its next acquire is due, while the
        # step at ``not_before`` is the catch-up read (0.0: none pending).
        self.catch_up = 0.0
        # An acquire the driver sent for this run with others' (reply, send
        # time), for the next contend step to use instead of a round trip.
        self.prefetched: tuple[Any, float] | None = None
        self.notices: NoticeSubscription | None = None
        if driven:
            run.driven = self

    def start(self) -> None:
        # Not listening yet: a run listens once an acquire finds the lease
        # held (see ``_contend_step``), so thousands started on fresh names, which
        # win at once, never subscribe and unsubscribe.
        driver().poke(self)

    def _listen(self) -> bool:
        """Listen for release notices (True), or say why not and poll (False)."""
        election = self.election
        try:
            # The engine's listener, on the connection the process's other
            # waiters share: each notice pokes this run on the driver thread
            # (native: the reader rings the driver's doorbell without the GIL).
            self.notices = election.engine.notices(election.client).listen(
                election.keys.leader, self.run.notice, driven=True
            )
        except Exception as exc:  # never the run's end: it polls instead
            election.events.debug(f"listens for no release notices: {exc!r}")
            return False
        return True

    def poke(self) -> None:
        if self.driven:
            driver().poke(self)
        else:
            self.keeper.notify()  # the run's own thread waits on the keeper

    def run_here(self) -> None:
        """Step the run on the calling thread until it ends (``Elector.run()``)."""
        run, keeper = self.run, self.keeper
        try:
            while self.phase != self.DONE:
                run.notices.deliver()
                when = self.step()  # keeps this thread among the run's own (not driven)
                if self.phase == self.DONE:
                    break
                if when is None:
                    # Leading, or waiting for the leader function to return.
                    keeper.wait(_STOP_POLL)
                    continue
                # A poll, a backoff or the rest after a term, cut short by a
                # release notice or a stop.
                while True:
                    run.notices.deliver()
                    left = when - time.monotonic()
                    if run.should_stop() or run.noticed or left <= 0:
                        break
                    keeper.wait(min(left, _STOP_POLL))
        except BaseException as exc:
            # An interrupt between steps: the run ends here, as a stop would.
            run.error = exc
            with self.busy:
                self._finish()

    # -- steps (on the driver thread) ---------------------------------------------------

    def step(self) -> float | None:
        if not self.busy.acquire(blocking=False):
            return None  # stop() is ending the run on another thread
        try:
            thread = threading.current_thread()
            self.run.own_threads.add(thread)
            try:
                return self._step()
            except BaseException as exc:
                self.run.error = exc
                self._finish()
                return None
            finally:
                if self.driven:
                    self.run.own_threads.discard(thread)
        finally:
            self.busy.release()

    def check(self) -> bool:
        """The watch: the keeper reported something while leading (True: watch no more)."""
        when = self.step()
        if when is not None:
            driver().schedule(self, when)
        return self.phase in (self.CONTEND, self.DONE)

    def _step(self) -> float | None:
        if self.phase == self.DONE:
            return None
        if self.phase == self.CONTEND:
            return self._contend_step()
        if self.phase == self.LEAD:
            reason = self._hold_reason()
            if reason is None:
                return None
            self._end_term(reason)
        if self.phase == self.DRAIN:
            worker = self.worker
            if worker is not None and not worker.finished:
                return None
            self._after_term()
            if self.run.error is not None or self.run.should_stop():
                self._finish()
                return None
            self.not_before = time.monotonic() + self.election.jittered(
                self.election.config.acquire_interval
            )
            return self.not_before
        return None

    def _contend_step(self) -> float | None:
        election, run, cfg = self.election, self.run, self.election.config
        if run.should_stop():
            self._finish()
            return None
        if not run.noticed and time.monotonic() < self.not_before:
            return self.not_before
        catch_up, self.catch_up = self.catch_up, 0.0
        if catch_up and not run.noticed and not self._lease_gone():
            # Still held: the acquire keeps its cadence.
            self.not_before = catch_up
            return catch_up
        run.noticed, run.resting = False, False
        released_by, run.released_by = run.released_by, None
        if released_by is not None:
            # A holder seen only through its release notice still led meanwhile.
            election.observe(run, instance_text(released_by))
        sent = time.monotonic()
        prefetched, self.prefetched = self.prefetched, None
        try:
            if prefetched is None:
                token, pttl_ms, holder = election.acquire()
            else:
                reply, sent = prefetched
                if isinstance(reply, Exception):
                    raise reply
                token, pttl_ms, holder = election.acquired(reply)
        except Exception as exc:
            election.report(exc)
            self.errors_in_row += 1
            backoff: float = min(cfg.acquire_interval * 2**self.errors_in_row, cfg.ttl)
            self.not_before = sent + backoff
            return self.not_before
        self.errors_in_row = 0
        election.events.ok()
        election.observe(run, holder)
        if token == 0:
            if not self.follower:
                self.follower = True
                election.emit(election.observer.on_follower)
            now = time.monotonic()
            poll = election.poll_delay(pttl_ms)
            if self.driven and self.notices is None and self._listen() and poll > NOTICE_CATCH_UP:
                # The first time this run follows: it listens from now on, and
                # looks again soon, for a release it could not hear yet. That
                # look is a read: the next acquire keeps its poll interval
                # unless the read finds the lease gone (``_lease_gone``).
                self.catch_up = now + poll
                self.not_before = now + NOTICE_CATCH_UP
                return self.not_before
            if self.notices is not None and self.notices.refused:
                # An ACL user without the channel: this follower polls.
                election.refusals.subscribe_refused(election.keys.leader)
            self.not_before = now + poll
            return self.not_before
        self.follower = False
        self._begin(token, sent)
        return None

    def _lease_gone(self) -> bool:
        """The catch-up look: one read of the lease, True when nobody holds it now.

        A read, not an acquire: a follower's acquires stay at least 0.9 x
        ``acquire_interval`` apart, and only a lease seen gone (as a
        release notice would say) is acquired sooner. A read that fails
        says "held": the acquire at its time reports whatever is wrong.
        """
        election = self.election
        try:
            return election.lease_holder() is None
        except Exception as exc:
            election.events.debug(f"the catch-up read of the lease failed: {exc!r}")
            return False

    # -- the driver's batched acquires (``_engine.driver.Contender``) --------------------------

    def hold_acquire(self) -> tuple[object, Engine, Any] | None:
        """The acquire this run's next step would send now, the run held; or None."""
        if not self.busy.acquire(blocking=False):
            return None  # a step or a stop is under way
        run, election = self.run, self.election
        route = None
        if (
            self.phase == self.CONTEND
            and self.prefetched is None
            and not run.should_stop()
            and (run.noticed or (not self.catch_up and time.monotonic() >= self.not_before))
        ):
            route = election.batch_route()
        if route is None:
            self.busy.release()
            return None
        return route, election.engine, election.acquire_request()

    def prefetch(self, reply: Any, sent: float) -> None:
        # Redirected in its batch, the acquire did not run: the step sends it alone.
        if not self.election.rerouted(reply):
            self.prefetched = (reply, sent)
        self.busy.release()

    def unhold(self) -> None:
        self.busy.release()

    def _begin(self, token: int, acquired_at: float) -> None:
        election, run, keeper = self.election, self.run, self.keeper
        run.resign_requested = False
        run.acquired_at = acquired_at
        keeper.begin(token, acquired_at)
        term = Term(token)
        run.term = term
        self.token = token
        self.phase = self.LEAD
        election.events.elected(token)
        election.emit(election.observer.on_elected, token)
        if self.fn is not None:
            worker = _LeaderThread(
                self.fn, term, election.make_fencer(token), keeper, self.poke, election.events
            )
            self.worker = worker
            run.own_threads.add(worker.thread)
            worker.thread.start()
        if self.phase == self.LEAD and self.driven:
            driver().watch(self)
            # A leader has no use for release notices (the lease is its own),
            # and a started run's stop then releases with nobody of this
            # process listening: no notice to read per stop. The run listens
            # again as its term ends (``_end_term``).
            notices, self.notices = self.notices, None
            if notices is not None:
                notices.cancel()

    def _hold_reason(self) -> Reason | None:
        """Why the running term ends now, or None while it holds."""
        run, worker = self.run, self.worker
        self.election.drain(run.keeper)
        if run.keeper.state != ACTIVE:
            return "lost"
        if worker is not None and worker.finished:
            return "returned"
        if run.resign_requested:
            return "resigned"
        if run.should_stop():
            return "stopped"
        return None

    def _end_term(self, reason: Reason) -> None:
        # Rest from here, and listen again (a started run stops listening
        # while it leads), before the release: a successor that takes the
        # lease and gives it back at once must still find this run listening.
        run = self.run
        run.noticed, run.released_by, run.resting = False, None, True
        if self.driven and self.notices is None and not run.should_stop():
            self._listen()
        self.keeper.end()
        self.reason = reason
        self.phase = self.DRAIN
        term = self.run.term
        if term is not None:
            end_term(term, reason)

    def _after_term(self) -> None:
        if self._drain_term():
            self.election.release()
        self._term_over()

    def _drain_term(self) -> bool:
        """The ended term's worker joined and its events read; True when a release is due."""
        election, run, worker = self.election, self.run, self.worker
        election.drain(self.keeper)
        if worker is not None:
            worker.join()
            run.own_threads.discard(worker.thread)
            self.worker = None
            if worker.error is not None:
                run.error = worker.error
        return self.reason != "lost"

    def _term_over(self) -> None:
        """After the release (or a lost lease): the term is over, the run contends."""
        election = self.election
        self.run.term = None
        election.events.stepped_down(self.token, self.reason)
        election.emit(election.observer.on_stepped_down)
        self.token = 0
        self.phase = self.CONTEND

    def _finish(self) -> None:
        if self.phase == self.DONE:
            return
        if self._wind_down():
            self.election.release()
        self._close()

    def _wind_down(self) -> bool:
        """The run's end up to its release; True when a release is due (``_close`` follows it)."""
        election = self.election
        # Unsubscribed before the release: the run's own notice is no news,
        # and thousands of runs stopping together should not flood the listener.
        if self.notices is not None:
            self.notices.cancel()
            self.notices = None
        prefetched, self.prefetched = self.prefetched, None
        if (
            prefetched is not None
            and self.phase == self.CONTEND
            and not isinstance(prefetched[0], Exception)
        ):
            # A batched acquire this run had not read yet: a term it won is
            # begun and ended like any other, so every token is a term.
            token = 0
            with contextlib.suppress(Exception):
                token = election.acquired(prefetched[0])[0]
            if token > 0:
                self._begin(token, prefetched[1])
        if self.phase == self.LEAD:
            self._end_term("stopped")
        return self.phase == self.DRAIN and self._drain_term()

    def _close(self) -> None:
        """The run's end after its release: the term over, the keeper closed, the run done."""
        election, run = self.election, self.run
        if self.phase == self.DRAIN:
            self._term_over()
        self.phase = self.DONE
        if self.driven:
            driver().forget(self)
        run.keeper.close()
        election.events.keeper_closed(run.keeper)
        with election.mutex:
            if election.run is run:
                election.run = None
        self._done()

    def _done(self) -> None:
        self.run.done.set()
        on_done = self.on_done
        if on_done is not None:
            self.on_done = None
            on_done()

    # -- stop (on the caller's thread) ---------------------------------------------------

    def stop(self, timeout: float | None) -> None:
        # Without a leader function, nothing to wait for but a step in
        # progress: the run ends here, without a hand-over to the driver
        # thread and back.
        if self.hold_stopped(timeout):
            self.finish_held(UNSENT)

    # -- a batched stop (``stop_all``, on the caller's thread) ----------------------------

    def hold_stopped(self, timeout: float | None, *, ask_first: bool = True) -> bool:
        """Ask the run to end; True when it is now held here, wound down to its release.

        Only a run without a leader function can be held (one with a function
        ends when that returns, on the driver). A held run's release is due
        when ``release_due`` says so; ``finish_held`` ends it. False: the run
        was asked to end, and ends on its own (or had ended).

        ``ask_first``: the run is asked to end before it is waited for, so a
        step in progress ends it (and releases) at once; without, that step
        runs its course and the run ends here (a batched stop's release).
        """
        run = self.run
        if ask_first:
            run.stopping.set()
        if self.fn is None and self.busy.acquire(
            timeout=-1 if timeout is None else max(timeout, 0)
        ):
            run.stopping.set()
            if self.phase == self.DONE:
                self.busy.release()
                return False
            run.own_threads.add(threading.current_thread())
            try:
                self._wind_down()
            except BaseException as exc:
                self._failed(exc)
                return False
            return True
        run.request_stop()
        return False

    @property
    def release_due(self) -> bool:
        """A held run's term ended without losing the lease: it is to be given back."""
        return self.phase == self.DRAIN and self.reason != "lost"

    def finish_held(self, reply: Any) -> None:
        """End a held run, given its release's reply (the exception in its place; or
        ``UNSENT``: the release is sent here)."""
        try:
            if self.release_due:
                if reply is UNSENT:
                    self.election.release()
                else:
                    self.election.after_release(reply)
            self._close()
        except BaseException as exc:
            self._failed(exc)
            return
        self._let_go()

    def _failed(self, exc: BaseException) -> None:
        self.run.error = exc
        self.phase = self.DONE
        self._done()
        self._let_go()

    def _let_go(self) -> None:
        self.run.own_threads.discard(threading.current_thread())
        self.busy.release()


def end_together(loops: Iterable[RunLoop], deadline: float | None) -> None:
    """Stop every run of ``loops`` as ``RunLoop.stop`` would, their releases sharing
    round trips: a batch of at most ``BATCH`` per engine (per engine and node
    on a cluster: ``Election.batch_route``).

    Each run is held from the moment its term winds down to its release's
    reply, as a lone stop holds it. A run that cannot share a batch (a leader
    function still running, the replication guard) is asked to end and ends
    on its own, or releases alone; so does a release its batch's node
    redirected (it did not run).
    """
    groups: dict[object, list[RunLoop]] = {}

    def flush(group: list[RunLoop]) -> None:
        held, replies = list(group), []
        group.clear()
        try:
            engine = held[0].election.engine
            replies = execute_batch(engine, [loop.election.release_request() for loop in held])
        finally:
            # Every held run ends here, whatever happened to the batch.
            unsent = RuntimeError("the batched release was cut short: its outcome is unknown")
            for i, loop in enumerate(held):
                reply = replies[i] if i < len(replies) else unsent
                loop.finish_held(UNSENT if loop.election.rerouted(reply) else reply)

    try:
        for loop in loops:
            left = None if deadline is None else deadline - time.monotonic()
            if not loop.hold_stopped(left, ask_first=False):
                continue
            route = loop.election.batch_route() if loop.release_due else None
            if route is None:
                loop.finish_held(UNSENT)
                continue
            group = groups.setdefault(route, [])
            group.append(loop)
            if len(group) >= BATCH:
                flush(group)
    finally:
        for group in groups.values():
            if group:
                flush(group)


class _LeaderThread:
    """The leader function on a thread of its own; wakes the run when fn returns."""

    def __init__(
        self,
        fn: LeaderFn,
        term: Term,
        fencer: Any,
        keeper: Keeper,
        on_finish: Callable[[], None] | None,
        events: Events,
    ) -> None:
        self.error: BaseException | None = None
        self._events = events
        self._on_finish = on_finish
        self.finished = False
        self._fn = fn
        self._term = term
        self._fencer = fencer
        self._keeper = keeper
        self.thread = threading.Thread(
            target=self._main, name=f"redlease-leader-{term.token}", daemon=True
        )

    def _main(self) -> None:
        try:
            with self._events.leading():  # e.g. the term's span current here
                self._fn(self._term, self._fencer)
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished = True
            self._keeper.notify()
            if self._on_finish is not None:
                self._on_finish()

    def join(self) -> None:
        self.thread.join()
