"""``redlease status``: the leader, the lease, the fence and the server's boundary."""

from __future__ import annotations

import json

import redlease
from cli_helpers import assert_one_line_error, cli_env, redlease_cli
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


def test_status_names_the_engine_auto_picks_in_text_and_json(redis_server: RedisServer) -> None:
    info = redlease.engine_info()
    text = redlease_cli("status", "jobs", "--redis", redis_server.url)
    as_json = redlease_cli("status", "jobs", "--redis", redis_server.url, "--json")

    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    assert json.loads(as_json.stdout)["engine"] == {
        "engine": info.engine,
        "native_available": info.native_available,
        "reason": info.reason,
        "tls": info.tls,
        "version": redlease.__version__,
    }
    line = [ln for ln in text.stdout.splitlines() if ln.startswith("engine: ")]
    assert len(line) == 1, text.stdout
    if info.engine == "native":
        assert line[0].startswith("engine: native (TLS: ")
    assert line[0].endswith(f"redlease {redlease.__version__}")


def test_status_says_why_the_engine_is_python(redis_server: RedisServer) -> None:
    env = cli_env(REDLEASE_ENGINE="python")
    text = redlease_cli("status", "jobs", "--redis", redis_server.url, env=env)
    as_json = redlease_cli("status", "jobs", "--redis", redis_server.url, "--json", env=env)

    line = f"engine: python \N{EM DASH} REDLEASE_ENGINE=python, redlease {redlease.__version__}"
    assert line in text.stdout.splitlines()
    engine = json.loads(as_json.stdout)["engine"]
    assert (engine["engine"], engine["reason"]) == ("python", "REDLEASE_ENGINE=python")


def test_status_with_a_bad_redlease_engine_is_one_line_naming_it(
    redis_server: RedisServer,
) -> None:
    result = redlease_cli(
        "status", "jobs", "--redis", redis_server.url, env=cli_env(REDLEASE_ENGINE="fast")
    )
    assert "REDLEASE_ENGINE" in assert_one_line_error(result, 1)
