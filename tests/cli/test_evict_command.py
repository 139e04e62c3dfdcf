"""``redlease evict NAME`` and ``redlease locks --release NAME``: who was evicted, the new mark."""

from __future__ import annotations

import json

import pytest

import redlease
from cli_helpers import redlease_cli
from helpers import wait_until
from redlease._testing import RedisServer


def test_the_evict_command_prints_who_and_the_mark(redis_server: RedisServer) -> None:
    client = redis_server.client()
    elector = redlease.Elector(client, "cli-evicted", ttl=30.0, instance_id="box-1")
    elector.start()
    try:
        wait_until(elector.is_leader, 10.0, what="the elector leads")
        token = elector.token()
        assert token is not None
        out = redlease_cli("evict", "cli-evicted", "--redis", redis_server.url, "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result == {"name": "cli-evicted", "evicted": "box-1", "mark": result["mark"]}
        assert result["mark"] > token
        text = redlease_cli("evict", "nobody-here", "--redis", redis_server.url)
        assert text.returncode == 0, text.stderr
        assert "nobody held elector 'nobody-here'" in text.stdout
    finally:
        elector.stop(timeout=10.0)
        client.close()


def test_locks_release_prints_who_and_the_counter(redis_server: RedisServer) -> None:
    client = redis_server.client()
    with redlease.RedisLocker(client, holder="nightly@box-7") as locker:
        held = locker.acquire("nightly", ttl=60.0)
        out = redlease_cli("locks", "--redis", redis_server.url, "--release", "nightly", "--json")
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["name"] == "nightly" and result["evicted"] == "nightly@box-7"
        assert result["mark"] > held.fencing_token
        with pytest.raises(redlease.NotHeld):
            held.release()
        text = redlease_cli("locks", "--redis", redis_server.url, "--release", "nightly")
        assert text.returncode == 0, text.stderr
        assert "nobody held lock or semaphore 'nightly' under 'redlease:lock:'" in text.stdout
    client.close()
