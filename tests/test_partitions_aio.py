"""redlease.aio.Partitions: the same member with coroutines, on both engines."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from redlease._testing import RedisServer
from redlease.aio import Partitions

NAME = "jobs"


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), 30))  # type: ignore[arg-type]


def async_client(server: RedisServer) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


async def until(predicate: Callable[[], Any], timeout: float = 5.0, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        await asyncio.sleep(0.005)
    return value


def make(
    client: Any, engine: str, member_id: str, partitions: Any = 4, **options: Any
) -> Partitions:
    options.setdefault("ttl", 0.5)
    return Partitions(client, NAME, partitions, member_id=member_id, engine=engine, **options)


def test_coroutine_callbacks_run_on_the_loop_that_started_the_member(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, str, object, bool]] = []

        async def assigned(partition: str, token: int) -> None:
            await asyncio.sleep(0)
            seen.append(("assigned", partition, token, asyncio.get_running_loop() is loop))

        async def revoked(partition: str, reason: str) -> None:
            await asyncio.sleep(0.01)  # finished before the release: nobody took it yet
            assert await client.get(f"{NAME}:p:{partition}:leader") == b"m1"
            seen.append(("revoked", partition, reason, asyncio.get_running_loop() is loop))

        parts = make(client, engine, "m1", on_assigned=assigned, on_revoked=revoked)
        assert parts.owned() == {}
        assert await parts.start() is parts
        await until(lambda: len(seen) == 4, what="every partition assigned")
        assert parts.owned() == {p: 1 for p in "0123"}
        await parts.stop()
        assert parts.owned() == {}
        assert seen == [("assigned", p, 1, True) for p in "0123"] + [
            ("revoked", p, "stopped", True) for p in "0123"
        ]
        assert await parts.members() == []
        await client.aclose()

    run(scenario)


def test_two_members_balance_and_a_stale_owners_write_is_rejected(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        async with make(client, engine, "m1") as first:
            await until(lambda: len(first.owned()) == 4, what="all owned")
            old = {p: first.fencer(p) for p in "0123"}
            assert all(isinstance(f, redlease.aio.Fencer) for f in old.values())
            assert all([await f.set(f"data:{p}", "m1") for p, f in old.items()])
            async with make(client, engine, "m2") as second:
                await until(
                    lambda: len(first.owned()) == 2 and len(second.owned()) == 2, what="2/2"
                )
                assignment = await second.assignment()
                assert assignment == {
                    **{p: "m1" for p in first.owned()},
                    **{p: "m2" for p in second.owned()},
                }
                assert await first.members() == ["m1", "m2"]
                for p, token in second.owned().items():
                    assert token > old[p].token
                    assert not await old[p].set(f"data:{p}", "stale m1")
                    assert await second.fencer(p).set(f"data:{p}", "m2")
                    assert await client.get(f"data:{p}") == b"m2"
            # The second left: the first takes its partitions back at once.
            await until(lambda: len(first.owned()) == 4, timeout=3, what="taken back")
        await client.aclose()

    run(scenario)


def test_a_coroutine_callback_that_raises_or_hangs_goes_to_on_error_and_the_member_goes_on(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        errors: list[Exception] = []

        async def assigned(partition: str, token: int) -> None:
            if partition == "0":
                raise ValueError("boom")
            if partition == "1":
                await asyncio.sleep(60)  # past the ttl: cancelled

        parts = make(
            client,
            engine,
            "m1",
            2,
            on_assigned=assigned,
            observer=redlease.Observer(on_error=errors.append),
        )
        async with parts:
            await until(lambda: len(errors) == 2, timeout=5, what="both reported")
            assert parts.owned() == {"0": 1, "1": 1}
        kinds = sorted(type(e).__name__ for e in errors)
        assert kinds == ["TimeoutError", "ValueError"]
        assert "within the ttl" in str(next(e for e in errors if isinstance(e, TimeoutError)))
        await client.aclose()

    run(scenario)


def test_stop_awaited_from_a_coroutine_callback_ends_the_run_without_waiting_for_itself(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        parts: Partitions

        async def assigned(partition: str, token: int) -> None:
            await parts.stop()

        # ttl 10 s: a stop that waited for its own callback would hang until that was cancelled.
        parts = make(client, engine, "m1", 1, ttl=10, on_assigned=assigned)
        await parts.start()
        deadline = time.monotonic() + 5
        while await client.zscore(f"{NAME}:members", "m1") is not None:
            assert time.monotonic() < deadline, "the member did not leave at once"
            await asyncio.sleep(0.01)
        await parts.stop()
        assert parts.owned() == {}
        assert await parts.assignment() == {"0": None}
        await client.aclose()

    run(scenario)


def test_plain_callbacks_run_on_the_member_thread(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        threads: list[threading.Thread] = []
        parts = make(
            client,
            engine,
            "m1",
            2,
            on_assigned=lambda p, t: threads.append(threading.current_thread()),
        )
        async with parts:
            await until(lambda: len(threads) == 2, what="assigned")
        assert threading.current_thread() not in threads
        await client.aclose()

    run(scenario)


def test_a_coroutine_callback_can_await_what_the_process_driver_runs(
    redis_server: RedisServer, engine: str
) -> None:
    # The member's callbacks wait on a thread of their own, never on the driver: a
    # coroutine callback awaiting an elector the driver steps is done well within the ttl
    # (it would be cancelled at the ttl, its TimeoutError told to on_error).
    async def scenario() -> None:
        client = async_client(redis_server)
        errors: list[Exception] = []
        led: list[str] = []

        async def assigned(partition: str, token: int) -> None:
            elector = redlease.aio.Elector(
                client, f"{NAME}-lead-{partition}", ttl=0.5, engine=engine
            ).start()
            try:
                await until(lambda: elector.is_leader, what="the callback's elector led")
                led.append(partition)
            finally:
                await elector.stop()

        observer = redlease.Observer(on_error=errors.append)
        async with make(client, engine, "m1", 2, on_assigned=assigned, observer=observer):
            await until(lambda: len(led) == 2, what="both callbacks awaited their elector")
        assert errors == []
        await client.aclose()

    run(scenario)


def test_different_partition_sets_are_refused_when_started(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        async with make(client, engine, "m1", ["a", "b"]):
            other = make(client, engine, "m2", ["a", "b", "c"])
            with pytest.raises(redlease.ConfigError, match=r"\{'a', 'b'\}.*\{'a', 'b', 'c'\}"):
                await other.start()
            assert other.owned() == {}
        await client.aclose()

    run(scenario)


def test_a_threaded_client_is_refused_with_the_face_to_use(redis_server: RedisServer) -> None:
    client = redis.Redis(port=redis_server.port)
    with pytest.raises(redlease.ConfigError, match="needs an asyncio client"):
        Partitions(client, NAME, 2)
    with pytest.raises(redlease.ConfigError, match="a bare str"):
        Partitions(async_client(redis_server), NAME, "ab")
    client.close()


# -- wait_owned ------------------------------------------------------------------------------


def _ghost(server: RedisServer, member: Partitions, partition: str) -> None:
    """Hold ``partition``'s lease at Redis for a member that is not in the group."""
    with server.client() as c:
        c.set(member._core.parts[partition].lease_key, "ghost", px=60_000)


def test_wait_owned_gives_each_member_its_share(redis_server: RedisServer, engine: str) -> None:
    assert inspect.iscoroutinefunction(Partitions.wait_owned)

    async def scenario() -> None:
        client = async_client(redis_server)
        a = make(client, engine, "a", 5)
        async with a:
            assert list(await a.wait_owned(timeout=10)) == ["0", "1", "2", "3", "4"]
            b = make(client, engine, "b", 5)
            async with b:
                of_b = await b.wait_owned(timeout=10)
                of_a = await a.wait_owned(timeout=10)
                assert sorted([len(of_a), len(of_b)]) == [2, 3]
                assert set(of_a) | set(of_b) == {"0", "1", "2", "3", "4"}
        with pytest.raises(RuntimeError, match="not running"):
            await a.wait_owned(timeout=1)
        await client.aclose()

    run(scenario)


def test_wait_owned_times_out_and_can_be_cancelled(redis_server: RedisServer, engine: str) -> None:
    async def scenario() -> None:
        client = async_client(redis_server)
        member = make(client, engine, "a", 3)
        _ghost(redis_server, member, "1")
        async with member:
            with pytest.raises(TimeoutError, match="balanced share"):
                await member.wait_owned(timeout=0.3)
            assert member._core.share.watchers == 0
            with pytest.raises(redlease.ConfigError, match="wait_owned timeout"):
                await member.wait_owned(timeout=-0.5)
            waiting = asyncio.create_task(member.wait_owned())
            await until(lambda: member._core.share.watchers == 1, what="the waiter registered")
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            assert member._core.share.watchers == 0  # nothing left waiting
        await client.aclose()

    run(scenario)
