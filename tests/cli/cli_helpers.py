"""Running the ``redlease`` command the way users run it: ``python -m redlease ...``."""

from __future__ import annotations

import os
import subprocess
import sys


def cli_env(**overrides: str) -> dict[str, str]:
    """This process's environment without REDIS_URL, with ``overrides``."""
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(overrides)
    return env


def redlease_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``python -m redlease ARGS``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "redlease", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else cli_env(),
        timeout=timeout,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Check the failure is one line on stderr with exit status ``code``; that line."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]
