"""``redlease locks``: every held lock under a prefix, for a person or as JSON."""

from __future__ import annotations

import json

import redlease
from cli_helpers import redlease_cli
from helpers import ClosedPort
from redlease._testing import ClusterSet, RedisServer


def test_locks_lists_each_held_lock_with_holder_token_and_ttl(redis_server: RedisServer) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="nightly@box-7") as locker:
        nightly = locker.acquire("nightly", ttl=60.0)
        reindex = locker.acquire("reindex:users", ttl=30.0)
        text = redlease_cli("locks", "--redis", redis_server.url)
        as_json = redlease_cli("locks", "--redis", redis_server.url, "--json")
        nightly.release()
        reindex.release()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["LOCK", "HOLDER", "TOKEN", "TTL"]
    assert lines[1].split()[:3] == ["nightly", "nightly@box-7", str(nightly.fencing_token)]
    assert lines[2].split()[:3] == ["reindex:users", "nightly@box-7", str(reindex.fencing_token)]
    assert "2 locks and permits held under 'redlease:lock:'" in lines[3]
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [set(r) for r in rows] == [{"name", "holder", "fencing_token", "ttl_ms"}] * 2
    assert [(r["name"], r["holder"], r["fencing_token"]) for r in rows] == [
        ("nightly", "nightly@box-7", nightly.fencing_token),
        ("reindex:users", "nightly@box-7", reindex.fencing_token),
    ]
    assert 0 < rows[0]["ttl_ms"] <= 60000 and 0 < rows[1]["ttl_ms"] <= 30000


def test_locks_under_another_prefix_and_none_held(redis_server: RedisServer) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, prefix="jobs:") as locker:
        held = locker.acquire("one", ttl=10.0)
        other = redlease_cli("locks", "--redis", redis_server.url, "--prefix", "jobs:", "--json")
        default = redlease_cli("locks", "--redis", redis_server.url)
        held.release()
    assert [r["name"] for r in json.loads(other.stdout)] == ["one"]
    assert default.returncode == 0
    assert default.stdout.strip().startswith("no lock is held under 'redlease:lock:'")
    empty = redlease_cli("locks", "--redis", redis_server.url, "--prefix", "jobs:", "--json")
    assert json.loads(empty.stdout) == []


def test_locks_on_a_cluster_node_reads_the_whole_cluster(cluster_set: ClusterSet) -> None:
    client = cluster_set.client(socket_timeout=2)
    with redlease.RedisLocker(client, prefix="{cli-locks}:", holder="cluster-job") as locker:
        held = [locker.acquire(f"n{i}", ttl=30.0) for i in range(3)]
        # Any node's URL: the command reaches every master from it.
        node = next(m for m in cluster_set.masters())
        url = f"redis://127.0.0.1:{node.port}"
        result = redlease_cli("locks", "--redis", url, "--prefix", "{cli-locks}:", "--json")
        untagged = redlease_cli("locks", "--redis", url)
        for lock in held:
            lock.release()
    client.close()
    assert result.returncode == 0, result.stderr
    assert [(r["name"], r["holder"]) for r in json.loads(result.stdout)] == [
        (f"n{i}", "cluster-job") for i in range(3)
    ]
    # The default prefix has no hash tag, which a cluster's lockers need: one line says so.
    assert untagged.returncode == 1
    assert untagged.stderr.count("\n") == 1 and "hash tag" in untagged.stderr


def test_locks_with_an_unreachable_server_is_one_line(closed_port: ClosedPort) -> None:
    result = redlease_cli("locks", "--redis", f"redis://127.0.0.1:{closed_port.port}")
    assert result.returncode == 1
    assert result.stderr.startswith("redlease: cannot reach Redis at")
    assert result.stderr.count("\n") == 1


def test_locks_lists_each_live_semaphore_permit_under_its_name(redis_server: RedisServer) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="pool-user") as locker:
        sem = locker.semaphore("db-pool", 3)
        permits = [sem.try_acquire(ttl=30.0) for _ in range(2)]
        result = redlease_cli("locks", "--redis", redis_server.url, "--json")
        for permit in permits:
            permit.release()
    assert [(r["name"], r["holder"], r["fencing_token"]) for r in json.loads(result.stdout)] == [
        ("db-pool", "pool-user", p.fencing_token) for p in permits
    ]
