"""Batched renewals: many leases of one server renewed together, each with its own outcome.

Leases falling due together on one server (an elector's, a lock's) may be
renewed in one script call (``lua/renew_many.lua``) instead of one call each.
Whatever the batching, each lease must end as its own renewal would have
ended it: renewed while its key holds its owner, lost when the key is gone or
another owner's, an error of its own when the key is of the wrong type, the
term ended at once by a failover reply, and the scripts loaded again after a
``SCRIPT FLUSH``. On a Cluster, leases on every master keep leading, and one
whose slot migrated is followed to its new master. Every test runs on both
engines (``engine``); the ones on one server with both client families too.
The last few drive the Python engine's batch with replies only a broken server
sends: each lease gets its own element, or the whole call's error, or an
``UnexpectedReply`` when the call's reply is not one per lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

import redlease
from helpers import Events, script_calls, wait_until
from redlease import _scripts
from redlease._engine.conn.pyconn import BoundedConnection
from redlease._engine.rules.replies import UnexpectedReply, classify, is_failover_reply
from redlease._engine.rules.replytable import ERROR
from redlease._testing import ClusterSet, RedisServer, key_slot
from redlease._testing.fake import FakeRedis, array, client_of
from redlease.lock import RedisLocker
from topology_helpers import leads_on

pytestmark = pytest.mark.usefixtures("engines_closed")

TTL = 1.0
"""Every lease's TTL: the same for all, so their renewals (every TTL/3) fall due together."""

ROUNDS = 3
"""Renewals each lease must send after a fault before the others are judged unaffected."""

WAIT = 20.0
"""A generous bound on anything a test waits for (renewals come every TTL/3)."""


@dataclass
class Leader:
    """One started elector and what its observer saw."""

    elector: redlease.Elector
    events: Events
    first_token: int = 0

    @property
    def key(self) -> str:
        return f"{self.elector.config.name}:leader"

    def unaffected(self) -> bool:
        return self.elector.token() == self.first_token and self.events.count("stepped_down") == 0

    def report(self) -> str:
        errors = [f"{type(e).__name__}: {e}" for e in self.events.values("error")]
        return (
            f"{self.elector.config.name}: token {self.elector.token()} (first {self.first_token}), "
            f"events {self.events.kinds()}, errors {errors[:4]}"
        )


def _leaders(client: Any, names: list[str], engine: str, ttl: float = TTL) -> list[Leader]:
    """A started, leading elector per name."""
    group = []
    for name in names:
        events = Events()
        elector = redlease.Elector(client, name, ttl=ttl, engine=engine, observer=events.observer())
        group.append(Leader(elector, events))
    for leader in group:
        leader.elector.start(None)
    for leader in group:
        leader.first_token = wait_until(leader.elector.token, WAIT, what="an election")
    return group


def _stop(group: list[Leader]) -> None:
    for leader in group:
        leader.elector.stop(timeout=5)


@pytest.fixture
def stopped() -> Iterator[list[Leader]]:
    """A list the test puts its leaders in: each is stopped after the test."""
    group: list[Leader] = []
    yield group
    _stop(group)


def _renew_rounds(group: list[Leader], rounds: int = ROUNDS) -> None:
    """Wait until every elector of ``group`` has sent ``rounds`` more renewals."""
    start = [leader.elector.renew_lateness_count() for leader in group]

    def renewed() -> bool:
        return all(
            leader.elector.renew_lateness_count() >= before + rounds
            for leader, before in zip(group, start, strict=True)
        )

    wait_until(renewed, WAIT, interval=0.02, what=f"{rounds} more renewals of every lease")


def _assert_unaffected(group: list[Leader]) -> None:
    bad = [leader.report() for leader in group if not leader.unaffected()]
    assert not bad, bad


# -- one server -----------------------------------------------------------------------------


def test_many_electors_due_together_all_keep_leading(
    client: redis.Redis, engine: str, stopped: list[Leader]
) -> None:
    stopped += _leaders(client, [f"many{i}" for i in range(50)], engine)
    _renew_rounds(stopped)
    _assert_unaffected(stopped)
    for leader in stopped:
        assert client.get(leader.key) == leader.elector.instance_id.encode()
        assert client.pttl(leader.key) > 0


def test_leases_due_together_are_renewed_in_fewer_script_calls_than_leases(
    redis_server: RedisServer, engine: str, stopped: list[Leader]
) -> None:
    client = redis_server.client()
    stopped += _leaders(client, [f"fewer{i}" for i in range(50)], engine)
    renewals = sum(leader.elector.renew_lateness_count() for leader in stopped)
    calls = script_calls(client, "evalsha") + script_calls(client, "eval")
    _renew_rounds(stopped)
    renewals = sum(leader.elector.renew_lateness_count() for leader in stopped) - renewals
    calls = script_calls(client, "evalsha") + script_calls(client, "eval") - calls
    _assert_unaffected(stopped)
    assert renewals >= 50 * ROUNDS
    assert calls * 2 < renewals, f"{calls} script calls for {renewals} renewals"


def test_in_a_batch_each_lease_keeps_its_own_outcome(
    client: redis.Redis, engine: str, stopped: list[Leader]
) -> None:
    """A deleted key, a key another owner took and a key of the wrong type, among leases
    that stay ours: each of the three ends as its own renewal would, the others go on."""
    stopped += _leaders(client, [f"mixed{i}" for i in range(12)], engine)
    deleted, taken, wrong_type = stopped[2], stopped[5], stopped[8]
    others = [leader for leader in stopped if leader not in (deleted, taken, wrong_type)]
    client.delete(deleted.key)
    client.set(taken.key, "someone-else")
    client.delete(wrong_type.key)
    client.rpush(wrong_type.key, "not a lease")

    wait_until(lambda: deleted.events.count("stepped_down") >= 1, WAIT, what="deleted: lost")
    wait_until(lambda: taken.events.count("stepped_down") >= 1, WAIT, what="taken: lost")

    def wrong_type_reported() -> bool:
        return any("WRONGTYPE" in str(e) for e in wrong_type.events.values("error"))

    wait_until(wrong_type_reported, WAIT, what="the wrong-type lease's own error")
    _renew_rounds(others)
    _assert_unaffected(others)
    # The lease another owner took is theirs still: a lost renewal writes nothing.
    assert client.get(taken.key) == b"someone-else"
    assert taken.elector.token() is None
    # The lease whose key was deleted was free again: a new term, a greater token.
    assert wait_until(deleted.elector.token, WAIT, what="a new term") > deleted.first_token
    for leader in others:
        assert client.get(leader.key) == leader.elector.instance_id.encode()


def test_locks_are_renewed_beside_electors(
    client: redis.Redis, engine: str, stopped: list[Leader]
) -> None:
    locker = RedisLocker(client, engine=engine)
    try:
        locks = [locker.acquire(f"batched{i}", ttl=TTL, auto_renew=True) for i in range(10)]
        stopped += _leaders(client, [f"beside{i}" for i in range(10)], engine)
        lost_lock = locks[4]
        client.delete(f"{redlease.lock.DEFAULT_PREFIX}key:batched4")
        assert lost_lock.done.wait(WAIT), "the lock whose key was deleted is found lost"
        # Several TTLs: only renewals keep the others.
        _renew_rounds(stopped, rounds=3 * ROUNDS)
        _assert_unaffected(stopped)
        for lock in locks:
            if lock is lost_lock:
                continue
            assert not lock.done.is_set(), lock.name
            lock.release()  # raises NotHeld had its lease lapsed
        with pytest.raises(redlease.lock.NotHeld):
            lost_lock.release()
    finally:
        locker.close()


def test_script_flush_then_every_lease_keeps_renewing(
    client: redis.Redis, engine: str, stopped: list[Leader]
) -> None:
    locker = RedisLocker(client, engine=engine)
    try:
        locks = [locker.acquire(f"flushed{i}", ttl=TTL, auto_renew=True) for i in range(5)]
        stopped += _leaders(client, [f"flush{i}" for i in range(20)], engine)
        client.script_flush()
        _renew_rounds(stopped, rounds=2 * ROUNDS)
        _assert_unaffected(stopped)
        for lock in locks:
            assert not lock.done.is_set(), lock.name
            lock.release()
    finally:
        locker.close()


def _wait_replicating(replica: redis.Redis) -> None:
    def linked() -> bool:
        info = replica.info("replication")
        return info.get("role") == "slave" and info.get("master_link_status") == "up"

    wait_until(linked, WAIT, interval=0.02, what="the replica in sync")


def test_a_failover_reply_ends_every_term_of_the_batch(
    redis_server: RedisServer, engine: str, family: str, stopped: list[Leader]
) -> None:
    """The server the leases live on becomes a replica holding them: their renewals are
    refused (READONLY), and every term ends."""
    client = redis_server.client(family=family, socket_timeout=5, socket_connect_timeout=5)
    # A long TTL: the leases outlive the switch; only the refusal ends them.
    stopped += _leaders(client, [f"demoted{i}" for i in range(8)], engine, ttl=5.0)
    with RedisServer() as other:
        promoted = other.client()
        promoted.replicaof("127.0.0.1", redis_server.port)
        _wait_replicating(promoted)
        wait_until(lambda: all(promoted.exists(leader.key) for leader in stopped), WAIT)
        promoted.replicaof("NO", "ONE")
        demoted = redis_server.client()
        demoted.replicaof("127.0.0.1", other.port)
        _wait_replicating(demoted)

        def all_ended() -> bool:
            return all(leader.events.count("stepped_down") >= 1 for leader in stopped)

        wait_until(all_ended, WAIT, interval=0.02, what="every term ended")
        for leader in stopped:
            assert any(
                "READONLY" in str(e) or "read only" in str(e).lower()
                for e in (leader.events.values("error"))
            ), leader.report()
            assert leader.elector.token() is None
            # The lease itself was never renewed away from the master that holds it.
            assert promoted.get(leader.key) == leader.elector.instance_id.encode()
        for leader in stopped:
            leader.elector.stop(timeout=5)
        stopped.clear()


# -- Cluster --------------------------------------------------------------------------------


def test_cluster_leases_on_every_master_keep_leading(
    cluster_set: ClusterSet, engine: str, family: str, stopped: list[Leader]
) -> None:
    client = cluster_set.client(family=family, socket_timeout=2)
    try:
        names = [f"{{spread{i}}}-{family}" for i in range(30)]
        owners = {cluster_set.node_for_key(f"{name}:leader").port for name in names}
        assert len(owners) == len(cluster_set.masters()), "the names do not reach every master"
        stopped += _leaders(client, names, engine)
        _renew_rounds(stopped)
        _assert_unaffected(stopped)
        for leader in stopped:
            assert leads_on(cluster_set.node_for_key(leader.key), leader.elector)
    finally:
        _stop(stopped)
        stopped.clear()
        client.close()


def test_cluster_a_lease_whose_slot_migrated_is_followed_the_others_unaffected(
    cluster_set_fresh: ClusterSet, engine: str, stopped: list[Leader]
) -> None:
    cluster = cluster_set_fresh
    client = cluster.client(socket_timeout=2)
    try:
        names = [f"{{moving{i}}}" for i in range(15)]
        stopped += _leaders(client, names, engine)
        moving = stopped[3]
        slot = key_slot(moving.key)
        source = cluster.master_for_slot(slot)
        target = next(m for m in cluster.masters() if m is not source)
        others = [
            leader for leader in stopped if leader is not moving and key_slot(leader.key) != slot
        ]
        assert cluster.migrate_slot(slot, target) >= 2  # its lease and fence at least
        wait_until(lambda: leads_on(target, moving.elector), WAIT, what="the moved lease leads")
        _renew_rounds(stopped)
        _assert_unaffected(others)
        assert moving.unaffected(), moving.report()
        assert leads_on(target, moving.elector) == moving.first_token
        for leader in others:
            assert leads_on(cluster.node_for_key(leader.key), leader.elector)
    finally:
        _stop(stopped)
        stopped.clear()
        client.close()


# -- the Python engine's batch: each lease's reply out of one call's -----------------------
#
# A real server gives renew_many only the replies it can give; a fake one gives any. These
# drive the Python engine's batch itself (``renewal.batch.send``) with the replies a broken
# server might send.


def _renewals(n: int) -> list[Any]:
    from redlease._engine.renewal.batch import renewal

    return [renewal((_scripts.load("renew"), (f"k{i}:leader",), (b"me", 1000))) for i in range(n)]


def _send_through(fake: FakeRedis, reply: bytes, n: int) -> tuple[list[Any], BoundedConnection]:
    from redlease._engine.renewal.batch import send

    fake.script("renew_many", reply)
    with client_of(fake, 5.0) as client:
        conn = BoundedConnection(client)
        try:
            return send(conn, _renewals(n), 5.0), conn
        finally:
            assert fake.runs("renew_many") == 1, "the leases went in one call"


def test_python_batch_gives_each_lease_its_own_element(fake: FakeRedis) -> None:
    reply = array(b":1\r\n", b"-WRONGTYPE Operation against a key\r\n", b":0\r\n", b":1\r\n")
    replies, _conn = _send_through(fake, reply, 4)
    assert replies[0] == 1 and replies[2] == 0 and replies[3] == 1
    assert isinstance(replies[1], redis.ResponseError) and "WRONGTYPE" in str(replies[1])
    assert classify(replies[1]) == ERROR


def test_python_batch_gives_an_error_of_the_whole_call_to_every_lease(fake: FakeRedis) -> None:
    replies, _conn = _send_through(fake, b"-READONLY You can't write against a replica\r\n", 3)
    assert all(is_failover_reply(reply) for reply in replies), replies


@pytest.mark.parametrize(
    "reply",
    [
        array(b":1\r\n", b":1\r\n"),  # one reply short
        array(b":1\r\n", b":1\r\n", b":1\r\n", b":1\r\n"),  # one too many
        array(b":1\r\n", b":5\r\n", b":1\r\n"),  # an element no renewal gives
        array(b":1\r\n", b"$1\r\n1\r\n", b":1\r\n"),
        b":1\r\n",  # not an array
    ],
    ids=["short", "long", "integer", "bulk", "flag"],
)
def test_python_batch_reads_a_reply_it_cannot_give_as_unexpected_for_every_lease(
    fake: FakeRedis, reply: bytes
) -> None:
    replies, conn = _send_through(fake, reply, 3)
    assert all(isinstance(each, UnexpectedReply) for each in replies), replies
    assert conn.address is None, "the connection that carried it is dropped"


@pytest.mark.parametrize(
    ("text", "elsewhere"),
    [
        ("Script attempted to access a non local key in a cluster node script", True),
        ("ERR Script attempted to access a non local key in a cluster node script", True),
        (
            "@user_script: 28: Lua script attempted to access a non local key in a cluster node",
            True,
        ),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
        ("READONLY You can't write against a read only replica.", False),
    ],
    ids=["redis-7", "redis-7-with-code", "redis-6", "wrongtype", "readonly"],
)
def test_a_key_the_node_does_not_serve_is_told_from_other_errors(
    text: str, elsewhere: bool
) -> None:
    """As redis-py gives it (the ERR code stripped, or kept), from Redis 7 and before."""
    from redlease._engine.rules.replies import renewed_elsewhere

    assert renewed_elsewhere(redis.ResponseError(text)) is elsewhere
    assert not renewed_elsewhere(text)
