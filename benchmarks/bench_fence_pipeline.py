"""Fenced pipelines and the Python CPU of one fenced write, measured side by side in one run.

    python benchmarks/bench_fence_pipeline.py [--batch N] [--seconds S] [--rounds R] [--writes W]
                                              [--unix]

One private redis-server on loopback TCP (``--unix``: on a unix socket,
where the kernel's share of a round trip is much smaller). Three tables:

1. Pipelines of ``--batch`` fenced SETs (default 100), built and executed
   back to back from one thread through the public API
   (``Elector.fence_pipeline(token).set(...)...execute()``, and again with
   the writes queued by one ``set_many``) on each engine,
   against redis-py's own pipeline (``transaction=False``) of the same
   EVALSHAs of the same script, hiredis parser when installed. Fenced
   writes per second (batches/s x batch size) and the ratio to redis-py;
   the best of ``--rounds`` rounds (a shared machine only ever makes a
   round slower).
2. The same from one asyncio task (``await pipe.execute()``, one hop to
   a worker thread per batch) against ``redis.asyncio``'s pipeline.
3. Python CPU per single fenced write (``Elector.fence_set``, sync, one
   thread): ``time.process_time()`` over ``--writes`` writes (default
   100,000) divided by their number, on each engine and for redis-py's
   ``evalsha``. process_time counts this process's user and system time
   in every thread: encoding, the GIL hand-offs, and the kernel's share of
   send/poll/recv (the table splits the two with ``getrusage``). The
   server's work is in its own process, not here.

Tables 1 and 3 carry the host's limit, ``raw socket``: the same EVALSHAs
encoded once before the round, written to a plain blocking socket and
their replies counted by their bytes (each is ``:1``), nothing parsed. No client that sends these
writes over a socket and reads their replies does less work than that, so
what it measures is what this host's loopback, kernel and redis-server
allow; the clients' figures are best read against it.

Prints the tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import time
from collections.abc import Awaitable, Callable

import redis
import redis.utils

import redlease
from redlease import _scripts
from redlease._cli.bench import native_engine_available
from redlease._keys import ElectionKeys
from redlease._testing import RedisServer

NAME = "bench"
TOKEN = 1
RAW = "raw socket"


def pipeline_op(e: redlease.Elector, batch: int) -> Callable[[], object]:
    keys = [f"{NAME}:value:{i}" for i in range(batch)]

    def op() -> object:
        pipe = e.fence_pipeline(TOKEN)
        for key in keys:
            pipe.set(key, "value")
        return pipe.execute()

    return op


def pipeline_many_op(e: redlease.Elector, batch: int) -> Callable[[], object]:
    """``pipeline_op`` through the bulk method: ``set_many`` of the same writes."""
    items = {f"{NAME}:value:{i}": "value" for i in range(batch)}

    def op() -> object:
        return e.fence_pipeline(TOKEN).set_many(items).execute()

    return op


def redis_py_pipeline_op(client: redis.Redis, batch: int) -> Callable[[], object]:
    script = _scripts.fenced_file("fence_set")
    client.script_load(script.source)
    applied = ElectionKeys(NAME).applied
    keys = [f"{NAME}:value:{i}" for i in range(batch)]

    def op() -> object:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.evalsha(script.sha, 2, applied, key, TOKEN, "value")
        return pipe.execute()

    return op


class RawSocket:
    """The host's limit: pre-encoded EVALSHAs on a blocking socket, replies counted by bytes.

    Every write of it applies, so every reply is ``:1``: the socket counts
    the bytes it reads into one buffer made once, and parses nothing. That is
    all a client cannot avoid (one send, reading the replies off the socket);
    ``check`` compares what the last call read with the replies it counted.
    """

    REPLY = b":1\r\n"

    def __init__(self, server: RedisServer, keys: list[str]) -> None:
        sha = _scripts.fenced_file("fence_set").sha
        applied = ElectionKeys(NAME).applied
        self.requests = b"".join(
            encode([b"EVALSHA", sha, b"2", applied, key, b"%d" % TOKEN, b"value"]) for key in keys
        )
        self.count = len(keys)
        self.want = self.count * len(self.REPLY)
        self.buffer = bytearray(max(self.want, 65536))
        self.view = memoryview(self.buffer)
        if server.unix_path is not None:
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.connect(server.unix_path)
        else:
            self.sock = socket.create_connection(server.address)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def op(self) -> object:
        self.sock.sendall(self.requests)
        got, want, view, recv_into = 0, self.want, self.view, self.sock.recv_into
        while got < want:
            n = recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the server closed the connection")
            got += n
        return self.count

    def check(self) -> None:
        """Raise unless the last call read exactly one ``:1`` reply per write."""
        if bytes(self.buffer[: self.want]) != self.REPLY * self.count:
            head = bytes(self.buffer[:64])
            raise RuntimeError(f"the raw socket read {head!r}..., not :1 replies")

    def close(self) -> None:
        self.sock.close()


def encode(parts: list[str | bytes]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def async_rates(
    server: RedisServer, engines: list[str], batch: int, seconds: float, rounds: int
) -> dict[str, float]:
    """Fenced writes/s of ``await pipe.execute()`` per engine and of redis.asyncio's pipeline."""
    import redis.asyncio

    import redlease.aio

    script = _scripts.fenced_file("fence_set")
    applied = ElectionKeys(NAME).applied
    keys = [f"{NAME}:value:{i}" for i in range(batch)]

    async def measure() -> dict[str, float]:
        client = (
            redis.asyncio.Redis(unix_socket_path=server.unix_path)
            if server.unix_path is not None
            else redis.asyncio.Redis(host="127.0.0.1", port=server.port)
        )
        await client.script_load(script.source)
        ops: dict[str, Callable[[], Awaitable[object]]] = {}
        for name in engines:
            e = redlease.aio.Elector(client, NAME, engine=name)

            async def fenced(e: redlease.aio.Elector = e) -> object:
                pipe = e.fence_pipeline(TOKEN)
                for key in keys:
                    pipe.set(key, "value")
                return await pipe.execute()

            ops[name] = fenced

        async def plain() -> object:
            pipe = client.pipeline(transaction=False)
            for key in keys:
                pipe.evalsha(script.sha, 2, applied, key, TOKEN, "value")
            return await pipe.execute()

        ops["redis.asyncio"] = plain
        rates: dict[str, float] = {}
        for name, op in ops.items():
            for _ in range(20):
                await op()
            best = 0.0
            for _ in range(rounds):
                calls = 0
                start = time.perf_counter()
                now = start
                while now < start + seconds:
                    await op()
                    calls += 1
                    now = time.perf_counter()
                best = max(best, calls * batch / (now - start))
            rates[name] = best
        await client.aclose()
        return rates

    return asyncio.run(measure())


def best_rate(op: Callable[[], object], per_call: int, seconds: float, rounds: int) -> float:
    """Writes per second of the best round of ``op`` called back to back."""
    for _ in range(20):
        op()
    best = 0.0
    for _ in range(rounds):
        calls = 0
        start = time.perf_counter()
        stop = start + seconds
        now = start
        while now < stop:
            op()
            calls += 1
            now = time.perf_counter()
        best = max(best, calls * per_call / (now - start))
    return best


def cpu_per_call_us(op: Callable[[], object], n: int, rounds: int) -> tuple[float, float, float]:
    """This process's CPU per call of ``op`` in microseconds, best of ``rounds`` x ``n`` calls.

    ``(total, user, system)``: total is ``time.process_time()``; the split
    between user and kernel time is ``getrusage``'s for the same round.
    """
    for _ in range(1000):
        op()
    best = (float("inf"), 0.0, 0.0)
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.process_time()
        for _ in range(n):
            op()
        total = time.process_time() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        user = after.ru_utime - before.ru_utime
        system = after.ru_stime - before.ru_stime
        best = min(best, (total / n * 1e6, user / n * 1e6, system / n * 1e6))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100, help="fenced writes per pipeline")
    parser.add_argument("--seconds", type=float, default=1.0, help="length of one round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per contender")
    parser.add_argument("--writes", type=int, default=100_000, help="writes for the CPU table")
    parser.add_argument("--unix", action="store_true", help="talk to redis-server on a unix socket")
    opts = parser.parse_args()
    transport = "unix socket" if opts.unix else "TCP loopback"

    native_ok, why = native_engine_available()
    engines = ["native", "python"] if native_ok else ["python"]
    with RedisServer(unix=opts.unix) as server:
        client = server.client()
        electors = {name: redlease.Elector(client, NAME, engine=name) for name in engines}

        rates: dict[str, float] = {}
        for name, e in electors.items():
            op = pipeline_op(e, opts.batch)
            rates[name] = best_rate(op, opts.batch, opts.seconds, opts.rounds)
            op = pipeline_many_op(e, opts.batch)
            rates[f"{name} set_many"] = best_rate(op, opts.batch, opts.seconds, opts.rounds)
        rates["redis-py"] = best_rate(
            redis_py_pipeline_op(client, opts.batch), opts.batch, opts.seconds, opts.rounds
        )
        raw = RawSocket(server, [f"{NAME}:value:{i}" for i in range(opts.batch)])
        rates[RAW] = best_rate(raw.op, opts.batch, opts.seconds, opts.rounds)
        raw.check()
        raw.close()

        arates = async_rates(server, engines, opts.batch, opts.seconds, opts.rounds)

        cpu: dict[str, tuple[float, float, float]] = {}
        for name, e in electors.items():
            cpu[name] = cpu_per_call_us(
                lambda e=e: e.fence_set(TOKEN, f"{NAME}:one", "v"), opts.writes, opts.rounds
            )
        script = _scripts.fenced_file("fence_set")
        applied = ElectionKeys(NAME).applied
        cpu["redis-py"] = cpu_per_call_us(
            lambda: client.evalsha(script.sha, 2, applied, f"{NAME}:one", TOKEN, "v"),
            opts.writes,
            opts.rounds,
        )
        raw = RawSocket(server, [f"{NAME}:one"])
        cpu[RAW] = cpu_per_call_us(raw.op, opts.writes, opts.rounds)
        raw.close()
        client.close()

    parser_name = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "pure-Python parser"
    if not native_ok:
        print(f"native engine unavailable: {why}")
    print(f"pipelines of {opts.batch} fenced SETs, one thread, {transport}")
    print(f"redis-py with {parser_name}")
    print(f"best of {opts.rounds} rounds x {opts.seconds:g} s\n")
    header = f"{'contender':<18}{'fenced writes/s':>17}{'vs redis-py':>13}"
    print(header)
    print("-" * len(header))
    for name, rate in rates.items():
        print(f"{name:<18}{rate:>17,.0f}{rate / rates['redis-py']:>12.2f}x")
    print(f"\nasyncio, one task: await pipe.execute() of {opts.batch} fenced SETs\n")
    header = f"{'contender':<14}{'fenced writes/s':>17}{'vs redis.asyncio':>18}"
    print(header)
    print("-" * len(header))
    for name, rate in arates.items():
        print(f"{name:<14}{rate:>17,.0f}{rate / arates['redis.asyncio']:>17.2f}x")
    print(f"\nPython CPU per single fenced write, {transport}")
    print(f"best of {opts.rounds} rounds x {opts.writes:,} writes, time.process_time()\n")
    header = f"{'contender':<12}{'CPU us/write':>14}{'user':>8}{'kernel':>8}"
    print(header)
    print("-" * len(header))
    for name, (total, user, system) in cpu.items():
        print(f"{name:<12}{total:>14.1f}{user:>8.1f}{system:>8.1f}")


if __name__ == "__main__":
    main()
