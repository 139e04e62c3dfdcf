"""``redlease partitions NAME``: each partition's owner, token and TTL, for a person or as JSON."""

from __future__ import annotations

import json

import redlease
from cli_helpers import redlease_cli
from helpers import wait_until
from redlease._testing import RedisServer


def test_partitions_lists_each_owner_token_and_ttl(redis_server: RedisServer) -> None:
    client = redis_server.client()
    members = [redlease.Partitions(client, "jobs", 6, member_id=f"m{i}", ttl=5.0) for i in range(2)]
    try:
        for member in members:
            member.start()
        wait_until(lambda: sorted(len(m.owned()) for m in members) == [3, 3], 15, what="balanced")
        as_json = redlease_cli("partitions", "jobs", "--redis", redis_server.url, "--json")
        text = redlease_cli("partitions", "jobs", "--redis", redis_server.url)
        owned = {p: (m.member_id, token) for m in members for p, token in m.owned().items()}
    finally:
        for member in members:
            member.stop(10)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    assert [r["partition"] for r in rows] == ["0", "1", "2", "3", "4", "5"]
    assert [set(r) for r in rows] == [{"partition", "member", "token", "ttl_ms"}] * 6
    assert {r["partition"]: (r["member"], r["token"]) for r in rows} == owned
    assert all(0 < r["ttl_ms"] <= 5000 for r in rows)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["PARTITION", "MEMBER", "TOKEN", "TTL"]
    assert lines[1].split()[:3] == ["0", owned["0"][0], str(owned["0"][1])]
    assert "6 of 6 partitions owned, 2 members in group 'jobs'" in lines[-1]


def test_partitions_of_a_group_nobody_runs(redis_server: RedisServer) -> None:
    out = redlease_cli("partitions", "nobody", "--redis", redis_server.url)
    assert out.returncode == 0, out.stderr
    assert "no partition group 'nobody'" in out.stdout
    as_json = redlease_cli("partitions", "nobody", "--redis", redis_server.url, "--json")
    assert json.loads(as_json.stdout) == []


def test_partitions_refuses_a_key_that_is_not_a_partition_set(redis_server: RedisServer) -> None:
    redis_server.client().set("broken:partitions", "not json")
    out = redlease_cli("partitions", "broken", "--redis", redis_server.url)
    assert out.returncode == 1
    assert "broken:partitions holds" in out.stderr and "not a partition set" in out.stderr
