"""Back-to-back call timing for the benchmark scripts that print tables.

``time_calls`` runs one operation in a loop for a fixed time and keeps every
call's latency; with several rounds the best one is kept, since a shared
machine only ever makes a round slower. Percentiles are the nearest-rank ones
``redlease bench`` prints.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from redlease._cli.bench import percentile


@dataclass
class Timed:
    """One case's calls: how many, over how long, and the latency of each."""

    name: str
    calls: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        """Calls per second."""
        return self.calls / self.seconds

    def percentile_us(self, q: float) -> float:
        """Nearest-rank percentile (q in 0..100) of the latencies, in microseconds."""
        return percentile(self.latencies_ns, q) / 1000

    def mean_us(self) -> float:
        """Mean latency in microseconds."""
        return statistics.fmean(self.latencies_ns) / 1000


def time_calls(
    name: str, op: Callable[[], object], seconds: float, rounds: int = 1, warmup: int = 200
) -> Timed:
    """Call ``op`` back to back for ``seconds``, ``rounds`` times; the best round.

    ``warmup`` calls first, untimed: they connect, load scripts, fill caches.
    """
    for _ in range(warmup):
        op()
    best: Timed | None = None
    clock = time.perf_counter_ns
    for _ in range(rounds):
        latencies: list[int] = []
        record = latencies.append
        start = clock()
        stop = start + int(seconds * 1e9)
        now = start
        while now < stop:
            op()
            after = clock()
            record(after - now)
            now = after
        timed = Timed(name, len(latencies), (now - start) / 1e9, latencies)
        if best is None or timed.rate > best.rate:
            best = timed
    assert best is not None
    return best
