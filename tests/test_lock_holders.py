"""Who holds a lock: a holder label stored with each lease, ``holder(name)`` and ``held()``.

On every locker (``RedisLocker`` on both engines and both client families,
``MemoryLocker``, and their asyncio faces) and every topology: a plain
server, a Sentinel set across a failover, a Cluster (on every master, a
slot mid-migration included).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator

import pytest
import redis

import redlease
from helpers import wait_until
from redlease import LockHolder
from redlease._scripts import load
from redlease._testing import ClusterSet, RedisServer, SentinelSet, key_slot
from redlease.lock import DEFAULT_PREFIX, MemoryLocker, RedisLocker

HOSTNAME_PID = f"{socket.gethostname()}-{os.getpid()}"


@pytest.fixture
def locker(client: redis.Redis, engine: str) -> Iterator[RedisLocker]:
    labelled = RedisLocker(client, engine=engine, holder="nightly@box-7")
    try:
        yield labelled
    finally:
        labelled.close()


# -- the label ----------------------------------------------------------------------------


def test_a_lease_carries_its_lockers_label_and_holder_reads_it_back(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.acquire("nightly", ttl=10.0)
    assert client.hget(f"{DEFAULT_PREFIX}key:nightly", "holder") == b"nightly@box-7"
    who = locker.holder("nightly")
    assert isinstance(who, LockHolder)
    assert who.holder == "nightly@box-7"
    assert who.fencing_token == held.fencing_token
    assert 9000 < who.ttl_ms <= 10000
    held.release()
    assert locker.holder("nightly") is None


def test_the_default_label_is_hostname_and_pid(client: redis.Redis, engine: str) -> None:
    with RedisLocker(client, engine=engine) as unlabelled:
        held = unlabelled.acquire("default-label", ttl=5.0)
        who = unlabelled.holder("default-label")
        assert who is not None and who.holder == HOSTNAME_PID
        held.release()


def test_the_label_never_decides_ownership(client: redis.Redis, engine: str) -> None:
    # Two lockers with the same label are still two owners.
    with RedisLocker(client, engine=engine, holder="same") as a, RedisLocker(
        client, engine=engine, holder="same"
    ) as b:
        held = a.acquire("owned", ttl=5.0)
        with pytest.raises(redlease.NotAcquired):
            b.try_acquire("owned")
        held.release()
        assert b.try_acquire("owned").fencing_token > held.fencing_token


def test_a_lease_written_without_a_label_reads_with_an_empty_holder(
    client: redis.Redis, locker: RedisLocker
) -> None:
    # A lease from before labels existed: the acquire script without its third argument.
    keys = (f"{DEFAULT_PREFIX}key:legacy", f"{DEFAULT_PREFIX}fencing")
    token, _ = client.eval(load("lock_acquire").source, 2, *keys, "o" * 32, 5000)
    assert client.hget(keys[0], "holder") is None
    who = locker.holder("legacy")
    assert who is not None and (who.holder, who.fencing_token) == ("", token)
    assert 0 < who.ttl_ms <= 5000
    assert [name for name, _ in locker.held()] == ["legacy"]


@pytest.mark.parametrize(
    ("label", "rule"),
    [
        (42, "must be a str or None"),
        ("", "must not be empty"),
        ("x" * 257, "at most 256 characters"),
        ("two\nlines", "control characters"),
    ],
)
def test_a_bad_label_is_a_config_error_naming_the_rule(
    client: redis.Redis, label: object, rule: str
) -> None:
    with pytest.raises(redlease.ConfigError, match=rule):
        RedisLocker(client, holder=label)  # type: ignore[arg-type]
    with pytest.raises(redlease.ConfigError, match=rule):
        MemoryLocker(holder=label)  # type: ignore[arg-type]


def test_holder_checks_the_name(locker: RedisLocker) -> None:
    with pytest.raises(redlease.ConfigError, match="must not be empty"):
        locker.holder("")


# -- held(): every lock under the prefix --------------------------------------------------


def test_held_lists_every_lock_under_the_prefix_and_nothing_else(
    client: redis.Redis, locker: RedisLocker, engine: str
) -> None:
    # More locks than one SCAN step or one read batch holds.
    names = [f"job:{i:04d}" for i in range(1200)]
    locks = [locker.acquire(n, ttl=30.0) for n in names]
    with RedisLocker(client, prefix="other:", engine=engine) as other:
        elsewhere = other.acquire("job:0001", ttl=30.0)
        # Keys under the prefix that are not live leases of ours.
        client.set(f"{DEFAULT_PREFIX}key:a-string", "x")
        client.hset(f"{DEFAULT_PREFIX}key:no-owner", "fencing", 3)
        client.hset(f"{DEFAULT_PREFIX}key:no-ttl", mapping={"owner": "o", "fencing": 4})
        held = locker.held()
        assert [name for name, _ in held] == names  # sorted, each once
        by_name = dict(held)
        for lock in locks:
            who = by_name[lock.name]
            assert who.holder == "nightly@box-7"
            assert who.fencing_token == lock.fencing_token
            assert 0 < who.ttl_ms <= 30000
        assert [name for name, _ in other.held()] == ["job:0001"]
        elsewhere.release()
    for lock in locks[:1000]:
        lock.release()
    assert [name for name, _ in locker.held()] == names[1000:]


def test_a_prefix_with_glob_characters_matches_itself_only(
    client: redis.Redis, engine: str
) -> None:
    with RedisLocker(client, prefix="a*[b]?:", engine=engine) as odd, RedisLocker(
        client, prefix="aXbY:", engine=engine
    ) as plain:
        odd_lock = odd.acquire("one", ttl=5.0)
        plain_lock = plain.acquire("two", ttl=5.0)
        assert [name for name, _ in odd.held()] == ["one"]
        assert [name for name, _ in plain.held()] == ["two"]
        odd_lock.release()
        plain_lock.release()


def test_an_expired_lock_is_neither_held_nor_has_a_holder(locker: RedisLocker) -> None:
    locker.acquire("short", ttl=0.2)
    assert locker.holder("short") is not None
    wait_until(lambda: locker.holder("short") is None, timeout=5, what="the lease's expiry")
    assert locker.held() == []


def test_memory_locker_reports_holders_as_redis_does() -> None:
    memory = MemoryLocker(holder="in-process")
    a = memory.acquire("b", ttl=10.0)
    c = memory.acquire("a", ttl=0.1)
    who = memory.holder("b")
    assert who is not None and who.holder == "in-process" and who.fencing_token == a.fencing_token
    assert 9000 < who.ttl_ms <= 10000
    assert [name for name, _ in memory.held()] == ["a", "b"]
    time.sleep(0.2)
    assert memory.holder("a") is None and c.fencing_token == a.fencing_token + 1
    assert [name for name, _ in memory.held()] == ["b"]
    a.release()
    assert memory.held() == [] and memory.holder("b") is None
    default = MemoryLocker()
    default.acquire("x", ttl=1.0)
    mine = default.holder("x")
    assert mine is not None and (mine.holder, mine.fencing_token) == (HOSTNAME_PID, 1)


def test_asyncio_lockers_report_holders(redis_server: RedisServer, family: str) -> None:
    async def main() -> None:
        client = redis_server.client(family=family, asyncio=True)
        locker = redlease.aio.RedisLocker(client, prefix="aio-holders:", holder="async-worker")
        memory = redlease.aio.MemoryLocker(holder="async-memory")
        try:
            for each in (locker, memory):
                held = await each.acquire("task", ttl=5.0)
                who = await each.holder("task")
                assert who is not None and who.fencing_token == held.fencing_token
                assert who.holder in ("async-worker", "async-memory")
                assert [name for name, _ in await each.held()] == ["task"]
                await held.release()
                assert await each.holder("task") is None
        finally:
            await locker.close()
            await client.aclose()

    asyncio.run(main())


# -- topologies ---------------------------------------------------------------------------


def test_holders_survive_a_sentinel_failover(sentinel_set_fresh: SentinelSet, engine: str) -> None:
    topology = sentinel_set_fresh
    client = topology.master_for(socket_timeout=1, socket_connect_timeout=1)
    with RedisLocker(client, engine=engine, holder="before-failover") as locker:
        held = locker.acquire("report", ttl=60.0)
        assert topology.master().client().wait(1, 2000) >= 1
        topology.failover()
        who = wait_until(lambda: _quiet(locker.holder, "report"), timeout=30, what="a read")
        assert who.holder == "before-failover" and who.fencing_token == held.fencing_token
        assert [name for name, _ in locker.held()] == ["report"]


def _quiet(read: object, name: str) -> LockHolder | None:
    try:
        return read(name)  # type: ignore[operator,no-any-return]
    except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
        return None  # the failover is still under way


def test_held_on_a_cluster_reads_every_master_even_mid_migration(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    cluster = cluster_set_fresh
    client = cluster.client(socket_timeout=2)
    prefix = "{ops-locks}:"
    names = [f"n{i:03d}" for i in range(40)]
    with RedisLocker(client, prefix=prefix, engine=engine, holder="cluster-job") as locker:
        locks = {n: locker.acquire(n, ttl=60.0) for n in names}
        slot = key_slot(prefix)
        target = next(m for m in cluster.masters() if m is not cluster.master_for_slot(slot))
        migration = cluster.begin_migration(slot, target)
        try:
            moved = migration.move_keys(limit=15)  # the slot's keys now on two masters
            assert 0 < moved < len(names) + 1
            held = dict(locker.held())
            assert sorted(held) == names
            assert all(held[n].fencing_token == locks[n].fencing_token for n in names)
            assert {who.holder for who in held.values()} == {"cluster-job"}
        finally:
            migration.finish()
        assert sorted(dict(locker.held())) == names
    client.close()
