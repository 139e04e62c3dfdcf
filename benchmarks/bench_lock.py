"""Uncontended lock round trips: acquire + release per second, per locker and engine.

Starts its own private redis-server (nothing shared, nothing left behind) and
times back-to-back ``try_acquire`` + ``release`` cycles on one name for:
MemoryLocker, RedisLocker on each available engine (with and without
auto-renewal), and redis-py's own ``redis.lock.Lock`` as the baseline. Prints
one table: cycles per second, latency per cycle (p50/p99/max) and the ratio
to redis-py.

    python benchmarks/bench_lock.py [--seconds 2] [--unix]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import redis

from redlease import Locker, MemoryLocker, RedisLocker
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer
from timing import Timed, time_calls

Cycle = Callable[[], None]


def locker_cycle(locker: Locker, name: str, *, auto_renew: bool) -> Cycle:
    def cycle() -> None:
        locker.try_acquire(name, ttl=30.0, auto_renew=auto_renew).release()

    return cycle


def redis_py_cycle(client: redis.Redis, name: str) -> Cycle:
    def cycle() -> None:
        lock = client.lock(name, timeout=30.0)
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py lock unexpectedly held")
        lock.release()

    return cycle


def run(seconds: float, unix: bool, notes: list[str]) -> list[Timed]:
    results: list[Timed] = []
    memory = MemoryLocker()
    results.append(
        time_calls("MemoryLocker", locker_cycle(memory, "m", auto_renew=False), seconds)
    )
    results.append(
        time_calls("MemoryLocker auto_renew", locker_cycle(memory, "m", auto_renew=True), seconds)
    )
    engines = ["python"]
    native_ok, why = native_engine_available()
    if native_ok:
        engines.append("native")
    else:
        notes.append(f"native engine skipped: {why}")
    with RedisServer(unix=unix) as server:
        client = server.client()
        for engine in engines:
            with RedisLocker(client, engine=engine) as locker:
                for auto_renew in (False, True):
                    label = f"RedisLocker {engine}" + (" auto_renew" if auto_renew else "")
                    cycle = locker_cycle(locker, f"bench:{engine}", auto_renew=auto_renew)
                    results.append(time_calls(label, cycle, seconds))
        results.append(
            time_calls("redis-py Lock", redis_py_cycle(client, "bench:redis-py"), seconds)
        )
        client.close()
    return results


def table(results: list[Timed]) -> str:
    baseline = next((r for r in results if r.name == "redis-py Lock"), None)
    header = (
        f"{'case':<30} {'cycles/s':>10} {'p50 us':>8} {'p99 us':>8} {'max us':>9} "
        f"{'vs redis-py':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        ratio = f"{r.rate / baseline.rate:.2f}x" if baseline else "-"
        lines.append(
            f"{r.name:<30} {r.rate:>10.0f} {r.percentile_us(50):>8.1f} "
            f"{r.percentile_us(99):>8.1f} {r.percentile_us(100):>9.1f} {ratio:>12}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per case (default 2)")
    parser.add_argument("--unix", action="store_true", help="talk to Redis over a unix socket")
    args = parser.parse_args(argv)
    notes: list[str] = []
    results = run(args.seconds, args.unix, notes)
    transport = "unix socket" if args.unix else "TCP loopback"
    print(f"Uncontended try_acquire + release, one name, {transport}, {args.seconds:g} s per case")
    print(table(results))
    for note in notes:
        print(f"({note})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
