"""``redlease locks``: every held lock under a prefix, for a person or as JSON."""

from __future__ import annotations

import contextlib
import json

import pytest

import redlease
from cli_helpers import assert_one_line_error, redlease_cli
from helpers import ClosedPort, wait_until
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
    assert "2 locks held under 'redlease:lock:'" in lines[3]
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [set(r) for r in rows] == [
        {"name", "kind", "holder", "token", "ttl_ms", "permits"}
    ] * 2
    assert [(r["name"], r["kind"], r["holder"], r["token"], r["permits"]) for r in rows] == [
        ("nightly", "lock", "nightly@box-7", nightly.fencing_token, None),
        ("reindex:users", "lock", "nightly@box-7", reindex.fencing_token, None),
    ]
    assert [(r["name"], r["holder"], r["token"]) for r in rows] == [
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
    assert default.stdout.strip().startswith("no lock or semaphore is held under 'redlease:lock:'")
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


def test_locks_lists_a_semaphore_as_a_semaphore_with_its_permits_held_of_its_limit(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="pool-user") as locker:
        job = locker.acquire("nightly", ttl=60.0)
        sem = locker.semaphore("db-pool", 3)
        permits = [sem.try_acquire(ttl=30.0) for _ in range(2)]
        text = redlease_cli("locks", "--redis", redis_server.url)
        as_json = redlease_cli("locks", "--redis", redis_server.url, "--json")
        for permit in permits:
            permit.release()
        job.release()
    client.close()
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["LOCK", "HOLDER", "TOKEN", "TTL"]
    assert lines[1].split()[:3] == ["nightly", "pool-user", str(job.fencing_token)]
    assert lines[2] == ""
    assert lines[3].split() == ["SEMAPHORE", "PERMITS", "HOLDER", "TOKEN", "TTL"]
    assert [line.split()[:4] for line in lines[4:6]] == [
        ["db-pool", "2/3", "pool-user", str(p.fencing_token)] for p in permits
    ]
    assert "1 lock and 1 semaphore (2 permits) held under 'redlease:lock:'" in lines[6]
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [(r["name"], r["kind"], r["holder"], r["token"], r["permits"]) for r in rows] == [
        ("nightly", "lock", "pool-user", job.fencing_token, None),
        *(("db-pool", "semaphore", "pool-user", p.fencing_token, 3) for p in permits),
    ]
    assert all(0 < r["ttl_ms"] <= 60000 for r in rows)


def test_release_of_a_semaphore_name_refuses_and_prints_the_command_for_one_permit(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="pool-user", prefix="jobs:") as locker:
        sem = locker.semaphore("db-pool", 2)
        first, second = sem.try_acquire(ttl=30.0), sem.try_acquire(ttl=30.0)
        url = ("--redis", redis_server.url, "--prefix", "jobs:")
        refused = redlease_cli("locks", *url, "--release", "db-pool")
        # Refusing took nothing: both permits are still live.
        assert [h.fencing_token for h in sorted(sem.holders(), key=lambda h: h.fencing_token)] == [
            first.fencing_token, second.fencing_token,
        ]
        taken = redlease_cli(
            "locks", *url, "--release", "db-pool", "--permit", str(first.fencing_token), "--json"
        )
        again = redlease_cli(
            "locks", *url, "--release", "db-pool", "--permit", str(first.fencing_token)
        )
        left = [h.fencing_token for h in sem.holders()]
        with pytest.raises(redlease.NotHeld):
            first.release()
        second.release()
    client.close()
    line = assert_one_line_error(refused, 1)
    assert "nobody held" not in line
    assert "'db-pool' under 'jobs:' is a semaphore, not a lock: 2 of 2 permits held" in line
    assert f"'pool-user' (token {first.fencing_token})" in line
    assert line.endswith(
        f"redlease locks --release db-pool --permit {first.fencing_token} --prefix jobs:"
    )
    assert taken.returncode == 0, taken.stderr
    result = json.loads(taken.stdout)
    assert result == {
        "name": "db-pool", "kind": "semaphore", "evicted": "pool-user", "mark": result["mark"]
    }
    assert result["mark"] > second.fencing_token
    assert left == [second.fencing_token]
    assert again.returncode == 0, again.stderr
    gone = f"no live permit of semaphore 'db-pool' under 'jobs:' has token {first.fencing_token}"
    assert gone in again.stdout


def test_permit_without_release_is_a_usage_error() -> None:
    result = redlease_cli("locks", "--permit", "3")
    assert "--release NAME" in assert_one_line_error(result, 2)


def test_a_permit_taken_by_release_is_found_lost_by_its_auto_renewing_holder(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="renewer", engine=engine) as locker:
        sem = locker.semaphore("renewed-pool", 2)
        kept = sem.acquire(ttl=30.0)
        permit = sem.acquire(ttl=1.0, auto_renew=True)
        try:
            taken = redlease_cli(
                "locks", "--redis", redis_server.url, "--release", "renewed-pool",
                "--permit", str(permit.fencing_token),
            )
            assert taken.returncode == 0, taken.stderr
            assert (
                f"evicted 'renewer' from permit {permit.fencing_token} of semaphore "
                "'renewed-pool'" in taken.stdout
            )
            # Its next renewal finds the permit gone: the watchdog sets done.
            wait_until(permit.done.is_set, 15.0, what="the evicted permit found lost")
            assert [h.fencing_token for h in sem.holders()] == [kept.fencing_token]
        finally:
            with contextlib.suppress(redlease.NotHeld):
                permit.release()
            kept.release()
    client.close()
