"""Every script in examples/ runs by itself, finishes in seconds and shows what happened."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from redlease._testing import RedisServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# What each example must show in its output.
EXPECTED = {
    "scheduler.py": ["elected, token 1", "fired the job (token 2)", "runs recorded"],
    "sequence_allocator.py": ["REJECTED by the fence", "every number handed out once"],
    "sql_fencing.py": ["0 rows: REJECTED", "status='built (B)', fence=2"],
}


def run_example(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_every_example_is_covered() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_against_a_given_server(script: str, redis_server: RedisServer) -> None:
    out = run_example(script, "--redis", redis_server.url)

    for text in EXPECTED[script]:
        assert text in out
    assert redis_server.client().dbsize() == 0  # each example cleans up after itself


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_on_its_own_embedded_server(script: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}

    out = run_example(script, env=env)

    for text in EXPECTED[script]:
        assert text in out


def test_example_reads_redis_url_from_the_environment(redis_server: RedisServer) -> None:
    env = dict(os.environ, REDIS_URL=redis_server.url)
    client = redis_server.client()
    before = client.info("stats")["total_commands_processed"]

    out = run_example("sql_fencing.py", env=env)

    assert "REJECTED" in out
    assert client.info("stats")["total_commands_processed"] > before + 5
