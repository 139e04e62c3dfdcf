"""What metrics cost: renew lateness under the GIL hog and fenced writes/s, with and without.

    python benchmarks/metrics_overhead.py [--seconds S] [--rounds N] [--redis URL]

For each engine, an Elector leads with a 20 ms renew interval while the main
thread makes ~200 ms C calls that hold the GIL (the ``gil`` load of
``redlease bench``); once plain, once instrumented with
``redlease.metrics.instrument`` and scraped every 0.5 s from another thread
(far more often than Prometheus does). The two alternate for ``--rounds``
rounds so that machine noise falls on both alike. Then one thread does
fenced SETs for the same time, plain and instrumented.

``--writes-only`` measures fenced writes alone instead: plain and
instrumented electors in alternating 1.5 s windows, per window and median,
a finer look at the per-write cost than the table's averages.

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import threading
import time

import prometheus_client
import redis

import redlease
import redlease.metrics
from redlease._cli.bench import (
    gil_call_size,
    lateness_under_load,
    native_engine_available,
    percentile,
    wait_for_token,
)
from redlease._testing import RedisServer

TTL = 2.0
INTERVAL = 0.02


def scraper(registry: prometheus_client.CollectorRegistry, stop: threading.Event) -> None:
    while not stop.wait(0.5):
        prometheus_client.generate_latest(registry)


def one_window(
    url: str, engine: str, instrumented: bool, seconds: float, gil_n: int
) -> tuple[list[float], float, bool]:
    """Lateness samples under the GIL hog, fenced writes/s, and whether the lease held."""
    client = redis.Redis.from_url(url)
    name = f"bench-metrics-{secrets.token_hex(3)}"
    elector = redlease.Elector(client, name, ttl=TTL, renew_interval=INTERVAL, engine=engine)
    stop = threading.Event()
    thread = None
    if instrumented:
        registry = prometheus_client.CollectorRegistry()
        redlease.metrics.instrument(elector, registry)
        thread = threading.Thread(target=scraper, args=(registry, stop), daemon=True)
        thread.start()
    try:
        with elector:
            token = wait_for_token(elector, timeout=5.0)
            window = lateness_under_load(
                elector, token, redis.Redis.from_url(url), "gil", seconds, gil_n
            )
            token = wait_for_token(elector, timeout=5.0)
            writes = 0
            start = time.monotonic()
            while time.monotonic() - start < seconds:
                for _ in range(100):
                    elector.fence_set(token, f"{name}:v", writes)
                    writes += 1
            rate = writes / (time.monotonic() - start)
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        client.delete(f"{name}:v", f"{name}:fence", f"{name}:fence:applied")
        client.close()
    return window.own, rate, window.kept


def writes_only(url: str, engines: list[str], rounds: int) -> None:
    client = redis.Redis.from_url(url)
    for engine in engines:
        rates: dict[bool, list[float]] = {False: [], True: []}
        for round_no in range(rounds):
            for instrumented in (False, True) if round_no % 2 == 0 else (True, False):
                name = f"bench-metrics-{secrets.token_hex(3)}"
                elector = redlease.Elector(client, name, engine=engine)
                if instrumented:
                    redlease.metrics.instrument(elector, prometheus_client.CollectorRegistry())
                writes = 0
                start = time.monotonic()
                while time.monotonic() - start < 1.5:
                    for _ in range(100):
                        elector.fence_set(1, f"{name}:v", writes)
                        writes += 1
                rates[instrumented].append(writes / (time.monotonic() - start))
                client.delete(f"{name}:v", f"{name}:fence:applied")
        for instrumented in (False, True):
            values = rates[instrumented]
            label = "instrumented" if instrumented else "plain"
            windows = " ".join(f"{v:,.0f}" for v in values)
            median = sorted(values)[len(values) // 2]
            print(f"{engine:<8}{label:<14}median {median:>9,.0f} writes/s   windows: {windows}")
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis", default=None, help="a server URL (default: a private one)")
    parser.add_argument("--writes-only", action="store_true")
    args = parser.parse_args()

    engines = ["native", "python"] if native_engine_available()[0] else ["python"]
    gil_n = gil_call_size()
    server = None
    url = args.redis
    if url is None:
        server = RedisServer()
        server.start()
        url = server.url
    if args.writes_only:
        try:
            writes_only(url, engines, args.rounds)
        finally:
            if server is not None:
                server.stop()
        return 0
    try:
        late: dict[tuple[str, bool], list[float]] = {}
        rates: dict[tuple[str, bool], list[float]] = {}
        kept: dict[tuple[str, bool], bool] = {}
        for round_no in range(args.rounds):
            for engine in engines:
                for instrumented in (False, True) if round_no % 2 == 0 else (True, False):
                    label = "instrumented" if instrumented else "plain"
                    print(f"round {round_no + 1}: {engine}, {label}", file=sys.stderr, flush=True)
                    samples, rate, held = one_window(
                        url, engine, instrumented, args.seconds, gil_n
                    )
                    late.setdefault((engine, instrumented), []).extend(samples)
                    rates.setdefault((engine, instrumented), []).append(rate)
                    kept[(engine, instrumented)] = kept.get((engine, instrumented), True) and held
    finally:
        if server is not None:
            server.stop()

    print(
        f"metrics overhead: gil load (~200 ms GIL holds), renewal every {INTERVAL * 1000:g} ms, "
        f"{args.rounds} rounds x {args.seconds:g} s, scraped every 0.5 s when instrumented"
    )
    print(f"{'':<12}{'':<14}{'renewals':>9}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}"
          f"{'writes/s':>10}{'lease':>7}")
    for engine in engines:
        for instrumented in (False, True):
            key = (engine, instrumented)
            ms = [s * 1000 for s in late[key]]
            rate = sum(rates[key]) / len(rates[key])
            print(
                f"{engine:<12}{'instrumented' if instrumented else 'plain':<14}{len(ms):>9}"
                f"{percentile(ms, 50):>9.3f}{percentile(ms, 99):>9.3f}{max(ms):>9.3f}"
                f"{rate:>10,.0f}{'kept' if kept[key] else 'LOST':>7}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
