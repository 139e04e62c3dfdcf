"""The native core's batches: many scripts in one round trip on a Pool connection."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.exceptions as rex

from engine_helpers import Server, run_batch
from helpers import require_native
from redlease._engine.contract.interface import ScriptSeries, flatten
from redlease._scripts import Script

native = require_native()


def lua(body: str) -> Script:
    return Script("test", body)


def test_every_reply_comes_back_in_order_as_redis_py_gives_it(pool: Any) -> None:
    batch = [
        (lua("return 7"), [], []),
        (lua("return ARGV[1]"), [], ["text"]),
        (lua("return {1, 'two', {3}}"), [], []),
        (lua("return redis.status_reply('OK')"), [], []),
        (lua("return nil"), [], []),
    ]
    assert run_batch(pool, batch, 2.0) == [7, b"text", [1, b"two", [3]], b"OK", None]


def test_error_replies_are_exception_objects_in_place_and_the_rest_runs(
    pool: Any, rc: redis.Redis
) -> None:
    rc.rpush("list", "x")
    batch = [
        (lua("return redis.call('incr', KEYS[1])"), ["n"], []),
        (lua("return redis.call('incr', KEYS[1])"), ["list"], []),
        (lua("return redis.call('incr', KEYS[1])"), ["n"], []),
    ]
    first, error, last = run_batch(pool, batch, 2.0)
    assert (first, last) == (1, 2)
    assert isinstance(error, rex.ResponseError) and "WRONGTYPE" in str(error)
    # The connection is still in step.
    assert run_batch(pool, [(lua("return 5"), [], [])], 2.0) == [5]


def test_only_the_scripts_the_server_lost_are_sent_again(pool: Any, rc: redis.Redis) -> None:
    known = lua("redis.call('rpush', KEYS[1], ARGV[1]) return 1")
    lost = lua("redis.call('rpush', KEYS[1], ARGV[1]) return 2")
    rc.script_load(known.source)
    batch = [(lost, ["log"], ["a"]), (known, ["log"], ["b"]), (lost, ["log"], ["c"])]
    assert run_batch(pool, batch, 2.0) == [2, 1, 2]
    assert sorted(rc.lrange("log", 0, -1)) == [b"a", b"b", b"c"]
    assert run_batch(pool, batch, 2.0) == [2, 1, 2], "loaded by the first batch"
    assert rc.llen("log") == 6


@pytest.mark.parametrize("unix", [False, True], ids=["tcp", "unix"])
def test_a_batch_whose_replies_cross_many_reads(server: Server, unix: bool) -> None:
    pool = native.Pool(server.target(unix=unix), 1)
    echo = lua("return ARGV[1]")
    values = [f"{i:06d}".encode() * 50 for i in range(3000)]  # ~900 kB of replies
    try:
        assert run_batch(pool, [(echo, [], [v]) for v in values], 10.0) == values
    finally:
        pool.close()


def test_an_empty_batch_opens_no_connection(server: Server) -> None:
    pool = native.Pool(server.target(), 1)
    assert run_batch(pool, [], 1.0) == []
    assert pool.connections == 0


def test_a_bad_argument_raises_before_the_connection_is_used(server: Server) -> None:
    pool = native.Pool(server.target(), 1)
    batch = [(lua("return 1"), [], [1]), (lua("return 1"), [], [object()])]
    with pytest.raises(TypeError, match="Invalid input of type: 'object'"):
        run_batch(pool, batch, 1.0)
    assert pool.connections == 0


def test_writes_sharing_a_first_key_and_first_arg_each_keep_their_own_rest(
    pool: Any, rc: redis.Redis
) -> None:
    # The encoder copies the bytes a request shares with the one before it
    # (script, arity, first key, first arg); what follows must still be its own.
    put = lua("redis.call('set', KEYS[2], ARGV[1] .. ARGV[2]) return redis.call('incr', KEYS[1])")
    first, token = "count", "t:"
    batch = [(put, (first, f"k{i}"), (token, f"v{i}")) for i in range(5)]
    batch.insert(2, (put, ("other", "k9"), (token, 1.5)))
    assert run_batch(pool, batch, 2.0) == [1, 2, 1, 3, 4, 5]
    assert rc.mget([f"k{i}" for i in range(5)]) == [f"t:v{i}".encode() for i in range(5)]
    assert rc.get("k9") == b"t:1.5"


@pytest.mark.parametrize(
    ("bodies", "flags"),
    [
        (["return 1", "return 1"], True),
        (["return 0", "return 1"], False),  # two scripts
        (["return 2", "return 2"], False),  # not a flag
        (["return 'x'", "return 'x'"], False),
    ],
)
def test_flags_says_one_script_answered_only_0s_and_1s(
    pool: Any, bodies: list[str], flags: bool
) -> None:
    scripts = {body: lua(body) for body in bodies}
    batch = [(scripts[body], (), ()) for body in bodies]
    _replies, acked, got = native.execute_scripts(pool, batch, {}, _ref, 2.0)
    assert (got, acked) == (flags, 0)


def _ref(script: Script) -> Any:
    return native.ScriptRef(script.sha, script.source)


def test_a_script_run_is_sent_as_the_calls_it_stands_for(pool: Any, rc: redis.Redis) -> None:
    log = lua(
        "redis.call('rpush', 'log', table.concat(KEYS, ',') .. '|' .. table.concat(ARGV, ','))"
        " return 1"
    )
    batch: list[Any] = [
        ScriptSeries(log, ("m",), ("t",), ["a", b"b"], ["1", 2], True),
        (log, ("m",), ("x",)),
        ScriptSeries(log, ("m", "h"), ("t",), ["f", 7], [3.5, b"v"], False),
        ScriptSeries(log, ("m",), ("t",), [], [], True),
    ]
    assert run_batch(pool, batch, 2.0) == [1] * 5
    sent = rc.lrange("log", 0, -1)
    assert sent == [b"m,a|t,1", b"m,b|t,2", b"m|x", b"m,h|t,f,3.5", b"m,h|t,7,v"]
    rc.delete("log")
    assert run_batch(pool, list(flatten(batch)), 2.0) == [1] * 5
    assert rc.lrange("log", 0, -1) == sent, "the calls flatten() makes are the same"


def test_a_batch_of_empty_runs_sends_nothing(server: Server) -> None:
    pool = native.Pool(server.target(), 1)
    empty = ScriptSeries(lua("return 1"), ("m",), ("t",), [], [], True)
    assert run_batch(pool, [empty], 1.0) == []
    assert pool.connections == 0


def test_split_pairs_splits_plainly_good_items_and_leaves_the_rest_to_the_caller() -> None:
    assert native.split_pairs({"a": 1, b"b": 2.5}, True) == (["a", b"b"], [1, 2.5])
    assert native.split_pairs([("a", "x"), [b"b", b"y"]], True) == (["a", b"b"], ["x", b"y"])
    assert native.split_pairs(((1, 2.0),), False) == ([1], [2.0]), "a field may be a number"
    assert native.split_pairs([], True) == ([], [])
    for odd in (
        {1: "v"},
        {"k": True},
        {"k": None},
        [("k",)],
        [("k", "v", "x")],
        ["kv"],
        "kv",
        iter([("k", "v")]),
        [("k", bytearray(b"x"))],
        [(True, "v")],
    ):
        assert native.split_pairs(odd, odd != [(True, "v")]) is None, odd
