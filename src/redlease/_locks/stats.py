"""What a locker counts of its own acquisitions, per lock name: how long each waited, and
how many found the lock (or every permit) taken.

Kept by every locker whether or not anyone reads it (a few additions under a
mutex per acquisition); ``redlease.metrics`` exports it at scrape time.
"""

from __future__ import annotations

import bisect
import threading

WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the acquire-wait histogram; a last bucket takes the rest."""

MAX_NAMES = 1000
"""Names counted apart; acquisitions of further names are counted under ``OTHER``."""

OTHER = "(other)"


class NameStats:
    """One name's figures: the wait histogram of its acquisitions, and its contention."""

    __slots__ = ("acquired", "buckets", "contended", "waited")

    def __init__(self) -> None:
        self.buckets = [0] * (len(WAIT_BUCKETS) + 1)
        self.waited = 0.0  # seconds, summed over the acquisitions
        self.acquired = 0
        self.contended = 0  # acquires that found it taken at least once (granted or not)

    def copy(self) -> NameStats:
        other = NameStats()
        other.buckets = list(self.buckets)
        other.waited, other.acquired, other.contended = self.waited, self.acquired, self.contended
        return other


class WaitStats:
    """A locker's ``NameStats`` by lock name. Thread-safe."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._names: dict[str, NameStats] = {}

    def record(self, name: str, waited: float, acquired: bool, contended: bool) -> None:
        """One ``acquire`` of ``name`` ended: granted after ``waited`` seconds, or not."""
        with self._mutex:
            stats = self._names.get(name)
            if stats is None:
                if len(self._names) >= MAX_NAMES:
                    name = OTHER
                stats = self._names.setdefault(name, NameStats())
            if acquired:
                stats.buckets[bisect.bisect_left(WAIT_BUCKETS, waited)] += 1
                stats.waited += waited
                stats.acquired += 1
            if contended:
                stats.contended += 1

    def snapshot(self) -> dict[str, NameStats]:
        """A copy of every name's figures."""
        with self._mutex:
            return {name: stats.copy() for name, stats in self._names.items()}
