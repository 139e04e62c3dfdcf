"""redlease.aio lockers: the lease lock with coroutines, on every store and engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from helpers import require_native
from redlease._testing import RedisServer

PREFIX = "t:lock:"


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro_fn(), 30)

    return asyncio.run(bounded())


@pytest.fixture(params=["memory", "python", "native"])
def store(request: pytest.FixtureRequest, redis_server: RedisServer) -> str:
    if request.param == "native":
        require_native()
    return str(request.param)


def make_locker(
    store: str, server: RedisServer
) -> redlease.aio.RedisLocker | redlease.aio.MemoryLocker:
    if store == "memory":
        return redlease.aio.MemoryLocker()
    client = redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)
    return redlease.aio.RedisLocker(client, prefix=PREFIX, engine=store)


def steal(store: str, server: RedisServer, name: str) -> None:
    """Make the lease someone else's behind the holder's back."""
    client = server.client()
    client.hset(f"{PREFIX}key:{name}", "owner", "thief")
    client.pexpire(f"{PREFIX}key:{name}", 60_000)


def test_hold_acquires_and_releases_with_a_fencing_token(
    store: str, redis_server: RedisServer
) -> None:
    async def scenario() -> None:
        locker = make_locker(store, redis_server)
        async with locker.hold("job", ttl=1.0) as held:
            assert held.name == "job"
            assert held.fencing_token >= 1
            with pytest.raises(redlease.NotAcquired):
                await locker.try_acquire("job")
        again = await locker.try_acquire("job", ttl=1.0)
        assert again.fencing_token > held.fencing_token
        await again.release()
        with pytest.raises(redlease.NotHeld):
            await again.release()

    run(scenario)


def test_with_lock_returns_the_body_result(store: str, redis_server: RedisServer) -> None:
    async def scenario() -> None:
        locker = make_locker(store, redis_server)

        async def body(held: redlease.aio.Lock) -> int:
            return held.fencing_token * 10

        result = await redlease.aio.with_lock(locker, "job", body, ttl=1.0)
        assert result >= 10
        await (await locker.try_acquire("job")).release()  # free again

    run(scenario)


def test_lost_lease_cancels_the_block_with_not_held(redis_server: RedisServer) -> None:
    async def scenario(engine: str) -> None:
        locker = make_locker(engine, redis_server)
        reached_end = False
        with pytest.raises(redlease.NotHeld, match="lost while held"):
            async with locker.hold(f"job-{engine}", ttl=0.3):
                steal(engine, redis_server, f"job-{engine}")
                await asyncio.sleep(5)
                reached_end = True
        assert not reached_end
        thief = redis_server.client().hget(f"{PREFIX}key:job-{engine}", "owner")
        assert thief == b"thief", "the successor's lock must be left alone"

    for engine in ("python", "native"):
        if engine == "native":
            require_native()
        run(lambda engine=engine: scenario(engine))


def test_auto_renewed_lock_survives_a_blocked_event_loop(
    store: str, redis_server: RedisServer
) -> None:
    async def scenario() -> None:
        locker = make_locker(store, redis_server)
        async with locker.hold("job", ttl=0.3) as held:
            time.sleep(1.2)  # four TTLs without the loop running
            assert not held.done.is_set()
            await held.refresh()

    run(scenario)


def test_cancelled_waiting_acquire_leaks_no_lock(store: str, redis_server: RedisServer) -> None:
    async def scenario() -> None:
        locker = make_locker(store, redis_server)
        first = await locker.acquire("job", ttl=0.4)
        waiter = asyncio.ensure_future(locker.acquire("job", ttl=30, wait=2, retry_interval=0.02))
        await asyncio.sleep(0.1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        # The waiting attempt wins once `first` expires, in its thread; it must
        # be given back at once rather than held for its 30 s TTL.
        await asyncio.sleep(1.0)
        third = await locker.acquire("job", ttl=1.0, wait=1.0, retry_interval=0.02)
        assert third.fencing_token > first.fencing_token
        await third.release()

    run(scenario)


def test_async_locker_rejects_a_threaded_client(redis_server: RedisServer) -> None:
    with pytest.raises(redlease.ConfigError, match=r"redis\.asyncio\.Redis"):
        redlease.aio.RedisLocker(redis_server.client())
