"""Fenced pipelines: many fenced writes in one round trip, each fenced on its own, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

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
    elected_token,
    make_elector,
    script_calls,
    wait_until,
)
from redlease._testing import ClusterSet, RedisServer, SentinelSet
from redlease._testing import key_slot as redlease_key_slot
from tls_helpers import require_native_tls

APPEND = "redis.call('rpush', KEYS[2], ARGV[2])"
APPEND_TWICE = "redis.call('rpush', KEYS[2], ARGV[2]) redis.call('rpush', KEYS[2], ARGV[2])"
INCR = "redis.call('incr', KEYS[2])"
# A newer term's write landing between two writes of the pipeline: the mark
# rises above the pipeline's token, and this write itself reports "not applied".
NEWER_TERM_WRITES = "redis.call('set', KEYS[1], ARGV[2]) do return 0 end"
SOCKET_TIMEOUT = 0.3
FROZEN_FOR = 1.5




# -- what a pipeline does -------------------------------------------------------------


def test_execute_applies_every_write_in_order_and_advances_the_mark(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(5)
    pipe.set("k", "a").hset("h", "f", 1).eval(APPEND, ["log"], ["x"]).set("k", "b")
    assert pipe.execute() == [True, True, True, True]
    assert client.get("k") == b"b"
    assert client.hget("h", "f") == b"1"
    assert client.lrange("log", 0, -1) == [b"x"]
    assert client.get(APPLIED_KEY) == b"5"


def test_each_write_method_returns_the_pipeline_itself(client: redis.Redis, engine: str) -> None:
    pipe = make_elector(client, engine).fence_pipeline(1)
    assert pipe.set("k", "v") is pipe
    assert pipe.hset("h", "f", "v") is pipe
    assert pipe.eval(APPEND, ["log"], ["v"]) is pipe
    assert len(pipe) == 3
    assert isinstance(pipe, redlease.FencedPipeline)


def test_fencer_pipeline_writes_with_the_fencers_token(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    pipe = redlease.Fencer(e, 9).pipeline()
    assert pipe.token == 9
    assert pipe.set("k", "v").execute() == [True]
    assert client.get(APPLIED_KEY) == b"9"


def test_a_mark_raised_mid_pipeline_rejects_that_write_and_every_later_one(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(5)
    pipe.set("a", "1").eval(APPEND, ["log"], ["2"])
    pipe.eval(NEWER_TERM_WRITES, args=[6])
    pipe.set("b", "4").hset("h", "f", "5").eval(APPEND, ["log"], ["6"])
    assert pipe.execute() == [True, True, False, False, False, False]
    assert client.get("a") == b"1"
    assert client.lrange("log", 0, -1) == [b"2"]
    assert client.exists("b", "h") == 0
    assert client.get(APPLIED_KEY) == b"6"


def test_a_token_already_stale_rejects_the_whole_pipeline(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(8, "k", "newer")
    assert e.fence_pipeline(7).set("k", "stale").set("j", "stale").execute() == [False, False]
    assert client.get("k") == b"newer"
    assert client.exists("j") == 0


def test_an_error_reply_mid_pipeline_raises_after_every_reply_was_read(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    client.set("text", "not a number")
    pipe = e.fence_pipeline(3).set("before", "1").eval(INCR, ["text"]).set("after", "2")
    with pytest.raises(redis.exceptions.ResponseError, match="not an integer"):
        pipe.execute()
    # The writes around the failing one are as Redis did them: both applied.
    assert client.get("before") == b"1"
    assert client.get("after") == b"2"
    assert client.get("text") == b"not a number"
    # The connection stayed in step: the next replies are this pipeline's own.
    assert e.fence_pipeline(3).set("next", "3").eval(APPEND, ["log"], ["4"]).execute() == [
        True,
        True,
    ]
    assert client.get("next") == b"3"


def test_the_pipeline_is_empty_after_execute_even_when_it_raised(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    client.set("text", "x")
    pipe = e.fence_pipeline(1).eval(INCR, ["text"])
    with pytest.raises(redis.exceptions.ResponseError):
        pipe.execute()
    assert len(pipe) == 0
    assert pipe.execute() == []


def test_writes_whose_script_the_server_lost_are_sent_again_once_each(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_eval(1, APPEND, ["warm"], ["w"])  # script cached, connection open
    client.script_flush()
    assert e.fence_eval(1, APPEND_TWICE, ["warm"], ["w"])  # only this one is loaded now
    evals_before = script_calls(client, "eval")
    pipe = e.fence_pipeline(1)
    pipe.eval(APPEND_TWICE, ["log"], ["a"]).eval(APPEND, ["log"], ["b"])
    pipe.eval(APPEND_TWICE, ["log"], ["c"]).eval(APPEND, ["log"], ["d"])
    assert pipe.execute() == [True, True, True, True]
    log = client.lrange("log", 0, -1)
    assert sorted(log) == [b"a", b"a", b"b", b"c", b"c", b"d"]
    # Exactly the two writes that met NOSCRIPT were sent again, as EVAL.
    assert script_calls(client, "eval") - evals_before == 2


def test_a_pipeline_after_script_flush_applies_each_write_once(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_pipeline(2).set("k", "warm").eval(APPEND, ["log"], ["warm"]).execute()
    client.script_flush()
    pipe = e.fence_pipeline(2).eval(APPEND, ["log"], ["1"]).set("k", "v").hset("h", "f", "v")
    assert pipe.eval(APPEND, ["log"], ["2"]).execute() == [True, True, True, True]
    assert client.lrange("log", 0, -1) == [b"warm", b"1", b"2"]
    assert client.get("k") == b"v"
    assert client.hget("h", "f") == b"v"


def test_a_large_pipeline_returns_one_result_per_write(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(4)
    for i in range(5000):
        pipe.eval(APPEND, ["log"], [i])
    assert pipe.execute() == [True] * 5000
    assert client.lrange("log", 0, -1) == [str(i).encode() for i in range(5000)]


def test_each_write_of_a_pipeline_is_counted_in_the_fenced_writes_metric(
    client: redis.Redis, engine: str
) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    import redlease.metrics

    registry = prometheus_client.CollectorRegistry()
    e = redlease.metrics.instrument(make_elector(client, engine), registry)
    client.set("text", "x")
    pipe = e.fence_pipeline(5).set("a", "1").eval(NEWER_TERM_WRITES, args=[6]).set("b", "2")
    assert pipe.execute() == [True, False, False]
    with pytest.raises(redis.exceptions.ResponseError):
        e.fence_pipeline(6).set("c", "3").eval(INCR, ["text"]).execute()

    def count(result: str) -> float | None:
        labels = {"name": NAME, "result": result}
        return registry.get_sample_value("redlease_fenced_writes_total", labels)

    # The write that met an error reply is neither applied nor rejected: it raised.
    assert count("applied") == 2
    assert count("rejected") == 2


# -- nothing sent when there is nothing to send or the input is bad ----------------


def test_an_empty_pipeline_returns_an_empty_list_without_a_round_trip(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    before = commands_processed(client)
    assert e.fence_pipeline(3).execute() == []
    assert commands_processed(client) == before


def test_an_inert_fencers_pipeline_rejects_every_write_without_a_round_trip(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    fencer = e.fencer()
    assert not fencer
    before = commands_processed(client)
    assert fencer.pipeline().set("k", "v").hset("h", "f", "v").execute() == [False, False]
    assert commands_processed(client) == before
    assert client.exists("k", "h") == 0


@pytest.mark.parametrize(
    ("add", "error"),
    [
        (lambda p: p.set(1, "v"), "key must be str or bytes, got int 1"),
        (lambda p: p.set("k", True), "value must be str, bytes, int or float, got bool True"),
        (lambda p: p.set("k", None), "value must be str, bytes, int or float, got NoneType"),
        (lambda p: p.hset("h", ["f"], "v"), "field must be str, bytes, int or float, got list"),
        (lambda p: p.eval(b"body"), "body must be a str of Lua, got bytes"),
        (lambda p: p.eval(APPEND, "log"), "keys must be a sequence of str/bytes, got str"),
        (lambda p: p.eval(APPEND, ["log"], [object()]), "each arg must be str, bytes"),
    ],
)
def test_a_bad_argument_raises_when_added_and_nothing_is_sent(
    client: redis.Redis, engine: str, add: Any, error: str
) -> None:
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(1).set("good", "v")
    before = commands_processed(client)
    with pytest.raises(TypeError, match=error.replace("(", r"\(")):
        add(pipe)
    assert commands_processed(client) == before
    assert len(pipe) == 1, "the bad write was not queued"
    assert pipe.execute() == [True]


@pytest.mark.parametrize("token", ["5", 5.0, True, None])
def test_a_non_int_token_is_a_type_error(client: redis.Redis, engine: str, token: Any) -> None:
    e = make_elector(client, engine)
    with pytest.raises(TypeError, match="fencing token must be an int"):
        e.fence_pipeline(token)


# -- an unresponsive server ---------------------------------------------------------


def test_a_server_paused_mid_pipeline_raises_timeout_bounded_by_socket_timeout(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client(socket_timeout=SOCKET_TIMEOUT)
    e = redlease.Elector(client, NAME, engine=engine)
    assert e.fence_pipeline(1).eval(APPEND, ["log"], ["warm"]).execute() == [True]
    pipe = e.fence_pipeline(1)
    for i in range(200):
        pipe.eval(APPEND, ["log"], [i])
    redis_server.pause()
    thaw = threading.Timer(FROZEN_FOR, redis_server.resume)
    thaw.start()
    try:
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            pipe.execute()
        took = time.monotonic() - started
        assert took < FROZEN_FOR, f"bounded by socket_timeout, not the thaw ({took:.2f}s)"
    finally:
        thaw.join()
    observer = redis_server.client()
    # The frozen batch ran once when the server woke, and was never sent again.
    wait_until(lambda: observer.llen("log") == 201, timeout=10, what="the frozen batch")
    time.sleep(3 * SOCKET_TIMEOUT)
    assert observer.lrange("log", 0, -1) == [b"warm"] + [str(i).encode() for i in range(200)]
    assert e.fence_pipeline(1).set("next", "works").execute() == [True], "the next call works"


# -- asyncio --------------------------------------------------------------------------



def test_aio_pipeline_applies_every_write_in_order(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> list[bool]:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            pipe = e.fence_pipeline(4)
            assert isinstance(pipe, redlease.aio.FencedPipeline)
            pipe.set("k", "a").hset("h", "f", "b").eval(APPEND, ["log"], ["c"])
            return await pipe.execute()

    assert asyncio.run(scenario()) == [True, True, True]
    assert client.get("k") == b"a"
    assert client.hget("h", "f") == b"b"
    assert client.lrange("log", 0, -1) == [b"c"]
    assert client.get(APPLIED_KEY) == b"4"


def test_aio_pipeline_with_a_mark_raised_mid_pipeline_rejects_the_rest(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    async def scenario() -> list[bool]:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            fencer = redlease.aio.Fencer(e, 5)
            pipe = fencer.pipeline().set("a", "1").eval(NEWER_TERM_WRITES, args=[6])
            return await pipe.set("b", "2").execute()

    assert asyncio.run(scenario()) == [True, False, False]
    assert client.get("a") == b"1"
    assert client.exists("b") == 0


def test_aio_pipeline_error_reply_raises_after_every_reply_was_read(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    client.set("text", "x")

    async def scenario() -> None:
        async with aio_client(redis_server) as aclient:
            e = redlease.aio.Elector(aclient, NAME, engine=engine)
            pipe = e.fence_pipeline(2).eval(INCR, ["text"]).set("after", "1")
            with pytest.raises(redis.exceptions.ResponseError):
                await pipe.execute()
            assert await e.fence_pipeline(2).execute() == []
            assert await e.fence_pipeline(2).set("next", "2").execute() == [True]

    asyncio.run(scenario())
    assert client.get("after") == b"1"
    assert client.get("next") == b"2"


# -- every deployment: Sentinel, Cluster, TLS --------------------------------------


def lead_and_pipeline(e: redlease.Elector, key: str) -> int:
    with e:
        token = elected_token(e)
        pipe = e.fence_pipeline(token).set(key, "v1").hset(key + ":h", "f", "v2")
        assert pipe.eval(APPEND, [key + ":log"], ["v3"]).execute() == [True, True, True]
        assert e.fence_pipeline(token - 1).set(key, "stale").execute() == [False]
    return token


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_on_a_sentinel_master(sentinel_set: SentinelSet, engine: str) -> None:
    client = sentinel_set.master_for(socket_timeout=2)
    e = redlease.Elector(client, f"pipe-{engine}", ttl=0.5, engine=engine)
    assert e.engine == engine
    token = lead_and_pipeline(e, f"pipe-{engine}:state")
    assert client.get(f"pipe-{engine}:state") == b"v1"
    assert client.hget(f"pipe-{engine}:state:h", "f") == b"v2"
    assert int(client.get(f"pipe-{engine}:fence:applied")) == token


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_on_a_cluster(cluster_set: ClusterSet, engine: str) -> None:
    client = cluster_set.client(socket_timeout=2)
    name = "{pipe-" + engine + "}"
    e = redlease.Elector(client, name, ttl=0.5, engine=engine)
    assert e.engine == engine
    token = lead_and_pipeline(e, f"{name}:state")
    assert client.get(f"{name}:state") == b"v1"
    assert client.lrange(f"{name}:state:log", 0, -1) == [b"v3"]
    assert int(client.get(f"{name}:fence:applied")) == token
    client.close()


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_on_a_cluster_refuses_a_key_outside_the_names_slot_before_sending(
    cluster_set: ClusterSet, engine: str
) -> None:
    client = cluster_set.client(socket_timeout=2)
    e = redlease.Elector(client, "{pipe-slot}", ttl=0.5, engine=engine)
    pipe = e.fence_pipeline(1).set("{pipe-slot}:ok", "v")
    with pytest.raises(redis.exceptions.ResponseError, match=r"CROSSSLOT.*other-key"):
        pipe.set("other-key", "v")
    assert pipe.execute() == [True]
    assert client.get("{pipe-slot}:ok") == b"v"
    assert client.get("other-key") is None
    client.close()


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_over_tls(tls_server: RedisServer, engine: str) -> None:
    if engine == "native":
        require_native_tls()
    client = tls_server.client(socket_timeout=2)
    e = redlease.Elector(client, NAME, engine=engine)
    assert e.engine == engine
    assert e.fence_pipeline(2).set("k", "a").hset("h", "f", "b").execute() == [True, True]
    assert client.get("k") == b"a"
    assert client.get(APPLIED_KEY) == b"2"
    client.close()


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_follows_a_migration_of_the_names_slot(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    topology = cluster_set_fresh
    name = "{pipe-mig}"
    slot = redlease_key_slot(name)
    client = topology.client(socket_timeout=2)
    e = redlease.Elector(client, name, ttl=0.5, engine=engine)
    # Connections open on the slot's owner, scripts loaded there.
    assert e.fence_pipeline(3).set(f"{name}:a", "1").set(f"{name}:b", "1").execute() == [
        True,
        True,
    ]
    owner = topology.master_for_slot(slot)
    target = next(m for m in topology.masters() if m is not owner)
    assert topology.migrate_slot(slot, target) >= 3
    moved_before = moved_replies(owner)
    # The old owner answers MOVED to every write, none of which ran: the batch
    # goes to the new owner, where every write runs once.
    pipe = e.fence_pipeline(3).set(f"{name}:a", "2").eval(APPEND, [f"{name}:log"], ["x"])
    assert pipe.set(f"{name}:b", "2").execute() == [True, True, True]
    on_target = target.client()
    assert on_target.mget(f"{name}:a", f"{name}:b") == [b"2", b"2"]
    assert on_target.lrange(f"{name}:log", 0, -1) == [b"x"]
    assert moved_replies(owner) - moved_before == 3, "the batch went to the old owner first"
    client.close()


def moved_replies(node: RedisServer) -> int:
    stat = node.client().info("errorstats").get("errorstat_MOVED", {})
    if isinstance(stat, str):  # redis-py 5.0 leaves "count=N" unparsed
        stat = dict(part.split("=", 1) for part in stat.split(","))
    return int(stat.get("count", 0))


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_lands_on_the_new_master_after_a_sentinel_failover(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    topology = sentinel_set_fresh
    client = topology.master_for(socket_timeout=1, socket_connect_timeout=1)
    e = redlease.Elector(client, "pipe-fo", ttl=1.0, engine=engine)
    with e:
        token = elected_token(e)
        pipe = e.fence_pipeline(token).eval(APPEND, ["pipe-fo:log"], ["before"])
        assert pipe.execute() == [True]
        assert topology.master().client().wait(1, 2000) >= 1
        on_new = topology.node_at(topology.failover()).client()
        sent: list[str] = []

        def attempt() -> bool:
            # Until the old master is demoted a batch may still land there (and
            # be lost with it): Sentinel's own window, the same for single writes.
            current = e.token()
            if current is None:
                return False
            value = f"after-{len(sent)}"
            sent.append(value)
            try:
                pipe = e.fence_pipeline(current).eval(APPEND, ["pipe-fo:log"], [value])
                applied = pipe.set("pipe-fo:state", value).execute()
            except (redis.exceptions.ConnectionError, redis.exceptions.ResponseError):
                return False
            assert applied == [True, True]
            return bool(on_new.get("pipe-fo:state") == value.encode())

        wait_until(attempt, timeout=10, what="a pipeline on the new master")
    log = on_new.lrange("pipe-fo:log", 0, -1)
    assert log[0] == b"before" and log[-1] == sent[-1].encode()
    assert len(log) == len(set(log)), f"no batch ran twice: {log}"


def get_asking(node: RedisServer, key: str) -> Any:
    """GET on a node importing the key's slot (ASKING first, on the same connection)."""
    pipe = node.client().pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.get(key)
    return pipe.execute()[1]


@pytest.mark.usefixtures("engines_closed")
def test_pipeline_mid_migration_goes_to_the_importing_node_with_asking(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    topology = cluster_set_fresh
    name = "{pipe-ask}"
    slot = redlease_key_slot(name)
    client = topology.client(socket_timeout=2)
    e = redlease.Elector(client, name, ttl=0.5, engine=engine)
    # The writes' keys exist before the move: a write needs all its keys on one side.
    pipe = e.fence_pipeline(3).set(f"{name}:a", "1").eval(APPEND, [f"{name}:log"], ["0"])
    assert pipe.execute() == [True, True]
    owner = topology.master_for_slot(slot)
    target = next(m for m in topology.masters() if m is not owner)
    migration = topology.begin_migration(slot, target)
    try:
        assert migration.move_keys() >= 3
        # The owner answers ASK to every write, none of which ran: each goes
        # to the importing node after its own ASKING, once.
        pipe = e.fence_pipeline(3).set(f"{name}:a", "2").eval(APPEND, [f"{name}:log"], ["1"])
        assert pipe.execute() == [True, True]
        assert get_asking(target, f"{name}:a") == b"2"
        assert get_asking(target, f"{name}:fence:applied") == b"3"
    finally:
        migration.finish()
    assert target.client().lrange(f"{name}:log", 0, -1) == [b"0", b"1"]
    client.close()
