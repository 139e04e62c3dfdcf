"""Renew lateness per engine under three loads, seen from both ends.

    python benchmarks/renew_lateness.py [--seconds S] [--interval S] [--redis URL]

For each engine and each load (idle; a pure-Python busy loop; repeated
~200 ms C calls that hold the GIL) an Elector leads with a short renew
interval while the main thread runs the load. Lateness is measured twice:

- by the renewer itself (send time minus scheduled time, its own clock);
- by the server: MONITOR timestamps of the renewal commands as Redis received
  them; each gap between two arrivals beyond one renew interval is late.

The server's view is the one that matters to the lease and cannot be
flattered by the renewer's clock. The window is measured as ``redlease bench``
measures it (``redlease._cli.bench.lateness_under_load``); this script runs
every load and prints a grid. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import redis

import redlease
from redlease._cli.bench import (
    gil_call_size,
    lateness_under_load,
    native_engine_available,
    percentile,
    wait_for_token,
)
from redlease._testing import RedisServer

LOADS = ("idle", "python", "gil")
TTL = 2.0


@dataclass
class Row:
    engine: str
    load: str
    own: list[float]
    server: list[float]
    kept: bool
    errors: int


def measure(url: str, engine: str, load: str, seconds: float, interval: float, gil_n: int) -> Row:
    client = redis.Redis.from_url(url)
    name = f"bench-lateness-{engine}-{load}"
    errors: list[Exception] = []
    elector = redlease.Elector(
        client,
        name,
        ttl=TTL,
        renew_interval=interval,
        engine=engine,
        observer=redlease.Observer(on_error=errors.append),
    )
    with elector:
        token = wait_for_token(elector, timeout=5.0)
        window = lateness_under_load(
            elector, token, redis.Redis.from_url(url), load, seconds, gil_n
        )
    client.close()
    return Row(engine, load, window.own, window.server or [], window.kept, len(errors))


def _fmt(samples: list[float]) -> str:
    if not samples:
        return f"{'-':>8} {'-':>8} {'-':>8}"
    ms = [s * 1000 for s in samples]
    return f"{percentile(ms, 50):8.2f} {percentile(ms, 99):8.2f} {max(ms):8.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--redis", help="a Redis URL; default: a private redis-server")
    args = parser.parse_args()

    engines = ["python"] + (["native"] if native_engine_available()[0] else [])
    server = None
    url = args.redis
    if url is None:
        server = RedisServer().start()
        url = server.url
    try:
        gil_n = gil_call_size()
        rows = [
            measure(url, engine, load, args.seconds, args.interval, gil_n)
            for load in LOADS
            for engine in engines
        ]
    finally:
        if server is not None:
            server.stop()

    print(
        f"renew lateness in ms, renew interval {args.interval * 1000:g} ms, {args.seconds:g} s "
        f"per cell (own = the renewer's clock, server = MONITOR arrival times)"
    )
    print(
        f"{'load':<7} {'engine':<7} {'own p50':>8} {'own p99':>8} {'own max':>8}  "
        f"{'srv p50':>8} {'srv p99':>8} {'srv max':>8}  {'arrived':>7} {'errors':>6}  lease"
    )
    for row in rows:
        print(
            f"{row.load:<7} {row.engine:<7} {_fmt(row.own)}  {_fmt(row.server)}  "
            f"{len(row.server) + 1 if row.server else 0:>7} {row.errors:>6}  "
            f"{'kept' if row.kept else 'LOST'}"
        )
    print(
        "arrived = renewals the server received in the window; errors = renewals that "
        "failed (a renewal's timeout is the renew interval); LOST = the term ended"
    )
    by = {(r.engine, r.load): r for r in rows}
    if "native" in engines:
        print("\nratio python/native under each load (server p50, server p99):")
        for load in LOADS:
            py, nat = by[("python", load)], by[("native", load)]
            if py.server and nat.server:
                # Below 50 us the gap is noise: floor the divisor there ("at least").
                p50 = percentile(py.server, 50) / max(percentile(nat.server, 50), 5e-5)
                p99 = percentile(py.server, 99) / max(percentile(nat.server, 99), 5e-5)
                print(f"  {load:<7} p50 >= x{p50:,.0f}  p99 >= x{p99:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
