"""TLS: fenced writes per second and renew lateness under a GIL hog, per engine.

    python benchmarks/bench_tls.py [--seconds S] [--rounds N] [--lateness-seconds S]

Starts a private TLS-only redis-server (certificates minted on the spot by
``redlease._testing.TLSMaterials``; needs a redis-server built with TLS and
the ``trustme`` test dependency) and measures, over TLS to it:

1. Fenced-write throughput, one thread, one connection, the same fenced SET
   script (``fence_guard`` + ``fence_set`` + ``fence_epilogue``) back to back:

   - ``native``: ``NativeEngine.run`` (OpenSSL driven without the GIL);
   - ``python engine``: ``PythonEngine.run`` on a redis-py TLS client;
   - ``redis-py``: ``redis.Redis.evalsha`` over TLS, with hiredis when installed.

   Each runs ``--rounds`` times, the contenders' rounds taken in turn (a
   burst of load from elsewhere lands on all of them alike), and each one's
   best round counts (a shared machine only ever makes a round slower).

2. Renew lateness while the main thread makes ~200 ms C calls that hold the
   GIL (``sum(range(n))``), for an Elector on each engine leading over TLS
   with a 20 ms renew interval: how late each renewal went out after its
   scheduled time (the renewer's own clock), and the gaps between renewal
   arrivals beyond one interval as the server saw them (MONITOR), measured as
   ``redlease bench`` does (``redlease._cli.bench.lateness_under_load``).

Prints a table; asserts nothing. Like ``bench_native_writes.py`` it drives
the engines' write paths directly (``redlease._engine``).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable

import redis
import redis.utils

import redlease
from redlease._cli.bench import (
    RENEW_INTERVAL,
    TTL,
    gil_call_size,
    lateness_under_load,
    percentile,
)
from redlease._engine._native import _core as _native
from redlease._engine.conn.client import native_endpoint
from redlease._engine.engines.native import NativeEngine
from redlease._engine.engines.python import PythonEngine
from redlease._keys import ElectionKeys
from redlease._scripts import fenced_file
from redlease._testing import RedisServer, ServerTLS, TLSMaterials
from timing import Timed, time_interleaved


def fenced_writes(server: RedisServer, seconds: float, rounds: int) -> list[Timed]:
    script = fenced_file("fence_set")
    keys = [ElectionKeys("bench").applied, "bench:value"]
    args = [1, "value"]
    client = server.client(socket_timeout=5)
    client.script_load(script.source)
    endpoint, why = native_endpoint(client)
    assert endpoint is not None and endpoint.tls is not None, why
    native = NativeEngine(endpoint, write_timeout=5.0)
    python = PythonEngine(client)
    contenders: list[tuple[str, Callable[[], object]]] = [
        ("native", lambda: native.execute(((script, keys, args),))),
        ("python engine", lambda: python.execute(((script, keys, args),))),
        ("redis-py", lambda: client.evalsha(script.sha, 2, *keys, *args)),
    ]
    try:
        return time_interleaved(contenders, seconds, rounds)
    finally:
        native.close()
        python.close()
        client.close()


Lateness = tuple[list[float], list[float] | None, bool]


def lateness(server: RedisServer, engine: str, seconds: float, gil_n: int) -> Lateness:
    client = server.client(socket_timeout=5)
    name = f"bench-tls-{secrets.token_hex(3)}"
    elector = redlease.Elector(client, name, ttl=TTL, renew_interval=RENEW_INTERVAL, engine=engine)
    assert elector.engine == engine, elector.engine_reason
    try:
        elector.start(None)
        deadline = time.monotonic() + 10
        while (token := elector.token()) is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"the {engine} elector was never elected over TLS")
            time.sleep(0.01)
        result = lateness_under_load(elector, token, server.client(), "gil", seconds, gil_n)
        return result.own, result.server, result.kept
    finally:
        elector.stop()
        client.close()


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="length of one write round")
    parser.add_argument("--rounds", type=int, default=9, help="write rounds per contender")
    parser.add_argument(
        "--lateness-seconds", type=float, default=5.0, help="GIL-hog window per engine"
    )
    opts = parser.parse_args()
    tls, why = _native.tls_available()
    if not tls:
        raise SystemExit(f"the native engine has no OpenSSL ({why}): nothing to compare")

    with TLSMaterials() as materials, RedisServer(tls=ServerTLS(materials)) as server:
        sys.stderr.write("bench_tls: fenced writes over TLS\n")
        writes = fenced_writes(server, opts.seconds, opts.rounds)
        gil_n = gil_call_size()
        late = {}
        for engine in ("native", "python"):
            sys.stderr.write(f"bench_tls: {engine} renew lateness under a GIL hog\n")
            late[engine] = lateness(server, engine, opts.lateness_seconds, gil_n)

    parser_name = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python parser"
    print(
        f"TLS (loopback, {_native.OPENSSL_VERSION}); redis-py {redis.__version__} "
        f"with {parser_name}"
    )
    print(f"fenced SET, one thread, one connection; best of {opts.rounds} x {opts.seconds:g} s\n")
    by_name = {r.name: r for r in writes}
    base = by_name["redis-py"].rate
    header = (
        f"{'contender':<15}{'writes/s':>11}{'mean us':>10}{'p50 us':>9}{'p99 us':>9}"
        f"{'vs redis-py':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in writes:
        print(
            f"{r.name:<15}{r.rate:>11,.0f}{r.mean_us():>10.1f}{r.percentile_us(50):>9.1f}"
            f"{r.percentile_us(99):>9.1f}{r.rate / base:>12.2f}x"
        )
    native_rate, python_rate = by_name["native"].rate, by_name["python engine"].rate
    print(f"\nnative / python engine: {native_rate / python_rate:.2f}x")

    print(
        f"\nrenew lateness, {opts.lateness_seconds:g} s of ~200 ms GIL-holding C calls, "
        f"renew every {RENEW_INTERVAL * 1000:.0f} ms, TTL {TTL:g} s (ms)\n"
    )
    header = f"{'':<28}{'native':>10}{'python':>10}"
    print(header)
    print("-" * len(header))
    def q(samples: list[float] | None, rank: float) -> str:
        if samples is None:
            return "-"  # MONITOR refused
        return ms(percentile(samples, rank) if samples else 0.0)

    rows: list[tuple[str, Callable[[str], str]]] = [
        ("renewals sent", lambda e: str(len(late[e][0]))),
        ("late by own clock p50", lambda e: q(late[e][0], 50)),
        ("late by own clock p99", lambda e: q(late[e][0], 99)),
        ("late by own clock max", lambda e: q(late[e][0], 100)),
        ("late at the server p99", lambda e: q(late[e][1], 99)),
        ("late at the server max", lambda e: q(late[e][1], 100)),
        ("lease kept", lambda e: "yes" if late[e][2] else "LOST"),
    ]
    for label, cell in rows:
        print(f"{label:<28}{cell('native'):>10}{cell('python'):>10}")


if __name__ == "__main__":
    main()
