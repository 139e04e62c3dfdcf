"""The chaos soak (``benchmarks/chaos.py``): it runs clean, and its checker can fail.

A soak whose checker never fails proves nothing, so besides a short clean run
on each engine these tests plant violations: in crafted evidence (the checker
alone) and in a live run (an entry pushed past the fence mid-run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from helpers import BENCHMARKS, load_benchmark
from process_helpers import processes_mentioning

SCRIPT = BENCHMARKS / "chaos.py"
# A short soak: a handful of faults. TTL 1 s keeps the 3-TTL heal bound
# generous on a busy machine.
SHORT = ["--duration", "8", "--ttl", "1", "--contenders", "3", "--quiet", "--gap", "0.5-1"]


def load_chaos() -> ModuleType:
    return load_benchmark("chaos.py", "redlease_chaos_soak")


def run_soak(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def evidence(chaos: ModuleType, entries: list[str]) -> object:
    events = [
        {"t": 1.0, "ev": "elected", "pid": 11, "slot": 0, "token": 4},
        {"t": 2.0, "ev": "write", "pid": 11, "slot": 0, "token": 4, "seq": 1, "r": "a"},
        {"t": 3.0, "ev": "elected", "pid": 22, "slot": 1, "token": 5},
        {"t": 4.0, "ev": "write", "pid": 22, "slot": 1, "token": 5, "seq": 1, "r": "a"},
        {"t": 5.0, "ev": "write", "pid": 11, "slot": 0, "token": 4, "seq": 2, "r": "e"},
    ]
    return chaos.Evidence("elector", events, entries, 5, 5, exits={11: (0, 0.1), 22: (0, 0.1)})


def test_checker_passes_a_clean_log_and_flags_a_decreasing_token() -> None:
    chaos = load_chaos()
    assert chaos.check(evidence(chaos, ["4:11:1", "5:22:1"])) == []
    # Token 4's write, whose outcome its writer never learned, landed after token 5's.
    found = chaos.check(evidence(chaos, ["4:11:1", "5:22:1", "4:11:2"]))
    assert [v.rule for v in found] == ["order"]
    assert "5:22:1 then 4:11:2" in found[0].message


def test_self_test_catches_every_planted_violation() -> None:
    result = run_soak("--self-test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout
    assert result.stdout.count("planted") >= 8


@pytest.mark.slow
def test_short_soak_holds_every_invariant(engine: str, tmp_path: Path) -> None:
    result = run_soak(*SHORT, "--seed", "7", "--engine", engine, "--workdir", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all invariants held" in result.stdout
    assert "VIOLATED" not in result.stdout
    # Every contender it started is gone (their logs, hence command lines, name tmp_path).
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.slow
def test_short_lock_soak_holds_every_invariant(engine: str, tmp_path: Path) -> None:
    result = run_soak(
        *SHORT, "--seed", "8", "--engine", engine, "--mode", "lock", "--workdir", str(tmp_path)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all invariants held" in result.stdout


@pytest.mark.slow
@pytest.mark.topology
def test_short_sentinel_soak_survives_a_failover(tmp_path: Path) -> None:
    result = run_soak(
        *SHORT,
        "--seed", "10",
        "--topology", "sentinel",
        "--weights", "failover=100",
        "--workdir", str(tmp_path),
        timeout=150,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all invariants held" in result.stdout
    failovers = next(line for line in result.stdout.splitlines() if line.startswith("| failover"))
    assert int(failovers.split("|")[2]) >= 1


@pytest.mark.slow
def test_soak_fails_when_a_stale_write_lands_past_the_fence(tmp_path: Path) -> None:
    result = run_soak(*SHORT, "--seed", "9", "--inject-stale-write", "--workdir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    # Caught twice: by the sampler while running, and in the final list.
    assert "then 1:0:0 (seen while running)" in result.stdout
    assert "[order] token decreased in the fenced list" in result.stdout


def test_bad_weights_are_refused_with_the_rule() -> None:
    result = run_soak("--weights", "earthquake=3")
    assert result.returncode == 2
    assert "KIND=NUMBER with KIND one of" in result.stderr
    assert "'earthquake=3'" in result.stderr


@pytest.mark.slow
def test_short_semaphore_soak_holds_every_invariant(engine: str, tmp_path: Path) -> None:
    result = run_soak(
        *SHORT,
        "--seed", "11",
        "--engine", engine,
        "--mode", "semaphore",
        "--permits", "2",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all invariants held" in result.stdout
    assert "never more than N live permits at the server (sampled)" in result.stdout


@pytest.mark.slow
def test_semaphore_soak_fails_when_permits_past_n_are_live(tmp_path: Path) -> None:
    result = run_soak(
        *SHORT,
        "--seed", "12",
        "--mode", "semaphore",
        "--inject-stale-write",
        "--workdir", str(tmp_path),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[permits]" in result.stdout and "live permits at the server, of 2" in result.stdout
