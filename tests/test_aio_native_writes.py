"""asyncio fenced writes pipelined on one connection the event loop drives, on both engines.

Many tasks' writes share the connection, replies are matched to the writes
in order, a cancelled task's reply is read and dropped, a hung server fails
the writes in flight after the client's socket_timeout, and none of it can
delay a native renewal.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

import redlease
import redlease.aio
from helpers import ProcessContender, gil_call_size, hold_gil_at_least, require_native
from redlease._testing import ClusterSet, RedisServer, SentinelSet, TLSMaterials
from redlease._testing._common import client_module
from tls_helpers import require_native_tls
from topology_helpers import assert_in_family

# Each test also runs with the asyncio writer's uncompiled source (conftest).
pytestmark = pytest.mark.usefixtures("writer_build")

NAME = "aiow"


def run(coro_fn: Callable[[], Awaitable[Any]], timeout: float = 60) -> Any:
    return asyncio.run(asyncio.wait_for(coro_fn(), timeout))  # type: ignore[arg-type]


def async_client(server: RedisServer, socket_timeout: float = 5) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=socket_timeout)


async def leading(
    server: RedisServer,
    engine: str,
    *,
    ttl: float = 5.0,
    socket_timeout: float = 5,
    client: redis.asyncio.Redis | None = None,
) -> tuple[redlease.aio.Elector, int]:
    """An elector leading with a token well above 1, so ``token - 1`` is stale, not inert."""
    client = client or async_client(server, socket_timeout)
    await client.set(f"{NAME}:fence", 100)
    e = redlease.aio.Elector(client, NAME, ttl=ttl, engine=engine).start()
    deadline = time.monotonic() + 10
    while (token := e.token()) is None:
        assert time.monotonic() < deadline, "not elected"
        await asyncio.sleep(0.01)
    assert token > 100
    # Raise the fence mark to this term, so a lower token is stale from now on.
    assert await e.fence_set(token, f"{NAME}:first", "x")
    return e, token


def loop_writer(e: redlease.aio.Elector) -> Any:
    writer = e._core.engine.loop_writer(asyncio.get_running_loop())
    assert writer is not None, "only a cluster client writes off the loop"
    return writer


def test_ten_thousand_concurrent_writes_with_cancellations_each_get_their_own_reply(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    rng = random.Random(9)
    count = 10_000
    # Current and stale tokens interleaved at random: a reply handed to the
    # wrong write would turn an applied write into a rejected one or back.
    stale = [rng.random() < 0.3 for _ in range(count)]
    outcome: dict[int, Any] = {}

    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        writer = loop_writer(e)
        peak = 0

        async def write(i: int) -> None:
            writer_token = token - 1 if stale[i] else token
            outcome[i] = await e.fence_set(writer_token, f"{NAME}:k{i}", f"v{i}")

        tasks = [asyncio.ensure_future(write(i)) for i in range(count)]
        loop = asyncio.get_running_loop()
        cancelled = rng.sample(range(count), count // 10)
        for i in cancelled:
            loop.call_later(rng.random() * 0.05, tasks[i].cancel)
        # Sampled at every turn of the loop: a sample a millisecond apart can
        # miss every write in flight on a loaded host (all sent and answered
        # between two samples).
        while not all(t.done() for t in tasks):
            peak = max(peak, writer.in_flight)
            await asyncio.sleep(0)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert peak > 1, "the writes were not pipelined"
        assert not [r for r in results if isinstance(r, Exception)]
        # The connection is still in step: a write after all that gets its own reply.
        assert await e.fence_set(token, f"{NAME}:after", "after")
        assert not await e.fence_set(token - 1, f"{NAME}:after", "stale")
        assert writer.in_flight == 0
        await e.stop()

    run(scenario)
    finished = [i for i in range(count) if i in outcome]
    assert len(finished) >= count - count // 10
    assert len(finished) < count, "no task was cancelled mid-flight"
    for i in finished:
        assert outcome[i] is (not stale[i]), f"write {i} got another write's reply"
    values = client.mget([f"{NAME}:k{i}" for i in range(count)])
    for i, value in enumerate(values):
        if stale[i]:
            assert value is None, f"stale write {i} was applied"
        elif i in outcome:
            assert value == f"v{i}".encode()
        else:
            # Cancelled: it may or may not have been sent, never someone else's value.
            assert value in (None, f"v{i}".encode())
    assert client.get(f"{NAME}:after") == b"after"


def test_an_async_pipeline_rides_the_loop_connection_without_a_thread_hop(
    redis_server: RedisServer, engine: str
) -> None:
    async def body() -> None:
        e, token = await leading(redis_server, engine)
        loop = asyncio.get_running_loop()
        hops: list[Any] = []
        real = loop.run_in_executor

        def counting(*args: Any) -> Any:
            hops.append(args)
            return real(*args)

        loop.run_in_executor = counting  # type: ignore[method-assign]
        try:
            pipe = redlease.aio.Fencer(e, token).pipeline()
            for i in range(50):
                pipe.set(f"{NAME}:p{i}", i)
            assert await pipe.execute() == [True] * 50
            stale = redlease.aio.Fencer(e, token - 1).pipeline().set(f"{NAME}:p0", "old")
            assert await stale.execute() == [False]
        finally:
            loop.run_in_executor = real  # type: ignore[method-assign]
            await e.stop()
        # Every write went out on the loop's own connection: no executor thread.
        assert hops == []

    run(body)
    c = redis_server.client()
    assert [c.get(f"{NAME}:p{i}") for i in (0, 49)] == [b"0", b"49"]


def test_one_elector_writes_from_one_loop_then_another_each_on_its_own_connection(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    client.set(f"{NAME}:fence", 100)
    e = redlease.aio.Elector(async_client(redis_server), NAME, ttl=5.0, engine=engine)

    async def writes(tag: str) -> tuple[list[bool], Any]:
        applied = [await e.fence_set(101, f"{NAME}:{tag}{i}", i) for i in range(3)]
        applied.append(await e.fence_set(99, f"{NAME}:{tag}-stale", "x"))
        return applied, loop_writer(e)

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        applied_a, writer_a = first.run_until_complete(writes("a"))
        applied_b, writer_b = second.run_until_complete(writes("b"))
        applied_c, writer_c = first.run_until_complete(writes("c"))  # the first loop again
    finally:
        second.close()
        first.close()
    gc.collect()
    third = asyncio.new_event_loop()  # a new loop after both are gone
    try:
        applied_d, writer_d = third.run_until_complete(writes("d"))
    finally:
        third.close()
    for applied in (applied_a, applied_b, applied_c, applied_d):
        assert applied == [True, True, True, False]
    assert writer_a is writer_c
    assert len({id(writer_a), id(writer_b), id(writer_d)}) == 3
    for tag in "abcd":
        assert client.mget([f"{NAME}:{tag}{i}" for i in range(3)]) == [b"0", b"1", b"2"]
        assert client.get(f"{NAME}:{tag}-stale") is None
    e._core.engine.close()


def test_loops_running_at_once_on_two_threads_each_write_on_their_own_connection(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    """A write never rides a writer whose loop runs on another thread right now."""
    import threading

    client.set(f"{NAME}:fence", 100)
    e = redlease.aio.Elector(async_client(redis_server), NAME, ttl=5.0, engine=engine)
    both_running = threading.Barrier(2, timeout=10)
    writers: dict[str, Any] = {}
    errors: list[BaseException] = []

    async def writes(tag: str) -> None:
        assert await e.fence_set(101, f"{NAME}:{tag}0", 0)
        both_running.wait()  # the other loop runs, and has written, from here on
        for i in range(1, 50):
            assert await e.fence_set(101, f"{NAME}:{tag}{i}", i)
            writers.setdefault(tag, loop_writer(e))
            await asyncio.sleep(0)

    def on_a_thread(tag: str) -> None:
        try:
            asyncio.run(writes(tag))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=on_a_thread, args=(tag,)) for tag in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    for tag in "xy":
        assert client.mget([f"{NAME}:{tag}{i}" for i in range(50)]) == [
            str(i).encode() for i in range(50)
        ]
    e._core.engine.close()


class _ShiftedClockLoop(asyncio.SelectorEventLoop):
    """A loop with its own clock and futures, as a third-party loop may have."""

    def __init__(self) -> None:
        super().__init__()
        self.futures_made = 0

    def time(self) -> float:
        return super().time() + 1e6

    def create_future(self) -> asyncio.Future[Any]:
        self.futures_made += 1
        return super().create_future()


def test_writes_on_a_loop_with_its_own_clock_and_futures_use_them(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    client.set(f"{NAME}:fence", 100)
    e = redlease.aio.Elector(async_client(redis_server), NAME, ttl=5.0, engine=engine)
    loop = _ShiftedClockLoop()

    async def writes() -> list[bool]:
        # A deadline taken on another clock than the loop's would have passed
        # long ago on it: every write would fail with TimeoutError.
        return list(
            await asyncio.gather(*(e.fence_set(101, f"{NAME}:own{i}", i) for i in range(50)))
        )

    try:
        applied = loop.run_until_complete(writes())
        assert applied == [True] * 50
        assert loop.futures_made >= 50
    finally:
        loop.close()
        e._core.engine.close()
    assert client.mget([f"{NAME}:own{i}" for i in range(50)]) == [
        str(i).encode() for i in range(50)
    ]


def test_a_cancelled_write_reply_is_dropped_not_given_to_the_next_write(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        redis_server.pause()
        try:
            applied = asyncio.ensure_future(e.fence_set(token, f"{NAME}:a", "a"))
            rejected = asyncio.ensure_future(e.fence_set(token - 1, f"{NAME}:b", "b"))
            await asyncio.sleep(0.05)  # both are on the wire, unanswered
            applied.cancel()
        finally:
            redis_server.resume()
        assert await rejected is False  # not the cancelled write's True
        with pytest.raises(asyncio.CancelledError):
            await applied
        assert await e.fence_set(token, f"{NAME}:c", "c") is True
        await e.stop()

    run(scenario)


def test_server_paused_mid_write_raises_timeout_after_socket_timeout_then_writes_work(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine, ttl=10, socket_timeout=0.5)
        redis_server.pause()
        try:
            started = time.monotonic()
            results = await asyncio.gather(
                *(e.fence_set(token, f"{NAME}:p{i}", i) for i in range(20)),
                return_exceptions=True,
            )
            elapsed = time.monotonic() - started
        finally:
            redis_server.resume()
        assert all(isinstance(r, redis.exceptions.TimeoutError) for r in results), results
        assert 0.4 <= elapsed < 3, f"the writes failed after {elapsed:.2f} s"
        assert await e.fence_set(token, f"{NAME}:p-after", "after") is True
        await e.stop()

    run(scenario)
    assert client.get(f"{NAME}:p-after") == b"after"


def test_a_server_crash_mid_write_fails_the_writes_in_flight_and_the_next_write_reconnects(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        redis_server.pause()
        in_flight = [
            asyncio.ensure_future(e.fence_set(token, f"{NAME}:crash{i}", i)) for i in range(20)
        ]
        await asyncio.sleep(0.05)
        redis_server.kill()  # never answered: the writes' outcome is unknown
        results = await asyncio.gather(*in_flight, return_exceptions=True)
        assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results
        redis_server.restart()
        # The data died with the process (the fence mark too): writes apply again.
        assert await e.fence_set(token, f"{NAME}:k", "after-crash") is True
        await e.stop()

    run(scenario)
    with redis_server.client() as check:
        assert [check.get(f"{NAME}:crash{i}") for i in range(20)] == [None] * 20, "resent"
        assert check.get(f"{NAME}:k") == b"after-crash"


def test_writes_after_script_flush_are_applied_exactly_once(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    body = "redis.call('INCR', KEYS[2])"  # KEYS[1] is the fence mark

    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        assert await e.fence_eval(token, body, [f"{NAME}:n"])
        client.script_flush()
        applied = await asyncio.gather(
            *(e.fence_eval(token, body, [f"{NAME}:n"]) for _ in range(50))
        )
        assert all(applied)
        await e.stop()

    run(scenario)
    assert client.get(f"{NAME}:n") == b"51"


def test_a_connection_the_server_closed_while_idle_is_replaced(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        client.client_kill_filter(_type="normal", skipme=True)
        await asyncio.sleep(0.1)
        assert await e.fence_set(token, f"{NAME}:k", "after-kill") is True
        await e.stop()

    run(scenario)
    assert client.get(f"{NAME}:k") == b"after-kill"


def test_a_write_refused_by_a_replica_raises_and_later_writes_work(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        with RedisServer() as master:
            client.replicaof("127.0.0.1", master.port)
            try:
                # ReadOnlyError itself on Redis 7 (its code stripped from the
                # message, as redis-py does); Redis 6 wraps it in a script error.
                with pytest.raises(redis.exceptions.ResponseError) as refused:
                    await e.fence_set(token, f"{NAME}:k", "refused")
                assert isinstance(refused.value, redis.exceptions.ReadOnlyError) or (
                    "READONLY" in str(refused.value)
                ), repr(refused.value)
            finally:
                client.replicaof("no", "one")
        # The replica's data replaced ours (the fence mark too); writing works again.
        assert await e.fence_set(token, f"{NAME}:k", "applied") is True
        assert loop_writer(e).in_flight == 0
        await e.stop()

    run(scenario)
    assert client.get(f"{NAME}:k") == b"applied"


def test_each_event_loop_connection_goes_away_with_its_loop(
    redis_server: RedisServer, engine: str
) -> None:
    e = redlease.aio.Elector(async_client(redis_server), NAME, engine=engine)

    async def write() -> None:
        assert await e.fence_set(1, f"{NAME}:k", "v") is True

    asyncio.run(write())  # the elector's own connections, opened once
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        asyncio.run(write())
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 1


def test_bad_arguments_raise_and_later_writes_are_unaffected(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        e, token = await leading(redis_server, engine)
        with pytest.raises(TypeError, match="value must be str, bytes, int or float"):
            await e.fence_set(token, f"{NAME}:k", None)  # type: ignore[arg-type]
        assert loop_writer(e).in_flight == 0
        assert await e.fence_set(token, f"{NAME}:k", "ok") is True
        await e.stop()

    run(scenario)


async def concurrent_writes_each_get_their_own_reply(
    e: redlease.aio.Elector, token: int, count: int
) -> dict[int, bool]:
    """``count`` writes at once, stale and current interleaved; each one's result checked."""
    stale = [i % 3 == 1 for i in range(count)]
    results = await asyncio.gather(
        *(
            e.fence_set(token - 1 if stale[i] else token, f"{NAME}:k{i}", f"v{i}")
            for i in range(count)
        )
    )
    for i, applied in enumerate(results):
        assert applied is (not stale[i]), f"write {i} got another write's reply"
    return {i: not stale[i] for i in range(count)}


def test_writes_over_tls_are_pipelined(
    tls_server: RedisServer, tls_materials: TLSMaterials, engine: str
) -> None:
    if engine == "native":
        require_native_tls()

    async def scenario() -> dict[int, bool]:
        client = redis.asyncio.Redis(
            host="127.0.0.1",
            port=tls_server.port,
            ssl=True,
            ssl_ca_certs=str(tls_materials.ca_file),
            ssl_cert_reqs="required",
            socket_timeout=5,
        )
        e, token = await leading(tls_server, engine, client=client)
        assert e.engine == engine
        writer = loop_writer(e)
        pending = asyncio.ensure_future(concurrent_writes_each_get_their_own_reply(e, token, 2000))
        peak = 0
        while not pending.done():
            peak = max(peak, writer.in_flight)
            await asyncio.sleep(0)
        applied = await pending
        assert peak > 1, "the writes were not pipelined"
        await e.stop()
        await client.aclose()
        return applied

    applied = run(scenario)
    with tls_server.client() as check:
        values = check.mget([f"{NAME}:k{i}" for i in range(len(applied))])
    assert values == [f"v{i}".encode() if ok else None for i, ok in applied.items()]


def test_writes_through_sentinels_reach_the_new_master_after_a_failover(
    sentinel_set_fresh: SentinelSet, engine: str, family: str
) -> None:
    topology = sentinel_set_fresh
    module = client_module(family, asyncio=True)
    refused: list[Exception] = []

    async def scenario() -> None:
        manager = module.sentinel.Sentinel(topology.sentinel_addresses(), socket_timeout=1)
        client = manager.master_for(topology.service, socket_timeout=2)
        e, token = await leading(topology.master, engine, ttl=10, client=client)
        writer = loop_writer(e)
        pending = asyncio.ensure_future(concurrent_writes_each_get_their_own_reply(e, token, 200))
        peak = 0
        while not pending.done():
            peak = max(peak, writer.in_flight)
            await asyncio.sleep(0)
        await pending
        assert peak > 1, "the writes were not pipelined"
        new_master = topology.node_at(topology.failover())
        # Writes across the switch may fail (their outcome unknown, or not
        # run at all: READONLY) or still land on the old master until it is
        # demoted; soon they land on the new one.
        deadline = time.monotonic() + 15
        with topology.node_client(new_master) as check:
            for n in range(1_000_000):
                assert time.monotonic() < deadline, "writes never reached the new master"
                try:
                    applied = await e.fence_set(e.token() or token, f"{NAME}:after", n)
                except (redis.exceptions.ConnectionError, redis.exceptions.ResponseError) as exc:
                    refused.append(exc)
                    applied = False
                if applied and check.get(f"{NAME}:after") == str(n).encode():
                    break
                await asyncio.sleep(0.1)
        await e.stop()
        await client.aclose()

    run(scenario)
    # A valkey client's caller catches valkey-py's classes: the write errors are those too
    # (and of the class named as their own, ReadOnlyError say).
    for exc in refused:
        caught = "ConnectionError" if isinstance(exc, redis.ConnectionError) else "ResponseError"
        assert_in_family(exc, family, caught)
        assert_in_family(exc, family)


def test_writes_on_a_cluster_follow_a_migration_of_the_slot(
    cluster_set_fresh: ClusterSet, engine: str, family: str
) -> None:
    cluster = cluster_set_fresh
    name = "{aiow}"
    slot = key_slot(name.encode())
    module = client_module(family, asyncio=True)

    async def scenario() -> None:
        client = module.RedisCluster(
            startup_nodes=[
                module.cluster.ClusterNode("127.0.0.1", node.port) for node in cluster.masters()
            ],
            socket_timeout=5,
        )
        e = redlease.aio.Elector(client, name, ttl=10, engine=engine).start()
        deadline = time.monotonic() + 10
        while (token := e.token()) is None:
            assert time.monotonic() < deadline, "not elected"
            await asyncio.sleep(0.01)
        writer = e._core.engine.loop_writer(asyncio.get_running_loop())
        assert (writer is not None) == (engine == "native")  # Python: the executor path

        async def write_all(tag: str) -> list[bool]:
            return list(
                await asyncio.gather(
                    *(e.fence_set(token, f"{name}:{tag}{i}", i) for i in range(100))
                )
            )

        assert all(await write_all("before"))
        target = next(m for m in cluster.masters() if m is not cluster.master_for_slot(slot))
        cluster.migrate_slot(slot, target)
        # The loop connection still reaches the old owner: every write is
        # answered MOVED there, sent again to the new owner, and applied once.
        assert all(await write_all("after"))
        assert await e.fence_set(token, f"{name}:last", "last") is True
        with target.client() as check:
            assert [check.get(f"{name}:after{i}") for i in range(100)] == [
                str(i).encode() for i in range(100)
            ]
            assert check.get(f"{name}:last") == b"last"
        await e.stop()
        await client.aclose()

    run(scenario)


def test_native_renewals_stay_on_time_through_a_gil_hog_while_asyncio_writes_run(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    require_native()
    n = gil_call_size(1.5)
    contender: list[ProcessContender] = []
    written: list[bool] = []

    async def scenario() -> None:
        e, token = await leading(redis_server, "native", ttl=0.3)
        stop = asyncio.Event()

        async def writer(w: int) -> None:
            i = 0
            while not stop.is_set():
                written.append(await e.fence_set(token, f"{NAME}:w{w}", i))
                i += 1

        writers = [asyncio.ensure_future(writer(w)) for w in range(16)]
        contender.append(
            ProcessContender(
                f'client = redis.Redis(host="127.0.0.1", port={redis_server.port}, '
                "socket_timeout=2)",
                NAME,
                0.3,
            )
        )
        await asyncio.sleep(0.2)
        before = len(written)
        held = hold_gil_at_least(n, 3 * 0.3)  # the loop and every Python thread stand still
        assert held > 3 * 0.3, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*writers)
        assert before > 0 and len(written) > before, "the writes did not run around the hog"
        assert all(written), "a write of the current term was rejected"
        assert e.token() == token
        assert contender[0].elections() == [], "the other process took over during the call"
        await e.stop()

    try:
        run(scenario)
    finally:
        for c in contender:
            c.close()


def test_python_engine_loses_the_lease_through_the_same_hog_and_its_writes_are_then_rejected(
    redis_server: RedisServer,
) -> None:
    n = gil_call_size(1.5)
    contender: list[ProcessContender] = []

    async def scenario() -> None:
        e, token = await leading(redis_server, "python", ttl=0.3)
        stop = asyncio.Event()

        async def writer(w: int) -> None:
            i = 0
            while not stop.is_set():
                await e.fence_set(token, f"{NAME}:w{w}", i)
                i += 1

        writers = [asyncio.ensure_future(writer(w)) for w in range(16)]
        contender.append(
            ProcessContender(
                f'client = redis.Redis(host="127.0.0.1", port={redis_server.port}, '
                "socket_timeout=2)",
                NAME,
                0.3,
            )
        )
        await asyncio.sleep(0.2)
        held = hold_gil_at_least(n, 3 * 0.3)
        assert held > 3 * 0.3
        deadline = time.monotonic() + 5
        while not contender[0].elections():
            assert time.monotonic() < deadline, "the other process never took over"
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*writers)
        # The new term raised the fence mark: the old term's writes are refused.
        assert await e.fence_set(token, f"{NAME}:late", "late") is False
        await e.stop()

    try:
        run(scenario)
    finally:
        for c in contender:
            c.close()
    with redis_server.client() as check:
        assert check.get(f"{NAME}:late") is None
