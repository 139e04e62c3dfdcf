"""Partitioned ownership behind Sentinel and on a Cluster, across a failover, on both engines.

Every member is a real ``Partitions`` (and, in the last test, a
``redlease.aio.Partitions``) on a client of the harness's sets: a
Sentinel-managed master (``master_for``), a Sentinel set failed over under
the members' feet, and a 3-master Redis Cluster (a group lives in its name's
hash tag's slot). The rolling restart of every member, one after another, is
in ``test_partitions_rolling.py``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis

import redlease
import redlease.aio
from helpers import stays, wait_until
from redlease import Partitions
from redlease._testing import ClusterSet, SentinelSet, key_slot
from test_partitions import Recorder, balanced, wait_balanced
from test_partitions_aio import run, until

pytestmark = [pytest.mark.topology]


def members_of(
    client: Any,
    name: str,
    engine: str,
    ids: Sequence[str],
    n: int,
    ttl: float,
    record: Recorder | None = None,
) -> list[Partitions]:
    """One (unstarted) member per id, recording its callbacks in ``record`` when given."""
    return [
        Partitions(
            client,
            name,
            n,
            ttl=ttl,
            member_id=member_id,
            engine=engine,
            **(record.callbacks(member_id) if record is not None else {}),
        )
        for member_id in ids
    ]


Tenure = tuple[float, float, str, int, str]
"""One member's hold of one partition: (assigned at, revoked at, member, token, reason)."""


def tenures_of(record: Recorder) -> dict[str, list[Tenure]]:
    """Each partition's tenures, in order, from the callbacks; every tenure must have ended.

    ``on_assigned`` is recorded as it is called (after the acquire),
    ``on_revoked`` as it returns. A tenure handed over or stopped
    (``"rebalanced"``, ``"stopped"``) is released only after its
    ``on_revoked`` returned, so one that overlaps its successor in these
    records overlapped it at Redis. A ``"lost"`` one ended earlier than its
    record: ``owned()`` drops a lease the moment it can no longer be proven,
    and the member reports it once its run thread is not in a call to Redis.
    """
    tenures: dict[str, list[Tenure]] = {}
    opened: dict[tuple[str, str], tuple[float, int]] = {}
    with record.mutex:
        events = list(record.events)
    for at, member_id, event, partition, detail, _ in events:
        if event == "assigned":
            assert (member_id, partition) not in opened, f"{member_id} assigned {partition} twice"
            opened[(member_id, partition)] = (at, detail)
        else:
            assert (member_id, partition) in opened, f"{member_id} revoked {partition} unassigned"
            began, token = opened.pop((member_id, partition))
            tenures.setdefault(partition, []).append((began, at, member_id, token, detail))
    assert not opened, f"tenures still open after every member stopped: {sorted(opened)}"
    for spans in tenures.values():
        spans.sort()
    return tenures


def assert_one_owner_at_a_time_with_growing_tokens(record: Recorder) -> dict[str, list[Tenure]]:
    """No two tenures of a partition overlap, and each has a greater token than the last.

    A tenure that ended ``"lost"`` is reported late (see ``tenures_of``):
    its successor must instead have found no other member owning the
    partition as it was assigned, which ``record`` checks at every
    assignment of the members it watches (``Recorder.watch``).
    """
    tenures = tenures_of(record)
    with record.mutex:
        doubled = list(record.doubled)
    assert doubled == [], f"owned by two members at once (at, assigned, partition, also): {doubled}"
    lost = any(reason == "lost" for spans in tenures.values() for *_, reason in spans)
    assert record.watched or not lost, "a tenure was lost, but nobody watched its successor"
    for partition, spans in tenures.items():
        for before, after in itertools.pairwise(spans):
            if before[4] == "lost":
                assert before[0] < after[0], f"{partition}: {before} and {after} overlapped"
            else:
                assert before[1] < after[0], f"{partition}: {before} and {after} overlapped"
            assert after[3] > before[3], f"{partition}: token {after} after {before}"
    return tenures


# -- Sentinel ----------------------------------------------------------------------------------


@pytest.fixture
def sentinel_client(sentinel_set: SentinelSet) -> Iterator[redis.Redis]:
    """A client that follows the shared set's master, as an application behind Sentinel has."""
    client: redis.Redis = sentinel_set.master_for(socket_timeout=5, socket_connect_timeout=5)
    try:
        yield client
    finally:
        client.close()


def test_members_behind_sentinel_balance_two_then_three_over_twelve_partitions(
    sentinel_client: redis.Redis,
    sentinel_set: SentinelSet,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    name = f"sentinel-balance-{engine}"
    first, second, third = members_of(sentinel_client, name, engine, ["m1", "m2", "m3"], 12, 1.0)
    group = [started(first), started(second)]
    wait_balanced(group, 12, timeout=3 * 1.0 + 5)
    assert sorted(len(m.owned()) for m in group) == [6, 6]
    group.append(started(third))
    wait_balanced(group, 12, timeout=3 * 1.0 + 5)
    assert stays(lambda: balanced(group, 12), 0.3)
    assert sorted(len(m.owned()) for m in group) == [4, 4, 4]
    # What Redis says is what the members hold, on the master the sentinels name.
    assignment = first.assignment()
    assert assignment == {p: m.member_id for m in group for p in m.owned()}
    assert first.members() == ["m1", "m2", "m3"]
    with sentinel_set.node_client(sentinel_set.master()) as master:
        for member in group:
            for partition, token in member.owned().items():
                assert master.get(f"{name}:p:{partition}:leader") == member.member_id.encode()
                assert master.get(f"{name}:p:{partition}:fence") == str(token).encode()


def test_behind_sentinel_a_stale_owners_fenced_write_is_rejected_and_the_owners_applies(
    sentinel_client: redis.Redis,
    sentinel_set: SentinelSet,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    name = f"sentinel-fenced-{engine}"
    old, new = members_of(sentinel_client, name, engine, ["m1", "m2"], 4, 1.0)
    started(old)
    wait_until(lambda: len(old.owned()) == 4, timeout=8, what="all four owned by m1")
    fencers = {p: old.fencer(p) for p in old.owned()}
    assert all(f.set(f"{name}:data:{p}", "m1") for p, f in fencers.items())
    started(new)
    wait_balanced([old, new], 4, timeout=3 * 1.0 + 5)
    moved = new.owned()
    assert len(moved) == 2
    for partition, token in moved.items():
        assert token > fencers[partition].token
        assert not fencers[partition].set(f"{name}:data:{partition}", "stale m1")
        assert new.fencer(partition).set(f"{name}:data:{partition}", "m2")
    for partition in old.owned():
        assert fencers[partition].set(f"{name}:data:{partition}", "m1 again")  # same tenure
    with sentinel_set.node_client(sentinel_set.master()) as master:
        for partition in fencers:
            want = b"m2" if partition in moved else b"m1 again"
            assert master.get(f"{name}:data:{partition}") == want


def test_across_a_sentinel_failover_every_partition_is_owned_again_one_owner_at_a_time(
    sentinel_set_fresh: SentinelSet,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    topology = sentinel_set_fresh
    ttl = 1.0
    name = "failover"
    record = Recorder()
    client: redis.Redis = topology.master_for(socket_timeout=2, socket_connect_timeout=2)
    members = members_of(client, name, engine, ["m1", "m2", "m3"], 12, ttl, record)
    record.watch(members)
    group = [started(member) for member in members]
    wait_balanced(group, 12, timeout=3 * ttl + 5)
    before = {p: t for m in group for p, t in m.owned().items()}
    stale = {p: m.fencer(p) for m in group for p in m.owned()}
    new_master = topology.node_at(topology.failover())

    with topology.node_client(new_master, socket_timeout=2) as check:

        def owned_on_the_new_master() -> bool:
            if not balanced(group, 12):
                return False
            holders: list[bytes | None] = check.mget([f"{name}:p:{p}:leader" for p in range(12)])
            owners = {p: m.member_id.encode() for m in group for p in m.owned()}
            return holders == [owners.get(str(p)) for p in range(12)]

        wait_until(
            owned_on_the_new_master,
            timeout=3 * ttl + 5,
            what="every partition owned again, balanced, on the new master",
        )
        after = {p: t for m in group for p, t in m.owned().items()}
        for partition, token in after.items():
            assert token >= before[partition], f"{partition}: token went back"
            owner = next(m for m in group if partition in m.owned())
            if token > before[partition]:
                # Taken again after the switch: the old tenure's writes are refused.
                assert not stale[partition].set(f"{name}:data:{partition}", "stale")
            assert owner.fencer(partition).set(f"{name}:data:{partition}", owner.member_id)
        written = check.mget([f"{name}:data:{p}" for p in range(12)])
        owners = {p: m.member_id.encode() for m in group for p in m.owned()}
        assert written == [owners[str(p)] for p in range(12)]

    for member in group:
        member.stop()
    client.close()
    tenures = assert_one_owner_at_a_time_with_growing_tokens(record)
    assert set(tenures) == {str(p) for p in range(12)}
    assert all(
        reason in ("rebalanced", "lost", "stopped")
        for *_, reason in itertools.chain(*tenures.values())
    )


# -- Cluster -----------------------------------------------------------------------------------


@pytest.fixture
def cluster_client(cluster_set: ClusterSet) -> Iterator[redis.RedisCluster]:
    client: redis.RedisCluster = cluster_set.client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


def test_on_a_cluster_a_hash_tagged_group_balances_in_its_slot_and_fences_writes(
    cluster_client: redis.RedisCluster,
    cluster_set: ClusterSet,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    name = f"{{parts-{engine}}}"
    group = [
        started(member)
        for member in members_of(cluster_client, name, engine, ["m1", "m2", "m3"], 12, 1.0)
    ]
    wait_balanced(group, 12, timeout=3 * 1.0 + 5)
    assert stays(lambda: balanced(group, 12), 0.3)
    assert sorted(len(m.owned()) for m in group) == [4, 4, 4]
    assert group[0].assignment() == {p: m.member_id for m in group for p in m.owned()}
    assert group[1].members() == ["m1", "m2", "m3"]
    # Every key of the group lives on the master of the name's hash tag's slot.
    with cluster_set.master_for_slot(key_slot(name.encode())).client() as master:
        assert master.zcard(f"{name}:members") == 3
        for member in group:
            for partition, token in member.owned().items():
                assert master.get(f"{name}:p:{partition}:leader") == member.member_id.encode()
                key = f"{name}:data:{partition}"
                assert member.fencer(partition).set(key, member.member_id)
                assert master.get(key) == member.member_id.encode()
                assert master.get(f"{name}:p:{partition}:fence:applied") == str(token).encode()


@pytest.mark.parametrize("name", ["orders", "{}orders"])
@pytest.mark.parametrize("face", ["threaded", "asyncio"])
def test_on_a_cluster_a_name_without_a_hash_tag_is_a_config_error_at_construction(
    cluster_set: ClusterSet, face: str, name: str
) -> None:
    # "{}" is no hash tag: Cluster hashes the whole key when the braces hold nothing.
    client = cluster_set.client(asyncio=face == "asyncio")
    shell: Any = redlease.aio.Partitions if face == "asyncio" else Partitions
    try:
        with pytest.raises(redlease.ConfigError) as raised:
            shell(client, name, 12)
    finally:
        if face == "asyncio":
            asyncio.run(client.aclose())
        else:
            client.close()
    message = str(raised.value)
    assert "hash tag" in message and f"got {name!r}" in message and f"'{{{name}}}'" in message


# -- the asyncio member ------------------------------------------------------------------------


@pytest.mark.parametrize("topology", ["sentinel_set", "cluster_set"])
def test_the_asyncio_member_balances_and_fences_behind_sentinel_and_on_a_cluster(
    request: pytest.FixtureRequest, engine: str, topology: str
) -> None:
    found: SentinelSet | ClusterSet = request.getfixturevalue(topology)
    name = f"{{aio-{engine}}}"

    async def scenario() -> None:
        if isinstance(found, SentinelSet):
            client = found.master_for(asyncio=True, socket_timeout=5)
        else:
            client = found.client(asyncio=True, socket_timeout=5)
        group = [
            redlease.aio.Partitions(client, name, 12, ttl=1.0, member_id=m, engine=engine)
            for m in ("m1", "m2", "m3")
        ]
        try:
            for member in group:
                await member.start()
            await until(
                lambda: sorted(len(m.owned()) for m in group) == [4, 4, 4],
                timeout=3 * 1.0 + 5,
                what="4 partitions each",
            )
            owners = {p: m.member_id for m in group for p in m.owned()}
            assert len(owners) == 12
            assert await group[0].assignment() == owners
            assert await group[1].members() == ["m1", "m2", "m3"]
            for member in group:
                for partition in member.owned():
                    key = f"{name}:data:{partition}"
                    assert await member.fencer(partition).set(key, member.member_id)
                    assert await client.get(key) == member.member_id.encode()
        finally:
            for member in group:
                await member.stop()
            await client.aclose()
        assert all(m.owned() == {} for m in group)

    run(scenario)
