"""A fenced write is sent at most once, whatever retry policy the user's client carries.

When the server stops answering mid-write, the write's outcome is unknown: the
script may already be queued on the server. The write must raise
(``TimeoutError``/``ConnectionError``) and never be sent again behind the
caller's back — a resent script would apply twice, or be "rejected" by the
mark its own first copy raised.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis
import redis.asyncio
from redis.backoff import ConstantBackoff
from redis.retry import Retry

import redlease
import redlease.aio
from helpers import wait_until
from redlease._testing import RedisServer

APPEND = "redis.call('rpush', KEYS[2], ARGV[2])"
SOCKET_TIMEOUT = 0.3
FROZEN_FOR = 1.2  # well past the client's socket_timeout
UNKNOWN_OUTCOME = (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)


def retrying_client(server: RedisServer) -> redis.Redis:
    """A client that retries timed-out commands three times, as many services configure."""
    return server.client(
        socket_timeout=SOCKET_TIMEOUT,
        retry=Retry(ConstantBackoff(0.05), 3),
    )


def freeze_during(server: RedisServer, seconds: float) -> threading.Timer:
    server.pause()
    thaw = threading.Timer(seconds, server.resume)
    thaw.start()
    return thaw


def settled_log(client: redis.Redis) -> list[bytes]:
    # Give any resent copy time to arrive and run after the server resumed.
    wait_until(lambda: b"once" in client.lrange("log", 0, -1), timeout=10, what="queued write")
    time.sleep(3 * SOCKET_TIMEOUT + 0.5)
    log: list[bytes] = client.lrange("log", 0, -1)
    return log


def test_a_write_frozen_past_socket_timeout_raises_and_lands_at_most_once(
    redis_server: RedisServer, engine: str
) -> None:
    client = retrying_client(redis_server)
    e = redlease.Elector(client, "once", engine=engine)
    assert e.fence_eval(1, APPEND, ["log"], ["warm"])  # script loaded, connection open
    thaw = freeze_during(redis_server, FROZEN_FOR)
    try:
        started = time.monotonic()
        with pytest.raises(UNKNOWN_OUTCOME):
            e.fence_eval(1, APPEND, ["log"], ["once"])
        assert time.monotonic() - started < FROZEN_FOR, "bounded by socket_timeout, not the thaw"
    finally:
        thaw.join()
    observer = redis_server.client()
    assert settled_log(observer) == [b"warm", b"once"]
    assert e.fence_eval(1, APPEND, ["log"], ["after"]), "the next write works"


def test_an_async_write_frozen_past_socket_timeout_raises_and_lands_at_most_once(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = redis.asyncio.Redis(
            host="127.0.0.1",
            port=redis_server.port,
            socket_timeout=SOCKET_TIMEOUT,
            retry=redis.asyncio.retry.Retry(ConstantBackoff(0.05), 3),
        )
        e = redlease.aio.Elector(client, "once", engine=engine)
        assert await e.fence_eval(1, APPEND, ["log"], ["warm"])
        thaw = freeze_during(redis_server, FROZEN_FOR)
        try:
            with pytest.raises(UNKNOWN_OUTCOME):
                await e.fence_eval(1, APPEND, ["log"], ["once"])
        finally:
            await asyncio.get_running_loop().run_in_executor(None, thaw.join)
        await client.aclose()

    asyncio.run(scenario())
    assert settled_log(redis_server.client()) == [b"warm", b"once"]
