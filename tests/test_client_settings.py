"""Every client setting users run: RESP2 and RESP3, and clients that decode replies.

The rest of the suite runs with each client library's default protocol (CI
runs it again with ``REDLEASE_TEST_PROTOCOL`` set to the other one); here the
core behaviours run on every combination of protocol and
``decode_responses``, both engines and both client families, with the
outcome checked through a second client that does not decode.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import redlease
import redlease.aio
from helpers import wait_until
from redlease._testing import RedisServer
from redlease.lock import DEFAULT_PREFIX, RedisLocker

SETTINGS = [
    pytest.param({"protocol": protocol, "decode_responses": decode}, id=f"resp{protocol}-{label}")
    for protocol in (2, 3)
    for decode, label in ((False, "bytes"), (True, "decoded"))
]


@pytest.fixture(params=SETTINGS)
def settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    value: dict[str, Any] = request.param
    return value


@pytest.fixture
def user_client(redis_server: RedisServer, family: str, settings: dict[str, Any]) -> Iterator[Any]:
    """The client a user hands to the library, with the settings under test."""
    c = redis_server.client(family=family, socket_timeout=5, **settings)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def check(redis_server: RedisServer) -> Iterator[Any]:
    """A plain bytes client that reads back what the library did."""
    c = redis_server.client(socket_timeout=5, protocol=2, decode_responses=False)
    try:
        yield c
    finally:
        c.close()


def test_an_elector_leads_fences_and_pipelines(user_client: Any, check: Any, engine: str) -> None:
    e = redlease.Elector(user_client, "cs", ttl=1.0, engine=engine)
    with e:
        token = wait_until(e.token, what="election")
        assert check.get("cs:leader") == e.instance_id.encode()
        fencer = e.fencer()
        assert fencer.set("cs:k", "v")
        assert fencer.hset("cs:h", "f", b"\x00\xff")
        assert fencer.eval("redis.call('INCRBY', KEYS[2], ARGV[2])", ["cs:n"], [5])
        assert fencer.pipeline().set("cs:p1", 1).set("cs:p2", 2.5).execute() == [True, True]
        assert not e.fence_set(token - 1, "cs:k", "stale")
    assert check.get("cs:k") == b"v"
    assert check.hget("cs:h", "f") == b"\x00\xff"
    assert check.get("cs:n") == b"5"
    assert check.mget("cs:p1", "cs:p2") == [b"1", b"2.5"]
    assert check.get("cs:fence:applied") == str(token).encode()
    assert not check.exists("cs:leader")


def test_a_released_lease_is_taken_over_at_once(user_client: Any, engine: str) -> None:
    first = redlease.Elector(user_client, "cs-handover", ttl=5.0, engine=engine)
    second = redlease.Elector(user_client, "cs-handover", ttl=5.0, engine=engine)
    first.start()
    wait_until(first.token, what="first election")
    with second:
        time.sleep(0.2)  # the follower is waiting on its acquire interval (2.5 s)
        began = time.monotonic()
        first.stop()
        wait_until(second.token, timeout=2.0, what="a pushed handover")
        assert time.monotonic() - began < 2.0


def test_locks_and_semaphores(user_client: Any, check: Any, engine: str) -> None:
    locker = RedisLocker(user_client, engine=engine, holder="cs-holder")
    try:
        held = locker.acquire("job", ttl=5.0)
        assert check.hget(f"{DEFAULT_PREFIX}key:job", "holder") == b"cs-holder"
        holder = locker.holder("job")
        assert holder is not None
        assert (holder.holder, holder.fencing_token) == ("cs-holder", held.fencing_token)
        assert [name for name, _ in locker.held()] == ["job"]
        with pytest.raises(redlease.NotAcquired):
            locker.try_acquire("job")
        held.refresh()
        held.release()
        with pytest.raises(redlease.NotHeld):
            held.release()
        assert not check.exists(f"{DEFAULT_PREFIX}key:job")

        with locker.hold("job", ttl=0.3) as renewed:
            time.sleep(0.5)  # past the TTL: the watchdog keeps it
            assert not renewed.done.is_set()
        sem = locker.semaphore("pool", 2)
        permits = [sem.acquire(ttl=5.0), sem.acquire(ttl=5.0)]
        assert sorted(h.fencing_token for h in sem.holders()) == sorted(
            p.fencing_token for p in permits
        )
        with pytest.raises(redlease.NotAcquired):
            sem.try_acquire()
        for permit in permits:
            permit.release()
        assert sem.holders() == []
    finally:
        locker.close()


def test_a_waiting_lock_acquirer_is_woken_by_the_release(user_client: Any, engine: str) -> None:
    locker = RedisLocker(user_client, engine=engine)
    try:
        held = locker.acquire("wake", ttl=10.0)
        got: list[float] = []

        def wait() -> None:
            locker.acquire("wake", ttl=10.0, wait=10.0, retry_interval=5.0).release()
            got.append(time.monotonic())

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.3)
        released = time.monotonic()
        held.release()
        waiter.join(10)
        assert got and got[0] - released < 2.0  # woken, not polled (every 5 s)
    finally:
        locker.close()


def test_asyncio_electors_locks_and_writes(
    redis_server: RedisServer, family: str, settings: dict[str, Any], engine: str, check: Any
) -> None:
    async def scenario() -> None:
        client = redis_server.client(family=family, asyncio=True, socket_timeout=5, **settings)
        try:
            e = redlease.aio.Elector(client, "cs-aio", ttl=1.0, engine=engine)
            async with e:
                while e.token() is None:
                    await asyncio.sleep(0.01)
                fencer = e.fencer()
                assert await fencer.set("cs-aio:k", "v")
                assert await fencer.pipeline().set("cs-aio:a", 1).set("cs-aio:b", 2).execute() == [
                    True,
                    True,
                ]
            locker = redlease.aio.RedisLocker(client, engine=engine)
            try:
                async with locker.hold("aio-job", ttl=1.0) as held:
                    assert held.fencing_token >= 1
                    assert await locker.holder("aio-job") is not None
                permit = await locker.semaphore("aio-pool", 1).acquire(ttl=5.0)
                await permit.release()
            finally:
                await locker.close()
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert check.get("cs-aio:k") == b"v"
    assert check.mget("cs-aio:a", "cs-aio:b") == [b"1", b"2"]
    assert not check.exists("cs-aio:leader", f"{DEFAULT_PREFIX}key:aio-job")
