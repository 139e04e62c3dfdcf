"""On a Cluster a fenced write is routed by its fence's slot, hashed once per fence.

The fence computes its name's slot once (every key of its writes is in it)
and hands it with each write to the engine, which routes by it instead of
hashing the first key again. A slot that is not the key's shows where the
write went: the node that owns that slot answers MOVED, and counts the
EVALSHA it refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import redlease
import redlease._engine.engines.python as python_engine
from helpers import require_native
from redlease._testing import ClusterSet, RedisServer, key_slot

pytestmark = pytest.mark.usefixtures("engines_closed")

TOKEN = 5
NOOP = "local unused = 1"


@pytest.fixture
def cluster(cluster_set: ClusterSet) -> Iterator[Any]:
    client = cluster_set.client(socket_timeout=2)
    yield client
    client.close()


def refused(node: RedisServer) -> int:
    """How many EVALSHA ``node`` refused (a MOVED or ASK among them) since it started."""
    with node.client() as c:
        stats = c.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("rejected_calls", 0))


def elsewhere(topology: ClusterSet, name: str) -> tuple[int, RedisServer]:
    """A slot, and its master, that another master than ``name``'s owns."""
    owner = topology.master_for_slot(key_slot(name))
    other = next(m for m in topology.masters() if m is not owner)
    slot = next(s for s in range(16384) if topology.master_for_slot(s) is other)
    return slot, other


def fence_of(e: Any) -> Any:
    return e._core.fence


def test_the_fences_slot_is_computed_once_and_names_its_mark(cluster: Any, engine: str) -> None:
    name = f"{{fslot-own-{engine}}}"
    e = redlease.Elector(cluster, name, ttl=2, engine=engine)
    assert fence_of(e)._slot == key_slot(f"{name}:fence:applied") == key_slot(name)


def test_the_native_engine_sends_a_fenced_write_to_the_master_of_the_slot_it_is_given(
    cluster_set: ClusterSet, cluster: Any
) -> None:
    """Each way a fenced write leaves a thread (one write, a batch) is routed by the slot
    the fence hands it, not by its key: given a slot another master owns, the write goes
    there, and the core, which trusts the slot, sends it there again after each MOVED
    until it gives up with the last one."""
    require_native()
    name = "{fslot-route}"
    e = redlease.Elector(cluster, name, ttl=2, engine="native")
    assert e.fence_eval(TOKEN, NOOP, [], [])  # connections open, the script loaded
    slot, other = elsewhere(cluster_set, name)
    before = refused(other)
    # The name's own slot: nothing goes to the other master.
    assert e.fence_eval(TOKEN, NOOP, [], [])
    assert e.fence_pipeline(TOKEN).eval(NOOP, [], []).eval(NOOP, [], []).execute()
    assert refused(other) == before
    fence_of(e)._slot = slot  # the mark, the only key, stays the name's: only the route changes
    for send in (
        lambda: e.fence_eval(TOKEN, NOOP, [], []),
        lambda: e.fence_pipeline(TOKEN).eval(NOOP, [], []).eval(NOOP, [], []).execute(),
    ):
        with pytest.raises(redis.exceptions.MovedError):
            send()
        assert refused(other) > before, "the write did not go where its slot said"
        before = refused(other)


def test_the_native_loop_writer_connects_to_the_master_of_the_slot_it_is_given(
    cluster_set: ClusterSet,
) -> None:
    """The same from a coroutine: the loop connection opens to the owner of the slot the
    write is given; its MOVED sends the write again the blocking way, with that slot."""
    require_native()
    name = "{fslot-aio}"
    slot, other = elsewhere(cluster_set, name)
    nodes = [redis.asyncio.cluster.ClusterNode("127.0.0.1", m.port) for m in cluster_set.masters()]

    async def scenario() -> list[int]:
        client = redis.asyncio.RedisCluster(startup_nodes=nodes, socket_timeout=2)
        e = redlease.aio.Elector(client, name, ttl=2, engine="native")
        counts = [refused(other)]
        try:
            assert await e.fence_eval(TOKEN, NOOP, [], [])
            counts.append(refused(other))
            fence_of(e)._slot = slot
            # The loop connection is open to the name's owner: dropped, the next
            # write connects to the owner of the slot it is given.
            e._core.engine.loop_writer(asyncio.get_running_loop())._disconnect()
            with pytest.raises(redis.exceptions.MovedError):
                await e.fence_eval(TOKEN, NOOP, [], [])
            counts.append(refused(other))
        finally:
            await client.aclose()
        return counts

    first, own, given = asyncio.run(scenario())
    assert own == first, "a write with its own slot went to another master"
    assert given > own, "the write did not go where its slot said"


def test_the_python_engine_routes_each_fenced_write_by_its_fences_slot(
    cluster_set: ClusterSet, cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every send of a fenced write, from a thread or a coroutine, one write or a batch,
    looks its route up by the fence's slot: no cluster client hashes a key for it."""
    name = "{fslot-count}"
    e = redlease.Elector(cluster, name, ttl=2, engine="python")
    nodes = [redis.asyncio.cluster.ClusterNode("127.0.0.1", m.port) for m in cluster_set.masters()]

    # A connection per pool opened (a new one is made by its key, once).
    assert e.fence_set(TOKEN, f"{name}:k", "first")
    assert e.fence_pipeline(TOKEN).set(f"{name}:a", "1").set(f"{name}:b", "2").execute()
    routed: list[int | None] = []
    real_route = python_engine.master_node

    def route(client: Any, key: Any, slot: int | None = None) -> Any:
        routed.append(slot)
        return real_route(client, key, slot)

    monkeypatch.setattr(python_engine, "master_node", route)
    hashed: list[object] = []  # by any cluster client, threaded or asyncio
    for cls in (redis.cluster.RedisCluster, redis.asyncio.RedisCluster):
        real_hash = cls.keyslot
        monkeypatch.setattr(
            cls,
            "keyslot",
            lambda self, key, real=real_hash: hashed.append(key) or real(self, key),
        )

    async def from_a_coroutine(n: int) -> None:
        client = redis.asyncio.RedisCluster(startup_nodes=nodes, socket_timeout=2)
        aio = redlease.aio.Elector(client, name, ttl=2, engine="python")
        try:
            assert await aio.fence_set(TOKEN, f"{name}:k", "aio")  # its engine's first
            hashed.clear()  # that engine's connection was made by its key
            routed.clear()
            for i in range(n):
                assert await aio.fence_set(TOKEN, f"{name}:k", f"aio{i}")
        finally:
            await client.aclose()

    for i in range(20):
        assert e.fence_set(TOKEN, f"{name}:k", str(i))
        assert e.fence_pipeline(TOKEN).set(f"{name}:a", i).set(f"{name}:b", i).execute()
    assert hashed == []
    assert routed == [key_slot(name)] * 40
    # A coroutine's writes: on the executor, through the same path.
    asyncio.run(from_a_coroutine(5))
    assert hashed == []
    assert routed == [key_slot(name)] * 5
    # The watch itself works: a call with no slot known hashes its key.
    script = fence_of(e)._eval_script(NOOP)
    hashed.clear()
    e._core.engine.call_one(script, (f"{name}:fence:applied",), (TOKEN,))
    assert routed[-1] is None
    assert hashed[:1] == [f"{name}:fence:applied"]


def test_a_fenced_write_follows_its_slot_mid_migration_and_after_it(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    """A single write while the name's keys have moved but the slot has not (ASK), and
    after the slot moved (MOVED): applied once, on the node that holds the keys."""
    topology = cluster_set_fresh
    name = "{fslot-move}"
    slot = key_slot(name)
    client = topology.client(socket_timeout=2)
    e = redlease.Elector(client, name, ttl=2, engine=engine)
    assert e.fence_set(TOKEN, f"{name}:k", "before")
    owner = topology.master_for_slot(slot)
    target = next(m for m in topology.masters() if m is not owner)
    migration = topology.begin_migration(slot, target)
    try:
        assert migration.move_keys() >= 2  # the key and the mark
        asked = refused(owner)
        assert e.fence_set(TOKEN + 1, f"{name}:k", "asked")
        assert refused(owner) > asked, "the write did not meet the migration"
        with target.client() as on_target:
            pipe = on_target.pipeline(transaction=False)
            pipe.execute_command("ASKING")
            pipe.get(f"{name}:k")
            assert pipe.execute()[1] == b"asked"
    finally:
        migration.finish()
    assert e.fence_set(TOKEN + 2, f"{name}:k", "moved")
    assert not e.fence_set(TOKEN + 1, f"{name}:k", "stale")
    with target.client() as on_target:
        assert on_target.get(f"{name}:k") == b"moved"
        assert on_target.get(f"{name}:fence:applied") == str(TOKEN + 2).encode()
    client.close()
