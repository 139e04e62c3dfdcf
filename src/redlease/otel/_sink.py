"""The process sink of ``redlease.otel``: every target's events as spans and instruments.

One ``Sink`` is installed in ``_log.PROCESS_SINKS`` by ``instrument()``; each
``Events`` of the process (electors, lockers and their locks, made before or
after) reports to it. A target's open span (its term, or a lock's hold) is
kept on its ``Events`` (``trace``), so it lives and dies with the target.

Metric attributes are ``redlease.name`` (the elector's name, the locker's key
prefix) and ``redlease.engine``, and a bounded reason or outcome: never a
token, an instance id or a lock's name, whose values have no bound (those go
on spans).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from .._engine import LATENESS_BUCKETS
from .._locks.stats import WAIT_BUCKETS
from .._log import Events

NAME = "redlease.name"
ENGINE = "redlease.engine"
TOKEN = "redlease.term.token"
END_REASON = "redlease.term.end_reason"
LOCK = "redlease.lock.name"
LOCK_TOKEN = "redlease.lock.token"
LOCK_END_REASON = "redlease.lock.end_reason"
WAIT_OUTCOME = "redlease.lock.wait.outcome"
REVOKE_REASON = "redlease.partitions.revoke_reason"

Attributes = dict[str, Any]


def target_attributes(events: Events) -> Attributes:
    """The metric attributes of ``events``' target (a lock's are its locker's)."""
    owner = events.parent if events.parent is not None else events
    return {NAME: owner.name, ENGINE: owner.engine}


def wall_ns(monotonic: float) -> int:
    """A ``time.monotonic()`` moment as the epoch nanoseconds a span is timed in."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)


class _Open:
    """A target's open span: a term's or a lock hold's, with when it began."""

    __slots__ = ("began", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.began = time.monotonic()


class _Kept:
    """A keeper whose renewals are counted: its attributes and the lateness samples seen."""

    __slots__ = ("attributes", "keeper", "key", "seen")

    def __init__(self, keeper: Any, attributes: Attributes) -> None:
        self.keeper = keeper
        self.attributes = attributes
        self.key = tuple(sorted(attributes.items()))
        self.seen: int = keeper.lateness_count()


class Sink:
    """The process sink (``_log.ProcessSink``): spans from a tracer, instruments on a meter."""

    def __init__(self, tracer: Tracer, meter: Meter) -> None:
        self.tracer = tracer
        self._mutex = threading.Lock()
        self._kept: dict[int, _Kept] = {}
        # Renewals of keepers closed since, per attribute set: the counter never goes back.
        self._renewed: dict[tuple[tuple[str, Any], ...], int] = {}
        self.terms_started = meter.create_counter(
            "redlease.term.started", "{term}", "Terms won by this process's electors"
        )
        self.terms_ended = meter.create_counter(
            "redlease.term.ended", "{term}", "Terms ended, by reason (redlease.term.end_reason)"
        )
        self.leader = meter.create_up_down_counter(
            "redlease.leader", "{term}", "Terms this process leads now (1 per elector leading)"
        )
        self.errors = meter.create_counter(
            "redlease.errors",
            "{error}",
            "Redis errors an elector or a lock watchdog handled itself (retried or stepped down)",
        )
        self.fenced = meter.create_counter(
            "redlease.fence.writes",
            "{write}",
            "Fenced writes, by outcome (redlease.fence.outcome: applied, stale, unknown)",
        )
        self.lateness = meter.create_histogram(
            "redlease.renew.lateness",
            "s",
            "How late each lease renewal was sent after its scheduled time (keeper-measured)",
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS,
        )
        meter.create_observable_counter(
            "redlease.renewals",
            [self._observe_renewals],
            "{renewal}",
            "Lease renewals that succeeded (counted by the keepers, read at collection)",
        )
        self.locks_acquired = meter.create_counter(
            "redlease.lock.acquired", "{lock}", "Locks (and semaphore permits) acquired"
        )
        self.locks_released = meter.create_counter(
            "redlease.lock.released",
            "{lock}",
            "Locks ended, by reason (redlease.lock.end_reason: released, lost)",
        )
        self.locks_held = meter.create_up_down_counter(
            "redlease.lock.held", "{lock}", "Locks this process holds now"
        )
        self.lock_wait = meter.create_histogram(
            "redlease.lock.wait.duration",
            "s",
            "How long each acquire waited, from its call to the grant or the timeout "
            "(redlease.lock.wait.outcome: granted, timed_out)",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.lock_hold = meter.create_histogram(
            "redlease.lock.hold.duration",
            "s",
            "How long each lock was held, from its grant to its release or loss",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )

        self.partitions_owned = meter.create_up_down_counter(
            "redlease.partitions.owned", "{partition}", "Partitions this process's members own now"
        )
        self.partitions_assigned = meter.create_counter(
            "redlease.partitions.assigned", "{partition}", "Partition tenures begun"
        )
        self.partitions_revoked = meter.create_counter(
            "redlease.partitions.revoked",
            "{partition}",
            "Partition tenures ended, by reason (redlease.partitions.revoke_reason: "
            "rebalanced, lost, stopped)",
        )

    # -- terms ------------------------------------------------------------------------

    def elected(self, events: Events, token: int) -> None:
        attributes = target_attributes(events)
        span = self.tracer.start_span(
            "redlease.term",
            context=otel_context.Context(),  # a term is a trace of its own
            kind=SpanKind.INTERNAL,
            attributes={**attributes, TOKEN: token, "redlease.instance.id": events.instance},
        )
        events.trace = _Open(span)
        self.terms_started.add(1, attributes)
        self.leader.add(1, attributes)

    def stepped_down(self, events: Events, token: int, reason: str) -> None:
        attributes = target_attributes(events)
        self.terms_ended.add(1, {**attributes, END_REASON: reason})
        opened, events.trace = events.trace, None
        if isinstance(opened, _Open):  # a term begun before instrument() has none
            self.leader.add(-1, attributes)
            opened.span.set_attribute(END_REASON, reason)
            opened.span.end()

    @contextlib.contextmanager
    def leading(self, events: Events) -> Iterator[object]:
        opened = events.trace
        if not isinstance(opened, _Open):
            yield None
            return
        with trace.use_span(opened.span, end_on_exit=False, record_exception=False):
            yield opened.span

    # -- locks ------------------------------------------------------------------------

    def acquired(self, events: Events, token: int) -> None:
        attributes = target_attributes(events)
        span = self.tracer.start_span(
            "redlease.lock.hold",
            kind=SpanKind.INTERNAL,
            attributes={**attributes, LOCK: events.name, LOCK_TOKEN: token},
        )
        events.trace = _Open(span)
        self.locks_acquired.add(1, attributes)
        self.locks_held.add(1, attributes)

    def released(self, events: Events, token: int, reason: str) -> None:
        attributes = target_attributes(events)
        self.locks_released.add(1, {**attributes, LOCK_END_REASON: reason})
        opened, events.trace = events.trace, None
        if isinstance(opened, _Open):
            self.locks_held.add(-1, attributes)
            self.lock_hold.record(
                time.monotonic() - opened.began, {**attributes, LOCK_END_REASON: reason}
            )
            opened.span.set_attribute(LOCK_END_REASON, reason)
            opened.span.end()

    def waited(self, events: Events, lock: str, began: float, granted: bool) -> None:
        attributes = target_attributes(events)
        outcome = {WAIT_OUTCOME: "granted" if granted else "timed_out"}
        self.lock_wait.record(time.monotonic() - began, {**attributes, **outcome})
        span = self.tracer.start_span(
            "redlease.lock.wait",
            kind=SpanKind.INTERNAL,
            attributes={**attributes, LOCK: lock, **outcome},
            start_time=wall_ns(began),
        )
        span.end()

    # -- partitions -----------------------------------------------------------------

    def tenure_began(self, events: Events) -> None:
        attributes = target_attributes(events)
        self.partitions_assigned.add(1, attributes)
        self.partitions_owned.add(1, attributes)
        # The tenures counted as owned (one begun before instrument() is not).
        events.trace = (events.trace or 0) + 1

    def tenure_ended(self, events: Events, reason: str) -> None:
        attributes = target_attributes(events)
        self.partitions_revoked.add(1, {**attributes, REVOKE_REASON: reason})
        if events.trace:
            events.trace -= 1
            self.partitions_owned.add(-1, attributes)

    # -- errors and keepers -------------------------------------------------------------

    def error(self, events: Events, exc: BaseException) -> None:
        self.errors.add(1, {**target_attributes(events), "error.type": type(exc).__name__})

    def keeper_opened(self, events: Events, keeper: Any) -> None:
        with self._mutex:
            if id(keeper) not in self._kept:
                self._kept[id(keeper)] = _Kept(keeper, target_attributes(events))

    def keeper_closed(self, events: Events, keeper: Any) -> None:
        with self._mutex:
            kept = self._kept.pop(id(keeper), None)
            if kept is not None and kept.keeper is keeper:
                self._fold(kept)

    def _catch_up(self, kept: _Kept) -> None:
        """Record the lateness samples ``kept``'s keeper took since the last look."""
        count: int = kept.keeper.lateness_count()
        new = count - kept.seen
        if new > 0:
            for late in kept.keeper.lateness()[-new:]:
                self.lateness.record(late, kept.attributes)
        kept.seen = count

    def _fold(self, kept: _Kept) -> None:
        self._catch_up(kept)
        self._renewed[kept.key] = self._renewed.get(kept.key, 0) + kept.keeper.renewals

    def _observe_renewals(self, options: CallbackOptions) -> Iterator[Observation]:
        """At each collection: every keeper's renewals, and the lateness of those new."""
        with self._mutex:
            # A keeper closed without telling (a lock dropped unreleased) is folded here.
            for ident, kept in list(self._kept.items()):
                if kept.keeper.closed:
                    del self._kept[ident]
                    self._fold(kept)
            totals = dict(self._renewed)
            attributes = {kept.key: kept.attributes for kept in self._kept.values()}
            for kept in self._kept.values():
                self._catch_up(kept)
                totals[kept.key] = totals.get(kept.key, 0) + kept.keeper.renewals
        for key, n in totals.items():
            yield Observation(n, attributes.get(key, dict(key)))

    def end(self) -> None:
        """Uninstrumented: keepers are no longer followed."""
        with self._mutex:
            self._kept.clear()


def record_error(span: trace.Span, exc: BaseException) -> None:
    """``exc`` on ``span`` as the OpenTelemetry instrumentations record one."""
    span.record_exception(exc)
    span.set_attribute("error.type", type(exc).__qualname__)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
