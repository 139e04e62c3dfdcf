"""Handover latency: how soon a waiting instance takes over after a release.

Starts its own private redis-server per engine (nothing shared, nothing left
behind). Two electors with the default TTL (5 s, so a follower polls every
~2.5 s) hand the lease back and forth; each handover is timed from the
leader's ``resign()`` (or ``stop()``) call to the successor's ``on_elected``.
A lock waiter blocked in ``acquire(wait=...)`` (default ``retry_interval``,
100 ms) is timed from the holder's ``release()`` to its ``acquire``
returning. Prints p50/p99/max per engine next to the targets
(handover p50 <= 5 ms, p99 <= 50 ms; lock waiter p50 <= 5 ms).

    python benchmarks/handover.py [--handovers 200] [--stops 20] [--locks 100] [--gil-ms 0]

``--gil-ms N`` runs a Python thread that holds the GIL for about N ms at a
time (one long C call after another), the load under which the notice path
(on the Python engine a Python listener thread, then the run thread's acquire;
on the native engine only the run thread's acquire, the notice is read natively)
waits its turn.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import redlease
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer

SETTLE = 0.02  # between rounds: the previous leader is back to waiting


def gil_hog(ms: float, stop: threading.Event) -> None:
    """Hold the GIL for about ``ms`` at a time until ``stop`` is set."""
    n = 100_000
    start = time.perf_counter()
    sum(range(n))
    per_item = (time.perf_counter() - start) / n
    size = max(1, int(ms / 1000 / per_item))
    while not stop.is_set():
        sum(range(size))  # one C call: the GIL is not given up inside it


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Contender:
    def __init__(self, client: object, engine: str, me: str) -> None:
        self.elected = threading.Event()
        self.elected_at = 0.0
        self.elector = redlease.Elector(
            client,
            "handover",
            engine=engine,
            instance_id=me,
            observer=redlease.Observer(on_elected=self._on_elected),
        )

    def _on_elected(self, _token: int) -> None:
        self.elected_at = time.monotonic()
        self.elected.set()


def wait_elected(contender: Contender) -> None:
    if not contender.elected.wait(10):
        raise RuntimeError("no handover within 10 s")


def resign_handovers(client: object, engine: str, count: int) -> list[float]:
    a, b = Contender(client, engine, "a"), Contender(client, engine, "b")
    a.elector.start()
    wait_elected(a)
    b.elector.start()
    time.sleep(0.3)  # b follows and listens
    leader, follower = a, b
    samples = []
    try:
        for _ in range(count):
            time.sleep(SETTLE)
            follower.elected.clear()
            start = time.monotonic()
            leader.elector.resign()
            wait_elected(follower)
            samples.append(follower.elected_at - start)
            leader, follower = follower, leader
    finally:
        a.elector.stop()
        b.elector.stop()
    return samples


def stop_handovers(client: object, engine: str, count: int) -> list[float]:
    samples = []
    leader = Contender(client, engine, "first")
    leader.elector.start()
    wait_elected(leader)
    for n in range(count):
        follower = Contender(client, engine, f"next-{n}")
        follower.elector.start()
        time.sleep(0.2)  # the follower lost its first acquire and listens
        start = time.monotonic()
        leader.elector.stop()
        wait_elected(follower)
        samples.append(follower.elected_at - start)
        leader = follower
    leader.elector.stop()
    return samples


def lock_waits(client: object, engine: str, count: int) -> list[float]:
    locker = redlease.RedisLocker(client, engine=engine)
    samples = []
    try:
        for _ in range(count):
            held = locker.acquire("handover", ttl=30)
            got: list[float] = []

            def wait(got: list[float] = got) -> None:
                second = locker.acquire("handover", ttl=30, wait=10)  # retry_interval 100 ms
                got.append(time.monotonic())
                second.release()

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(SETTLE)  # the waiter's first attempt failed; it waits
            start = time.monotonic()
            held.release()
            waiter.join(10)
            samples.append(got[0] - start)
    finally:
        locker.close()
    return samples


def row(label: str, samples: list[float], target_p50: float, target_p99: float | None) -> str:
    p50, p99 = percentile(samples, 0.5) * 1000, percentile(samples, 0.99) * 1000
    ok = p50 <= target_p50 and (target_p99 is None or p99 <= target_p99)
    target = f"p50<={target_p50:g}" + (f" p99<={target_p99:g}" if target_p99 else "")
    return (
        f"{label:<30} {len(samples):>5} {p50:>9.2f} {p99:>9.2f} "
        f"{max(samples) * 1000:>9.2f} {statistics.fmean(samples) * 1000:>9.2f}  "
        f"{target:<20} {'met' if ok else 'MISSED'}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handovers", type=int, default=200)
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--locks", type=int, default=100)
    parser.add_argument("--gil-ms", type=float, default=0.0)
    options = parser.parse_args()
    stop_hog = threading.Event()
    if options.gil_ms > 0:
        threading.Thread(target=gil_hog, args=(options.gil_ms, stop_hog), daemon=True).start()
        print(f"with a thread holding the GIL {options.gil_ms:g} ms at a time")
    engines = ["python"]
    native_ok, why = native_engine_available()
    if native_ok:
        engines.append("native")
    print(
        f"{'case (ms)':<30} {'n':>5} {'p50':>9} {'p99':>9} {'max':>9} {'mean':>9}  "
        f"{'target':<20} result"
    )
    for engine in engines:
        with RedisServer() as server:
            client = server.client(socket_timeout=5)
            resign = resign_handovers(client, engine, options.handovers)
            print(row(f"{engine}: resign -> elected", resign, 5, 50))
            stop = stop_handovers(client, engine, options.stops)
            print(row(f"{engine}: stop -> elected", stop, 5, 50))
            locks = lock_waits(client, engine, options.locks)
            print(row(f"{engine}: release -> lock waiter", locks, 5, None))
            client.close()
    stop_hog.set()
    if not native_ok:
        print(f"native engine skipped: {why}")
    print("default TTL 5 s: without notices a follower polls every ~2.5 s, a lock waiter 100 ms")


if __name__ == "__main__":
    main()
