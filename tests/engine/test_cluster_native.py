"""The native engine on a Redis Cluster: it routes to the owner of the name's
slot itself, without the GIL, follows MOVED and ASK, and refreshes its slot map
after a failover."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot as redis_key_slot

import redlease
from engine_helpers import command
from helpers import (
    Events,
    ProcessContender,
    elected_token,
    gil_call_size,
    hold_gil_at_least,
    require_native,
    require_probe,
)
from redlease._testing import ClusterSet, RedisServer, key_slot
from topology_helpers import close_all_engines, wait_leading_on

pytestmark = [pytest.mark.topology]


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


TTL = 1.0
MARGIN = 3.0
STOP_WITHIN = 3.0


@pytest.fixture(scope="module")
def cluster(cluster_set: ClusterSet) -> Iterator[RedisCluster]:
    client = cluster_set.client(socket_timeout=2)
    yield client
    client.close()


def _elector(
    client: RedisCluster,
    name: str,
    events: Events | None = None,
    ttl: float = TTL,
    engine: str = "native",
) -> redlease.Elector:
    if engine == "native":
        require_native()
    e = redlease.Elector(
        client, name, ttl=ttl, engine=engine, observer=events.observer() if events else None
    )
    assert e.engine == engine
    return e


def _stop(e: redlease.Elector) -> None:
    began = time.monotonic()
    e.stop(timeout=STOP_WITHIN)
    assert time.monotonic() - began < STOP_WITHIN, "stop() took too long"


SLOT_KEYS: list[str | bytes] = ["", "foo", "{job}:leader", "{job}", "a{b}c{d}", "{}x", "x{}{y}"]
SLOT_KEYS += ["{a", "a}", "é{ü}", b"\xff{\x00}"]


@pytest.mark.parametrize("key", SLOT_KEYS)
def test_key_slot_in_c_is_the_clusters(key: str | bytes) -> None:
    probe = require_probe()
    raw = key.encode() if isinstance(key, str) else key
    assert probe.key_slot(key) == redis_key_slot(raw)


def test_native_elector_on_a_cluster_fences_on_the_slots_owner(
    cluster_set: ClusterSet, cluster: RedisCluster
) -> None:
    e = _elector(cluster, "{cn-basic}")
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "{cn-basic}:state", "v1")
        assert e.fence_eval(
            token,
            "redis.call('SET', KEYS[2], ARGV[2]) redis.call('SET', KEYS[3], ARGV[3])",
            ["{cn-basic}:a", "{cn-basic}:b"],
            ["1", "2"],
        )
        assert not e.fence_set(token - 1, "{cn-basic}:state", "stale")
    owner = cluster_set.node_for_key("{cn-basic}").client()
    assert owner.get("{cn-basic}:state") == b"v1"
    assert owner.get("{cn-basic}:b") == b"2"
    assert int(owner.get("{cn-basic}:fence:applied")) == token


def test_a_fenced_write_with_a_key_in_another_slot_is_refused_before_sending(
    cluster: RedisCluster, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"{{cn-cross-{engine}}}"
    e = _elector(cluster, name, engine=engine)
    with e:
        token = elected_token(e)
        sent: list[object] = []
        engine_obj = e._core.engine
        # Every way a call reaches the engine: a batch, or a single call.
        for way in ("execute", "call_one"):
            real = getattr(engine_obj, way)
            monkeypatch.setattr(
                engine_obj, way, lambda *a, real=real, **k: sent.append(a) or real(*a, **k)
            )
        with pytest.raises(redis.exceptions.ResponseError, match=r"^CROSSSLOT.*'elsewhere'"):
            e.fence_set(token, "elsewhere", "x")
        with pytest.raises(redis.exceptions.ResponseError, match=r"^CROSSSLOT.*'other:b'"):
            e.fence_eval(token, "return 1", [f"{name}:a", "other:b"], [])
        with pytest.raises(redis.exceptions.ResponseError, match=r"^CROSSSLOT"):
            e.fence_hset(token, "h", "f", "v")
        assert sent == [], "a cross-slot write reached the engine"
        assert e.fence_set(token, f"{name}:ok", "x")
        assert sent, "the watch missed the write that was sent"
    assert cluster.get("elsewhere") is None


@pytest.mark.parametrize("fault", ["failover", "kill_master"])
def test_native_elector_follows_its_slot_to_the_new_master(
    cluster_set_fresh: ClusterSet, fault: str
) -> None:
    topology = cluster_set_fresh
    name = "{cn-fo}"
    slot = key_slot(name)
    events = Events()
    e = _elector(topology.client(socket_timeout=1), name, events)
    e.start()
    try:
        first = elected_token(e, timeout=10)
        assert topology.master_for_slot(slot).client().wait(1, 2000) >= 1
        began = time.monotonic()
        new = getattr(topology, fault)(slot)
        took = time.monotonic() - began
        token = wait_leading_on(new, e, TTL + MARGIN)
        print(f"{fault}: {took:.2f} s, leading on the new owner {time.monotonic() - began:.2f} s")
        if events.count("stepped_down"):
            assert token > first
        else:
            assert token == first
        assert e.fence_set(token, f"{name}:state", "after")
        assert new.client().get(f"{name}:state") == b"after"
        if token != first:
            assert not e.fence_set(first, f"{name}:state", "stale")
    finally:
        _stop(e)


def test_native_elector_follows_a_migration_of_its_slot(cluster_set_fresh: ClusterSet) -> None:
    topology = cluster_set_fresh
    name = "{cn-mig}"
    slot = key_slot(name)
    events = Events()
    e = _elector(topology.client(socket_timeout=1), name, events)
    e.start()
    try:
        first = elected_token(e, timeout=10)
        target = next(m for m in topology.masters() if m is not topology.master_for_slot(slot))
        assert topology.migrate_slot(slot, target) >= 3
        token = wait_leading_on(target, e, TTL + MARGIN)
        assert token == first and events.count("stepped_down") == 0, events.kinds()
        assert e.fence_set(token, f"{name}:state", "moved")
        assert target.client().get(f"{name}:state") == b"moved"
    finally:
        _stop(e)


def _get_asking(node: RedisServer, key: str) -> bytes | None:
    """GET on a node importing the key's slot (ASKING first, on the same connection)."""
    pipe = node.client().pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.get(key)
    value: bytes | None = pipe.execute()[1]
    return value


def test_native_elector_keeps_leading_while_its_slot_is_mid_migration(
    cluster_set_fresh: ClusterSet,
) -> None:
    """The lease's keys moved, the slot not yet handed over: every renewal gets ASK."""
    topology = cluster_set_fresh
    name = "{cn-ask}"
    slot = key_slot(name)
    events = Events()
    e = _elector(topology.client(socket_timeout=1), name, events)
    e.start()
    try:
        first = elected_token(e, timeout=10)
        # A multi-key write during a migration needs all its keys on one side
        # (else TRYAGAIN): the state key exists before the keys move.
        assert e.fence_set(first, f"{name}:state", "before")
        target = next(m for m in topology.masters() if m is not topology.master_for_slot(slot))
        migration = topology.begin_migration(slot, target)
        try:
            assert migration.move_keys() >= 3
            time.sleep(3 * TTL)
            assert events.count("stepped_down") == 0, events.kinds()
            assert e.token() == first
            assert _get_asking(target, f"{name}:leader") == e.instance_id.encode()
            # The source answers ASK: ASKING and the write go to the target.
            assert e.fence_set(first, f"{name}:state", "asked")
            assert _get_asking(target, f"{name}:state") == b"asked"
        finally:
            migration.finish()
        assert e.fence_set(first, f"{name}:state", "after")
        assert target.client().get(f"{name}:state") == b"after"
    finally:
        _stop(e)


def test_native_cluster_leader_keeps_its_lease_through_a_long_gil_holding_call(
    cluster_set: ClusterSet, cluster: RedisCluster
) -> None:
    # A whole TTL, not 0.3 s: with the cluster's six redis-servers and the
    # contender's process on a loaded 2-core host, the lease's master or the
    # renewer thread can stand still for the 0.2 s a 0.3 s lease renewed
    # every 0.1 s outlives, and the lease is lost with no GIL involved (seen
    # once in a run of tests/engine/ under load). The call still holds the
    # GIL for three TTLs.
    ttl = TTL
    name = "{cn-gil}"
    n = gil_call_size(3.2 * ttl)
    e = _elector(cluster, name, ttl=ttl)
    e.start()
    contender = None
    try:
        token = elected_token(e)
        seeds = [(n.host, n.port) for n in cluster.get_nodes()]
        contender = ProcessContender(
            "client = redis.cluster.RedisCluster(startup_nodes=["
            f"redis.cluster.ClusterNode(h, p) for h, p in {seeds!r}], socket_timeout=2)",
            name,
            ttl,
        )
        held = hold_gil_at_least(n, 3.2 * ttl)
        assert held > 3 * ttl, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        assert cluster.get(f"{name}:leader") == e.instance_id.encode()
        assert contender.elections() == [], "the other process took over during the call"
    finally:
        if contender is not None:
            contender.close()
        _stop(e)


def test_pool_routes_each_call_to_its_keys_slot(
    cluster_set: ClusterSet, cluster: RedisCluster
) -> None:
    core = require_native()
    from redlease._engine.conn.client import native_endpoint

    endpoint, why = native_endpoint(cluster)
    assert endpoint is not None, why
    target = core.Target(endpoint)
    assert target.kind == "cluster"
    assert target.address.startswith("cluster:")
    pool = core.Pool(target, 1)
    script = core.ScriptRef(
        "d8f2fad9f8e86a53d2a6ebd960b33c4972cacc37", "return redis.call('SET', KEYS[1], ARGV[1])"
    )
    try:
        # Keys of every master's slots, one after the other, on one connection.
        for key in ("a", "b", "c", "d", "{x}1", "{y}2"):
            assert pool.execute(script, [key], ["v-" + key], 2.0) == b"OK"
            assert cluster_set.node_for_key(key).client().get(key) == b"v-" + key.encode()
        assert command(pool, ["PING"], 2.0) == b"PONG"
    finally:
        pool.close()


def test_a_pool_keeps_a_connection_per_master_for_calls_that_go_all_over_the_cluster(
    cluster_set: ClusterSet, cluster: RedisCluster
) -> None:
    core = require_native()
    from redlease._engine.conn.client import native_endpoint

    endpoint, why = native_endpoint(cluster)
    assert endpoint is not None, why
    pool = core.Pool(core.Target(endpoint), 8)
    script = core.ScriptRef(
        "d8f2fad9f8e86a53d2a6ebd960b33c4972cacc37", "return redis.call('SET', KEYS[1], ARGV[1])"
    )
    masters = cluster_set.masters()

    def connections_made() -> int:
        return sum(int(m.client().info("stats")["total_connections_received"]) for m in masters)

    keys = [f"{{spread{i}}}" for i in range(90)]  # their slots on every master, in turn
    assert len({cluster_set.node_for_key(k).address for k in keys}) == len(masters)
    try:
        before = connections_made()
        for key in keys:
            assert pool.execute(script, [key], ["v"], 2.0) == b"OK"
        made = connections_made() - before - len(masters)  # the counting clients' own
        # One per master (and one that asked for the slot map); not one each
        # time a call's slot is on another master.
        assert made <= len(masters) + 1, made
    finally:
        pool.close()


@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_cluster_where_no_node_answers_is_reported_and_never_elects(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    client = cluster_set_fresh.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    events = Events()
    e = _elector(client, "{cn-dark}", events, engine=engine)
    cluster_set_fresh.stop()  # every node gone: masters and replicas
    e.start(None)
    deadline = time.monotonic() + 4 * TTL
    while time.monotonic() < deadline and len(events.values("error")) < 2:
        time.sleep(0.05)
    assert e.token() is None
    _stop(e)  # bounded with every node gone
    errors = events.values("error")
    assert "elected" not in events.kinds()
    unreachable = (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        redis.exceptions.RedisClusterException,
    )
    assert errors and all(isinstance(x, unreachable) for x in errors), errors
