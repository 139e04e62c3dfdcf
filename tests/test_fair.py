"""Fair waiting: ``acquire(..., fair=True)`` serves one name's waiters in arrival order.

Locks and semaphores, on ``MemoryLocker`` and on ``RedisLocker`` with both
engines; a waiter that gives up leaves the queue at once, one that dies
within max(3 x its retry interval, 100 ms) (``tests/test_fair_order.py``: under load).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

import pytest
import redis

import redlease
from helpers import fair_acquirer as acquirer
from helpers import wait_until
from redlease._locks.fair import place_ms
from redlease._testing import ClusterSet, RedisServer, SentinelSet
from redlease.lock import Lock, Locker, RedisLocker


@pytest.fixture
def locker(fair_locker: Locker) -> Locker:
    return fair_locker


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_fair_waiters_are_served_in_the_order_they_came(locker: Locker, kind: str) -> None:
    acquire = acquirer(locker, kind)
    holder = acquire(ttl=30.0)
    served: list[int] = []

    def waiter(i: int) -> None:
        held = acquire(ttl=30.0, wait=30.0, retry_interval=0.2, fair=True)
        served.append(i)
        time.sleep(0.02)
        held.release()

    threads = []
    for i in range(6):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        time.sleep(0.15)  # each has made its first attempt, and queued, before the next
    holder.release()
    for thread in threads:
        thread.join(30)
    assert served == list(range(6))


def test_a_waiter_that_gives_up_leaves_the_queue_at_once(locker: Locker) -> None:
    holder = locker.acquire("job", ttl=30.0)
    gave_up: list[BaseException] = []
    got: list[float] = []

    def impatient() -> None:
        # First in the queue; its place would live 10 s, but it leaves when it gives up.
        try:
            locker.acquire("job", ttl=30.0, wait=0.5, retry_interval=10.0, fair=True)
        except redlease.NotAcquired as exc:
            gave_up.append(exc)

    def patient() -> None:
        held = locker.acquire("job", ttl=30.0, wait=30.0, retry_interval=10.0, fair=True)
        got.append(time.monotonic())
        held.release()

    first = threading.Thread(target=impatient)
    first.start()
    time.sleep(0.2)
    second = threading.Thread(target=patient)
    second.start()
    first.join(10)
    assert gave_up, "the impatient waiter did not give up"
    released = time.monotonic()
    holder.release()
    second.join(15)
    assert got, "the second waiter was not served"
    assert got[0] - released < 1.0, f"served {got[0] - released:.2f} s after the release"


def test_a_fair_single_attempt_does_not_jump_the_queue(locker: Locker) -> None:
    holder = locker.acquire("job", ttl=30.0)
    queued: list[Lock] = []
    waiter = threading.Thread(
        target=lambda: queued.append(
            locker.acquire("job", ttl=30.0, wait=30.0, retry_interval=5.0, fair=True)
        )
    )
    waiter.start()
    time.sleep(0.3)
    holder.release()
    waiter.join(10)
    assert queued
    with pytest.raises(redlease.NotAcquired):
        locker.try_acquire("job")
    queued[0].release()


def test_fair_must_be_a_bool(locker: Locker) -> None:
    with pytest.raises(redlease.ConfigError, match="fair must be a bool"):
        locker.acquire("job", fair=1)  # type: ignore[arg-type]


_WAITER = textwrap.dedent(
    """
    import sys, redis, redlease
    locker = redlease.RedisLocker(redis.Redis(port=int(sys.argv[1])), prefix="fair:")
    print("waiting", flush=True)
    locker.acquire("job", ttl=30, wait=60, retry_interval=float(sys.argv[2]), fair=True)
    print("acquired", flush=True)
    """
)


def test_a_waiter_that_dies_leaves_the_queue_within_its_place_life(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client()
    with RedisLocker(client, prefix="fair:", engine=engine) as locker:
        holder = locker.acquire("job", ttl=30.0)
        doomed = subprocess.Popen(
            [sys.executable, "-c", _WAITER, str(redis_server.port), "0.5"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert doomed.stdout is not None and doomed.stdout.readline().strip() == "waiting"
            time.sleep(0.5)  # queued first
            got: list[float] = []

            def second() -> None:
                held = locker.acquire("job", ttl=30.0, wait=30.0, retry_interval=0.1, fair=True)
                got.append(time.monotonic())
                held.release()

            waiter = threading.Thread(target=second)
            waiter.start()
            time.sleep(0.3)
            os.kill(doomed.pid, signal.SIGKILL)
            killed = time.monotonic()
            holder.release()
            waiter.join(15)
            assert got, "the queue did not move on past the dead waiter"
            life = place_ms(0.5) / 1000  # 1.5 s: three of the dead waiter's intervals
            assert got[0] - killed < life + 1.0, f"held up {got[0] - killed:.2f} s"
        finally:
            doomed.kill()
            doomed.wait()
        # Nothing of the queue is left behind.
        assert client.keys("fair:queue*") == []


def test_asyncio_fair_waiters_in_order(redis_server: RedisServer, engine: str) -> None:
    async def main() -> None:
        client = redis_server.client(asyncio=True)
        locker = redlease.aio.RedisLocker(client, prefix="fair-aio:", engine=engine)
        served: list[int] = []
        try:
            holder = await locker.acquire("job", ttl=30.0)

            async def waiter(i: int) -> None:
                held = await locker.acquire(
                    "job", ttl=30.0, wait=30.0, retry_interval=0.2, fair=True
                )
                served.append(i)
                await held.release()

            tasks = []
            for i in range(4):
                tasks.append(asyncio.ensure_future(waiter(i)))
                await asyncio.sleep(0.15)
            await holder.release()
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            assert served == list(range(4))
        finally:
            await locker.close()
            await client.aclose()

    asyncio.run(main())


def test_fair_waiting_on_a_cluster(cluster_set: ClusterSet, engine: str) -> None:
    client = cluster_set.client(socket_timeout=2)
    with RedisLocker(client, prefix="{fair-cluster}:", engine=engine) as locker:
        for acquire in (acquirer(locker, "lock"), acquirer(locker, "semaphore")):
            holder = acquire(ttl=30.0)
            served: list[int] = []

            def waiter(
                i: int, acquire: Callable[..., Lock] = acquire, served: list[int] = served
            ) -> None:
                held = acquire(ttl=30.0, wait=30.0, retry_interval=0.3, fair=True)
                served.append(i)
                held.release()

            threads = []
            for i in range(4):
                thread = threading.Thread(target=waiter, args=(i,))
                thread.start()
                threads.append(thread)
                time.sleep(0.2)
            holder.release()
            for thread in threads:
                thread.join(30)
            assert served == list(range(4))
    client.close()


def test_fair_waiters_are_all_served_after_a_sentinel_failover(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    topology = sentinel_set_fresh
    client = topology.master_for(socket_timeout=1, socket_connect_timeout=1)
    with RedisLocker(client, prefix="fair-sentinel:", engine=engine) as locker:
        holder = locker.acquire("job", ttl=30.0)
        served: list[int] = []

        def waiter(i: int) -> None:
            while True:
                try:
                    held = locker.acquire(
                        "job", ttl=30.0, wait=60.0, retry_interval=0.5, fair=True
                    )
                    break
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    time.sleep(0.1)  # the failover under way: the waiter tries again
            served.append(i)
            held.release()

        threads = []
        for i in range(3):
            thread = threading.Thread(target=waiter, args=(i,))
            thread.start()
            threads.append(thread)
            time.sleep(0.3)
        old = topology.master()
        assert old.client().wait(1, 2000) >= 1  # the queue is on the replica too
        topology.failover()

        def demoted() -> bool:
            try:
                return bool(topology.role(old)[0] != "master")
            except (redis.ConnectionError, redis.TimeoutError):
                return False

        wait_until(demoted, 30, interval=0.05, what="the old master demoted")
        while True:
            try:
                holder.release()
                break
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                time.sleep(0.1)
        for thread in threads:
            thread.join(60)
        # Places are short leases, and an attempt that meets the
        # failover ends its acquire (as every backend error does): the order
        # across a failover is not promised, but no waiter is stranded and the
        # queue is left empty.
        assert sorted(served) == [0, 1, 2]
        master = topology.master().client()
        wait_until(lambda: master.keys("fair-sentinel:queue*") == [], 5, what="no queue left")
