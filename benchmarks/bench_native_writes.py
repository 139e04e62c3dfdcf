"""Fenced-write throughput on one connection: native engine vs redis-py vs a raw socket.

    python benchmarks/bench_native_writes.py [--seconds S] [--rounds N] [--unix]

Every contender runs the same fenced SET script (``lua/fence_guard.lua`` +
``fence_set.lua`` + ``fence_epilogue.lua``) back to back from one thread on
one connection to a private redis-server it starts (loopback TCP, or a unix
socket with ``--unix``):

- ``native``: ``NativeEngine.run`` (encode in Cython, round trip without the GIL);
- ``redis-py``: ``redis.Redis.evalsha`` with the hiredis parser when installed;
- ``python engine``: ``PythonEngine.run``, the pure-Python engine's write path;
- ``raw socket``: a pre-encoded EVALSHA through ``socket.sendall``/``recv``,
  the floor for any client that waits for each reply.

Each contender runs ``--rounds`` times; the best round is reported (a shared
machine only ever makes a round slower). Prints a table; asserts nothing.

Unlike the other benchmarks, which measure through the public API, this one drives
the engines' write paths and the native core directly (``redlease._engine``):
the per-call cost of the core is what it measures, without the Elector's
argument checks in front of it.
"""

from __future__ import annotations

import argparse
import socket
from collections.abc import Callable

import redis
import redis.utils

from redlease._engine._native import _probe
from redlease._engine.conn.client import Endpoint
from redlease._engine.engines.native import NativeEngine
from redlease._keys import ElectionKeys
from redlease._scripts import fenced_file
from redlease._testing import RedisServer
from timing import time_calls


def raw_socket_writer(server: RedisServer, unix: bool, command: bytes) -> Callable[[], object]:
    if unix:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(server.unix_path))
    else:
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sendall, recv = sock.sendall, sock.recv

    def op() -> object:
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
    keys = [ElectionKeys("bench").applied, "bench:value"]
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
        contenders: list[tuple[str, Callable[[], object]]] = [
            ("native", lambda: native.execute(((script, keys, args),))),
            ("redis-py", lambda: client.evalsha(script.sha, 2, *keys, *args)),
        ]
        try:
            from redlease._engine.engines.python import PythonEngine

            python = PythonEngine(client)
            contenders.append(("python engine", lambda: python.execute(((script, keys, args),))))
        except ImportError:
            pass
        raw = _probe.encode_command(["EVALSHA", script.sha, len(keys), *keys, *args])
        contenders.append(("raw socket", raw_socket_writer(server, opts.unix, raw)))

        results = [time_calls(name, op, opts.seconds, opts.rounds) for name, op in contenders]
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
        print(
            f"{r.name:<15}{r.rate:>11,.0f}{r.mean_us():>10.1f}{r.percentile_us(50):>9.1f}"
            f"{r.percentile_us(99):>9.1f}{r.rate / base:>12.2f}x"
        )


if __name__ == "__main__":
    main()
