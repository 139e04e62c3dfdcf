"""redlease.aio: the same elector with coroutines, on both engines."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from redlease._testing import RedisServer


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 30))  # type: ignore[arg-type]


def async_client(server: RedisServer) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


async def until(predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {predicate}")
        await asyncio.sleep(0.005)
    return value


def test_async_elector_elects_fences_and_releases(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.5, engine=engine)
        assert e.engine == engine
        seen: list[tuple[int, bool]] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            seen.append((term.token, await fencer.set("aio:state", "leader-wrote")))

        stop = asyncio.Event()
        task = asyncio.ensure_future(e.run(lead, stop=stop))
        await until(lambda: seen)
        stop.set()
        await task
        token, applied = seen[0]
        assert applied
        assert await client.get("aio:state") == b"leader-wrote"
        assert await client.get("aio:fence:applied") == str(token).encode()
        assert not await client.exists("aio:leader")
        await client.aclose()

    run(scenario)


def test_async_with_holds_leadership_token_driven(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.5, engine=engine)
        async with e:
            token = await until(e.token)
            assert e.is_leader()
            fencer = e.fencer()
            assert fencer and fencer.token == token
            assert await e.fence_hset(token, "aio:h", "f", 1)
            assert not await e.fence_set(token - 1, "aio:k", "stale")
            assert not await redlease.aio.Fencer(e, 0).set("aio:k", "inert")
        assert e.token() is None
        assert not e.fencer()
        assert await client.hget("aio:h", "f") == b"1"
        assert await client.get("aio:k") is None
        await client.aclose()

    run(scenario)


def test_lost_lease_cancels_the_leader_task(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.6, engine=engine)
        ended: list[str | None] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                ended.append(term.reason)
                raise

        stop = asyncio.Event()
        task = asyncio.ensure_future(e.run(lead, stop=stop))
        await until(e.token)
        await client.set("aio:leader", "thief", px=60_000)
        await until(lambda: ended, timeout=3)
        assert ended == ["lost"]
        stop.set()
        await task
        assert await client.get("aio:leader") == b"thief"
        await client.aclose()

    run(scenario)


def test_leader_exception_is_reraised_by_run(redis_server: RedisServer, engine: str) -> None:
    class Boom(Exception):
        pass

    boom = Boom("leader failed")

    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.5, engine=engine)

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            raise boom

        with pytest.raises(Boom) as info:
            await e.run(lead)
        assert info.value is boom
        assert not await client.exists("aio:leader")
        await client.aclose()

    run(scenario)


def test_blocked_event_loop_does_not_cost_the_lease(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.3, engine=engine)
        async with e:
            token = await until(e.token)
            time.sleep(1.2)  # the loop is blocked for four TTLs
            assert e.token() == token
            assert await client.get("aio:leader") == e.instance_id.encode()
        await client.aclose()

    run(scenario)


def test_already_set_stop_returns_without_touching_redis(closed_port: Any) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis(host="127.0.0.1", port=closed_port.port)
        e = redlease.aio.Elector(client, "aio", engine="python")
        stop = asyncio.Event()
        stop.set()
        started = time.monotonic()
        await e.run(None, stop=stop)
        assert time.monotonic() - started < 0.5

    run(scenario)


def test_threaded_client_is_a_config_error(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match=r"redis\.asyncio\.Redis"):
        redlease.aio.Elector(client, "aio")
    with pytest.raises(redlease.ConfigError, match="None"):
        redlease.aio.Elector(None, "aio")


def test_concurrent_run_raises(redis_server: RedisServer) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.5)
        async with e:
            with pytest.raises(RuntimeError, match="already running"):
                await e.run(None)
        await client.aclose()

    run(scenario)


def test_stop_awaited_by_the_leader_coroutine_ends_the_run(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        e = redlease.aio.Elector(client, "aio", ttl=0.5, engine=engine)
        came_back = asyncio.Event()

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            await e.stop()
            came_back.set()

        e.start(lead)
        await asyncio.wait_for(came_back.wait(), 3)
        await asyncio.wait_for(e.stop(), 3)
        assert e.token() is None
        assert not await client.exists("aio:leader")
        await client.aclose()

    run(scenario)


def test_many_started_async_electors_add_a_fixed_number_of_threads(
    redis_server: RedisServer, engine: str
) -> None:
    # Native threads count too: /proc/self/task sees them, threading does not.
    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    async def scenario() -> None:
        client = async_client(redis_server)
        warm = redlease.aio.Elector(client, "many-aio-warm", ttl=2.0, engine=engine)
        async with warm:
            await until(warm.token)
        base = threads()
        electors = [
            redlease.aio.Elector(client, f"many-aio-{i}", ttl=2.0, engine=engine)
            for i in range(200)
        ]
        for e in electors:
            e.start()
        await until(lambda: all(e.token() for e in electors), timeout=30)
        added = threads() - base
        assert added <= 4, f"200 started async electors added {added} threads"
        for e in electors:
            await e.stop()
        assert not any(e.token() for e in electors)
        await client.aclose()

    run(scenario)
