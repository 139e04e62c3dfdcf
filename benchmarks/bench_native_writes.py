"""Fenced-write throughput on one connection: native engine vs redis-py vs a raw socket.

    python benchmarks/bench_native_writes.py [--seconds S] [--rounds N] [--unix]

Every contender runs the same fenced SET script (``lua/fence_guard.lua`` +
``fence_set.lua`` + ``fence_epilogue.lua``) back to back from one thread on
one connection to a private redis-server it starts (loopback TCP, or a unix
socket with ``--unix``):

- ``native``: ``NativeEngine.write`` (encode in Cython, round trip without the GIL);
- ``redis-py``: ``redis.Redis.evalsha`` with the hiredis parser when installed;
- ``python engine``: ``PythonEngine.write``, the pure-Python engine's write path;
- ``raw socket``: a pre-encoded EVALSHA through ``socket.sendall``/``recv``,
  the floor for any client that waits for each reply.

Each contender runs ``--rounds`` times; the best round is reported (a shared
machine only ever makes a round slower). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
import redis.utils

from redlease._engine._native import _core as _native
from redlease._engine.client import Endpoint
from redlease._engine.native import NativeEngine
from redlease._scripts import fenced_file
from redlease._testing import RedisServer


@dataclass
class Result:
    name: str
    ops: int
    seconds: float
    latencies_ns: list[int]

    @property
    def rate(self) -> float:
        return self.ops / self.seconds

    def percentile_us(self, q: float) -> float:
        ordered = sorted(self.latencies_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def measure(name: str, op: Callable[[int], object], seconds: float, rounds: int) -> Result:
    """Run ``op`` back to back for ``seconds``, ``rounds`` times; the best round."""
    for i in range(200):  # warm up: connect, load the script, fill caches
        op(i)
    best: Result | None = None
    clock = time.perf_counter_ns
    for _ in range(rounds):
        latencies: list[int] = []
        record = latencies.append
        start = clock()
        stop = start + int(seconds * 1e9)
        i = 0
        now = start
        while now < stop:
            op(i)
            after = clock()
            record(after - now)
            now = after
            i += 1
        result = Result(name, i, (now - start) / 1e9, latencies)
        if best is None or result.rate > best.rate:
            best = result
    assert best is not None
    return best


def raw_socket_writer(server: RedisServer, unix: bool, command: bytes) -> Callable[[int], object]:
    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(server.unix_path))
    else:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sendall, recv = sock.sendall, sock.recv

    def op(_: int) -> object:
        sendall(command)
        reply = recv(64)
        while not reply.endswith(b"\r\n"):
            reply += recv(64)
        return reply

    return op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender")
    parser.add_argument("--unix", action="store_true", help="use a unix socket, not TCP")
    opts = parser.parse_args()

    script = fenced_file("fence_set")
    keys = ["bench:fence:applied", "bench:value"]
    args = [1, "value"]

    with RedisServer(unix=opts.unix) as server:
        client = server.client()
        client.script_load(script.source)
        endpoint = Endpoint(
            host=None if opts.unix else "127.0.0.1",
            port=server.port or 0,
            path=str(server.unix_path) if opts.unix else None,
            db=0,
            username=None,
            password=None,
            client_name=None,
        )
        native = NativeEngine(endpoint, write_timeout=5.0)
        contenders: list[tuple[str, Callable[[int], object]]] = [
            ("native", lambda i: native.write(script, keys, args)),
            ("redis-py", lambda i: client.evalsha(script.sha, 2, *keys, *args)),
        ]
        try:
            from redlease._engine.python import PythonEngine

            python = PythonEngine(client)
            contenders.append(("python engine", lambda i: python.write(script, keys, args)))
        except ImportError:
            pass
        raw = _native._encode_command(["EVALSHA", script.sha, len(keys), *keys, *args])
        contenders.append(("raw socket", raw_socket_writer(server, opts.unix, raw)))

        results = [measure(name, op, opts.seconds, opts.rounds) for name, op in contenders]
        native.close()
        client.close()

    parser_name = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python parser"
    transport = "unix socket" if opts.unix else "TCP loopback"
    print(f"fenced SET, one thread, one connection, {transport}; redis-py with {parser_name}")
    print(f"best of {opts.rounds} rounds x {opts.seconds:g} s\n")
    base = next(r for r in results if r.name == "redis-py").rate
    header = (
        f"{'contender':<15}{'writes/s':>11}{'mean us':>10}{'p50 us':>9}{'p99 us':>9}"
        f"{'vs redis-py':>13}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        mean = statistics.fmean(r.latencies_ns) / 1000
        print(
            f"{r.name:<15}{r.rate:>11,.0f}{mean:>10.1f}{r.percentile_us(0.5):>9.1f}"
            f"{r.percentile_us(0.99):>9.1f}{r.rate / base:>12.2f}x"
        )


if __name__ == "__main__":
    main()
