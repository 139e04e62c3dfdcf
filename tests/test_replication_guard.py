"""The replication guard (``min_replicas``) and failover replies ending a term at once.

A master with one replica, both real servers; freezing the replica (SIGSTOP)
is what "replication held back" looks like to ``WAIT``.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from helpers import (
    APPLIED_KEY,
    LEADER_KEY,
    LOOPBACK,
    ClosedPort,
    Events,
    Terms,
    make_elector,
    wait_until,
)
from redlease._engine import is_failover_reply
from redlease._testing import RedisServer
from redlease._testing._common import client_module


class Replicated:
    """A master and one replica streaming from it."""

    def __init__(self, master: RedisServer, replica: RedisServer) -> None:
        self.master = master
        self.replica = replica
        self.client = master.client(socket_timeout=5, socket_connect_timeout=5)

    def in_sync(self) -> bool:
        # "online" alone is not enough: after a diskless sync (Redis 7's
        # default) the master streams nothing to the replica until its first
        # acknowledgement, up to a second later, and a WAIT until then times
        # out. A write on this connection that the replica acknowledges is.
        info = self.client.info("replication")
        if not (info.get("connected_slaves") == 1 and info["slave0"]["state"] == "online"):
            return False
        self.client.publish("replication-probe", "")  # replicated, and touches no key
        return bool(self.client.wait(1, 100) == 1)


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    # No diskless-sync delay (5 s by default on Redis 7): the replica syncs at once.
    with (
        RedisServer(args=["--repl-diskless-sync-delay", "0"]) as master,
        RedisServer(args=["--replicaof", LOOPBACK, str(master.port)]) as replica,
    ):
        pair = Replicated(master, replica)
        try:
            wait_until(pair.in_sync, 10.0, what="the replica to sync")
            yield pair
        finally:
            if replica.paused:
                replica.resume()
            pair.client.close()


def not_replicated(events: Events) -> list[redlease.NotReplicated]:
    return [e for e in events.values("error") if isinstance(e, redlease.NotReplicated)]


# -- acquire -------------------------------------------------------------------------


def test_acquire_confirmed_by_the_replica_starts_a_term(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1)
    with e:
        wait_until(e.token, 5.0, what="election")
    assert e.config.min_replicas == 1


def test_acquire_unconfirmed_starts_no_term_reports_not_replicated_and_releases_the_lease(
    replicated: Replicated, engine: str
) -> None:
    events = Events()
    reported = []

    def on_error(exc: Exception) -> None:
        if isinstance(exc, redlease.NotReplicated):
            # Right after the report the run backs off: nothing re-acquires yet.
            reported.append(replicated.client.exists(LEADER_KEY))
        events.record("error", exc)

    e = make_elector(
        replicated.client,
        engine,
        ttl=2.0,
        min_replicas=1,
        replica_timeout=0.05,
        observer=events.observer(on_error=on_error),
    )
    replicated.replica.pause()
    with e:
        errors = wait_until(lambda: not_replicated(events), 5.0, what="NotReplicated")
        assert errors[0].applied is True
        assert errors[0].replicas == 0
        assert reported[0] == 0, "the unconfirmed lease was left held"
        assert e.token() is None
        assert events.count("elected") == 0
        replicated.replica.resume()
        elected = wait_until(
            lambda: events.values("elected"), 10.0, what="election once the replica is back"
        )
        assert elected == [e.token()]


def test_lock_acquire_unconfirmed_raises_not_replicated_and_leaves_the_lock_free(
    replicated: Replicated, engine: str
) -> None:
    locker = redlease.RedisLocker(
        replicated.client, engine=engine, min_replicas=1, replica_timeout=0.05
    )
    try:
        replicated.replica.pause()
        with pytest.raises(redlease.NotReplicated) as caught:
            locker.try_acquire("job", ttl=5.0)
        assert caught.value.applied is True
        assert caught.value.replicas == 0
        assert replicated.client.exists(locker.key("job")) == 0
        replicated.replica.resume()
        wait_until(replicated.in_sync, 10.0, what="the replica to catch up")
        held = locker.acquire("job", ttl=5.0, wait=5.0)
        assert held.fencing_token >= 1
        held.release()
    finally:
        locker.close()


def test_lock_acquire_confirmed_by_the_replica_returns_the_lock(
    replicated: Replicated, engine: str
) -> None:
    locker = redlease.RedisLocker(replicated.client, engine=engine, min_replicas=1)
    with locker, locker.hold("job", ttl=5.0) as held:
        assert held.fencing_token >= 1
        assert locker.min_replicas == 1


# -- fenced writes -------------------------------------------------------------------


def test_fenced_write_confirmed_by_the_replica_returns_applied(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1)
    assert e.fence_set(1, "k", "v") is True
    assert e.fence_set(0, "k", "never") is False
    assert replicated.replica.client().get("k") == b"v"


def test_fenced_write_unconfirmed_raises_not_replicated_with_applied_true(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1, replica_timeout=0.05)
    replicated.replica.pause()
    with pytest.raises(redlease.NotReplicated) as caught:
        e.fence_set(3, "k", "v")
    assert caught.value.applied is True
    assert caught.value.replicas == 0
    # Applied on the master all the same: WAIT confirms, it does not undo.
    assert replicated.client.get("k") == b"v"
    assert replicated.client.get(APPLIED_KEY) == b"3"


def test_rejected_fenced_write_with_the_replica_frozen_is_just_rejected(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1, replica_timeout=0.05)
    assert e.fence_set(5, "k", "v") is True
    replicated.replica.pause()
    assert e.fence_set(4, "k", "stale") is False
    assert replicated.client.get("k") == b"v"


def test_leader_fenced_write_unconfirmed_raises_and_the_term_goes_on(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1, replica_timeout=0.05)
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        replicated.replica.pause()
        with pytest.raises(redlease.NotReplicated) as caught:
            terms.fencers[0].set("k", "v")
        assert caught.value.applied is True
        assert not term.ended()


def test_fenced_pipeline_confirmed_by_the_replica_returns_every_result(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1)
    assert e.fence_pipeline(2).set("a", "1").hset("h", "f", "v").execute() == [True, True]
    assert e.fence_pipeline(1).set("a", "stale").execute() == [False]


def test_fenced_pipeline_unconfirmed_raises_not_replicated_after_one_wait(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1, replica_timeout=0.05)
    replicated.replica.pause()
    with pytest.raises(redlease.NotReplicated) as caught:
        e.fence_pipeline(4).set("a", "1").set("b", "2").execute()
    assert caught.value.applied is True
    assert caught.value.replicas == 0
    assert replicated.client.mget("a", "b") == [b"1", b"2"]


def test_fenced_set_many_confirmed_or_not_is_one_wait_after_the_batch(
    replicated: Replicated, engine: str
) -> None:
    e = make_elector(replicated.client, engine, min_replicas=1, replica_timeout=0.05)
    pipe = e.fence_pipeline(2).set_many({"a": "1", "b": "2"}).hset_many("h", {"f": "v"})
    assert pipe.execute() == [True, True, True]
    replicated.replica.pause()
    with pytest.raises(redlease.NotReplicated) as caught:
        e.fence_pipeline(3).set_many([("a", "3"), ("b", "4")]).execute()
    assert caught.value.applied is True
    assert replicated.client.mget("a", "b") == [b"3", b"4"]


def test_aio_fenced_write_unconfirmed_raises_not_replicated(
    replicated: Replicated, engine: str
) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(host=LOOPBACK, port=replicated.master.port)
        try:
            e = redlease.aio.Elector(
                client, "svc", ttl=1.0, engine=engine, min_replicas=1, replica_timeout=0.05
            )
            assert await e.fence_set(1, "k", "v") is True
            replicated.replica.pause()
            with pytest.raises(redlease.NotReplicated):
                await e.fence_set(1, "k", "w")
        finally:
            await client.aclose()

    asyncio.run(main())


# -- failover replies end the term at once ------------------------------------------


def lead(client: redis.Redis, engine: str, **kwargs: Any) -> tuple[Any, Terms, Events]:
    events = Events()
    terms = Terms()
    e = make_elector(client, engine, observer=events.observer(), **kwargs)
    e.start(terms)
    terms.wait_for(1)
    return e, terms, events


def test_readonly_on_renew_ends_the_term_within_one_renew_interval(
    client: redis.Redis, engine: str, closed_port: ClosedPort
) -> None:
    # TTL 6 s: the deadline alone would end the term only ~5 s from now.
    e, terms, events = lead(client, engine, ttl=6.0, renew_interval=0.5)
    try:
        term = terms.terms[0]
        started = time.monotonic()
        client.execute_command("REPLICAOF", LOOPBACK, str(closed_port.port))
        assert term.wait(0.5 + 1.0), "the term outlived READONLY renewals"
        assert time.monotonic() - started < 1.5
        assert term.reason == "lost"
        assert e.token() is None
        assert any(is_failover_reply(x) for x in events.values("error"))
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")
        e.stop()


def test_noreplicas_on_renew_ends_the_term_at_once(client: redis.Redis, engine: str) -> None:
    e, terms, _ = lead(client, engine, ttl=6.0, renew_interval=0.5)
    try:
        term = terms.terms[0]
        client.config_set("min-replicas-to-write", 1)
        assert term.wait(1.5), "the term outlived NOREPLICAS renewals"
        assert term.reason == "lost"
    finally:
        client.config_set("min-replicas-to-write", 0)
        e.stop()


READONLY_WRITES: dict[str, Callable[[Any], object]] = {
    "a fenced write": lambda fencer: fencer.set("k", "v"),
    "a fenced pipeline": lambda fencer: fencer.pipeline().set("k1", "v").set("k2", "v").execute(),
    "a set_many": lambda fencer: fencer.pipeline().set_many({"k1": "v", "k2": "v"}).execute(),
}


@pytest.mark.parametrize("write", sorted(READONLY_WRITES))
def test_readonly_on_a_fenced_write_ends_the_term_before_the_next_renewal(
    client: redis.Redis, engine: str, closed_port: ClosedPort, write: str
) -> None:
    # The next renewal is 3 s away: only the write can have ended the term.
    e, terms, _ = lead(client, engine, ttl=9.0, renew_interval=3.0)
    try:
        term = terms.terms[0]
        time.sleep(0.1)  # past the first renewal, sent at once on election
        client.execute_command("REPLICAOF", LOOPBACK, str(closed_port.port))
        with pytest.raises(redis.exceptions.ResponseError):
            READONLY_WRITES[write](terms.fencers[0])
        assert term.wait(1.0), f"the term outlived a READONLY answer to {write}"
        assert term.reason == "lost"
    finally:
        client.execute_command("REPLICAOF", "NO", "ONE")
        e.stop()


@pytest.mark.parametrize("via", ["Fencer.set", "Elector.fence_set"])
def test_readonly_on_an_asyncio_fenced_write_ends_the_term_before_the_next_renewal(
    redis_server: RedisServer,
    client: redis.Redis,
    family: str,
    engine: str,
    closed_port: ClosedPort,
    via: str,
) -> None:
    # A write after the first on its loop takes the common path (the loop's
    # writer awaited with no coroutine of the fence's between): its error
    # must still be the client's family's and still end the term at once.
    async def main() -> None:
        aclient = redis_server.client(family=family, asyncio=True, socket_timeout=5)
        e = redlease.aio.Elector(aclient, "svc-aio", ttl=9.0, renew_interval=3.0, engine=engine)
        e.start()
        try:
            token = await until_async(e.token)
            fencer = redlease.aio.Fencer(e, token)
            write = fencer.set if via == "Fencer.set" else functools.partial(e.fence_set, token)
            assert await write("k", "v1") is True
            assert await write("k", "v2") is True
            client.execute_command("REPLICAOF", LOOPBACK, str(closed_port.port))
            with pytest.raises(client_module(family).exceptions.ReadOnlyError):
                await write("k", "v3")
            assert await until_async(lambda: e.token() is None, 1.0), (
                f"the term outlived a READONLY answer to {via}"
            )
        finally:
            client.execute_command("REPLICAOF", "NO", "ONE")
            await e.stop()
            await aclient.aclose()

    asyncio.run(main())


async def until_async(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    """``predicate()`` once it is truthy, polled on the running loop; fails after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        await asyncio.sleep(0.01)
    return value


def test_lock_refresh_answered_readonly_loses_the_lock_at_once(
    client: redis.Redis, engine: str, closed_port: ClosedPort
) -> None:
    with redlease.RedisLocker(client, engine=engine) as locker:
        held = locker.acquire("job", ttl=6.0, auto_renew=True)
        try:
            client.execute_command("REPLICAOF", LOOPBACK, str(closed_port.port))
            assert held.done.wait(3.0), "the lock outlived READONLY refreshes"
        finally:
            client.execute_command("REPLICAOF", "NO", "ONE")


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
        redis.exceptions.MasterDownError("Link with MASTER is down"),
        redis.exceptions.ResponseError("NOREPLICAS Not enough good replicas to write."),
        redis.exceptions.ResponseError(
            "Error running script (call to f_0): @user_script:1: @user_script: 1: "
            "-READONLY You can't write against a read only replica."
        ),
        redis.exceptions.ResponseError(
            "NOREPLICAS Not enough good replicas to write. script: 0, on @user_script:1."
        ),
        redis.exceptions.ConnectionError("The previous master is now a slave"),
    ],
    ids=["readonly", "masterdown", "noreplicas", "script-redis6", "script-redis7", "sentinel"],
)
def test_failover_replies_are_recognised_in_every_shape_redis_gives_them(
    exc: Exception,
) -> None:
    assert is_failover_reply(exc)


@pytest.mark.parametrize(
    "exc",
    [
        redis.exceptions.ResponseError("ERR wrong number of arguments"),
        redis.exceptions.ConnectionError("Connection refused"),
        redis.exceptions.ResponseError("WRONGTYPE the body said READONLY"),
    ],
)
def test_other_errors_are_not_failover_replies(exc: Exception) -> None:
    assert not is_failover_reply(exc)


# -- settings ------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, 1.0, "1", True, None])
def test_min_replicas_that_is_negative_or_not_an_int_is_a_config_error(
    client: redis.Redis, bad: object
) -> None:
    with pytest.raises(redlease.ConfigError, match="min_replicas") as caught:
        redlease.Elector(client, "svc", min_replicas=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(caught.value)
    with pytest.raises(redlease.ConfigError, match="min_replicas"):
        redlease.RedisLocker(client, min_replicas=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -0.1, float("nan"), False])
def test_replica_timeout_that_is_not_positive_is_a_config_error(
    client: redis.Redis, bad: object
) -> None:
    with pytest.raises(redlease.ConfigError, match="replica_timeout"):
        redlease.Elector(client, "svc", min_replicas=1, replica_timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(redlease.ConfigError, match="replica_timeout"):
        redlease.RedisLocker(client, min_replicas=1, replica_timeout=bad)  # type: ignore[arg-type]


def test_replica_timeout_as_long_as_the_ttl_is_a_config_error(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match="replica_timeout must be less than ttl"):
        redlease.Elector(client, "svc", ttl=1.0, min_replicas=1, replica_timeout=1.0)


def test_aio_twins_validate_the_guard_too(client: redis.Redis) -> None:
    port = client.connection_pool.connection_kwargs["port"]
    aclient = redis.asyncio.Redis(host=LOOPBACK, port=port)
    with pytest.raises(redlease.ConfigError, match="min_replicas"):
        redlease.aio.Elector(aclient, "svc", min_replicas=-1)
    with pytest.raises(redlease.ConfigError, match="replica_timeout"):
        redlease.aio.RedisLocker(aclient, min_replicas=1, replica_timeout=0)


def test_guard_settings_show_in_the_config(client: redis.Redis) -> None:
    e = redlease.Elector(client, "svc", min_replicas=2, replica_timeout=0.25)
    assert (e.config.min_replicas, e.config.replica_timeout) == (2, 0.25)
    plain = redlease.Elector(client, "svc")
    assert (plain.config.min_replicas, plain.config.replica_timeout) == (0, 0.1)
