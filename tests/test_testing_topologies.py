"""The topology harness itself, against real processes: TLS servers, Sentinel sets, Clusters.

Other tests lean on these fixtures to put the library through failovers; here
each promise the harness makes is checked on its own: certificates are
accepted and rejected as TLS says, a failover really moves the master, a
migration really moves the keys, and nothing is left running afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster
from redis.exceptions import AskError, MovedError

from helpers import wait_until
from redlease._testing import (
    ClusterSet,
    RedisServer,
    SentinelSet,
    TLSMaterials,
    TLSRedisServer,
    key_slot,
    tls_unsupported_reason,
)
from redlease._testing._common import live

pytestmark = pytest.mark.topology

FAST = {"socket_timeout": 2, "socket_connect_timeout": 2, "retry": None}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True


# -- TLS ------------------------------------------------------------------------------


def test_tls_server_verifies_against_the_test_ca_in_every_form(
    tls_server: RedisServer, tls_materials: TLSMaterials
) -> None:
    assert tls_server.url.startswith("rediss://127.0.0.1:")
    assert tls_server.client(ssl_check_hostname=True).ping()
    by_data = tls_server.client(ssl_ca_certs=None, ssl_ca_data=tls_materials.ca_data)
    assert by_data.ping()
    by_dir = tls_server.client(ssl_ca_certs=None, ssl_ca_path=str(tls_materials.ca_path))
    assert by_dir.ping()
    assert redis.Redis.from_url(f"{tls_server.url}?ssl_ca_certs={tls_materials.ca_file}").ping()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=tls_server.port, **FAST).ping()  # plain TCP


def test_a_client_trusting_another_ca_is_rejected(
    tls_server: RedisServer, tls_materials: TLSMaterials
) -> None:
    wrong = tls_server.client(ssl_ca_certs=str(tls_materials.other_ca_file), **FAST)
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        wrong.ping()
    wrong_data = tls_server.client(
        ssl_ca_certs=None, ssl_ca_data=tls_materials.other_ca_data, **FAST
    )
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        wrong_data.ping()


def test_mutual_tls_requires_a_client_certificate_from_the_ca(
    make_tls_server: Callable[..., RedisServer], tls_materials: TLSMaterials
) -> None:
    m = tls_materials
    required = make_tls_server("yes")
    assert required.client().ping()  # the test client certificate by default
    with pytest.raises(redis.ConnectionError):
        required.client(ssl_certfile=None, ssl_keyfile=None, **FAST).ping()
    stranger = {
        "ssl_certfile": str(m.other_client_cert_file),
        "ssl_keyfile": str(m.other_client_key_file),
    }
    with pytest.raises(redis.ConnectionError):
        required.client(**stranger, **FAST).ping()

    optional = make_tls_server("optional")
    assert optional.client(ssl_certfile=None, ssl_keyfile=None).ping()
    assert optional.client().ping()
    with pytest.raises(redis.ConnectionError):
        optional.client(**stranger, **FAST).ping()


def test_hostname_mismatch_is_rejected_only_when_checked(
    make_tls_server: Callable[..., RedisServer],
) -> None:
    server = make_tls_server(mismatched=True)
    checked = server.client(ssl_check_hostname=True, ssl_cert_reqs="required", **FAST)
    with pytest.raises(redis.ConnectionError, match="mismatch"):
        checked.ping()
    by_name = server.client(host="localhost", ssl_check_hostname=True, **FAST)
    with pytest.raises(redis.ConnectionError, match="mismatch"):
        by_name.ping()
    # The chain is still verified; only the name is not compared.
    assert server.client(ssl_check_hostname=False, ssl_cert_reqs="required").ping()
    # redis-py drops the hostname check when nothing is verified.
    assert server.client(ssl_cert_reqs="none", ssl_check_hostname=True, ssl_ca_certs=None).ping()

    matching = make_tls_server()
    assert matching.client(host="localhost", ssl_check_hostname=True).ping()


def test_tls_server_with_its_own_materials_removes_them(tls_materials: TLSMaterials) -> None:
    if tls_unsupported_reason() is not None:
        pytest.skip(str(tls_unsupported_reason()))
    server = TLSRedisServer(auth_clients="yes").start()
    certs, pid = server.materials.dir, server.pid
    assert server.client().ping()
    assert server in live() and server.materials in live()
    server.stop()
    assert not certs.exists()
    assert not _alive(pid)
    assert server not in live() and server.materials not in live()
    assert tls_materials.dir.exists(), "materials given by the caller are left alone"


def test_tls_support_is_told_apart_without_starting_a_server(tmp_path: Path) -> None:
    without = tmp_path / "without" / "redis-server"
    with_tls = tmp_path / "with" / "redis-server"
    for path, line in (
        (without, ">>> 'tls-port \"0\"'"),
        (with_tls, ">>> 'redlease-tls-probe \"yes\"'"),
    ):
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\necho 'Bad directive'\necho '{line}'\nexit 1\n")
        path.chmod(0o755)
    reason = tls_unsupported_reason(str(without))
    assert reason is not None and "without TLS" in reason
    assert tls_unsupported_reason(str(with_tls)) is None


# -- Sentinel -----------------------------------------------------------------------------


def test_sentinel_set_serves_the_master_through_the_sentinels(sentinel_set: SentinelSet) -> None:
    assert len(sentinel_set.sentinel_addresses()) == 3
    address = sentinel_set.master_address()
    assert sentinel_set.master_addresses() == [address] * 3
    master = sentinel_set.master()
    assert master.address == address
    assert sentinel_set.role(master)[0] == "master"
    [replica] = sentinel_set.replicas()
    assert sentinel_set.role(replica)[:3] == ["slave", "127.0.0.1", address[1]]

    client = sentinel_set.master_for(**FAST)
    client.set("sentinel-set:k", "v")
    assert master.client().get("sentinel-set:k") == b"v"
    reader = sentinel_set.replica_for(**FAST)
    wait_until(lambda: reader.get("sentinel-set:k") == b"v", timeout=5, what="replication")


def test_sentinel_set_answers_with_a_sentinel_frozen(sentinel_set: SentinelSet) -> None:
    frozen = sentinel_set.sentinels[0]
    sentinel_set.freeze(frozen)
    try:
        assert frozen.paused
        assert len(sentinel_set.master_addresses()) == 2
        assert sentinel_set.master_for(**FAST).ping()
    finally:
        sentinel_set.thaw(frozen)
    assert len(sentinel_set.master_addresses()) == 3


def test_sentinel_failover_promotes_a_replica_and_the_sentinels_say_so() -> None:
    with SentinelSet(replicas=2) as topology:
        nodes = [*topology.data_nodes, *topology.sentinels]
        assert topology in live() and all(n in live() for n in nodes)
        old = topology.master_address()
        replicas = {n.address for n in topology.replicas()}
        assert len(replicas) == 2
        client = topology.master_for(**FAST)
        client.set("k", "before")
        with topology.watch_switches() as switches:
            started = time.monotonic()
            new = topology.failover()
            took = time.monotonic() - started
            assert new in replicas
            assert topology.master_addresses() == [new] * 3
            assert topology.role(topology.node_at(new))[0] == "master"
            assert switches.wait(1, timeout=5) == (topology.service, old, new)
        # A new client asks the sentinels and lands on the new master. (One
        # with pooled connections may still write to the old master, which
        # stays writable until the sentinels demote it, about 10 s later.)
        fresh = topology.master_for(**FAST)
        assert fresh.get("k") == b"before"
        fresh.set("k", "after")
        assert topology.node_at(new).client().get("k") == b"after"
        pids, dirs = [n.pid for n in nodes], [n.dir for n in nodes]
    assert took < 15
    # Stopped: nothing left running, on disk, or waiting for the exit hook.
    assert not any(_alive(pid) for pid in pids)
    assert not any(d.exists() for d in dirs)
    assert topology not in live() and not any(n in live() for n in nodes)


def test_sentinel_kill_master_with_passwords_promotes_the_replica() -> None:
    # The restarted node comes back empty. Should the sentinels judge the new
    # master down before that node has synced (a host stalled past
    # down-after-ms), Redis itself would promote the empty node and the data
    # would be gone; a down-after of 4 s keeps a loaded host from doing so.
    with SentinelSet(
        password="data-secret", sentinel_password="sentinel-secret", down_after_ms=4000
    ) as topology:
        old_node = topology.master()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=old_node.port, password="wrong", **FAST).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=topology.sentinels[0].port, **FAST).ping()
        client = topology.master_for(**FAST)
        client.set("k", "kept")
        wait_until(
            lambda: topology.replicas()[0].client().get("k") == b"kept", 5, what="replication"
        )
        new = topology.kill_master(restart=True)
        assert new != old_node.address
        assert client.get("k") == b"kept"
        topology.wait_settled()
        # The restarted node rejoined as a replica of the master the sentinels
        # name: of ``new`` as a rule, but a host loaded past down-after-ms can
        # make them fail over once more, to the rejoined node, once it synced.
        named = topology.master_address()
        assert named in (new, old_node.address)
        for node in topology.data_nodes:
            if node.port != named[1]:
                role = topology.role(node)
                assert role[:3] == ["slave", "127.0.0.1", named[1]]
                assert role[3] == "connected"
        assert topology.node_at(named).client().get("k") == b"kept"


# -- Cluster -------------------------------------------------------------------------------


def _keys_on_every_master(cluster: ClusterSet) -> dict[str, str]:
    keys: dict[str, str] = {}
    owners: set[int] = set()
    i = 0
    while len(owners) < 3:
        key = f"spread:{i}"
        owner = cluster.node_for_key(key)
        if owner.port not in owners:
            owners.add(owner.port or 0)
            keys[key] = str(i)
        i += 1
    return keys


def test_cluster_client_reads_and_writes_across_every_master(cluster_set: ClusterSet) -> None:
    assert all(n.port is not None and n.port <= 55535 for n in cluster_set.nodes)
    masters = cluster_set.masters()
    assert len(masters) == 3 and len(cluster_set.nodes) == 6
    client = cluster_set.client()
    keys = _keys_on_every_master(cluster_set)
    for key, value in keys.items():
        client.set(key, value)
    for key, value in keys.items():
        owner = cluster_set.node_for_key(key)
        assert owner is cluster_set.master_for_slot(key_slot(key))
        assert client.get_node_from_key(key).port == owner.port
        assert owner.client().get(key) == value.encode()
        replica = cluster_set.replica_of(owner)
        assert cluster_set.replicas_of(owner) == [replica]
        role = replica.client().execute_command("ROLE")
        assert role[0] == b"slave" and int(role[2]) == owner.port
    assert all(cluster_set.info(n)["cluster_state"] == "ok" for n in cluster_set.nodes)


def test_cluster_slot_migration_gives_ask_then_moved(cluster_set: ClusterSet) -> None:
    slot = key_slot("{mig}")
    client = cluster_set.client()
    for i in range(5):
        client.set(f"{{mig}}:{i}", i)
    source = cluster_set.master_for_slot(slot)
    target = next(m for m in cluster_set.masters() if m is not source)
    raw = source.client()
    migration = cluster_set.begin_migration(slot, target)
    try:
        assert migration.move_keys(limit=2) == 2
        left = migration.keys()
        assert len(left) == 3
        moved = next(k for k in (f"{{mig}}:{i}" for i in range(5)) if k not in left)
        with pytest.raises(AskError, match=f"^{slot} 127.0.0.1:{target.port}$"):
            raw.get(moved)
        assert client.get(moved) is not None  # the cluster client follows the ASK
    finally:
        migration.finish()
    assert cluster_set.master_for_slot(slot) is target
    with pytest.raises(MovedError, match=f"^{slot} 127.0.0.1:{target.port}$"):
        raw.get("{mig}:0")
    assert [client.get(f"{{mig}}:{i}") for i in range(5)] == [str(i).encode() for i in range(5)]
    # Give it back: the module's other tests expect the slot map they started with.
    assert cluster_set.migrate_slot(slot, source) == 5
    assert cluster_set.master_for_slot(slot) is source
    cluster_set.wait_healthy()


def test_cluster_failover_moves_the_slot_to_the_replica(cluster_set_fresh: ClusterSet) -> None:
    cluster = cluster_set_fresh
    slot = key_slot("{fo}")
    client = cluster.client()
    client.set("{fo}:k", "v")
    master = cluster.master_for_slot(slot)
    replica = cluster.replica_of(master)
    assert cluster.failover(slot) is replica
    for node in cluster.nodes:
        owner = next(i for i in cluster.view(node) if slot in i.slots)
        assert owner.id == cluster.node_id(replica)
    assert client.get("{fo}:k") == b"v"
    cluster.wait_healthy()
    assert cluster.replicas_of(replica) == [master]


def test_cluster_kill_master_promotes_the_replica(cluster_set_fresh: ClusterSet) -> None:
    cluster = cluster_set_fresh
    slot = key_slot("{kill}")
    client = cluster.client()
    client.set("{kill}:k", "v")
    master = cluster.master_for_slot(slot)
    replica = cluster.replica_of(master)
    wait_until(lambda: replica.client().dbsize() == 1, 5, what="replication")
    pid = master.pid
    assert cluster.kill_master(slot) is replica
    assert not _alive(pid)
    assert cluster.master_for_slot(slot) is replica
    fresh: RedisCluster = cluster.client()
    assert fresh.get("{kill}:k") == b"v"
    master.restart()
    cluster.wait_healthy()
    assert cluster.replicas_of(replica) == [master]


def test_cluster_frozen_master_is_replaced_and_rejoins_when_thawed(
    cluster_set_fresh: ClusterSet,
) -> None:
    cluster = cluster_set_fresh
    slot = key_slot("{freeze}")
    master = cluster.master_for_slot(slot)
    replica = cluster.replica_of(master)
    cluster.freeze(master)
    try:
        with pytest.raises(redis.TimeoutError):
            master.client(socket_timeout=0.3).ping()
        wait_until(
            lambda: cluster.master_for_slot(slot) is replica,
            timeout=20,
            interval=0.1,
            what="the replica to take over from the frozen master",
        )
    finally:
        cluster.thaw(master)
    assert master.client(socket_timeout=2).ping()
    cluster.wait_healthy()
    assert cluster.replicas_of(replica) == [master]
    assert cluster.client().set("{freeze}:k", "v")


# -- cleanup at exit -------------------------------------------------------------------------

_ABANDON = """
import json
from redlease._testing import ClusterSet, SentinelSet, TLSRedisServer, tls_unsupported_reason
sentinel = SentinelSet(sentinels=1, quorum=1).start()
cluster = ClusterSet(masters=1, replicas_per_master=0).start()
servers = [*sentinel.data_nodes, *sentinel.sentinels, *cluster.nodes]
paths = [str(s.dir) for s in servers]
if tls_unsupported_reason() is None:
    tls = TLSRedisServer().start()
    servers.append(tls)
    paths += [str(tls.dir), str(tls.materials.dir)]
servers[0].pause()  # a frozen process must not hold up the exit either
print(json.dumps({"pids": [s.pid for s in servers], "paths": paths}), flush=True)
raise RuntimeError("the test process dies without stopping anything")
"""


def test_everything_left_running_is_stopped_at_interpreter_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ABANDON], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1 and "dies without stopping" in done.stderr, done.stderr
    left = json.loads(done.stdout.splitlines()[-1])
    assert len(left["pids"]) >= 4
    assert not [pid for pid in left["pids"] if _alive(pid)]
    assert not [path for path in left["paths"] if Path(path).exists()]
