"""What an elector or a lock watchdog has to say: the ``"redlease"`` logger, and metrics.

One ``Events`` per Elector (and per RedisLocker, with one child per held
lock) is the single place the run loop, the fence and the lock watchdog
report to. It logs politely — one record per state change, never one per
retry — and passes each event on to the sinks ``redlease.metrics`` attached
(none unless the target was instrumented, so an uninstrumented elector pays
for an empty loop), then to the process's sinks (``PROCESS_SINKS``: what
``redlease.otel.instrument()`` installs for every target, made before or
after). Fenced writes are the metrics sinks' only: the process's sinks see
none of them here (``redlease.otel`` wraps the writes themselves), so the
fenced-write path stays one falsy check while nothing is attached.

Levels: INFO when a term starts or ends and when an outage is over; WARNING
when an outage starts (the first handled error of a streak) and, while it
lasts, "still failing" at most every ``STILL_FAILING_EVERY`` seconds; DEBUG
for everything else (each further error, follower, lock acquired/released).
The library never adds a handler but the ``NullHandler`` and never sets a level.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

logger = logging.getLogger("redlease")


def _as_is(exc: BaseException) -> BaseException:
    """The default ``Events.adopt``: a redis-py client's errors are already its family's."""
    return exc
logger.addHandler(logging.NullHandler())

STILL_FAILING_EVERY = 10.0
"""Seconds between "still failing" records while one outage lasts."""


class Sink(Protocol):
    """What ``Events`` passes on (``redlease.metrics`` implements it)."""

    def elected(self, token: int) -> None: ...

    def stepped_down(self, token: int, reason: str) -> None: ...

    def error(self, exc: BaseException) -> None: ...

    def fenced(self, applied: bool) -> None: ...

    def keeper_opened(self, keeper: Any) -> None: ...

    def keeper_closed(self, keeper: Any) -> None: ...


class ProcessSink(Protocol):
    """What every ``Events`` of the process passes on once installed (``redlease.otel``).

    Each call names the ``Events`` it comes from: one sink serves every target.
    """

    def elected(self, events: Events, token: int) -> None: ...

    def stepped_down(self, events: Events, token: int, reason: str) -> None: ...

    def acquired(self, events: Events, token: int) -> None: ...

    def released(self, events: Events, token: int, reason: str) -> None: ...

    def waited(self, events: Events, lock: str, began: float, granted: bool) -> None: ...

    def error(self, events: Events, exc: BaseException) -> None: ...

    def keeper_opened(self, events: Events, keeper: Any) -> None: ...

    def keeper_closed(self, events: Events, keeper: Any) -> None: ...

    def leading(self, events: Events) -> contextlib.AbstractContextManager[object]: ...

    def tenure_began(self, events: Events) -> None: ...

    def tenure_ended(self, events: Events, reason: str) -> None: ...


PROCESS_SINKS: list[ProcessSink] = []
"""The sinks every ``Events`` of the process reports to (empty unless ``redlease.otel``
instrumented the process). Changed in place only, so each ``Events`` sees it at once."""

_NOTHING = contextlib.nullcontext()


# One lock for every Events: it guards a few fields for a moment, on an
# error or a lost lock, and 100,000 electors should not cost a lock each.
# New in a forked child (a parent's thread may have held it).
_EVENTS = threading.Lock()


def _new_lock_after_fork() -> None:
    global _EVENTS
    _EVENTS = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


class Events:
    """One elector's (or lock's) reports: logged here, then handed to the sinks.

    ``what`` says who speaks ("elector", "lock"); ``name`` is the elector's
    name or the lock's; ``engine`` the engine's name and ``client`` the
    client it talks to (None for a store in memory), for what a process sink
    says of the target; ``parent`` the locker's ``Events`` for one of its
    locks; ``trace`` is a process sink's own record of the target (its open
    span). Thread-safe: the run thread, a leader function's writes and a
    lock's watchdog all report here.
    """

    __slots__ = (
        "_ended",
        "_failing_since",
        "_failures",
        "_renewals",
        "_said_at",
        "_token",
        "adopt",
        "client",
        "engine",
        "instance",
        "name",
        "parent",
        "sinks",
        "trace",
        "what",
    )

    def __init__(
        self,
        what: str,
        name: str,
        instance: str = "",
        sinks: list[Sink] | None = None,
        adopt: Callable[[BaseException], object] | None = None,
        *,
        engine: str = "",
        client: Any = None,
        parent: Events | None = None,
    ):
        self.what = what
        self.name = name
        self.instance = instance
        self.engine = engine
        self.client = client
        self.parent = parent
        self.trace: Any = None
        # Shared with children (a locker's locks), so instrumenting the
        # locker reaches the locks it grants later. Until something is
        # attached, the empty tuple every Events shares (see ``attach``).
        self.sinks: list[Sink] | tuple[()] = sinks if sinks is not None else ()
        # Makes an error one of the user's client family (see ``_engine.clientfamily``), in place.
        self.adopt: Callable[[BaseException], object] = adopt or _as_is
        self._failing_since = 0.0  # 0: no outage going on
        self._failures = 0
        self._said_at = 0.0
        self._renewals = -1
        self._token = 0
        self._ended = False

    def attach(self, sink: Sink) -> None:
        """Pass every later event on to ``sink`` too (and, through children made after, theirs)."""
        if isinstance(self.sinks, list):
            self.sinks.append(sink)
        else:
            self.sinks = [sink]

    def child(self, what: str, name: str) -> Events:
        """Events for a part of this target (one lock of a locker), feeding the same sinks."""
        sinks = self.sinks
        if not isinstance(sinks, list):
            sinks = self.sinks = []  # shared from now on: a sink attached later reaches both
        return Events(
            what,
            name,
            self.instance,
            sinks,
            self.adopt,
            engine=self.engine,
            client=self.client,
            parent=self,
        )

    # -- terms ------------------------------------------------------------------

    def elected(self, token: int) -> None:
        logger.info(
            "%s %r elected: instance %s, token %d", self.what, self.name, self.instance, token
        )
        for sink in self.sinks:
            sink.elected(token)
        for process_sink in PROCESS_SINKS:
            process_sink.elected(self, token)

    def stepped_down(self, token: int, reason: str) -> None:
        logger.info("%s %r stepped down: token %d, %s", self.what, self.name, token, reason)
        for sink in self.sinks:
            sink.stepped_down(token, reason)
        for process_sink in PROCESS_SINKS:
            process_sink.stepped_down(self, token, reason)

    def leading(self) -> contextlib.AbstractContextManager[object]:
        """Where a leader function runs its term: within each process sink's context for it
        (``redlease.otel``: the term's span made current), or nothing."""
        if not PROCESS_SINKS:
            return _NOTHING
        stack = contextlib.ExitStack()
        for process_sink in PROCESS_SINKS:
            stack.enter_context(process_sink.leading(self))
        return stack

    def acquired(self, token: int) -> None:
        """A lock was granted (DEBUG: locks come and go by the thousand)."""
        self._token = token
        logger.debug("%s %r acquired: fencing token %d", self.what, self.name, token)
        for sink in self.sinks:
            sink.elected(token)
        for process_sink in PROCESS_SINKS:
            process_sink.acquired(self, token)

    def released(self, reason: str) -> None:
        """The acquired lock ended: "released", or "lost" when its lease was found gone.

        Once per lock: the watchdog and ``release()`` may both find the loss.
        """
        with _EVENTS:
            if self._ended:
                return
            self._ended = True
        # A lost lock is a handled failure, worth a WARNING; a release is routine.
        level = logging.WARNING if reason == "lost" else logging.DEBUG
        logger.log(level, "%s %r %s: fencing token %d", self.what, self.name, reason, self._token)
        for sink in self.sinks:
            sink.stepped_down(self._token, reason)
        for process_sink in PROCESS_SINKS:
            process_sink.released(self, self._token, reason)

    def waited(self, lock: str, began: float, granted: bool) -> None:
        """One acquire of ``lock`` begun at ``began`` (``time.monotonic()``) ended now,
        ``granted`` or not (a locker's; the process's sinks only: metrics read ``WaitStats``)."""
        for process_sink in PROCESS_SINKS:
            process_sink.waited(self, lock, began, granted)

    def tenure_began(self) -> None:
        """A partition group member began a tenure (the process's sinks only: metrics read
        ``GroupStats``, and the member logs its tenures itself, a round at a time)."""
        for process_sink in PROCESS_SINKS:
            process_sink.tenure_began(self)

    def tenure_ended(self, reason: str) -> None:
        """A member's tenure ended: ``rebalanced``, ``lost`` or ``stopped``."""
        for process_sink in PROCESS_SINKS:
            process_sink.tenure_ended(self, reason)

    def debug(self, text: str) -> None:
        logger.debug("%s %r %s", self.what, self.name, text)

    # -- errors: one record per outage ----------------------------------------------

    def error(self, exc: BaseException) -> None:
        """An error the elector or a watchdog handled itself (retried, backed off, stepped down).

        The error is first made one of the user's client family, in place:
        whoever sees it next (``on_error``, a metric, the log) sees that.
        """
        self.adopt(exc)
        now = time.monotonic()
        with _EVENTS:
            self._failures += 1
            if not self._failing_since:
                self._failing_since = self._said_at = now
                level, text = logging.WARNING, "failing"
            elif now - self._said_at >= STILL_FAILING_EVERY:
                self._said_at = now
                level, text = logging.WARNING, "still failing"
            else:
                level, text = logging.DEBUG, "failed again"
            failures, since = self._failures, now - self._failing_since
        logger.log(
            level,
            "%s %r %s (%d errors in %.1f s, handled and retried): %s: %s",
            self.what,
            self.name,
            text,
            failures,
            since,
            type(exc).__name__,
            exc,
        )
        for sink in self.sinks:
            sink.error(exc)
        for process_sink in PROCESS_SINKS:
            process_sink.error(self, exc)

    def ok(self) -> None:
        """A round trip succeeded: ends the outage, if one was going on."""
        if not self._failing_since:  # the common case, without the lock
            return
        now = time.monotonic()
        with _EVENTS:
            if not self._failing_since:
                return
            failures, since = self._failures, now - self._failing_since
            self._failing_since = 0.0
            self._failures = 0
        logger.info(
            "%s %r recovered after %d errors in %.1f s", self.what, self.name, failures, since
        )

    def drain(self, keeper: Any) -> list[Exception]:
        """A keeper's renewal errors since the last call, for the caller to ``error()`` each.

        A good renewal since the last call (and no error) is ``ok()``.
        """
        errors: list[Exception] = keeper.pop_errors()
        renewals: int = keeper.renewals
        if renewals != self._renewals:
            if self._renewals >= 0 and not errors:
                self.ok()
            self._renewals = renewals
        return errors

    def failing(self) -> bool:
        """Whether an outage is going on (a watchdog then looks back for the recovery)."""
        return bool(self._failing_since)

    # -- fenced writes and keepers (metrics only) ----------------------------------------

    def fenced(self, applied: bool) -> None:
        for sink in self.sinks:
            sink.fenced(applied)

    def keeper_opened(self, keeper: Any) -> None:
        for sink in self.sinks:
            sink.keeper_opened(keeper)
        for process_sink in PROCESS_SINKS:
            process_sink.keeper_opened(self, keeper)

    def keeper_closed(self, keeper: Any) -> None:
        for sink in self.sinks:
            sink.keeper_closed(keeper)
        for process_sink in PROCESS_SINKS:
            process_sink.keeper_closed(self, keeper)
