"""Fenced writes/s from asyncio tasks and from threads: redlease's engines vs redis-py.

    python benchmarks/bench_aio_writes.py [--seconds S] [--rounds N] [--tasks N] [--threads N]

Every contender runs the same fenced SET script (``lua/fence_guard.lua`` +
``fence_set.lua`` + ``fence_epilogue.lua``) against one private redis-server
on loopback TCP, through the public API:

- asyncio, ``--tasks`` tasks on one loop, and 1 task: ``aio.Fencer.set`` on
  the native and the Python engine vs ``redis.asyncio.Redis.evalsha`` (its
  pool, one connection per concurrent task);
- sync, ``--threads`` threads sharing one ``Elector``: ``Fencer.set`` on both
  engines vs ``redis.Redis.evalsha`` from the same threads sharing one client;
  and the native engine once more with 4 write connections (the size before
  8), to show what the pool size is worth;
- the native keeper's renew lateness (p99, its own clock) while the asyncio
  ``--tasks`` load runs on the native engine, renewing every 50 ms;
- the limit of any client that waits on the event loop, for 1 task: the
  same EVALSHA pre-encoded once, sent on a bare socket that the loop watches
  (``add_reader``), one future per write, nothing parsed.

Rounds are interleaved (round 1 of every contender, then round 2...; each
round's order rotated, so that none always goes first) and the best round
of each kept, since a shared machine only ever makes a round
slower; ratios are to redis-py in the same run. The asyncio rounds are also
printed one by one with each round's ratio and the median of those ratios
(``--asyncio-only`` skips the threaded rows). With one task a round is a
string of loopback round trips, and its rate depends mostly on whether the
scheduler put this process and redis-server on one CPU or on two (about 4x
apart here); ``--pin`` fixes that choice for every round. Prints tables;
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import socket
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import redis
import redis.asyncio

import redlease
import redlease.aio
from redlease._cli.bench import LatenessWindow, native_engine_available, percentile
from redlease._cli.writers import async_rate
from redlease._engine.engines import native as native_engine
from redlease._scripts import fenced_file
from redlease._testing import RedisServer

NAME = "bench-aio"
SCRIPT = fenced_file("fence_set")
KEYS = (f"{NAME}:fence:applied", f"{NAME}:value")

AsyncOp = Callable[[int], Awaitable[object]]
NATIVE_4 = "native, 4 connections"
BARE = "bare asyncio socket"
T = TypeVar("T")


class BareLoopSocket:
    """One task's limit on an event loop: pre-encoded EVALSHA, ``add_reader``, a future each.

    Only for one write in flight: whatever arrives answers the write waiting.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, port: int, applied: str) -> None:
        parts = [b"EVALSHA", SCRIPT.sha.encode(), b"2", applied.encode(), KEYS[1].encode()]
        parts += [b"1", b"5"]
        self.request = b"*%d\r\n" % len(parts) + b"".join(
            b"$%d\r\n%s\r\n" % (len(p), p) for p in parts
        )
        self.loop = loop
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.waiting: asyncio.Future[bytes] | None = None
        loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        reply = self.sock.recv(65536)
        waiting, self.waiting = self.waiting, None
        if waiting is not None and not waiting.done():
            waiting.set_result(reply)

    def write(self, n: int) -> asyncio.Future[bytes]:
        self.sock.send(self.request)
        self.waiting = self.loop.create_future()
        return self.waiting

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


def turn_order(names: Sequence[T], turn: int) -> list[T]:
    """The order the contenders ``names`` take in turn number ``turn``: each starts one in turn.

    Whoever goes first follows whatever ran before (another case's heavier
    load: its garbage, its server-side clean-up); in a fixed order one
    contender would always pay for that and the others never. Rotated, each
    does in an equal share of turns, and its best turn is a fair one.
    """
    k = turn % len(names) if names else 0
    return [*names[k:], *names[:k]]


def thread_rate(op: Callable[[int], object], threads: int, seconds: float) -> float:
    """Writes/s of ``threads`` threads each calling ``op`` back to back for ``seconds``."""
    counts = [0] * threads
    barrier = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        barrier.wait()
        stop = time.perf_counter() + seconds
        n = 0
        while time.perf_counter() < stop:
            op(n)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - start)


async def wait_token(e: redlease.aio.Elector) -> int:
    deadline = time.monotonic() + 10
    while (token := e.token()) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{e!r} was not elected")
        await asyncio.sleep(0.01)
    return token


async def asyncio_rows(
    server: RedisServer,
    engines: list[str],
    tasks: int,
    seconds: float,
    rounds: int,
    turn: float | None = None,
) -> tuple[dict[str, dict[int, list[float]]], list[float]]:
    """Every round's writes/s per contender and task count; the native renew lateness samples.

    ``turn``: each round is cut into turns of about this many seconds, every
    contender's turn after the other's (a figure per turn), so that load from
    elsewhere falls on all of them alike.
    """
    aclient = redis.asyncio.Redis(
        host="127.0.0.1", port=server.port, socket_timeout=5, max_connections=tasks + 8
    )
    await aclient.script_load(SCRIPT.source)
    electors = {
        engine: redlease.aio.Elector(
            redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5),
            f"{NAME}-{engine}",
            ttl=1.0,
            renew_interval=0.05,
            engine=engine,
        ).start()
        for engine in engines
    }
    ops: dict[str, AsyncOp] = {}
    for engine, e in electors.items():
        fencer = redlease.aio.Fencer(e, await wait_token(e))
        # C-level calls in front, as the bare socket's bound method is: no frame
        # of the benchmark's own is counted against a contender.
        ops[engine] = functools.partial(fencer.set, f"{NAME}-{engine}:value")
    applied = f"{NAME}-redis:fence:applied"
    await aclient.set(applied, 1)
    ops["redis.asyncio"] = functools.partial(aclient.evalsha, SCRIPT.sha, 2, applied, KEYS[1], 1)
    assert server.port is not None, "the benchmark's server listens on TCP"
    bare = BareLoopSocket(asyncio.get_running_loop(), server.port, applied)
    ops[BARE] = bare.write

    every: dict[str, dict[int, list[float]]] = {name: {tasks: [], 1: []} for name in ops}
    lateness: list[float] = []
    turns = max(1, round(seconds / turn)) if turn else 1
    for n in range(rounds * turns):
        for count in (tasks, 1):
            for name in turn_order([c for c in ops if count == 1 or c != BARE], n):
                op = ops[name]
                if turns == 1 or not every[name][count]:
                    await async_rate(op, count, 0.05)  # connect, warm up
                window = None
                if name == "native" and count == tasks:
                    native = electors["native"]
                    window = LatenessWindow(native.renew_lateness, native.renew_lateness_count)
                rate = await async_rate(op, count, seconds / turns)
                if window is not None:
                    lateness.extend(window.take())
                every[name][count].append(rate)
    for e in electors.values():
        await e.stop()
    bare.close()
    await aclient.aclose()
    return every, lateness


def sync_elector(server: RedisServer, name: str, engine: str) -> redlease.Elector:
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    return redlease.Elector(client, name, ttl=1.0, engine=engine).start()


def sync_rows(
    server: RedisServer, engines: list[str], threads: int, seconds: float, rounds: int
) -> dict[str, list[float]]:
    """Every round's writes/s per contender."""
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    client.script_load(SCRIPT.source)
    electors = {engine: sync_elector(server, f"{NAME}-sync-{engine}", engine) for engine in engines}
    if "native" in engines:
        size = native_engine.WRITE_CONNECTIONS
        native_engine.WRITE_CONNECTIONS = 4  # read when the engine is made
        try:
            electors[NATIVE_4] = sync_elector(server, f"{NAME}-sync-native4", "native")
        finally:
            native_engine.WRITE_CONNECTIONS = size
    ops: dict[str, Callable[[int], object]] = {}
    for engine, e in electors.items():
        deadline = time.monotonic() + 10
        while (token := e.token()) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert token is not None, f"{e!r} was not elected"
        fencer = redlease.Fencer(e, token)
        ops[engine] = lambda n, fencer=fencer, key=f"{NAME}-sync-{engine}:value": fencer.set(key, n)
    applied = f"{NAME}-sync-redis:fence:applied"
    client.set(applied, 1)
    ops["redis-py"] = lambda n: client.evalsha(SCRIPT.sha, 2, applied, KEYS[1], 1, n)
    rates: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, op in ops.items():
            thread_rate(op, threads, 0.05)
            rates[name].append(thread_rate(op, threads, seconds))
    for e in electors.values():
        e.stop()
    client.close()
    return rates


def print_rounds(
    every: dict[str, dict[int, list[float]]], engines: list[str], counts: tuple[int, ...]
) -> None:
    """Each asyncio round's writes/s with its ratio to redis.asyncio, and the median ratios."""
    print("\nasyncio rounds in turn, writes/s (ratio to redis.asyncio in that round):")
    for count in counts:
        base = every["redis.asyncio"][count]
        tasks = f"{count} task{'s' if count > 1 else ''}"
        for engine in engines:
            rates = every[engine][count]
            ratios = [rate / b for rate, b in zip(rates, base, strict=True)]
            cells = "  ".join(
                f"{rate:,.0f} ({r:.2f}x)" for rate, r in zip(rates, ratios, strict=True)
            )
            print(f"  {tasks}, {engine}: {cells}")
            print(
                f"    median {statistics.median(rates):,.0f} writes/s, ratio median "
                f"{statistics.median(ratios):.2f}x (min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
            )
        print(
            f"  {tasks}, redis.asyncio: median {statistics.median(base):,.0f} writes/s "
            f"(min {min(base):,.0f}, max {max(base):,.0f})"
        )
        if every[BARE][count]:
            rates = every[BARE][count]
            ratios = [rate / b for rate, b in zip(rates, base, strict=True)]
            print(
                f"  {tasks}, {BARE} (the limit): median {statistics.median(rates):,.0f} "
                f"writes/s, ratio median {statistics.median(ratios):.2f}x "
                f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent asyncio tasks")
    parser.add_argument("--threads", type=int, default=8, help="threads sharing one Elector")
    parser.add_argument(
        "--asyncio-only", action="store_true", help="skip the threaded (sync) contenders"
    )
    parser.add_argument(
        "--pin",
        metavar="CLIENT,SERVER",
        help="run this process on CPU CLIENT and redis-server on CPU SERVER (Linux): "
        "0,1 keeps them apart, as the scheduler does on an idle host; 0,0 together",
    )
    opts = parser.parse_args()
    engines = ["native", "python"] if native_engine_available()[0] else ["python"]

    with RedisServer() as server:
        if opts.pin:
            # One round trip crosses CPUs or not: pinned, every round of every
            # contender does the same, where unpinned rounds flip between both.
            client_cpu, server_cpu = (int(cpu) for cpu in opts.pin.split(","))
            os.sched_setaffinity(0, {client_cpu})
            os.sched_setaffinity(server.pid, {server_cpu})
        aio_every, lateness = asyncio.run(
            asyncio_rows(server, engines, opts.tasks, opts.seconds, opts.rounds)
        )
        sync_rounds = (
            {}
            if opts.asyncio_only
            else sync_rows(server, engines, opts.threads, opts.seconds, opts.rounds)
        )
    sync_best = {name: max(rates) for name, rates in sync_rounds.items()}

    print(f"fenced SET writes/s, TCP loopback, best of {opts.rounds} rounds x {opts.seconds:g} s")
    if opts.pin:
        print(f"client and server pinned to CPUs {opts.pin}")
    print("(ratio to redis-py / redis.asyncio EVALSHA of the same script, same run)\n")
    cols = [*engines, "redis-py"]
    header = f"{'case':<38}" + "".join(f"{c:>22}" for c in cols)
    print(header)
    print("-" * len(header))

    def row(case: str, rates: dict[str, float], base: float) -> None:
        cells = "".join(
            f"{f'{rates[c]:,.0f} ({rates[c] / base:.2f}x)':>22}" if c in rates else f"{'-':>22}"
            for c in cols
        )
        print(f"{case:<38}{cells}")

    for count in (opts.tasks, 1):
        rates = {c: max(aio_every[c][count]) for c in engines}
        rates["redis-py"] = max(aio_every["redis.asyncio"][count])
        tasks = f"{count} task{'s' if count > 1 else ''}"
        row(f"asyncio, {tasks} on one loop", rates, rates["redis-py"])
    if sync_best:
        row(f"sync, {opts.threads} threads sharing one Elector", sync_best, sync_best["redis-py"])
    if NATIVE_4 in sync_best:
        row(
            f"sync, {opts.threads} threads, native, 4 write conns",
            {"native": sync_best[NATIVE_4]},
            sync_best["redis-py"],
        )
    print_rounds(aio_every, engines, (opts.tasks, 1))
    if NATIVE_4 in sync_best:
        print(
            "\nsync rounds in turn, writes/s (native 8 conns | native 4 conns | redis-py), "
            "and native (8 conns) / redis-py in that round:"
        )
        ratios = []
        for i in range(opts.rounds):
            native, native4, base = (
                sync_rounds[name][i] for name in ("native", NATIVE_4, "redis-py")
            )
            ratios.append(native / base)
            print(
                f"  round {i + 1}: {native:,.0f} | {native4:,.0f} | {base:,.0f}   {ratios[-1]:.2f}x"
            )
        print(f"  median of the rounds' ratios: {statistics.median(ratios):.2f}x")
    if lateness:
        ms = sorted(x * 1000 for x in lateness)
        print(
            f"\nnative renew lateness under the {opts.tasks}-task asyncio load "
            f"({len(ms)} renewals, every 50 ms): p50 {percentile(ms, 50):.2f} ms, "
            f"p99 {percentile(ms, 99):.2f} ms, max {ms[-1]:.2f} ms"
        )


if __name__ == "__main__":
    main()
