"""What a member's looks at its group tell the outside: its share held, its rebalances counted.

Each look at the group (``Member.rebalance``) ends by telling ``ShareWatch``
whether the member holds its share for the live members of that look;
``wait_owned`` waits on it (a condition for threads, a watcher that wakes an
event loop for asyncio; ``wait_deadline`` and ``timed_out`` are both faces'
bounds and message). ``GroupStats`` counts the member's tenures and how long
each rebalance took, for ``redlease.metrics``.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter
from collections.abc import Callable

from .._config import non_negative_seconds
from .._log import Events

REBALANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""The bounds (seconds) a member's rebalance durations are counted into (``redlease.metrics``)."""


class GroupStats:
    """What a member counts of its tenures and rebalances, for ``redlease.metrics``.

    A rebalance, as this member sees it, lasts from the first look at the
    group that finds it away from its share (partitions to hand over, to
    take, or still free) to the first look that finds it settled.
    """

    __slots__ = (
        "_events",
        "_mutex",
        "_since",
        "assigned",
        "rebalance_counts",
        "rebalance_sum",
        "rebalances",
        "revoked",
    )

    def __init__(self, events: Events | None = None) -> None:
        self._events = events  # the member's: each tenure is passed on to the process's sinks
        self._mutex = threading.Lock()
        self._since: float | None = None
        self.assigned = 0
        self.revoked: Counter[str] = Counter()
        self.rebalances = 0
        self.rebalance_counts = [0] * (len(REBALANCE_BUCKETS) + 1)
        self.rebalance_sum = 0.0

    def tenure_began(self) -> None:
        with self._mutex:
            self.assigned += 1
        if self._events is not None:
            self._events.tenure_began()

    def tenure_ended(self, reason: str) -> None:
        with self._mutex:
            self.revoked[reason] += 1
        if self._events is not None:
            self._events.tenure_ended(reason)

    def looked(self, settled: bool, now: float) -> None:
        """One look at the group: this member settled at its share, or not."""
        with self._mutex:
            if not settled:
                if self._since is None:
                    self._since = now
                return
            if self._since is None:
                return
            took = max(0.0, now - self._since)
            self._since = None
            self.rebalances += 1
            self.rebalance_sum += took
            self.rebalance_counts[bisect.bisect_left(REBALANCE_BUCKETS, took)] += 1

    def snapshot(self) -> tuple[int, dict[str, int], int, list[int], float]:
        """``(assigned, revoked by reason, rebalances, their bucket counts, their sum)``."""
        with self._mutex:
            return (
                self.assigned,
                dict(self.revoked),
                self.rebalances,
                list(self.rebalance_counts),
                self.rebalance_sum,
            )


def wait_deadline(timeout: object, what: str) -> float:
    """When a wait of ``timeout`` seconds ends (monotonic; ``math.inf`` for None), or ConfigError.

    Zero is allowed (one look, no wait); a bool, NaN or a negative value is a
    mistake, as for every other duration.
    """
    if timeout is None:
        return math.inf
    seconds = non_negative_seconds(
        timeout, f"{what} timeout", "None waits for as long as it takes"
    )
    return time.monotonic() + seconds


class ShareWatch:
    """What the last look at the group found of this member's share, for ``wait_owned``.

    Each look at the group (``Member.rebalance``) ends by telling this the
    share the member holds for the live members Redis named at that look
    (``looked(quota)``), or that it is still short (``looked(None)``). The
    share is ``balance.quota``: ``N // M``, plus one for the ``N % M`` members
    ranked first, so the members' shares add up to N whatever M is. A join or
    a leave while someone waits is just another look: the share is computed
    again for the new M, and a waiter wakes only when the member holds that.

    Threads wait on the condition; an event loop registers a watcher (a plain
    callable, called on the thread of each change, the driver's mostly) and wakes on it.
    """

    __slots__ = ("_changed", "_quota", "_running", "_watchers")

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = False
        self._quota: int | None = None
        self._watchers: set[Callable[[], None]] = set()

    def _tell(self) -> None:
        """Wake every waiter (called with ``_changed`` held)."""
        self._changed.notify_all()
        for watcher in list(self._watchers):
            watcher()

    def started(self) -> None:
        with self._changed:
            self._running, self._quota = True, None
            self._tell()

    def stopped(self) -> None:
        with self._changed:
            self._running, self._quota = False, None
            self._tell()

    def looked(self, quota: int | None) -> None:
        with self._changed:
            if self._running:
                self._quota = quota
                self._tell()

    def watch(self, watcher: Callable[[], None]) -> None:
        with self._changed:
            self._watchers.add(watcher)

    def unwatch(self, watcher: Callable[[], None]) -> None:
        with self._changed:
            self._watchers.discard(watcher)

    @property
    def quota(self) -> int | None:
        """The share the last look found held (None: short of it, or not running)."""
        with self._changed:
            return self._quota

    @property
    def watchers(self) -> int:
        """How many event-loop waiters are registered now."""
        with self._changed:
            return len(self._watchers)

    def ready(self, owned: Callable[[], dict[str, int]], what: str) -> dict[str, int] | None:
        """``owned()`` when it is this member's whole share now, else None; RuntimeError when
        the member is not running."""
        with self._changed:
            if not self._running:
                raise RuntimeError(
                    f"{what} is not running: wait_owned() waits for a started member "
                    "(call start() first; a stopped member owns nothing)"
                )
            if self._quota is None:
                return None
            held = owned()
            return held if len(held) == self._quota else None

    def wait(
        self, owned: Callable[[], dict[str, int]], deadline: float, what: str
    ) -> dict[str, int]:
        """Block until ``ready`` gives the share (TimeoutError past ``deadline``)."""
        with self._changed:
            while True:
                held = self.ready(owned, what)
                if held is not None:
                    return held
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(timed_out(what, self._quota))
                self._changed.wait(None if math.isinf(left) else left)


def timed_out(what: str, quota: int | None) -> str:
    """What ``TimeoutError`` says of a ``wait_owned`` that ran out (``quota``: ``ShareWatch``'s)."""
    seen = (
        "its last look at the group found it short of its share"
        if quota is None
        else f"its last look found its share of {quota} held, but not all of it is proven now"
    )
    return f"{what} did not hold its balanced share of the partitions in time ({seen})"
