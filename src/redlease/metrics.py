"""Prometheus metrics for an Elector or a RedisLocker (the ``metrics`` extra).

```python
import prometheus_client
import redlease, redlease.metrics

elector = redlease.Elector(client, "report-builder")
redlease.metrics.instrument(elector)          # into prometheus_client.REGISTRY
prometheus_client.start_http_server(9100)     # /metrics
```

What an instrumented target exports (every series labelled ``name``: the
elector's name, or the locker's key prefix):

- ``redlease_leader`` (gauge): 1 while this elector leads, else 0; for a
  locker, how many of its locks are held right now.
- ``redlease_term_token`` (gauge): the current term's fencing token, 0 while
  not leading; for a locker, the last fencing token it was granted.
- ``redlease_terms_total`` (counter): terms won (locks acquired).
- ``redlease_stepdowns_total`` (counter, label ``reason``): terms ended, by
  why — ``lost``, ``returned``, ``resigned``, ``stopped`` (locks:
  ``released``, ``lost``).
- ``redlease_errors_total`` (counter, label ``error``: the exception class):
  Redis errors the elector or a lock watchdog handled itself — what
  ``Observer.on_error`` sees, and the lock watchdog's failed renewals.
- ``redlease_fenced_writes_total`` (counter, label ``result``: ``applied`` |
  ``rejected``): fenced writes Redis answered (an elector only).
- ``redlease_renew_lateness_seconds`` (histogram): how late each renewal was
  sent after its scheduled moment, as the keeper itself measured it.
- ``redlease_lock_wait_seconds`` (histogram, label ``lock``: the lock's or
  semaphore's name; a locker only): how long each granted ``acquire`` waited,
  from its call to the attempt that won.
- ``redlease_lock_contended_total`` (counter, label ``lock``; a locker only):
  acquires that found the lock (or every permit) taken at least once, granted
  in the end or not.

A ``redlease.Partitions`` member (threaded or asyncio) exports, labelled with
its group's name: ``redlease_partitions_owned`` (gauge: the partitions it
owns now), ``redlease_partitions_assigned_total`` (counter: tenures begun),
``redlease_partitions_revoked_total`` (counter, label ``reason``:
``rebalanced``, ``lost``, ``stopped``) and
``redlease_partition_rebalance_seconds`` (histogram: how long each rebalance
took, as the member saw it).

Cost: until ``instrument`` is called the hooks have no listener, and an
event costs a loop over an empty list. Once instrumented, the events above
are counted in Python as they happen — a handful per term, one per fenced
write — but renewals are not: the
keeper counts their lateness into fixed buckets on its own thread (natively
in C, without the GIL) and the collector reads those counters at scrape time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError:  # pragma: no cover - exercised in a subprocess without the extra
    # One line that says what to do, rather than prometheus_client's own.
    raise ImportError(
        "redlease.metrics needs prometheus_client: pip install 'redlease[metrics]'"
    ) from None

from ._election.election import Election
from ._election.member import Member
from ._election.sharewatch import REBALANCE_BUCKETS
from ._engine import LATENESS_BUCKETS, ForkSafeLock
from ._locks.lock import LockerCore
from ._locks.stats import WAIT_BUCKETS, WaitStats
from ._log import Events

__all__ = ["instrument"]

T = TypeVar("T")

_ELECTOR_REASONS = ("lost", "returned", "resigned", "stopped")
_PARTITION_REASONS = ("rebalanced", "lost", "stopped")
_LOCK_REASONS = ("released", "lost")


def _buckets(
    bounds: tuple[float, ...], counts: Sequence[int], total: int
) -> list[tuple[str, float]]:
    """Cumulative histogram buckets as Prometheus wants them: one per bound, then ``+Inf``.

    ``counts[i]`` is how many fell at or below ``bounds[i]`` (and above the
    bound before); ``total`` how many there were in all (the ``+Inf`` bucket).
    """
    running = 0
    out: list[tuple[str, float]] = []
    for bound, n in zip(bounds, counts, strict=False):
        running += n
        out.append((repr(float(bound)), running))  # Prometheus' own 'le' format
    out.append(("+Inf", total))
    return out


class _Target:
    """One instrumented target's counters: an ``_log.Sink`` fed by its ``Events``."""

    def __init__(
        self,
        name: str,
        reasons: tuple[str, ...],
        leader: Callable[[], int] | None,
        token: Callable[[], int] | None,
        fenced: bool,
        waits: WaitStats | None = None,
    ) -> None:
        self.name = name
        self._waits = waits
        self._leader = leader
        self._token = token
        self._has_fence = fenced
        self._mutex = threading.Lock()
        self._terms = 0
        self._ended = 0
        self._last_token = 0
        self._stepdowns = dict.fromkeys(reasons, 0)
        self._errors: dict[str, int] = {}
        self._fenced = {"applied": 0, "rejected": 0}
        # Keepers still in use, read at scrape time; a closed keeper's final
        # figures are folded into the base so the histogram never goes back.
        self._keepers: list[Any] = []
        self._base_counts = [0] * (len(LATENESS_BUCKETS) + 1)
        self._base_sum = 0.0

    # -- the Sink protocol (called from the run thread, writers, watchdogs) -----------

    def elected(self, token: int) -> None:
        with self._mutex:
            self._terms += 1
            self._last_token = token

    def stepped_down(self, token: int, reason: str) -> None:
        with self._mutex:
            self._ended += 1
            self._stepdowns[reason] = self._stepdowns.get(reason, 0) + 1

    def error(self, exc: BaseException) -> None:
        kind = type(exc).__name__
        with self._mutex:
            self._errors[kind] = self._errors.get(kind, 0) + 1

    def fenced(self, applied: bool) -> None:
        with self._mutex:
            self._fenced["applied" if applied else "rejected"] += 1

    def keeper_opened(self, keeper: Any) -> None:
        with self._mutex:
            if not any(k is keeper for k in self._keepers):
                self._keepers.append(keeper)

    def keeper_closed(self, keeper: Any) -> None:
        with self._mutex:
            for i, k in enumerate(self._keepers):
                if k is keeper:
                    del self._keepers[i]
                    self._fold(keeper)
                    return

    def _fold(self, keeper: Any) -> None:
        counts, total = keeper.lateness_totals()
        for i, n in enumerate(counts):
            self._base_counts[i] += n
        self._base_sum += total

    # -- scrape ---------------------------------------------------------------------

    def lateness(self) -> tuple[list[int], float]:
        """Renew lateness of every keeper this target used: per-bucket counts and the sum."""
        with self._mutex:
            # A keeper closed without telling us (a lock dropped unreleased,
            # collected by the GC's finalizer) is folded here.
            for keeper in [k for k in self._keepers if k.closed]:
                self._keepers.remove(keeper)
                self._fold(keeper)
            counts = list(self._base_counts)
            total = self._base_sum
            live = list(self._keepers)
        for keeper in live:
            more, more_sum = keeper.lateness_totals()
            for i, n in enumerate(more):
                counts[i] += n
            total += more_sum
        return counts, total

    def families(self) -> dict[str, Metric]:
        name = [self.name]
        with self._mutex:
            terms, ended, last_token = self._terms, self._ended, self._last_token
            stepdowns = dict(self._stepdowns)
            errors = dict(self._errors)
            fenced = dict(self._fenced)
        leader = self._leader() if self._leader is not None else max(terms - ended, 0)
        token = self._token() if self._token is not None else last_token
        out: dict[str, Metric] = {}
        _add(out, GaugeMetricFamily(
            "redlease_leader",
            "1 while this instance leads (a locker: how many of its locks are held)",
            labels=["name"],
        ), [(name, leader)])
        _add(out, GaugeMetricFamily(
            "redlease_term_token",
            "Fencing token of the current term, 0 while not leading (a locker: the last granted)",
            labels=["name"],
        ), [(name, token)])
        _add(out, CounterMetricFamily(
            "redlease_terms", "Terms won (a locker: locks acquired)", labels=["name"]
        ), [(name, terms)])
        _add(out, CounterMetricFamily(
            "redlease_stepdowns", "Terms ended, by reason", labels=["name", "reason"]
        ), [([self.name, reason], n) for reason, n in stepdowns.items()])
        _add(out, CounterMetricFamily(
            "redlease_errors",
            "Redis errors handled by the elector or a lock watchdog (retried or stepped down)",
            labels=["name", "error"],
        ), [([self.name, kind], n) for kind, n in errors.items()])
        if self._has_fence:
            _add(out, CounterMetricFamily(
                "redlease_fenced_writes",
                "Fenced writes answered by Redis, by result",
                labels=["name", "result"],
            ), [([self.name, result], n) for result, n in fenced.items()])
        counts, total = self.lateness()
        buckets = _buckets(LATENESS_BUCKETS, counts[:-1], sum(counts))
        h = HistogramMetricFamily(
            "redlease_renew_lateness_seconds",
            "How late each lease renewal was sent after its scheduled time (keeper-measured)",
            labels=["name"],
        )
        h.add_metric(name, buckets, sum_value=total)
        out[h.name] = h
        if self._waits is not None:
            out.update(self._wait_families())
        return out

    def _wait_families(self) -> dict[str, Metric]:
        """The locker's own counts of its acquisitions, per lock name."""
        assert self._waits is not None
        h = HistogramMetricFamily(
            "redlease_lock_wait_seconds",
            "How long each granted acquire waited, from the call to the attempt that won",
            labels=["name", "lock"],
        )
        c = CounterMetricFamily(
            "redlease_lock_contended",
            "Acquires that found the lock (or every permit) taken at least once",
            labels=["name", "lock"],
        )
        for lock, stats in sorted(self._waits.snapshot().items()):
            buckets = _buckets(WAIT_BUCKETS, stats.buckets, stats.acquired)
            h.add_metric([self.name, lock], buckets, sum_value=stats.waited)
            c.add_metric([self.name, lock], stats.contended)
        return {h.name: h, c.name: c}


def _add(out: dict[str, Metric], family: Any, samples: Iterable[tuple[list[str], float]]) -> None:
    """``family`` with a sample per ``(label values, value)``, into ``out`` under its name."""
    for labels, value in samples:
        family.add_metric(labels, value)
    out[family.name] = family


class _PartitionsTarget:
    """One partition group member's series, read from its counters at scrape time."""

    def __init__(self, member: Member) -> None:
        self.name = member.config.name
        self._member = weakref.ref(member)

    def families(self) -> dict[str, Metric]:
        member = self._member()
        if member is None:
            return {}
        name = [self.name]
        assigned, revoked, rebalances, counts, total = member.stats.snapshot()
        out: dict[str, Metric] = {}
        _add(out, GaugeMetricFamily(
            "redlease_partitions_owned",
            "Partitions this member owns now (each proven by its lease)",
            labels=["name"],
        ), [(name, len(member.owned()))])
        _add(out, CounterMetricFamily(
            "redlease_partitions_assigned", "Partition tenures this member began", labels=["name"]
        ), [(name, assigned)])
        _add(out, CounterMetricFamily(
            "redlease_partitions_revoked",
            "Partition tenures this member ended, by why",
            labels=["name", "reason"],
        ), [
            ([self.name, reason], revoked.get(reason, 0))
            for reason in sorted({*_PARTITION_REASONS, *revoked})
        ])
        h = HistogramMetricFamily(
            "redlease_partition_rebalance_seconds",
            "How long each rebalance took, as this member saw it: from the first look at the "
            "group that found it away from its share to the first that found it settled",
            labels=["name"],
        )
        h.add_metric(name, _buckets(REBALANCE_BUCKETS, counts[:-1], rebalances), sum_value=total)
        out[h.name] = h
        return out


class _Collector:
    """Every instrumented target of one registry, as one set of metric families."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._targets: list[tuple[weakref.ref[Any], _Target | _PartitionsTarget]] = []

    def add(
        self, owner: object, target: _Target | _PartitionsTarget
    ) -> _Target | _PartitionsTarget:
        with self._mutex:
            self._targets = [(ref, t) for ref, t in self._targets if ref() is not None]
            for ref, t in self._targets:
                if ref() is owner:
                    return t
                if t.name == target.name:
                    raise ValueError(
                        f"a redlease target named {target.name!r} is already instrumented in "
                        "this registry; use one registry per process for each name"
                    )
            self._targets.append((weakref.ref(owner), target))
        return target

    def collect(self) -> Iterator[Metric]:
        with self._mutex:
            targets = [t for ref, t in self._targets if ref() is not None]
        merged: dict[str, Metric] = {}
        for target in targets:
            for key, family in target.families().items():
                if key in merged:
                    merged[key].samples.extend(family.samples)
                else:
                    merged[key] = family
        yield from merged.values()


_collectors: weakref.WeakKeyDictionary[CollectorRegistry, _Collector] = (
    weakref.WeakKeyDictionary()
)
_collectors_mutex = ForkSafeLock()


def _collector(registry: CollectorRegistry) -> _Collector:
    with _collectors_mutex:
        collector = _collectors.get(registry)
        if collector is None:
            collector = _Collector()
            registry.register(collector)
            _collectors[registry] = collector
        return collector


def _core_of(target: object) -> Election | LockerCore | Member | None:
    """The target's core: every public shell's one documented internal attribute, ``_core``."""
    core = getattr(target, "_core", None)
    return core if isinstance(core, (Election, LockerCore, Member)) else None


def instrument(target: T, registry: CollectorRegistry | None = None) -> T:
    """Export ``target``'s metrics (see the module doc) to ``registry``; returns ``target``.

    ``target`` is a ``redlease.Elector``, a ``redlease.aio.Elector``, a
    ``redlease.RedisLocker`` (or ``MemoryLocker``), an asyncio locker, or a
    ``redlease.Partitions`` member (threaded or asyncio).
    ``registry`` defaults to ``prometheus_client.REGISTRY``. Instrumenting the
    same target twice into one registry is a no-op; two targets of the same
    name in one registry is a ``ValueError`` (their series would collide).
    Counting starts now: terms won before are not counted, but the renew
    lateness of a run already going is.
    """
    registry = REGISTRY if registry is None else registry
    core = _core_of(target)
    if isinstance(core, Member):
        _collector(registry).add(target, _PartitionsTarget(core))
        return target
    election = core if isinstance(core, Election) else None
    events: Events
    if election is not None:

        def token(election: Election = election) -> int:
            return election.token() or 0

        def leader(election: Election = election) -> int:
            return 1 if election.token() is not None else 0

        instruments = _Target(election.config.name, _ELECTOR_REASONS, leader, token, True)
        events = election.events
    else:
        if not isinstance(core, LockerCore):
            raise TypeError(
                "instrument() takes a redlease Elector, RedisLocker or Partitions (threaded or "
                f"asyncio), got {type(target).__name__}"
            )
        events = core.events
        instruments = _Target(events.name, _LOCK_REASONS, None, None, False, core.waits)
    added = _collector(registry).add(target, instruments)
    if added is instruments:
        events.attach(instruments)
        run = election.run if election is not None else None
        if run is not None:
            instruments.keeper_opened(run.keeper)
    return target
