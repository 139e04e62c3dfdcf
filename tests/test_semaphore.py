"""Semaphores: at most N holders of a name at once, each permit a fenced lock of its own.

The same behaviour from ``MemoryLocker`` and ``RedisLocker`` on both
engines (one parameter), asyncio included; then Redis specifics: a holder
killed, a lost release notice, replays, a Sentinel failover and a Cluster.
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
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import redis

import redlease
from helpers import wait_until
from redlease._scripts import load
from redlease._testing import ClusterSet, RedisServer, SentinelSet
from redlease.lock import Locker, MemoryLocker, RedisLocker

KINDS = ("memory", "native", "python")
T = TypeVar("T")


@pytest.fixture(params=KINDS, ids=KINDS)
def locker(request: pytest.FixtureRequest) -> Iterator[Locker]:
    if request.param == "memory":
        yield MemoryLocker(holder="worker-a")
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    client = server.client()
    made = RedisLocker(client, engine=request.param, holder="worker-a")
    try:
        yield made
    finally:
        made.close()
        client.close()


def semaphore(locker: Locker, name: str, permits: int) -> redlease.Semaphore:
    return locker.semaphore(name, permits)  # type: ignore[attr-defined,no-any-return]


@pytest.mark.parametrize("permits", [0, -1, True, 2.0, "3", None])
def test_permits_must_be_a_whole_number_of_at_least_one(locker: Locker, permits: object) -> None:
    with pytest.raises(redlease.ConfigError, match="permits must be"):
        semaphore(locker, "pool", permits)  # type: ignore[arg-type]
    with pytest.raises(redlease.ConfigError, match="must not be empty"):
        semaphore(locker, "", 2)


def test_at_most_n_permits_are_live_and_each_has_its_own_greater_token(locker: Locker) -> None:
    sem = semaphore(locker, "pool", 3)
    assert (sem.name, sem.permits) == ("pool", 3)
    permits = [sem.try_acquire(ttl=10.0) for _ in range(3)]
    tokens = [p.fencing_token for p in permits]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    with pytest.raises(redlease.NotAcquired, match="all 3 permits of semaphore 'pool'"):
        sem.try_acquire()
    with pytest.raises(redlease.NotAcquired, match=r"after waiting 0\.2 s"):
        sem.acquire(wait=0.2, retry_interval=0.05)
    holders = sem.holders()
    assert sorted(h.fencing_token for h in holders) == tokens
    assert {h.holder for h in holders} == {"worker-a"}
    assert all(0 < h.ttl_ms <= 10000 for h in holders)
    permits[1].release()
    again = sem.try_acquire(ttl=10.0)
    assert again.fencing_token > max(tokens)
    assert again.name == "pool"
    # A lock of the same name is another thing: it does not count against the permits.
    lock = locker.try_acquire("pool", ttl=5.0)
    lock.release()
    for p in (permits[0], permits[2], again):
        p.release()
    assert sem.holders() == []


def test_an_expired_permit_frees_its_place_at_its_ttl(locker: Locker) -> None:
    sem = semaphore(locker, "expiring", 1)
    first = sem.try_acquire(ttl=0.3)
    with pytest.raises(redlease.NotAcquired):
        sem.try_acquire()
    started = time.monotonic()
    second = sem.acquire(ttl=5.0, wait=5.0, retry_interval=0.05)
    assert time.monotonic() - started < 2.0
    assert second.fencing_token > first.fencing_token
    with pytest.raises(redlease.NotHeld):
        first.release()
    with pytest.raises(redlease.NotHeld):
        first.refresh()
    second.release()


def test_one_name_with_two_counts_is_a_config_error_while_permits_are_live(
    locker: Locker,
) -> None:
    held = semaphore(locker, "counted", 2).try_acquire(ttl=5.0)
    with pytest.raises(redlease.ConfigError, match=r"permits=2.*permits=3"):
        semaphore(locker, "counted", 3).try_acquire()
    held.release()
    # None live: the name may take another count.
    other = semaphore(locker, "counted", 3).try_acquire(ttl=5.0)
    other.release()


def test_a_release_admits_a_waiter_at_once(locker: Locker) -> None:
    sem = semaphore(locker, "handover", 1)
    held = sem.try_acquire(ttl=30.0)
    got: list[float] = []

    def wait_for_it() -> None:
        permit = sem.acquire(ttl=30.0, wait=20.0, retry_interval=5.0)
        got.append(time.monotonic())
        permit.release()

    waiter = threading.Thread(target=wait_for_it)
    waiter.start()
    time.sleep(0.5)  # its first attempt failed: it sleeps up to its 5 s interval
    released = time.monotonic()
    held.release()
    waiter.join(10)
    assert got, "the waiter did not get the permit"
    assert got[0] - released < 1.0, f"admitted {got[0] - released:.3f} s after the release"


def test_hold_renews_a_permit_past_its_ttl_and_releases_it(locker: Locker) -> None:
    sem = semaphore(locker, "long", 1)
    with sem.hold(ttl=0.3) as permit:
        time.sleep(1.0)  # three TTLs: the watchdog renews it
        assert not permit.done.is_set()
        with pytest.raises(redlease.NotAcquired):
            sem.try_acquire()
    assert sem.holders() == []
    sem.try_acquire(ttl=1.0).release()


def test_contenders_never_exceed_the_permits_and_tokens_only_grow(locker: Locker) -> None:
    sem = semaphore(locker, "busy", 3)
    inside = 0
    most = 0
    grants: list[int] = []
    guard = threading.Lock()
    stop = time.monotonic() + 3.0

    def worker() -> None:
        nonlocal inside, most
        while time.monotonic() < stop:
            try:
                permit = sem.acquire(ttl=5.0, wait=1.0, retry_interval=0.01)
            except redlease.NotAcquired:
                continue
            with guard:
                inside += 1
                most = max(most, inside)
                grants.append(permit.fencing_token)
            time.sleep(0.005)
            with guard:
                inside -= 1
            permit.release()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most <= 3, f"{most} permits were held at once"
    assert len(grants) > 20
    assert len(set(grants)) == len(grants), "a token was given twice"


def test_held_lists_live_permits_under_the_semaphores_name(locker: Locker) -> None:
    sem = semaphore(locker, "pool", 2)
    a, b = sem.try_acquire(ttl=10.0), sem.try_acquire(ttl=10.0)
    lock = locker.try_acquire("solo", ttl=10.0)
    held = locker.held()
    assert [(name, who.fencing_token) for name, who in held] == [
        ("pool", a.fencing_token),
        ("pool", b.fencing_token),
        ("solo", lock.fencing_token),
    ]
    for each in (a, b, lock):
        each.release()
    assert locker.held() == []


def test_asyncio_semaphores(locker: Locker, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["locker"]

    async def main() -> None:
        if kind == "memory":
            async_locker: object = redlease.aio.MemoryLocker(holder="async")
            client = None
        else:
            server: RedisServer = request.getfixturevalue("redis_server")
            client = server.client(asyncio=True)
            async_locker = redlease.aio.RedisLocker(client, engine=kind, holder="async")
        sem = async_locker.semaphore("aio-pool", 2)  # type: ignore[attr-defined]
        try:
            a = await sem.acquire(ttl=5.0)
            async with sem.hold(ttl=5.0) as b:
                assert b.fencing_token > a.fencing_token
                with pytest.raises(redlease.NotAcquired):
                    await sem.try_acquire()
                assert len(await sem.holders()) == 2
                # A waiter cancelled mid-wait leaks no permit.
                waiting = asyncio.ensure_future(sem.acquire(wait=10.0, retry_interval=0.05))
                await asyncio.sleep(0.2)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            await a.release()
            await asyncio.sleep(0.3)
            assert await sem.holders() == []
        finally:
            await async_locker.close()  # type: ignore[attr-defined]
            if client is not None:
                await client.aclose()

    asyncio.run(main())


# -- Redis specifics ----------------------------------------------------------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time, redis, redlease
    locker = redlease.RedisLocker(redis.Redis(port=int(sys.argv[1])), holder="doomed")
    permit = locker.semaphore("killed", 1).try_acquire(ttl=float(sys.argv[2]))
    print(permit.fencing_token, flush=True)
    time.sleep(60)
    """
)


def test_a_killed_holders_permit_frees_at_its_ttl(redis_server: RedisServer, engine: str) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(redis_server.port), "1.0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        token = int(holder.stdout.readline())
        os.kill(holder.pid, signal.SIGKILL)
        killed = time.monotonic()
        with RedisLocker(redis_server.client(), engine=engine) as locker:
            sem = locker.semaphore("killed", 1)
            assert [h.holder for h in sem.holders()] == ["doomed"]
            permit = sem.acquire(ttl=5.0, wait=10.0, retry_interval=0.05)
            waited = time.monotonic() - killed
            assert permit.fencing_token > token
            assert waited < 3.0, f"the dead holder's permit freed after {waited:.2f} s"
            permit.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_lost_release_notice_still_admits_the_waiter_by_polling(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client()
    with RedisLocker(client, engine=engine) as locker:
        sem = locker.semaphore("unannounced", 1)
        held = sem.try_acquire(ttl=30.0)
        started = time.monotonic()
        got: list[redlease.Lock] = []
        waiter = threading.Thread(
            target=lambda: got.append(sem.acquire(ttl=5.0, wait=10.0, retry_interval=0.3))
        )
        waiter.start()
        time.sleep(0.5)
        # The permit goes without a release (no notice): as if its notice were lost.
        client.delete(f"{redlease.lock.DEFAULT_PREFIX}sem:unannounced")
        waiter.join(10)
        assert got, "the waiter was not admitted"
        assert time.monotonic() - started < 3.0
        with pytest.raises(redlease.NotHeld):
            held.release()
        got[0].release()


def test_a_replayed_acquire_returns_the_same_permit(redis_server: RedisServer) -> None:
    client = redis_server.client()
    script = load("sem_acquire")
    keys = ("p:sem:r", "p:sem-info:r", "p:fencing")
    first = client.eval(script.source, 3, *keys, "owner-1", 5000, 1, "h")
    again = client.eval(script.source, 3, *keys, "owner-1", 5000, 1, "h")
    other = client.eval(script.source, 3, *keys, "owner-2", 5000, 1, "h")
    assert first[0] == again[0] == 1
    assert other[0] == 0 and 0 < other[1] <= 5000


def test_permits_survive_a_sentinel_failover(sentinel_set_fresh: SentinelSet, engine: str) -> None:
    topology = sentinel_set_fresh
    client = topology.master_for(socket_timeout=1, socket_connect_timeout=1)
    with RedisLocker(client, engine=engine, holder="before") as locker:
        sem = locker.semaphore("failover", 2)
        a, b = sem.try_acquire(ttl=60.0), sem.try_acquire(ttl=60.0)
        old = topology.master()
        assert old.client().wait(1, 2000) >= 1
        topology.failover()
        # Writes the old master took before it was demoted would be lost
        # (asynchronous replication): the test writes once it is a replica.
        def demoted() -> bool:
            try:
                return bool(topology.role(old)[0] != "master")
            except (redis.ConnectionError, redis.TimeoutError):
                return False  # it drops its clients as it turns replica

        wait_until(demoted, 30, interval=0.05, what="the old master demoted")

        def settled(step: Callable[[], T]) -> T:
            """``step`` once the sentinels' new master serves it (refusals meanwhile are fine)."""
            done: list[T] = []

            def attempt() -> bool:
                try:
                    done.append(step())
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                    return False  # the failover is still under way
                return True

            wait_until(attempt, timeout=30, interval=0.05, what="the new master")
            return done[0]

        def third() -> None:
            with pytest.raises(redlease.NotAcquired):
                sem.try_acquire(ttl=5.0)

        settled(third)
        assert sorted(h.fencing_token for h in sem.holders()) == [a.fencing_token, b.fencing_token]
        settled(a.release)
        c = settled(lambda: sem.try_acquire(ttl=5.0))
        assert c.fencing_token > b.fencing_token
        c.release()
        b.release()


def test_semaphores_on_a_cluster(cluster_set: ClusterSet, engine: str) -> None:
    client = cluster_set.client(socket_timeout=2)
    with RedisLocker(client, prefix="{sem-cluster}:", engine=engine, holder="c") as locker:
        sem = locker.semaphore("pool", 2)
        a = sem.try_acquire(ttl=10.0)
        with sem.hold(ttl=1.0) as b:
            with pytest.raises(redlease.NotAcquired):
                sem.try_acquire()
            assert [name for name, _ in locker.held()] == ["pool", "pool"]
            got: list[float] = []

            def wait_for_it() -> None:
                permit = sem.acquire(ttl=5.0, wait=20.0, retry_interval=5.0)
                got.append(time.monotonic())
                permit.release()

            waiter = threading.Thread(target=wait_for_it)
            waiter.start()
            time.sleep(0.5)
            released = time.monotonic()
            a.release()
            waiter.join(10)
            assert got and got[0] - released < 1.0, "the release was not pushed on the cluster"
            assert b.fencing_token > a.fencing_token
    client.close()


def test_a_semaphore_named_like_another_ones_details_is_its_own(locker: Locker) -> None:
    # Names are free text: none collides with the keys of another semaphore.
    first = semaphore(locker, "x", 1).try_acquire(ttl=5.0)
    second = semaphore(locker, "x:info", 1).try_acquire(ttl=5.0)
    third = semaphore(locker, "sem-info:x", 1).try_acquire(ttl=5.0)
    assert [name for name, _ in locker.held()] == ["sem-info:x", "x", "x:info"]
    for permit in (first, second, third):
        permit.release()
