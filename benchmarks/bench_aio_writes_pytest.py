"""pytest-benchmark suite: fenced writes from asyncio tasks per engine, vs redis.asyncio.

    pytest benchmarks/bench_aio_writes_pytest.py --benchmark-group-by=param:tasks

One timed call is a batch of fenced SETs: ``tasks`` tasks on one event loop,
each awaiting ``WRITES_PER_TASK`` writes back to back (so a batch is
``tasks * WRITES_PER_TASK`` writes), through ``aio.Fencer.set`` on each
engine or ``redis.asyncio.Redis.evalsha`` of the same script. Compare the
means within a group; ``bench_aio_writes.py`` prints the writes/s and ratios.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

import redlease.aio
from redlease._cli.bench import native_engine_available
from redlease._scripts import fenced_file
from redlease._testing import RedisServer

WRITES_PER_TASK = 16
SCRIPT = fenced_file("fence_set")


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


def _writer(
    loop: asyncio.AbstractEventLoop, server: RedisServer, case: str
) -> tuple[Callable[[int], Awaitable[object]], Callable[[], Awaitable[None]]]:
    """The write to time, and what to run once done."""
    client = redis.asyncio.Redis(
        host="127.0.0.1", port=server.port, socket_timeout=5, max_connections=128
    )
    if case == "redis.asyncio":
        applied = "bench-aio-redis:fence:applied"
        loop.run_until_complete(client.set(applied, 1))
        loop.run_until_complete(client.script_load(SCRIPT.source))

        def evalsha(n: int) -> Awaitable[object]:
            return client.evalsha(SCRIPT.sha, 2, applied, "bench-aio-redis:value", 1, n)

        return evalsha, client.aclose
    available, why = native_engine_available()
    if case == "native" and not available:
        pytest.skip(why)
    e = redlease.aio.Elector(client, f"bench-aio-{case}", ttl=2.0, engine=case)

    async def lead() -> redlease.aio.Fencer:
        e.start()
        deadline = time.monotonic() + 10
        while e.token() is None:
            assert time.monotonic() < deadline, "not elected"
            await asyncio.sleep(0.01)
        return e.fencer()

    fencer = loop.run_until_complete(lead())
    key = f"bench-aio-{case}:value"

    def fenced(n: int) -> Awaitable[object]:
        return fencer.set(key, n)

    async def done() -> None:
        await e.stop()
        await client.aclose()

    return fenced, done


@pytest.mark.parametrize("tasks", (64, 1))
@pytest.mark.parametrize("case", ("native", "python", "redis.asyncio"))
def test_fenced_set_from_tasks(
    benchmark: Any, loop: asyncio.AbstractEventLoop, server: RedisServer, case: str, tasks: int
) -> None:
    write, done = _writer(loop, server, case)

    async def task() -> None:
        for n in range(WRITES_PER_TASK):
            assert await write(n)

    async def batch() -> None:
        await asyncio.gather(*(task() for _ in range(tasks)))

    try:
        loop.run_until_complete(batch())  # connect, load the script
        benchmark(lambda: loop.run_until_complete(batch()))
    finally:
        loop.run_until_complete(done())
