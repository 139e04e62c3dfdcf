"""Back-to-back call timing for the benchmark scripts that print tables.

``time_calls`` runs one operation in a loop for a fixed time and keeps every
call's latency; with several rounds the best one is kept, since a shared
machine only ever makes a round slower. Percentiles are the nearest-rank ones
``redlease bench`` prints.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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


def time_interleaved(
    contenders: Sequence[tuple[str, Callable[[], object]]],
    seconds: float,
    rounds: int,
    warmup: int = 200,
) -> list[Timed]:
    """``time_calls`` for several operations, their rounds taken in turn; the best of each.

    Round 1 of every contender, then round 2 of every contender, and so on:
    a burst of load from elsewhere on a shared machine lands on all of them
    alike instead of on whichever happened to run its rounds back to back
    then, so the ratios of one run compare like with like.
    """
    best: dict[str, Timed] = {}
    for _name, op in contenders:
        for _ in range(warmup):
            op()
    for _ in range(rounds):
        for name, op in contenders:
            timed = time_calls(name, op, seconds, rounds=1, warmup=0)
            if name not in best or timed.rate > best[name].rate:
                best[name] = timed
    return [best[name] for name, _ in contenders]
