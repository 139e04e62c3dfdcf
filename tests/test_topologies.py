"""The Elector on every kind of client it accepts: unix sockets, ACL users
and databases, Sentinel-managed masters and Redis Cluster.

The tests taking ``family`` run with a redis-py client and with a valkey-py one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

import redlease
import redlease._engine.engines.select
import redlease.aio
from helpers import elected_token, require_native, wait_until, watch_release_batches
from redlease._testing import ClusterSet, RedisServer, SentinelSet
from redlease._testing._common import client_module

pytestmark = pytest.mark.usefixtures("engines_closed")


def _lead_and_fence(elector: redlease.Elector, key: str) -> int:
    with elector:
        token = elected_token(elector)
        assert elector.fence_set(token, key, "v1")
        assert not elector.fence_set(token - 1, key, "stale")
    return token


# -- unix sockets, ACL users, databases ---------------------------------------------


def test_elector_works_over_a_unix_socket(engine: str, family: str) -> None:
    with RedisServer(unix=True) as server:
        client = server.client(family=family)
        assert client.connection_pool.connection_kwargs.get("path")
        e = redlease.Elector(client, "unix", ttl=0.5, engine=engine)
        assert e.engine == engine
        token = _lead_and_fence(e, "unix:state")
        assert client.get("unix:state") == b"v1"
        assert client.get("unix:fence:applied") == str(token).encode()
        assert not client.exists("unix:leader")


def test_elector_respects_the_clients_acl_user_and_database(
    redis_server: RedisServer, engine: str, family: str
) -> None:
    admin = redis_server.client()
    admin.acl_setuser("svc", enabled=True, passwords=["+s3cret"], keys=["~*"], commands=["+@all"])
    user_client = redis_server.client(family=family, db=3, username="svc", password="s3cret")
    e = redlease.Elector(user_client, "acl", ttl=0.5, engine=engine)
    _lead_and_fence(e, "acl:state")
    db3 = redis_server.client(db=3)
    assert db3.get("acl:state") == b"v1"
    assert db3.exists("acl:fence")
    assert not admin.exists("acl:fence"), "keys must land in the client's database, not db 0"


def test_wrong_password_is_raised_by_start_and_never_elects(
    redis_server: RedisServer, engine: str
) -> None:
    redis_server.client().config_set("requirepass", "right")
    errors: list[Exception] = []
    bad = redis.Redis(host="127.0.0.1", port=redis_server.port, password="wrong")
    e = redlease.Elector(
        bad, "auth", ttl=0.3, engine=engine, observer=redlease.Observer(on_error=errors.append)
    )
    # Retrying cannot mend it: the first contact raises it (tests/test_first_contact.py).
    with pytest.raises(redis.exceptions.AuthenticationError), e:
        pass
    assert e.token() is None
    assert errors == []


# -- Sentinel -----------------------------------------------------------------------


@pytest.fixture
def sentinel(sentinel_set: SentinelSet) -> Sentinel:
    """A redis-py ``Sentinel`` for the module's Sentinel set (master ``svc``, three sentinels)."""
    return sentinel_set.manager()


def test_sentinel_master_client_runs_on_the_native_engine(
    sentinel_set: SentinelSet, family: str
) -> None:
    require_native()
    client = sentinel_set.master_for("svc", family=family, socket_timeout=1)
    e = redlease.Elector(client, "sentinel", ttl=0.5)
    assert e.engine == "native"
    token = _lead_and_fence(e, "sentinel:state")
    assert client.get("sentinel:state") == b"v1"
    assert int(client.get("sentinel:fence:applied")) == token


def test_sentinel_master_client_on_the_python_engine(
    sentinel_set: SentinelSet, family: str
) -> None:
    client = sentinel_set.master_for("svc", family=family, socket_timeout=1)
    e = redlease.Elector(client, "sentinel-py", ttl=0.5, engine="python")
    token = _lead_and_fence(e, "sentinel-py:state")
    assert int(client.get("sentinel-py:fence:applied")) == token


def test_a_refusal_behind_sentinel_is_raised_by_start_naming_the_sentinels(
    sentinel_set: SentinelSet, engine: str, family: str
) -> None:
    """The first contact goes to the master the sentinels name (DESIGN.md section 16)."""
    client = sentinel_set.master_for("svc", family=family, db=9999, socket_timeout=2)
    e = redlease.Elector(client, "sentinel-contact", ttl=0.5, engine=engine)
    with pytest.raises(client_module(family).exceptions.ResponseError) as caught:
        e.start()
    text = str(caught.value)
    assert "DB index is out of range" in text
    assert "'svc'" in text and f":{sentinel_set.sentinels[0].port}" in text, text
    assert e.token() is None


def test_a_refused_password_behind_sentinel_is_the_same_class_on_both_engines(
    sentinel_set: SentinelSet, engine: str, family: str
) -> None:
    """The native core names the service before the master's reply; the class stays the
    one the reply's code maps to (an ``AuthenticationError``), as on the Python engine."""
    client = sentinel_set.master_for(
        "svc", family=family, username="nobody", password="not-it", socket_timeout=2
    )
    e = redlease.Elector(client, "sentinel-auth", ttl=0.5, engine=engine)
    with pytest.raises(client_module(family).exceptions.AuthenticationError) as caught:
        e.start()
    assert "not-it" not in str(caught.value)
    assert e.token() is None


def test_stop_all_behind_sentinel_batches_the_releases_on_the_master(
    sentinel_set: SentinelSet, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = sentinel_set.master_for("svc", socket_timeout=1)
    group = [redlease.Elector(client, f"s-stopall{i}", ttl=5, engine=engine) for i in range(20)]
    for e in group:
        e.start(None)
    for e in group:
        elected_token(e)
    sizes = watch_release_batches(monkeypatch)
    redlease.stop_all(group)
    assert sizes == [20]
    assert all(e.token() is None for e in group)
    assert client.exists(*[f"s-stopall{i}:leader" for i in range(20)]) == 0


def test_native_engine_refuses_a_sentinel_client_and_says_why(
    sentinel: Sentinel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build of the extension without Sentinel support: auto falls back, native refuses."""
    require_native()
    monkeypatch.setattr(redlease._engine.engines.select, "native_features", lambda: frozenset())
    client = sentinel.master_for("svc")
    e = redlease.Elector(client, "sentinel")
    assert e.engine == "python"
    assert "Sentinel" in e.engine_reason
    with pytest.raises(redlease.ConfigError, match="Sentinel"):
        redlease.Elector(client, "sentinel", engine="native")


# -- Cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(cluster_set: ClusterSet) -> Iterator[RedisCluster]:
    """A client for the module's cluster: three masters with a replica each.

    Shared by this module's tests (a cluster takes seconds to converge); each
    test uses names of its own.
    """
    client = cluster_set.client(socket_timeout=2)
    yield client
    client.close()


@pytest.fixture
def family_cluster(cluster_set: ClusterSet, family: str) -> Iterator[Any]:
    """As ``cluster``, of the test's ``family``: a ``RedisCluster`` or a ``ValkeyCluster``."""
    client = cluster_set.client(family=family, socket_timeout=2)
    yield client
    client.close()


def test_cluster_name_without_hash_tag_is_a_config_error(cluster: RedisCluster) -> None:
    with pytest.raises(redlease.ConfigError, match="hash tag"):
        redlease.Elector(cluster, "no-tag")


def test_cluster_elector_with_hash_tag_elects_and_fences(
    engine: str, family_cluster: Any
) -> None:
    cluster = family_cluster
    e = redlease.Elector(cluster, "{job}", ttl=0.5, engine=engine)
    assert e.engine == engine
    token = _lead_and_fence(e, "{job}:state")
    assert cluster.get("{job}:state") == b"v1"
    assert int(cluster.get("{job}:fence:applied")) == token
    assert not cluster.exists("{job}:leader")


def test_cluster_elector_runs_on_the_native_engine_by_default(
    family_cluster: Any,
) -> None:
    require_native()
    assert redlease.Elector(family_cluster, "{auto}").engine == "native"


def test_cluster_contenders_hand_over_with_increasing_tokens(cluster: RedisCluster) -> None:
    first = redlease.Elector(cluster, "{sched}", ttl=0.5)
    second = redlease.Elector(cluster, "{sched}", ttl=0.5)
    with first:
        t1 = elected_token(first)
        second.start()
        try:
            time.sleep(0.3)
            assert second.token() is None
            first.stop()
            t2 = elected_token(second)
        finally:
            second.stop()
    assert t2 > t1


def _leading(cluster: RedisCluster, names: list[str], engine: str) -> list[redlease.Elector]:
    """A started Elector per name, each leading."""
    group = [redlease.Elector(cluster, name, ttl=5, engine=engine) for name in names]
    for e in group:
        e.start(None)
    for e in group:
        elected_token(e)
    return group


def _masters_of(cluster: RedisCluster, names: list[str]) -> dict[str, str]:
    """The master the cluster names for each name's slot."""
    return {name: cluster.get_node_from_key(f"{name}:leader").name for name in names}


def test_stop_all_on_a_cluster_batches_the_releases_per_master(
    engine: str, cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Names on many slots share a batch per master: one round trip a master, and all go."""
    batched = watch_release_batches(monkeypatch)
    names = [f"{{stopall{i}}}" for i in range(12)]
    group = _leading(cluster, names, engine)
    redlease.stop_all(group)
    masters = _masters_of(cluster, names)
    per_master = sorted(list(masters.values()).count(m) for m in set(masters.values()))
    assert sorted(batched) == per_master
    assert all(e.token() is None for e in group)
    assert sum(cluster.exists(f"{name}:leader") for name in names) == 0


def _one_owner_for_all(monkeypatch: pytest.MonkeyPatch, cluster: RedisCluster) -> str:
    """The client's slot map, as grouping reads it, names one master for every slot
    (a map gone stale): batches then meet the other masters' names there."""
    import redlease._election.election as election

    only = cluster.get_primaries()[0].name
    monkeypatch.setattr(election, "slot_owner", lambda _client, _key: only)
    return only


def test_a_release_its_batch_met_on_the_wrong_master_goes_again_alone(
    engine: str, cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [f"{{rerouted{i}}}" for i in range(12)]
    group = _leading(cluster, names, engine)
    only = _one_owner_for_all(monkeypatch, cluster)
    masters = _masters_of(cluster, names)
    assert set(masters.values()) - {only}, "the names all live on one master"
    batched = watch_release_batches(monkeypatch)
    redlease.stop_all(group)
    # One batch, to the first name's master; the others answered MOVED, did not
    # run, and were released alone: every lease is given back, none left to expire.
    assert batched == [12]
    assert all(e.token() is None for e in group)
    assert sum(cluster.exists(f"{name}:leader") for name in names) == 0


@pytest.mark.parametrize("stale_map", [False, True], ids=["map", "stale-map"])
def test_cluster_acquires_due_together_share_a_round_trip_per_master(
    engine: str, cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch, stale_map: bool
) -> None:
    """The driver's batched acquires on a cluster: a batch per master, each run its
    own reply; with a stale map the names of other masters are answered MOVED and
    acquire alone, and every run still leads."""
    from helpers import HeldDriver, watch_acquire_batches
    from redlease._engine.process import driver as driver_module

    if stale_map:
        _one_owner_for_all(monkeypatch, cluster)
    sizes = watch_acquire_batches(monkeypatch)
    names = [f"{{acq{int(stale_map)}-{i}}}" for i in range(24)]
    group = [redlease.Elector(cluster, name, ttl=5, engine=engine) for name in names]
    held = HeldDriver()
    try:
        driver_module.driver().poke(held)
        assert held.holding.wait(10.0)
        for e in group:
            e.start(None)  # each first step due now, the driver still held
        held.release()
        wait_until(lambda: all(e.token() for e in group), timeout=15, what="24 elections")
        assert all(
            cluster.get(f"{name}:leader") == e.instance_id.encode()
            for name, e in zip(names, group, strict=True)
        )
    finally:
        held.release()
        redlease.stop_all(group)
    if stale_map:
        assert sizes[:1] == [24]
    else:
        masters = _masters_of(cluster, names)
        per_master = sorted(list(masters.values()).count(m) for m in set(masters.values()))
        assert sorted(sizes[: len(per_master)]) == per_master


def test_native_engine_refuses_a_cluster_client(
    cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build of the extension without Cluster support: auto falls back, native refuses."""
    require_native()
    monkeypatch.setattr(redlease._engine.engines.select, "native_features", lambda: frozenset())
    assert redlease.Elector(cluster, "{job}").engine == "python"
    with pytest.raises(redlease.ConfigError, match="RedisCluster"):
        redlease.Elector(cluster, "{job}", engine="native")


def test_cluster_locker_needs_a_hash_tag_and_then_works(
    engine: str, family_cluster: Any
) -> None:
    cluster = family_cluster
    with pytest.raises(redlease.ConfigError, match="hash tag"):
        redlease.RedisLocker(cluster, prefix="locks:", engine=engine)
    locker = redlease.RedisLocker(cluster, prefix="{locks}:", engine=engine)
    assert locker.engine == engine
    with locker.hold("nightly", ttl=0.5) as held:
        assert held.fencing_token >= 1
        with pytest.raises(redlease.NotAcquired):
            locker.try_acquire("nightly")
        time.sleep(1.0)  # two TTLs: the watchdog keeps it through the cluster client
        assert not held.done.is_set()
    again = locker.try_acquire("nightly", ttl=0.5)
    assert again.fencing_token > held.fencing_token
    again.release()


def test_status_on_a_cluster_node_reports_the_lease_or_names_the_owner(
    cluster: RedisCluster,
) -> None:
    e = redlease.Elector(cluster, "{status}", ttl=2.0)
    with e:
        token = elected_token(e)
        owner = cluster.get_node_from_key("{status}:leader")
        others = [n for n in cluster.get_nodes() if n.name != owner.name]

        def status(node: ClusterNode) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "redlease",
                    "status",
                    "{status}",
                    "--json",
                    "--redis",
                    f"redis://{node.host}:{node.port}",
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )

        right = status(owner)
        assert right.returncode == 0, right.stderr
        report = json.loads(right.stdout)
        assert report["leader"] == e.instance_id
        assert report["fence"] == token
        assert report["applied"] == token
        wrong = status(others[0])
        assert wrong.returncode == 1
        assert "MOVED" in wrong.stderr or (
            owner.port is not None and str(owner.port) in wrong.stderr
        )
        assert "Traceback" not in wrong.stderr


# -- asyncio clients of every kind ------------------------------------------------------


async def _aio_lead_and_fence(elector: redlease.aio.Elector, key: str) -> int:
    async with elector:
        deadline = time.monotonic() + 10
        while (token := elector.token()) is None:
            assert time.monotonic() < deadline, "no election"
            await asyncio.sleep(0.01)
        assert await elector.fence_set(token, key, "v1")
        assert not await elector.fence_set(token - 1, key, "stale")
    return token


def test_aio_elector_on_a_sentinel_master(sentinel_set: SentinelSet, family: str) -> None:
    host, port = sentinel_set.sentinel_addresses()[0]
    module = client_module(family, asyncio=True)

    async def scenario() -> int:
        manager = module.sentinel.Sentinel([(host, port)], socket_timeout=1)
        client = manager.master_for("svc", socket_timeout=2)
        e = redlease.aio.Elector(client, "aio-sentinel", ttl=0.5)
        # Its sync twin is a Sentinel master client: native when the extension is built.
        native = redlease._engine.engines.select.native_available()[0]
        assert e.engine == ("native" if native else "python")
        token = await _aio_lead_and_fence(e, "aio-sentinel:state")
        assert await client.get("aio-sentinel:state") == b"v1"
        await client.aclose()
        return token

    assert asyncio.run(scenario()) >= 1


def test_aio_elector_on_a_cluster(cluster: RedisCluster, family: str) -> None:
    nodes = [(n.host, n.port) for n in cluster.get_nodes()]
    module = client_module(family, asyncio=True)

    async def scenario() -> int:
        client = module.RedisCluster(
            startup_nodes=[module.cluster.ClusterNode(h, p) for h, p in nodes],
            socket_timeout=2,
        )
        with pytest.raises(redlease.ConfigError, match="hash tag"):
            redlease.aio.Elector(client, "untagged")
        e = redlease.aio.Elector(client, "{aio}", ttl=0.5)
        token = await _aio_lead_and_fence(e, "{aio}:state")
        assert await client.get("{aio}:state") == b"v1"
        await client.aclose()
        return token

    assert asyncio.run(scenario()) >= 1


def test_a_stopped_sentinel_elector_stops_listening_for_switches(
    sentinel_set: SentinelSet, engine: str
) -> None:
    def listeners() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("redlease-sentinel-")]

    before = len(listeners())
    client = sentinel_set.master_for(socket_timeout=1)
    e = redlease.Elector(client, "listen", ttl=0.5, engine=engine)
    with e:
        elected_token(e)
        wait_until(lambda: len(listeners()) > before, timeout=5, what="a +switch-master listener")
    wait_until(lambda: len(listeners()) == before, timeout=5, what="the listener to end")
