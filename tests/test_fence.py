"""Fenced writes: one high-water mark, checked and advanced atomically at Redis."""

from __future__ import annotations

import time

import pytest
import redis

import redlease
from helpers import APPLIED_KEY, FENCE_KEY, make_elector, wait_until
from redlease._testing import RedisServer

ZADD = "redis.call('zadd', KEYS[2], ARGV[2], ARGV[3])"


def mark(client: redis.Redis) -> bytes | None:
    value = client.get(APPLIED_KEY)
    assert value is None or isinstance(value, bytes)
    return value


def test_stale_token_is_rejected_after_successor_elected(client: redis.Redis, engine: str) -> None:
    old = make_elector(client, engine)
    with old:
        stale = wait_until(old.token)
        assert old.fence_set(stale, "state", "old")
    new = make_elector(client, engine)
    with new:
        current = wait_until(new.token)
        assert current > stale
        # The successor has written nothing yet: its election alone fences the old term out.
        assert not old.fence_set(stale, "state", "stale")
        assert not new.fence_set(stale, "state", "stale")
    assert client.get("state") == b"old"


def test_write_with_token_equal_to_the_mark_is_applied(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(7, "k", "first")
    assert e.fence_set(7, "k", "second")
    assert client.get("k") == b"second"
    assert mark(client) == b"7"


def test_write_with_token_above_the_mark_is_applied_and_advances_it(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(3, "k", "a")
    assert e.fence_set(9, "k", "b")
    assert client.get("k") == b"b"
    assert mark(client) == b"9"


def test_write_with_token_below_the_mark_is_rejected_and_leaves_the_mark(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(9, "k", "b")
    assert not e.fence_set(8, "k", "stale")
    assert client.get("k") == b"b"
    assert mark(client) == b"9"


@pytest.mark.parametrize("token", [0, -1, -(2**40)])
def test_non_positive_token_is_rejected_without_moving_the_mark(
    client: redis.Redis, engine: str, token: int
) -> None:
    e = make_elector(client, engine)
    assert not e.fence_set(token, "fresh", "x")
    assert client.get("fresh") is None
    assert mark(client) is None
    assert e.fence_set(4, "k", "v")
    assert not e.fence_hset(token, "h", "f", "x")
    assert not e.fence_eval(token, ZADD, keys=["z"], args=[1, "m"])
    assert mark(client) == b"4"
    assert client.exists("h", "z") == 0


def test_fencer_of_an_elector_that_is_not_leading_is_inert(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(2, "k", "v")
    f = e.fencer()
    assert f.token == 0
    assert not f
    assert not f.set("k", "inert")
    assert not f.hset("h", "f", "inert")
    assert not f.eval(ZADD, keys=["z"], args=[1, "m"])
    assert client.get("k") == b"v"
    assert client.exists("h", "z") == 0
    assert mark(client) == b"2"


def test_fencer_binds_a_token_to_the_elector(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    f = redlease.Fencer(e, 5)
    assert f.token == 5
    assert f
    assert f.set("k", "v")
    assert f.hset("h", "f", "v")
    assert f.eval(ZADD, keys=["z"], args=[2, "m"])
    assert not redlease.Fencer(e, 4).set("k", "stale")
    assert not redlease.Fencer(e, 0)
    assert mark(client) == b"5"


def test_fence_eval_applies_a_zadd(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    assert e.fence_eval(6, ZADD, keys=["board"], args=[100, "alice"])
    assert client.zscore("board", "alice") == 100
    assert mark(client) == b"6"


def test_fence_eval_with_stale_token_leaves_the_data_untouched(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_eval(6, ZADD, keys=["board"], args=[100, "alice"])
    assert not e.fence_eval(5, ZADD, keys=["board"], args=[1, "mallory"])
    # (redis-py 5 gives RESP3 pairs as lists, later versions as tuples)
    board = [tuple(pair) for pair in client.zrange("board", 0, -1, withscores=True)]
    assert board == [(b"alice", 100.0)]
    assert mark(client) == b"6"


def test_fence_eval_addresses_caller_keys_and_args_from_index_two(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    body = "redis.call('set', KEYS[2], ARGV[2]) redis.call('set', KEYS[3], ARGV[3])"
    assert e.fence_eval(1, body, keys=["a", "b"], args=["va", b"vb"])
    assert client.mget("a", "b") == [b"va", b"vb"]


def test_fenced_writes_accept_str_bytes_int_and_float_values(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(1, "s", "text")
    assert e.fence_set(1, b"b", b"\x00\xff")
    assert e.fence_set(1, "i", 42)
    assert e.fence_set(1, "f", 1.5)
    assert client.mget("s", "b", "i", "f") == [b"text", b"\x00\xff", b"42", b"1.5"]
    assert e.fence_hset(1, "h", "n", 7)
    assert e.fence_hset(1, "h", b"raw", b"\x01")
    assert client.hgetall("h") == {b"n": b"7", b"raw": b"\x01"}


class _Name(str):
    """A str subclass: not one of the exact types a fenced SET takes without a closer look."""


@pytest.mark.parametrize("bad", [True, None, [1], {"v": 1}])
def test_fenced_set_checks_values_of_any_type_and_takes_subclasses_of_plain_ones(
    client: redis.Redis, engine: str, bad: object
) -> None:
    e = make_elector(client, engine)
    with pytest.raises(TypeError, match="value must be str, bytes, int or float"):
        e.fence_set(1, "k", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be str or bytes"):
        e.fence_set(1, bad, "v")  # type: ignore[arg-type]
    assert client.exists("k") == 0
    assert mark(client) is None
    assert e.fence_set(1, _Name("k"), _Name("v"))
    assert client.get("k") == b"v"


def test_all_fenced_writes_share_one_mark(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(10, "k", "v10")
    assert not e.fence_hset(9, "h", "f", "v9")
    assert not e.fence_eval(9, ZADD, keys=["z"], args=[9, "m"])
    assert e.fence_eval(11, ZADD, keys=["z"], args=[11, "m"])
    assert not e.fence_set(10, "k", "v10-again")
    assert e.fence_hset(11, "h", "f", "v11")
    assert not e.fence_set(10, "k", "late")
    assert mark(client) == b"11"
    assert client.get("k") == b"v10"


def test_electors_of_one_name_share_the_mark(client: redis.Redis, engine: str) -> None:
    a = make_elector(client, engine)
    b = make_elector(client, "python")
    assert a.fence_set(20, "k", "a")
    assert not b.fence_set(19, "k", "b")
    assert b.fence_hset(21, "h", "f", "b")
    assert not a.fence_set(20, "k", "a-again")


def test_257th_distinct_eval_body_raises_and_cached_bodies_keep_working(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    bodies = [f"redis.call('set', KEYS[2], ARGV[2]) -- body {i}" for i in range(256)]
    for i, body in enumerate(bodies):
        assert e.fence_eval(1, body, keys=[f"k{i}"], args=[i])
    with pytest.raises(redlease.TooManyEvalBodies):
        e.fence_eval(2, "redis.call('set', KEYS[2], ARGV[2]) -- one too many", keys=["x"], args=[1])
    assert client.get("x") is None
    assert mark(client) == b"1"
    assert e.fence_eval(3, bodies[0], keys=["k0"], args=["again"])
    assert e.fence_eval(3, bodies[255], keys=["k255"], args=["again"])
    assert client.mget("k0", "k255") == [b"again", b"again"]


def test_too_many_eval_bodies_is_a_redlease_error() -> None:
    assert issubclass(redlease.TooManyEvalBodies, redlease.RedleaseError)


def test_failing_write_raises_response_error_and_does_not_move_the_mark(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(5, "k", "v")
    client.set("not-a-hash", "string")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        e.fence_hset(8, "not-a-hash", "f", "v")
    assert mark(client) == b"5"
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        e.fence_eval(8, ZADD, keys=["not-a-hash"], args=[1, "m"])
    assert mark(client) == b"5"
    assert e.fence_set(6, "k", "still-works")


def test_sixteen_digit_token_is_minted_and_stored_verbatim(
    client: redis.Redis, engine: str
) -> None:
    client.set(FENCE_KEY, "1234567890123456")
    e = make_elector(client, engine)
    with e:
        token = wait_until(e.token)
        assert token == 1234567890123457
        assert client.get(APPLIED_KEY) == b"1234567890123457"
        assert e.fencer().set("k", "v")
        assert client.get(APPLIED_KEY) == b"1234567890123457"
        assert not e.fence_set(1234567890123456, "k", "stale")


def test_largest_exact_token_is_accepted_and_stored_verbatim(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(2**53 - 1, "k", "v")
    assert client.get(APPLIED_KEY) == b"9007199254740991"


@pytest.mark.parametrize("token", [2**53, 2**53 + 1, 2**64])
def test_token_of_two_to_the_53_or_more_is_a_value_error_before_sending(
    redis_server: RedisServer, client: redis.Redis, engine: str, token: int
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(1, "warm", "up")
    # A frozen server answers nothing: only a check made before sending can answer in time.
    redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(ValueError):
            e.fence_set(token, "k", "v")
        with pytest.raises(ValueError):
            e.fence_hset(token, "h", "f", "v")
        with pytest.raises(ValueError):
            e.fence_eval(token, ZADD, keys=["z"], args=[1, "m"])
        assert time.monotonic() - started < 1.0
    finally:
        redis_server.resume()
    assert client.exists("k", "h", "z") == 0
    assert mark(client) == b"1"


@pytest.mark.parametrize("token", [True, False, 3.0, "3", b"3", None])
def test_non_int_token_is_a_type_error(client: redis.Redis, engine: str, token: object) -> None:
    e = make_elector(client, engine)
    with pytest.raises(TypeError):
        e.fence_set(token, "k", "v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        e.fence_hset(token, "h", "f", "v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        e.fence_eval(token, ZADD, keys=["z"], args=[1, "m"])  # type: ignore[arg-type]
    assert client.exists("k", "h", "z") == 0
    assert mark(client) is None


def test_fenced_writes_survive_script_flush(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(1, "k", "a")
    assert e.fence_hset(1, "h", "f", "a")
    assert e.fence_eval(1, ZADD, keys=["z"], args=[1, "a"])
    client.script_flush()
    assert e.fence_set(2, "k", "b")
    client.script_flush()
    assert e.fence_hset(2, "h", "f", "b")
    client.script_flush()
    assert e.fence_eval(2, ZADD, keys=["z"], args=[2, "b"])
    assert client.get("k") == b"b"
    assert client.hget("h", "f") == b"b"
    assert client.zscore("z", "b") == 2
