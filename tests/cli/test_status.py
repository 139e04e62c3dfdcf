"""``redlease status``: the leader, the lease, the fence and the server's boundary."""

from __future__ import annotations

import json

import redlease
from cli_helpers import cli_env, redlease_cli
from helpers import wait_until
from redlease._testing import RedisServer


def test_status_json_reports_leader_lease_fence_and_mark(redis_server: RedisServer) -> None:
    client = redis_server.client()
    elector = redlease.Elector(client, "jobs", ttl=5, instance_id="box-1", engine="python")
    with elector:
        token = wait_until(elector.token, what="election")
        result = redlease_cli("status", "jobs", "--redis", redis_server.url, "--json")

    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["name"] == "jobs"
    assert report["leader"] == "box-1"
    assert 0 < report["ttl_ms"] <= 5000
    assert report["fence"] == token
    assert report["applied"] == token
    server = report["server"]
    assert server["role"] == "master"
    assert server["appendonly"] == "no"
    assert server["maxmemory_policy"] == "noeviction"


def test_status_of_a_name_nobody_leads_has_null_leader_and_ttl(redis_server: RedisServer) -> None:
    result = redlease_cli("status", "nobody", "--redis", redis_server.url, "--json")

    report = json.loads(result.stdout)
    assert (report["leader"], report["ttl_ms"], report["fence"], report["applied"]) == (
        None, None, None, None,
    )


def test_status_flags_a_server_without_persistence(redis_server: RedisServer) -> None:
    result = redlease_cli("status", "jobs", "--redis", redis_server.url, "--json")

    server = json.loads(result.stdout)["server"]
    assert server["tokens_can_regress"] is True
    assert any("no persistence" in w for w in server["warnings"])


def test_status_flags_allkeys_eviction_and_everysec(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.config_set("appendonly", "yes")
    client.config_set("appendfsync", "everysec")

    result = redlease_cli("status", "jobs", "--redis", redis_server.url, "--json")

    warnings = json.loads(result.stdout)["server"]["warnings"]
    assert any("allkeys-lru" in w for w in warnings)
    assert any("everysec" in w for w in warnings)


def test_status_passes_a_durable_non_evicting_single_server(aof_server: RedisServer) -> None:
    result = redlease_cli("status", "jobs", "--redis", aof_server.url, "--json")

    server = json.loads(result.stdout)["server"]
    assert server["warnings"] == []
    assert server["tokens_can_regress"] is False


def test_status_text_names_the_leader_and_the_boundary(redis_server: RedisServer) -> None:
    elector = redlease.Elector(redis_server.client(), "jobs", instance_id="box-2", engine="python")
    with elector:
        wait_until(elector.token, what="election")
        result = redlease_cli("status", "jobs", env=cli_env(REDIS_URL=redis_server.url))

    assert result.returncode == 0, result.stderr
    assert "leader     box-2 (lease expires in" in result.stdout
    assert "tokens CAN go backwards" in result.stdout


def test_status_of_an_empty_server_over_a_unix_socket() -> None:
    with RedisServer(unix=True) as server:
        result = redlease_cli("status", "jobs", "--redis", server.url, "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["server"]["url"].startswith("unix://")


def test_status_reads_the_wire_compatible_keys(redis_server: RedisServer) -> None:
    # The keys a Go elector writes too: N:leader, N:fence, N:fence:applied.
    client = redis_server.client()
    client.set("legacy:leader", "go-box", px=3000)
    client.set("legacy:fence", 41)
    client.set("legacy:fence:applied", "41")

    report = json.loads(
        redlease_cli("status", "legacy", "--redis", redis_server.url, "--json").stdout
    )

    assert (report["leader"], report["fence"], report["applied"]) == ("go-box", 41, 41)
    assert 0 < report["ttl_ms"] <= 3000
