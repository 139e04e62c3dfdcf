"""Bulk writes on a fenced pipeline: ``set_many`` and ``hset_many`` queue many fenced writes
in one call, each fenced on its own, exactly as a loop of ``set`` / ``hset`` would."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, NamedTuple

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from helpers import (
    APPLIED_KEY,
    NAME,
    aio_client,
    commands_processed,
    make_elector,
    script_calls,
)
from redlease._testing import ClusterSet, RedisServer

APPEND = "redis.call('rpush', KEYS[2], ARGV[2])"
INCR = "redis.call('incr', KEYS[2])"
# A newer term's write landing mid-pipeline: the mark rises above the pipeline's token.
NEWER_TERM_WRITES = "redis.call('set', KEYS[1], ARGV[2]) do return 0 end"




# -- what the bulk writes do --------------------------------------------------------


def test_set_many_of_a_mapping_sets_every_key_and_gives_one_result_per_write(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    items = {"a": "1", b"b": b"2", "c": 3, "d": 4.5}
    assert e.fence_pipeline(5).set_many(items).execute() == [True] * 4
    assert client.mget("a", "b", "c", "d") == [b"1", b"2", b"3", b"4.5"]
    assert client.get(APPLIED_KEY) == b"5"


def test_set_many_gives_what_a_loop_of_set_gives(client: redis.Redis, engine: str) -> None:
    items = [(f"k{i}", f"v{i}") for i in range(50)]
    bulk = make_elector(client, engine, name="bulk")
    looped = make_elector(client, engine, name="looped")
    pipe = looped.fence_pipeline(3)
    for key, value in items:
        pipe.set("looped:" + key, value)
    by_loop = pipe.execute()
    by_bulk = bulk.fence_pipeline(3).set_many([("bulk:" + k, v) for k, v in items]).execute()
    assert by_bulk == by_loop == [True] * 50
    assert client.mget([f"bulk:k{i}" for i in range(50)]) == client.mget(
        [f"looped:k{i}" for i in range(50)]
    )


def test_set_many_of_pairs_writes_in_order_and_a_repeated_key_takes_the_last_value(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pairs = ((key, value) for key, value in [("k", "first"), ("j", "x"), ("k", "last")])
    assert e.fence_pipeline(2).set_many(pairs).execute() == [True, True, True]
    assert client.get("k") == b"last"
    assert client.get("j") == b"x"


def test_hset_many_sets_each_field_as_a_fenced_write_of_its_own(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(4).hset_many("h", {"f": "1", b"g": 2}).hset_many(b"h", [(3, 4.5)])
    assert pipe.execute() == [True, True, True]
    assert client.hgetall("h") == {b"f": b"1", b"g": b"2", b"3": b"4.5"}
    assert client.get(APPLIED_KEY) == b"4"


def test_bulk_writes_take_their_places_among_the_other_writes(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(6).set("k", "a").set_many({"k": "b", "j": "c"})
    pipe.eval(APPEND, ["log"], ["d"]).hset_many("h", {"f": "e"}).hset("h", "f", "f")
    pipe.set_many([("j", "g")])
    assert pipe.execute() == [True] * 7
    assert client.mget("k", "j") == [b"b", b"g"]
    assert client.lrange("log", 0, -1) == [b"d"]
    assert client.hget("h", "f") == b"f"


def test_each_bulk_write_returns_the_pipeline_and_counts_every_write(
    client: redis.Redis, engine: str
) -> None:
    pipe = make_elector(client, engine).fence_pipeline(1)
    assert pipe.set_many({"a": 1, "b": 2}) is pipe
    assert pipe.hset_many("h", {"f": 1, "g": 2, "h": 3}) is pipe
    assert len(pipe) == 5
    assert pipe.execute() == [True] * 5
    assert len(pipe) == 0


def test_a_large_set_many_returns_one_result_per_write(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    items = {f"k{i}": i for i in range(5000)}
    assert e.fence_pipeline(1).set_many(items).execute() == [True] * 5000
    assert client.mget(["k0", "k2500", "k4999"]) == [b"0", b"2500", b"4999"]


def test_the_items_are_read_when_queued_and_later_changes_are_not_written(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    items: dict[str, Any] = {"k": "queued"}
    fields = [("f", "queued")]
    pipe = e.fence_pipeline(1).set_many(items).hset_many("h", fields)
    items["k"] = "changed"
    items["j"] = "added"
    fields.append(("g", "added"))
    assert pipe.execute() == [True, True]
    assert client.get("k") == b"queued"
    assert client.exists("j") == 0
    assert client.hgetall("h") == {b"f": b"queued"}


# -- the fence ----------------------------------------------------------------------


def test_a_stale_token_rejects_every_bulk_write(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(8, "k", "newer")
    pipe = e.fence_pipeline(7).set_many({"k": "stale", "j": "stale"})
    assert pipe.hset_many("h", {"f": "stale"}).execute() == [False, False, False]
    assert client.get("k") == b"newer"
    assert client.exists("j", "h") == 0


def test_a_mark_raised_mid_pipeline_rejects_every_later_bulk_write(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(5).set_many({"a": "1", "b": "2"})
    pipe.eval(NEWER_TERM_WRITES, args=[6])
    pipe.set_many({"c": "3", "d": "4"}).hset_many("h", {"f": "5"}).set("e", "6")
    assert pipe.execute() == [True, True, False, False, False, False, False]
    assert client.mget("a", "b") == [b"1", b"2"]
    assert client.exists("c", "d", "h", "e") == 0
    assert client.get(APPLIED_KEY) == b"6"


def test_an_inert_fencers_bulk_writes_are_rejected_without_a_round_trip(
    client: redis.Redis, engine: str
) -> None:
    fencer = make_elector(client, engine).fencer()
    before = commands_processed(client)
    pipe = fencer.pipeline().set_many({"a": 1, "b": 2}).hset_many("h", {"f": 1})
    assert len(pipe) == 3
    assert pipe.execute() == [False, False, False]
    assert commands_processed(client) == before
    assert client.exists("a", "b", "h") == 0


def test_an_error_reply_beside_bulk_writes_raises_after_every_reply_was_read(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    client.set("text", "not a number")
    pipe = e.fence_pipeline(3).set_many({"before": "1"}).eval(INCR, ["text"])
    pipe.set_many({"after": "2"})
    with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
        pipe.execute()
    assert client.mget("before", "after") == [b"1", b"2"]
    assert e.fence_pipeline(3).set_many({"next": "3"}).execute() == [True]


def test_bulk_writes_whose_script_the_server_lost_apply_once_each(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_pipeline(2).set_many({"warm": 1}).hset_many("h", {"warm": 1}).execute()
    client.script_flush()
    evals_before = script_calls(client, "eval")
    pipe = e.fence_pipeline(2).set_many({"a": 1, "b": 2}).hset_many("h", {"f": 3, "g": 4})
    assert pipe.execute() == [True] * 4
    assert client.mget("a", "b") == [b"1", b"2"]
    assert client.hgetall("h") == {b"warm": b"1", b"f": b"3", b"g": b"4"}
    # Each write that met NOSCRIPT ran once, as EVAL.
    assert script_calls(client, "eval") - evals_before == 4


# -- nothing queued or sent when there is nothing to write or the input is bad -------


def test_empty_bulk_writes_queue_nothing_and_send_nothing(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    before = commands_processed(client)
    pipe = e.fence_pipeline(3).set_many({}).set_many([]).hset_many("h", iter(()))
    assert len(pipe) == 0
    assert pipe.execute() == []
    assert commands_processed(client) == before


def _bad_midway() -> Iterator[tuple[Any, Any]]:
    yield "fine", "v"
    yield "bad", None


@pytest.mark.parametrize(
    ("add", "error"),
    [
        (lambda p: p.set_many(5), "set_many takes a mapping or an iterable of (key, value) pairs"),
        (lambda p: p.set_many("kv"), "set_many takes a mapping or an iterable of (key, value)"),
        (lambda p: p.set_many([("k", "v"), ("k",)]), "set_many: item 1 must be a (key, value)"),
        (lambda p: p.set_many([("k", "v", "x")]), "set_many: item 0 must be a (key, value) pair"),
        (lambda p: p.set_many(["kv"]), "set_many: item 0 must be a (key, value) pair, got str"),
        (lambda p: p.set_many({1: "v"}), "set_many: the key of item 0 must be str or bytes, got"),
        (
            lambda p: p.set_many({"k": "v", "j": True}),
            "set_many: the value of item 1 must be str, bytes, int or float, got bool True",
        ),
        (lambda p: p.set_many(_bad_midway()), "the value of item 1 must be str, bytes, int or"),
        (lambda p: p.hset_many(1, {"f": "v"}), "key must be str or bytes, got int 1"),
        (lambda p: p.hset_many("h", {None: "v"}), "hset_many: the field of item 0 must be str"),
        (lambda p: p.hset_many("h", [("f", [1])]), "hset_many: the value of item 0 must be str"),
        (lambda p: p.hset_many("h", "fv"), "hset_many takes a mapping or an iterable of (field,"),
    ],
)
def test_a_bad_bulk_argument_raises_before_anything_of_it_is_queued_or_sent(
    client: redis.Redis, engine: str, add: Any, error: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(1).set("good", "v")
    before = commands_processed(client)
    with pytest.raises(TypeError, match=error.replace("(", r"\(").replace(")", r"\)")):
        add(pipe)
    assert commands_processed(client) == before
    assert len(pipe) == 1, "nothing of the bad call was queued"
    assert pipe.execute() == [True]
    assert client.exists("fine", "k", "h") == 0


# -- asyncio ------------------------------------------------------------------------



def test_aio_bulk_writes_apply_in_order_and_a_stale_token_is_rejected(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> tuple[list[bool], list[bool]]:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            pipe = e.fence_pipeline(4).set("k", "a").set_many({"j": "b", "i": "c"})
            assert isinstance(pipe, redlease.aio.FencedPipeline)
            assert pipe.hset_many("h", [("f", "d")]) is pipe
            applied = await pipe.execute()
            stale = e.fence_pipeline(3).set_many({"k": "x"}).hset_many("h", {"f": 1})
            return applied, await stale.execute()

    assert asyncio.run(scenario()) == ([True] * 4, [False, False])
    assert client.mget("k", "j", "i") == [b"a", b"b", b"c"]
    assert client.hgetall("h") == {b"f": b"d"}
    assert client.get(APPLIED_KEY) == b"4"


def test_aio_a_mark_raised_mid_pipeline_rejects_the_later_bulk_writes(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> list[bool]:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            pipe = redlease.aio.Fencer(e, 5).pipeline().set_many({"a": "1"})
            pipe.eval(NEWER_TERM_WRITES, args=[6]).set_many({"b": "2", "c": "3"})
            return await pipe.execute()

    assert asyncio.run(scenario()) == [True, False, False, False]
    assert client.get("a") == b"1"
    assert client.exists("b", "c") == 0


def test_aio_a_bad_bulk_argument_raises_and_queues_nothing(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> list[bool]:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            pipe = e.fence_pipeline(1).set("good", "v")
            with pytest.raises(TypeError, match="the value of item 1"):
                pipe.set_many({"k": "v", "j": object()})
            return await pipe.execute()

    assert asyncio.run(scenario()) == [True]


# -- on a cluster ---------------------------------------------------------------------


@pytest.mark.usefixtures("engines_closed")
def test_bulk_writes_on_a_cluster(cluster_set: ClusterSet, engine: str) -> None:
    client = cluster_set.client(socket_timeout=2)
    name = "{bulk-" + engine + "}"
    e = redlease.Elector(client, name, ttl=0.5, engine=engine)
    assert e.engine == engine
    pipe = e.fence_pipeline(3).set_many({f"{name}:a": "1", f"{name}:b": "2"})
    assert pipe.hset_many(f"{name}:h", {"f": "3"}).execute() == [True, True, True]
    assert client.get(f"{name}:b") == b"2"
    assert client.hget(f"{name}:h", "f") == b"3"
    assert e.fence_pipeline(2).set_many({f"{name}:a": "stale"}).execute() == [False]
    assert client.get(f"{name}:a") == b"1"
    client.close()


@pytest.mark.usefixtures("engines_closed")
def test_bulk_writes_on_a_cluster_refuse_a_key_outside_the_names_slot_before_queuing(
    cluster_set: ClusterSet, engine: str
) -> None:
    client = cluster_set.client(socket_timeout=2)
    e = redlease.Elector(client, "{bulk-slot}", ttl=0.5, engine=engine)
    pipe = e.fence_pipeline(1).set("{bulk-slot}:ok", "v")
    with pytest.raises(redis.exceptions.ResponseError, match=r"CROSSSLOT.*other-key"):
        pipe.set_many({"{bulk-slot}:fine": "v", "other-key": "v"})
    with pytest.raises(redis.exceptions.ResponseError, match=r"CROSSSLOT.*other-hash"):
        pipe.hset_many("other-hash", {"f": "v"})
    assert len(pipe) == 1
    assert pipe.execute() == [True]
    assert client.get("{bulk-slot}:fine") is None
    assert client.get("other-key") is None
    client.close()


def test_any_mapping_and_any_pairs_are_taken_as_a_loop_of_set_would_take_them(
    client: redis.Redis, engine: str
) -> None:
    class Key(str):
        pass

    class Pair(NamedTuple):
        key: str
        value: str

    e = make_elector(client, engine)
    pipe = e.fence_pipeline(1).set_many(MappingProxyType({Key("a"): "1"}))
    pipe.set_many([Pair("b", "2")]).set_many(OrderedDict([("c", 3)])).hset_many("h", {Key("f"): 4})
    assert pipe.execute() == [True] * 4
    assert client.mget("a", "b", "c") == [b"1", b"2", b"3"]
    assert client.hget("h", "f") == b"4"


def test_without_the_extension_the_items_are_checked_and_split_the_same_way(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redlease._engine.rules.encodable as encodable

    monkeypatch.setattr(encodable, "_split", None)
    monkeypatch.setattr(encodable, "_looked", True)
    e = make_elector(client, "python")
    pipe = e.fence_pipeline(1).set_many({"a": 1, b"b": 2.5}).set_many([("c", "x"), ["d", b"y"]])
    assert pipe.hset_many("h", {3: "z"}).execute() == [True] * 5
    assert client.mget("a", "b", "c", "d") == [b"1", b"2.5", b"x", b"y"]
    assert client.hget("h", "3") == b"z"
    with pytest.raises(TypeError, match="set_many: the value of item 1 must be str"):
        e.fence_pipeline(1).set_many([("k", "v"), ("j", True)])
