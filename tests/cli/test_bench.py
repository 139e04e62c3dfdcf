"""``redlease bench``: renew lateness and fenced writes, engines side by side."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import deque

import pytest
import redis

import redlease
from cli_helpers import assert_one_line_error, cli_env, redlease_cli
from helpers import require_valkey
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer


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
    from redlease._cli.redisurl import ReachableServer

    results = [
        Result(engine="native", unavailable="the native extension is not built"),
        Result(engine="python", lateness=[0.001, 0.002, 0.010],
               server_lateness=[0.0, 0.003, 0.020], kept_lease=True, writes_per_second=9000.0),
    ]
    table = render(results, "idle", 1.0, ReachableServer("redis://x", "a server", embedded=False))

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


class Ring:
    """A keeper's lateness readers over a ring of four: its newest samples and its count."""

    def __init__(self) -> None:
        self.held: deque[float] = deque(maxlen=4)
        self.count = 0
        self.renew_while_read = 0

    def record(self, *samples: float) -> None:
        self.held.extend(samples)
        self.count += len(samples)

    def lateness(self) -> list[float]:
        held = list(self.held)
        if self.renew_while_read:  # a renewal right after the copy, before the next read
            self.renew_while_read -= 1
            self.record(float(self.count))
        return held

    def lateness_count(self) -> int:
        return self.count


def test_the_samples_since_a_mark_are_the_newest_the_keeper_still_holds() -> None:
    from redlease._cli.bench import newest_since

    held = [6.0, 7.0, 8.0, 9.0]  # samples 6 to 9 of 10, oldest first
    assert newest_since(held, 10, 10) == []
    assert newest_since(held, 9, 10) == [9.0]
    assert newest_since(held, 7, 10) == [7.0, 8.0, 9.0]
    assert newest_since(held, 6, 10) == held
    assert newest_since(held, 2, 10) == held  # 2 to 5 are gone
    assert newest_since([0.0, 1.0], 0, 2) == [0.0, 1.0]  # not wrapped yet


def test_a_lateness_window_gathers_every_sample_recorded_since_it_opened() -> None:
    from redlease._cli.bench import LatenessWindow

    ring = Ring()
    ring.record(0.0, 1.0, 2.0)
    window = LatenessWindow(ring.lateness, ring.lateness_count)
    assert window.take() == []
    ring.record(3.0, 4.0, 5.0)
    assert window.take() == [3.0, 4.0, 5.0]
    ring.record(6.0, 7.0, 8.0, 9.0)  # as many as the ring holds: none lost
    assert window.take() == [float(i) for i in range(3, 10)]
    ring.record(10.0, 11.0, 12.0, 13.0, 14.0, 15.0)  # more: 10 and 11 are gone
    assert window.take()[-5:] == [9.0, 12.0, 13.0, 14.0, 15.0]
    # A renewal between reading the count and the samples: read again, none twice.
    ring.renew_while_read = 2
    assert window.take()[-3:] == [15.0, 16.0, 17.0]
    assert window.samples == [float(i) for i in range(3, 10)] + [12.0, 13.0, 14.0, 15.0, 16.0, 17.0]


# The extension hidden from a fresh interpreter: what a user without a build sees.
WITHOUT_NATIVE = (
    "import sys; sys.modules['redlease._engine._native._core'] = None; "
    "from redlease._cli import main; sys.exit(main(sys.argv[1:]))"
)


def redlease_cli_without_native(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_NATIVE, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
    )


def test_bench_on_the_native_engine_without_the_extension_is_one_line() -> None:
    result = redlease_cli_without_native("bench", "--engine", "native")

    line = assert_one_line_error(result, 1)
    assert line.startswith(
        "redlease: the native engine is unavailable: the native extension was not built ("
    )
    assert line.endswith("; try --engine python")


def test_bench_of_both_engines_without_the_extension_measures_python(
    redis_server: RedisServer,
) -> None:
    result = redlease_cli_without_native(
        "bench", "--load", "idle", "--seconds", "0.3", "--redis", redis_server.url
    )

    assert result.returncode == 0, result.stderr
    assert re.search(r"renewals sent\s+unavailable\s+\d+", result.stdout)
    assert "native: unavailable: the native extension was not built (" in result.stdout


def test_the_native_probe_agrees_with_the_engine_auto_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("REDLEASE_ENGINE", raising=False)

    available, why = native_engine_available()
    picked = redlease.Elector(redis.Redis(), "probe", engine="auto").engine

    assert available == (picked == "native")
    assert (why == "") == available


@pytest.mark.topology
@pytest.mark.parametrize("topology", ["tls", "sentinel", "cluster", "tls-sentinel", "tls-cluster"])
def test_bench_measures_both_engines_on_a_deployment_it_starts(topology: str) -> None:
    result = redlease_cli(
        "bench", "--topology", topology, "--seconds", "0.3", "--load", "idle", timeout=120
    )
    assert result.returncode == 0, result.stderr
    described = {
        "tls": "over TLS",
        "sentinel": "Sentinel-managed",
        "cluster": "Redis Cluster",
        "tls-sentinel": "Sentinel-managed master (1 replica, 3 sentinels), all over TLS",
        "tls-cluster": "Redis Cluster (3 masters, 1 replica each) over TLS",
    }
    assert "server: " in result.stdout and described[topology] in result.stdout
    writes = next(line for line in result.stdout.splitlines() if line.startswith("fenced writes/s"))
    # One cell per engine, then their ratio when both measured.
    cells = writes.split()[2:4]
    assert len(cells) == 2
    # Each engine either measured writes or says in one sentence why it cannot serve this client.
    for engine, cell in zip(("native", "python"), cells, strict=True):
        if cell == "unavailable":
            assert f"{engine}: unavailable: " in result.stdout
        else:
            assert int(cell.replace(",", "")) > 0
    assert "python: unavailable" not in result.stdout


def test_bench_refuses_a_url_for_a_topology_it_starts_itself() -> None:
    result = redlease_cli("bench", "--topology", "cluster", "--redis", "redis://127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("--redis is for plain")


WRITER_ROWS = (
    "sync, 1 thread",
    "asyncio, 64 tasks",
    "asyncio, 1 task",
    "pipelines of 100, 1 thread",
)


def writer_cells(stdout: str, row: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if line.startswith(row))
    return re.findall(r"([\d,]+) \(([\d.]+)x\)", line[len(row):])


@pytest.mark.parametrize("topology", ["plain", pytest.param("tls", marks=pytest.mark.topology)])
def test_bench_writers_compares_every_engine_with_redis_py_on_the_same_server(
    topology: str,
) -> None:
    require_valkey()  # its columns stand beside redis-py's
    result = redlease_cli(
        "bench", "--writers", "--topology", topology, "--seconds", "0.2", "--load", "idle",
        timeout=180,
    )

    assert result.returncode == 0, result.stderr
    engines = ["native", "python"] if native_engine_available()[0] else ["python"]
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("fenced writes/s by"))
    on_valkey = [f"{engine} (valkey-py)" for engine in engines]
    columns = [*engines, "redis-py", *on_valkey, "valkey-py"]
    assert re.split(r"\s{2,}", header.strip())[1:] == columns, header
    for row in WRITER_ROWS:
        cells = writer_cells(result.stdout, row)
        assert len(cells) == len(columns), (row, result.stdout)
        assert all(int(rate.replace(",", "")) > 0 for rate, _ratio in cells)
        # Each library is the baseline of its own family's columns.
        assert cells[len(engines)][1] == "1.00"
        assert cells[-1][1] == "1.00"
    cpu = next(line for line in lines if line.startswith("CPU per sync write"))
    assert len(re.findall(r"[\d.]+ us", cpu)) == len(columns)


def test_bench_writers_refuses_a_deployment_of_many_servers_before_starting_it() -> None:
    result = redlease_cli("bench", "--writers", "--topology", "cluster", timeout=30)
    line = assert_one_line_error(result, 1)
    assert "--writers compares with redis-py on one server" in line and "not cluster" in line


def test_bench_writers_fails_a_run_whose_writes_were_rejected(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    from redlease._cli import writers
    from redlease._cli.redisurl import CliError, async_connect
    from redlease._keys import ElectionKeys

    taken = "someone-else"
    client.set(ElectionKeys(taken).applied, 10)  # a newer writer's mark: token 1 is stale

    with pytest.raises(CliError, match=r"fenced writes of the benchmark were rejected"):
        writers.measure_writers(
            redis_server.client,
            lambda: async_connect(redis_server.url),
            lambda _base: taken,
            ["python"],
            0.05,
            lambda _text, _seconds: lambda _now: None,
        )
