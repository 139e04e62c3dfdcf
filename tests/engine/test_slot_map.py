"""A cluster client's slot map is refreshed by a bounded, capped round trip of ours.

``refresh_slot_map`` asks the known nodes for ``CLUSTER SLOTS`` itself, over a
connection whose reply ends by the client's call bound and reads no more than
the reply cap, checks the answer entry by entry, and only then installs it
into the client's nodes manager, keeping the node objects (and their pools)
of every address it already knew. Against a real cluster the new owner of a
migrated slot is found; against the fake server (``redlease._testing.fake``)
as a cluster's only node, every answer that is not a map in time leaves the
old map, never raises and ends within the bound; and one cluster stuck
answering holds no other client's refresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.cluster import PRIMARY, REPLICA, ClusterNode, RedisCluster

from helpers import ClosedPort, wait_until
from redlease._engine.conn.client import refresh_slot_map
from redlease._engine.contract.interface import MAX_REPLY_BYTES
from redlease._testing import ClusterSet, key_slot
from redlease._testing.fake import HOSTILE, FakeRedis, Reply, Stream, array, bulk

pytestmark = pytest.mark.timeout(120)

BOUND = 1.0
"""The fake cluster client's socket_timeout: the bound on asking one node."""

SLACK = 1.5
"""What a loaded machine may add to a bound before the test calls it broken (seconds)."""

LAST_SLOT = 16383


def node(port: int, host: bytes = b"127.0.0.1") -> bytes:
    return array(bulk(host), b":%d\r\n" % port, bulk(b"%040d" % port))


def slot_range(first: int, last: int, *nodes: bytes) -> bytes:
    return array(b":%d\r\n" % first, b":%d\r\n" % last, *nodes)


def slots_reply(*ranges: tuple[int, int, int]) -> bytes:
    """A ``CLUSTER SLOTS`` answer: for each ``(first, last, port)``, a range held on that port."""
    return array(*(slot_range(first, last, node(port)) for first, last, port in ranges))


@contextmanager
def fake_cluster(*fakes: FakeRedis, timeout: float = BOUND) -> Iterator[RedisCluster]:
    """A ``RedisCluster`` started from ``fakes[0]``, its slots shared out over the fakes."""
    share = (LAST_SLOT + 1) // len(fakes)
    ranges = [
        (i * share, LAST_SLOT if i == len(fakes) - 1 else (i + 1) * share - 1, f.port)
        for i, f in enumerate(fakes)
    ]
    fakes[0].command("CLUSTER", slots_reply(*ranges))
    for fake in fakes:
        fake.command("COMMAND", b"*0\r\n")  # redis-py reads the command table once
    client = RedisCluster(
        startup_nodes=[ClusterNode("127.0.0.1", fakes[0].port)],
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
    )
    try:
        yield client
    finally:
        client.close()


def the_map(client: RedisCluster) -> tuple[Any, ...]:
    manager = client.nodes_manager
    return manager.slots_cache, manager.nodes_cache, manager.default_node


SLOTS_COMMAND = [b"CLUSTER", b"SLOTS"]


def slots_asked(fake: FakeRedis) -> int:
    """How many ``CLUSTER SLOTS`` the fake was sent."""
    return sum(1 for cmd in list(fake.commands) if [c.upper() for c in cmd] == SLOTS_COMMAND)


def timed(call: Callable[[], object]) -> float:
    began = time.monotonic()
    call()
    return time.monotonic() - began


VALID = slots_reply((0, LAST_SLOT, 1))
"""A map a refresh would install, were it read in time (every slot on port 1)."""

NOT_MAPS: dict[str, bytes] = {
    "a range whose first slot is past its last": array(slot_range(10, 5, node(1))),
    "a range past the last slot": array(slot_range(0, LAST_SLOT + 1, node(1))),
    "a node on port 0": array(slot_range(0, LAST_SLOT, node(0))),
    "a port past 65535": array(slot_range(0, LAST_SLOT, node(65536))),
    "a string where a slot belongs": array(array(bulk(b"0"), b":%d\r\n" % LAST_SLOT, node(1))),
    "a string where a port belongs": array(
        slot_range(0, LAST_SLOT, array(bulk(b"127.0.0.1"), bulk(b"6379")))
    ),
    "a range with no primary": array(array(b":0\r\n", b":%d\r\n" % LAST_SLOT)),
    "a node that is not an array": array(slot_range(0, LAST_SLOT, bulk(b"127.0.0.1:6379"))),
    "ranges that overlap": slots_reply((0, 100, 1), (100, LAST_SLOT, 2)),
    "no range at all": b"*0\r\n",
}
"""Answers shaped almost like a slot map: each is refused whole, not installed in part."""

ANSWERS: dict[str, Callable[[], Reply]] = {
    **HOSTILE,
    **{name: (lambda reply=reply: reply) for name, reply in NOT_MAPS.items()},
    "a valid map, one byte every 400 ms": lambda: Stream(
        [VALID[i : i + 1] for i in range(len(VALID))], every=0.4
    ),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_a_slot_map_answered_badly_leaves_the_old_map_within_the_bound(
    fake: FakeRedis, answer: str
) -> None:
    with fake_cluster(fake) as client:
        before = the_map(client)
        fake.command("CLUSTER", ANSWERS[answer]())
        took = timed(lambda: refresh_slot_map(client))  # never raises
        assert slots_asked(fake) == 2, "the startup read, then one refresh"
        assert took < BOUND + SLACK, f"the refresh took {took:.2f} s, its bound is {BOUND} s"
        assert all(now is then for now, then in zip(the_map(client), before, strict=True))


def test_a_flood_is_cut_off_at_the_reply_cap(fake: FakeRedis) -> None:
    mib = 1 << 20
    sent: list[int] = []

    def flood() -> Iterator[bytes]:
        yield b"$%d\r\n" % (64 * mib)
        for i in range(64):
            sent.append(i)
            yield b"x" * mib
        yield b"\r\n"

    with fake_cluster(fake) as client:
        before = the_map(client)
        fake.command("CLUSTER", Stream(flood(), every=0.0))
        took = timed(lambda: refresh_slot_map(client))
        assert took < BOUND + SLACK
        assert all(now is then for now, then in zip(the_map(client), before, strict=True))
    time.sleep(0.5)  # the fake stops at its first write after the hang-up
    # Reading stopped at the cap: past it, only what socket buffers hold was sent.
    assert len(sent) < MAX_REPLY_BYTES // mib + 16, f"{len(sent)} MiB of the bulk were sent"


def test_a_slot_map_is_installed_keeping_the_nodes_it_knew(
    fake: FakeRedis, closed_port: ClosedPort
) -> None:
    with fake_cluster(fake) as client:
        manager = client.nodes_manager
        kept = manager.get_node_from_slot(0)
        pool = kept.redis_connection.connection_pool
        fake.command(
            "CLUSTER",
            array(
                slot_range(0, 8191, node(fake.port)),
                # An empty host is the node that answered.
                slot_range(8192, LAST_SLOT, node(closed_port.port), node(fake.port, b"")),
            ),
        )
        refresh_slot_map(client)
        assert manager.get_node_from_slot(0) is kept
        assert kept.redis_connection.connection_pool is pool
        assert kept.server_type == PRIMARY and client.get_default_node() is kept
        new = manager.get_node_from_slot(LAST_SLOT)
        assert (new.host, new.port, new.server_type) == ("127.0.0.1", closed_port.port, PRIMARY)
        assert new.redis_connection is not None
        assert manager.slots_cache[LAST_SLOT] == [new, kept]


def test_callers_that_saw_the_same_move_cause_one_refresh(fake: FakeRedis) -> None:
    with fake_cluster(fake) as client:
        seen = time.monotonic()
        fake.command("CLUSTER", slots_reply((0, LAST_SLOT, fake.port)))
        callers = [threading.Thread(target=refresh_slot_map, args=(client, seen)) for _ in range(4)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(10)
        assert slots_asked(fake) == 2
        refresh_slot_map(client)  # a need seen after that refresh began: a refresh of its own
        assert slots_asked(fake) == 3


def test_a_frozen_node_is_passed_over_for_the_next_one_within_the_bound() -> None:
    with FakeRedis() as frozen, FakeRedis() as healthy, fake_cluster(frozen, healthy) as client:
        frozen.command("CLUSTER", Stream([b"*1\r\n", b""], every=5.0))
        healthy.command("CLUSTER", slots_reply((0, LAST_SLOT, healthy.port)))
        took = timed(lambda: refresh_slot_map(client))
        assert BOUND * 0.9 < took < BOUND + SLACK, f"the refresh took {took:.2f} s"
        assert client.nodes_manager.get_node_from_slot(0).port == healthy.port


def test_a_refresh_asks_no_longer_than_twice_the_bound_in_all() -> None:
    with FakeRedis() as a, FakeRedis() as b, FakeRedis() as c, fake_cluster(a, b, c) as client:
        before = the_map(client)
        for fake in (a, b, c):
            fake.command("CLUSTER", Stream([b"*1\r\n", b""], every=5.0))
        took = timed(lambda: refresh_slot_map(client))
        assert took < 2 * BOUND + SLACK, f"the refresh took {took:.2f} s"
        assert (slots_asked(a), slots_asked(b), slots_asked(c)) == (2, 1, 0)
        assert all(now is then for now, then in zip(the_map(client), before, strict=True))


def test_a_refresh_stuck_on_one_cluster_does_not_hold_another_clients(
    fake: FakeRedis, closed_port: ClosedPort
) -> None:
    with (
        FakeRedis() as other,
        fake_cluster(fake, timeout=4.0) as stuck,
        fake_cluster(other) as healthy,
    ):
        fake.command("CLUSTER", Stream([b"*1\r\n", b""], every=10.0))
        other.command("CLUSTER", slots_reply((0, LAST_SLOT, closed_port.port)))
        waiting = threading.Thread(target=refresh_slot_map, args=(stuck,))
        waiting.start()
        try:
            wait_until(lambda: slots_asked(fake) == 2, 5, what="the stuck refresh to ask")
            took = timed(lambda: refresh_slot_map(healthy))
            assert waiting.is_alive(), "the stuck refresh ended first"
            assert took < 1.0, f"the healthy refresh took {took:.2f} s"
            assert healthy.nodes_manager.get_node_from_slot(0).port == closed_port.port
        finally:
            waiting.join(10)


# -- a real cluster -------------------------------------------------------------------


@pytest.mark.topology
def test_a_migrated_slot_has_its_new_owner_after_a_refresh(cluster_set_fresh: ClusterSet) -> None:
    topology = cluster_set_fresh
    client = topology.client()
    try:
        manager = client.nodes_manager
        nodes = dict(manager.nodes_cache)
        pools = {name: n.redis_connection.connection_pool for name, n in nodes.items()}
        owners = {slot: manager.get_node_from_slot(slot) for slot in range(0, LAST_SLOT + 1, 97)}
        slot = key_slot("{slot-map}")
        client.set("{slot-map}:k", "v")
        source = topology.master_for_slot(slot)
        target = next(m for m in topology.masters() if m is not source)
        topology.migrate_slot(slot, target)
        assert manager.get_node_from_slot(slot).port == source.port  # not looked at yet

        refresh_slot_map(client)

        assert manager.get_node_from_slot(slot).port == target.port
        # Every node known before is kept, with its pool (a replica of a fresh
        # cluster may have joined the map since the client was made).
        assert nodes.keys() <= manager.nodes_cache.keys()
        for name, before in nodes.items():
            assert manager.nodes_cache[name] is before
            assert before.redis_connection.connection_pool is pools[name]
        assert all(manager.get_node_from_slot(s) is owner for s, owner in owners.items())
        assert client.get("{slot-map}:k") == b"v"
    finally:
        client.close()


@pytest.mark.topology
def test_after_a_failover_a_refresh_gives_the_same_nodes_their_new_roles(
    cluster_set_fresh: ClusterSet,
) -> None:
    topology = cluster_set_fresh
    client = topology.client()
    try:
        manager = client.nodes_manager
        slot = key_slot("{roles}")
        # A replica is listed once it has replicated something.
        client.set("{roles}:k", "v")

        def replica_listed() -> bool:
            refresh_slot_map(client)
            return len(manager.slots_cache[slot]) == 2

        wait_until(replica_listed, 10, interval=0.1, what="the slot's replica in the map")
        primary, replica = manager.slots_cache[slot]
        promoted = topology.failover(slot)
        assert promoted.port == replica.port
        topology.wait_healthy()  # the old primary is its replica now, and says so

        refresh_slot_map(client)

        assert manager.get_node_from_slot(slot) is replica
        assert manager.slots_cache[slot] == [replica, primary]
        assert (replica.server_type, primary.server_type) == (PRIMARY, REPLICA)
        assert client.get_default_node().server_type == PRIMARY
    finally:
        client.close()


@pytest.mark.topology
def test_a_cluster_clients_socket_timeout_is_its_call_and_write_bound(
    cluster_set: ClusterSet,
) -> None:
    from redlease._engine.conn.client import call_timeout, write_timeout

    timed = cluster_set.client(socket_timeout=1.5)
    untimed = cluster_set.client(socket_timeout=None)
    try:
        assert (call_timeout(timed), write_timeout(timed)) == (1.5, 1.5)
        # Without one: the defaults, 5 s for a control call and 30 s for a write.
        assert (call_timeout(untimed), write_timeout(untimed)) == (5.0, 30.0)
    finally:
        timed.close()
        untimed.close()
