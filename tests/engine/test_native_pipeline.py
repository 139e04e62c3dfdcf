"""The native core's batches: many scripts in one round trip on a Pool connection."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.exceptions as rex

from engine_helpers import Server, lua
from helpers import require_native

native = require_native()


def test_every_reply_comes_back_in_order_as_redis_py_gives_it(pool: Any) -> None:
    batch = [
        (lua("return 7"), [], []),
        (lua("return ARGV[1]"), [], ["text"]),
        (lua("return {1, 'two', {3}}"), [], []),
        (lua("return redis.status_reply('OK')"), [], []),
        (lua("return nil"), [], []),
    ]
    assert native.execute_many(pool, batch, 2.0) == [7, b"text", [1, b"two", [3]], b"OK", None]


def test_error_replies_are_exception_objects_in_place_and_the_rest_runs(
    pool: Any, rc: redis.Redis
) -> None:
    rc.rpush("list", "x")
    batch = [
        (lua("return redis.call('incr', KEYS[1])"), ["n"], []),
        (lua("return redis.call('incr', KEYS[1])"), ["list"], []),
        (lua("return redis.call('incr', KEYS[1])"), ["n"], []),
    ]
    first, error, last = native.execute_many(pool, batch, 2.0)
    assert (first, last) == (1, 2)
    assert isinstance(error, rex.ResponseError) and "WRONGTYPE" in str(error)
    # The connection is still in step.
    assert native.execute_many(pool, [(lua("return 5"), [], [])], 2.0) == [5]


def test_only_the_scripts_the_server_lost_are_sent_again(pool: Any, rc: redis.Redis) -> None:
    known = lua("redis.call('rpush', KEYS[1], ARGV[1]) return 1")
    lost = lua("redis.call('rpush', KEYS[1], ARGV[1]) return 2")
    rc.script_load(known.source.decode())
    batch = [(lost, ["log"], ["a"]), (known, ["log"], ["b"]), (lost, ["log"], ["c"])]
    assert native.execute_many(pool, batch, 2.0) == [2, 1, 2]
    assert sorted(rc.lrange("log", 0, -1)) == [b"a", b"b", b"c"]
    assert native.execute_many(pool, batch, 2.0) == [2, 1, 2], "loaded by the first batch"
    assert rc.llen("log") == 6


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_batch_whose_replies_cross_many_reads(server: Server, unix: bool) -> None:
    pool = native.Pool(server.target(unix=unix), 1)
    echo = lua("return ARGV[1]")
    values = [f"{i:06d}".encode() * 50 for i in range(3000)]  # ~900 kB of replies
    try:
        assert native.execute_many(pool, [(echo, [], [v]) for v in values], 10.0) == values
    finally:
        pool.close()


def test_an_empty_batch_opens_no_connection(server: Server) -> None:
    pool = native.Pool(server.target(), 1)
    assert native.execute_many(pool, [], 1.0) == []
    assert pool.connections == 0


def test_a_bad_argument_raises_before_the_connection_is_used(server: Server) -> None:
    pool = native.Pool(server.target(), 1)
    batch = [(lua("return 1"), [], [1]), (lua("return 1"), [], [object()])]
    with pytest.raises(TypeError, match="Invalid input of type: 'object'"):
        native.execute_many(pool, batch, 1.0)
    assert pool.connections == 0
