"""Behind Sentinel, a won acquire becomes a term only on a master the sentinels still name.

After a failover the old master answers as a master for seconds more, and a
killed master restarted empty answers as one until the sentinels demote it:
what is acquired there is thrown away with its data, and the token can be
handed out again. The ``+switch-master`` notice ends terms the old master
granted, but a notice can be lost; so each won acquire is confirmed with the
sentinels (a majority of them must name the node, none may report it being
failed over) before a term starts or a lock is handed out.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

import redlease
from helpers import Events, Terms, elected_token, make_elector, wait_until
from redlease._engine.conn import failover
from redlease._engine.conn.client import sentinels_of
from redlease._testing import SentinelSet

pytestmark = [pytest.mark.topology, pytest.mark.usefixtures("engines_closed")]


def _not_confirmed(events: Events) -> list[str]:
    return [str(e) for e in events.values("error") if isinstance(e, failover.MasterNotConfirmed)]


def _held_on(sset: SentinelSet, address: tuple[str, int], key: str) -> bool:
    client = sset.node_client(sset.node_at(address), socket_timeout=2)
    try:
        return bool(client.exists(key))
    finally:
        client.close()


def test_an_acquire_on_a_node_the_sentinels_no_longer_name_is_given_back_and_refused(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    # Where the acquire ran is what the engine says it last used; here it
    # is made to say the replica: a node the sentinels do not name, as the
    # old master is after a failover whose notice was lost.
    sset = sentinel_set_fresh
    elector = make_elector(sset.master_for(socket_timeout=2), engine, name="stale-master")
    assert elector.leader() is None  # connected: the engine knows its master
    switches = elector._core.engine._switches  # type: ignore[attr-defined]
    master = sset.master_address()
    [replica] = [(master[0], node.port) for node in sset.replicas()]
    switches.confirm(2.0, lambda: pytest.fail("confirmed: nothing to give back"))
    forgotten: list[bool] = []
    switches._forget_master = lambda: (lambda: forgotten.append(True))
    released: list[bool] = []
    switches._master_now = lambda: replica
    with pytest.raises(failover.MasterNotConfirmed) as refused:
        switches.confirm(2.0, lambda: released.append(True))
    assert f"names {master[0]}:{master[1]}" in str(refused.value)
    assert f"not {replica[0]}:{replica[1]}" in str(refused.value)
    assert isinstance(refused.value, redis.ConnectionError)
    # Given back on the node that granted it first, then forgotten: the next
    # call asks the sentinels for the master again.
    assert released == [True] and forgotten == [True]


def test_an_acquire_on_a_master_being_failed_over_is_refused_without_forgetting_it(
    sentinel_set_fresh: SentinelSet,
) -> None:
    sset = sentinel_set_fresh
    forgotten: list[bool] = []

    class Engine:
        def forget(self) -> None:
            forgotten.append(True)

    engine = Engine()
    switches = failover.MasterSwitches(
        sentinels_of(sset.master_for()), engine.forget, sset.master_address
    )
    released: list[bool] = []
    switches.confirm(2.0, lambda: released.append(True))  # a healthy master: confirmed
    assert released == []
    # A failover the first sentinel leads, stuck waiting for the frozen
    # replica to be promoted: the master is still named, but being replaced.
    leader = sset.sentinel_client(sset.sentinels[0], socket_timeout=2)
    replicas = sset.replicas()
    try:
        leader.execute_command("SENTINEL", "FAILOVER", sset.service)
        for node in replicas:
            sset.freeze(node)

        def refused() -> str:
            try:
                switches.confirm(2.0, lambda: released.append(True))
            except failover.MasterNotConfirmed as exc:
                return str(exc)
            return ""

        why = wait_until(refused, 10, what="a refusal while the failover is under way")
        assert "failover_in_progress" in why
        assert released and not forgotten  # still the named master: not forgotten
    finally:
        for node in replicas:
            sset.thaw(node)
        leader.close()
        switches.close()


def test_no_term_starts_while_most_sentinels_cannot_confirm_the_master(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    sset = sentinel_set_fresh
    events = Events()
    elector = make_elector(
        sset.master_for(socket_timeout=2), engine, name="unconfirmed",
        observer=events.observer(), ttl=1.5,
    )
    assert elector.leader() is None
    master = sset.master_address()
    frozen = sset.sentinels[1:]
    for sentinel in frozen:
        sset.freeze(sentinel)
    try:
        elector.start(Terms())
        wait_until(lambda: _not_confirmed(events), 20, what="a refused acquire")
        assert events.count("elected") == 0
        assert "only 1 of the 3 sentinels answered" in _not_confirmed(events)[0]
        elector.stop()
        # Each refused win was given back at once: nothing is left held.
        assert not _held_on(sset, master, "unconfirmed:leader")
        assert events.count("elected") == 0
    finally:
        for sentinel in frozen:
            sset.thaw(sentinel)
    elector.start(Terms())
    try:
        elected_token(elector, timeout=20)
    finally:
        elector.stop()


def test_a_lock_is_not_handed_out_while_most_sentinels_cannot_confirm_the_master(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    sset = sentinel_set_fresh
    locker = redlease.RedisLocker(sset.master_for(socket_timeout=2), engine=engine)
    try:
        locker.try_acquire("warmup", ttl=5.0).release()  # connected, confirmed
        master = sset.master_address()
        frozen = sset.sentinels[:2]
        for sentinel in frozen:
            sset.freeze(sentinel)
        try:
            with pytest.raises(redis.ConnectionError, match="only 1 of the 3 sentinels answered"):
                locker.try_acquire("report", ttl=5.0)
            assert not _held_on(sset, master, locker.key("report"))
        finally:
            for sentinel in frozen:
                sset.thaw(sentinel)
        held = wait_until(lambda: _try(locker), 20, what="the lock once the sentinels answer")
        assert held.fencing_token > 0
        held.release()
    finally:
        locker.close()


def _try(locker: redlease.RedisLocker) -> Any:
    try:
        return locker.try_acquire("report", ttl=5.0)
    except (redis.ConnectionError, redlease.NotAcquired):
        return None


def test_confirmation_off_sentinel_costs_nothing(client: redis.Redis, engine: str) -> None:
    # A plain server: no sentinel to ask, the acquire's own answer is final.
    events = Events()
    elector = make_elector(client, engine, name="plain-confirm", observer=events.observer())
    elector.start(Terms())
    try:
        elected_token(elector, timeout=10)
        assert not _not_confirmed(events)
    finally:
        elector.stop()
