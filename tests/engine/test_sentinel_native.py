"""The native engine on a Sentinel-managed master: it asks the sentinels itself,
without the GIL, and follows the master through failovers."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
import redis.sentinel

import redlease
from engine_helpers import command, threads
from helpers import (
    ClosedPort,
    Events,
    ProcessContender,
    elected_token,
    gil_call_size,
    hold_gil_at_least,
    require_native,
    wait_until,
)
from redlease._testing import SentinelSet
from topology_helpers import close_all_engines, wait_leading_on

pytestmark = [pytest.mark.topology]


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


TTL = 1.0
MARGIN = 3.0
STOP_WITHIN = 3.0


@pytest.fixture(autouse=True)
def _native() -> None:
    require_native()


def _elector(
    client: redis.Redis, name: str, events: Events | None = None, ttl: float = TTL
) -> redlease.Elector:
    e = redlease.Elector(client, name, ttl=ttl, observer=events.observer() if events else None)
    assert e.engine == "native", e.engine_reason
    return e


def _stop(e: redlease.Elector) -> None:
    began = time.monotonic()
    e.stop(timeout=STOP_WITHIN)
    assert time.monotonic() - began < STOP_WITHIN, "stop() took too long"


def test_native_elector_on_a_sentinel_master_elects_and_fences(
    sentinel_set: SentinelSet,
) -> None:
    client = sentinel_set.master_for(socket_timeout=1)
    e = _elector(client, "sn-basic")
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "sn-basic:state", "v1")
        assert not e.fence_set(token - 1, "sn-basic:state", "stale")
    master = sentinel_set.master().client()
    assert master.get("sn-basic:state") == b"v1"
    assert int(master.get("sn-basic:fence:applied")) == token


def test_native_locker_on_a_sentinel_master_keeps_its_lock(sentinel_set: SentinelSet) -> None:
    locker = redlease.RedisLocker(sentinel_set.master_for(socket_timeout=1), prefix="sn-locks:")
    assert locker.engine == "native"
    try:
        with locker.hold("job", ttl=0.5) as held:
            time.sleep(1.0)
            assert not held.done.is_set()
            with pytest.raises(redlease.NotAcquired):
                locker.try_acquire("job")
    finally:
        locker.close()


@pytest.mark.parametrize("fault", ["failover", "kill_master"])
def test_native_elector_follows_the_master(sentinel_set_fresh: SentinelSet, fault: str) -> None:
    topology = sentinel_set_fresh
    events = Events()
    e = _elector(topology.master_for(socket_timeout=1), "sn-fo", events)
    e.start()
    try:
        first = elected_token(e, timeout=10)
        assert topology.master().client().wait(1, 2000) >= 1
        began = time.monotonic()
        new = topology.node_at(getattr(topology, fault)())
        took = time.monotonic() - began
        token = wait_leading_on(new, e, TTL + MARGIN)
        followed = time.monotonic() - began
        print(f"{fault}: {took:.2f} s, leading on the new master {followed:.2f} s after it began")
        if events.count("stepped_down"):
            assert token > first
        else:
            assert token == first
        assert e.fence_set(token, "sn-fo:state", "after")
        assert new.client().get("sn-fo:state") == b"after"
        if token != first:
            assert not e.fence_set(first, "sn-fo:state", "stale")
    finally:
        _stop(e)


def test_no_second_leader_after_a_failover(sentinel_set_fresh: SentinelSet) -> None:
    """A newcomer asking the sentinels after the failover does not lead beside the leader.

    The leader re-asks the sentinels at least once a second, so it leaves the
    old master (still writable until the sentinels demote it) within about a
    second of the switch; a newcomer meanwhile finds the lease on the new master.
    """
    topology = sentinel_set_fresh
    leader = _elector(topology.master_for(socket_timeout=1), "sn-one")
    leader.start()
    newcomer = _elector(topology.master_for(socket_timeout=1), "sn-one")
    try:
        elected_token(leader, timeout=10)
        assert topology.master().client().wait(1, 2000) >= 1
        topology.failover()
        newcomer.start()
        longest, since = 0.0, None
        deadline = time.monotonic() + TTL + MARGIN
        while time.monotonic() < deadline:
            now = time.monotonic()
            if leader.token() is not None and newcomer.token() is not None:
                since = now if since is None else since
                longest = max(longest, now - since)
            else:
                since = None
            time.sleep(0.01)
        assert longest <= TTL + 0.2, f"two leaders for {longest:.2f} s"
    finally:
        _stop(newcomer)
        _stop(leader)


def _never_elected(client: redis.Redis, name: str) -> list[Exception]:
    """Run an elector that can find no master: its errors, once on_error has seen one."""
    events = Events()
    e = _elector(client, name, events, ttl=0.5)
    with e:
        deadline = time.monotonic() + 10
        while not events.values("error") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert e.token() is None
    errors: list[Exception] = events.values("error")
    assert errors, "no error through on_error"
    assert events.count("elected") == 0
    return errors


@pytest.fixture
def dead_sentinels() -> Iterator[list[ClosedPort]]:
    ports = [ClosedPort(), ClosedPort()]
    try:
        yield ports
    finally:
        for p in ports:
            p.close()


def test_no_sentinel_answering_is_a_connection_error_never_an_election(
    dead_sentinels: list[ClosedPort],
) -> None:
    manager = redis.sentinel.Sentinel([("127.0.0.1", p.port) for p in dead_sentinels])
    client = manager.master_for("svc", socket_timeout=1)
    began = time.monotonic()
    errors = _never_elected(client, "sn-none")
    assert time.monotonic() - began < 8
    assert all(isinstance(x, redis.exceptions.ConnectionError) for x in errors), errors
    assert "svc" in str(errors[0])


def test_a_service_the_sentinels_do_not_know_is_a_connection_error(
    sentinel_set: SentinelSet,
) -> None:
    client = sentinel_set.master_for("nosuch", socket_timeout=1)
    errors = _never_elected(client, "sn-unknown")
    assert all(isinstance(x, redis.sentinel.MasterNotFoundError) for x in errors), errors
    assert "nosuch" in str(errors[0])


def test_sentinel_password_is_honoured() -> None:
    with SentinelSet(sentinel_password="s3ntinel", password="m4ster") as topology:
        e = _elector(topology.master_for(socket_timeout=1), "sn-auth")
        with e:
            token = elected_token(e, timeout=10)
            assert e.fence_set(token, "sn-auth:state", "v")
        assert topology.master().client().get("sn-auth:state") == b"v"
        # The same sentinels with a wrong password name no master.
        manager = redis.sentinel.Sentinel(
            topology.sentinel_addresses(), sentinel_kwargs={"password": "wrong"}
        )
        client = manager.master_for("svc", password="m4ster", socket_timeout=1)
        errors = _never_elected(client, "sn-auth-bad")
        assert isinstance(errors[0], redis.exceptions.ConnectionError), errors


def test_native_sentinel_leader_keeps_its_lease_through_a_long_gil_holding_call(
    sentinel_set: SentinelSet,
) -> None:
    ttl = 0.3
    name = "sn-gil"
    n = gil_call_size(1.5)
    client = sentinel_set.master_for(socket_timeout=1)
    e = _elector(client, name, ttl=ttl)
    e.start()
    contender = None
    try:
        token = elected_token(e)
        addresses = sentinel_set.sentinel_addresses()
        contender = ProcessContender(
            f"client = redis.sentinel.Sentinel({addresses!r}).master_for("
            f"{sentinel_set.service!r}, socket_timeout=2)",
            name,
            ttl,
        )
        held = hold_gil_at_least(n, 3.2 * ttl)
        assert held > 3 * ttl, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        assert client.get(f"{name}:leader") == e.instance_id.encode()
        assert contender.elections() == [], "the other process took over during the call"
    finally:
        if contender is not None:
            contender.close()
        _stop(e)


def test_target_and_pool_through_the_sentinels(sentinel_set: SentinelSet) -> None:
    core = require_native()
    from redlease._engine.conn.client import native_endpoint

    endpoint, why = native_endpoint(sentinel_set.master_for())
    assert endpoint is not None, why
    target = core.Target(endpoint)
    assert target.kind == "sentinel"
    assert target.address == "sentinel:svc"
    pool = core.Pool(target, 1)
    try:
        assert command(pool, ["ROLE"], 2.0)[0] == b"master"
        port = command(pool, ["CONFIG", "GET", "port"], 2.0)[1]
        assert int(port) == sentinel_set.master().port
    finally:
        pool.close()


def test_many_sentinel_leases_share_one_renewer_and_follow_failovers(
    sentinel_set_fresh: SentinelSet,
) -> None:
    # Behind Sentinel every lease of the engine is renewed by its one shared
    # renewer too: no thread per lease, and its connection follows the master.
    sset = sentinel_set_fresh
    client = sset.master_for(socket_timeout=2)
    count = 200
    before = threads()
    group = [_elector(client, f"many{i}", ttl=2.0) for i in range(count)]
    try:
        for e in group:
            e.start()
        wait_until_all = time.monotonic() + 60
        while not all(e.token() for e in group):
            assert time.monotonic() < wait_until_all, "not every elector leads"
            time.sleep(0.05)
        engine = group[0]._core.engine  # type: ignore[attr-defined]
        renewer = engine.renewer
        assert renewer is not None
        # ``leases`` counts those waiting in the timer heap: one whose renewal is in
        # flight is out of it for that round trip, so the count is read until whole.
        wait_until(lambda: renewer.leases == count, 10, what="every lease in the heap")
        # The driver, the renewer, the notice reader and the switch watcher.
        assert threads() - before <= 5, threads() - before
        # A round of renewals takes one renew interval (2/3 s): count of them.
        wait_until(
            lambda floor=renewer.sent[0] + count: renewer.sent[0] >= floor,
            10,
            what="a round of renewals",
        )
        for fault in ("failover", "kill"):
            # The old master must have become a replica first, or the kill
            # would promote a node that never had the newest tokens.
            sset.wait_settled()
            time.sleep(0.5)
            tokens = {e.config.name: e.token() for e in group}
            old = sset.master_address()
            new = sset.failover() if fault == "failover" else sset.kill_master(restart=True)
            assert new != old
            deadline = time.monotonic() + 60
            # Every term the old master granted ends; each elector leads again
            # with a newer token, renewed on the new master by the same renewer.
            while not all((e.token() or 0) > (tokens[e.config.name] or 0) for e in group):
                assert time.monotonic() < deadline, f"not every elector re-elected after {fault}"
                time.sleep(0.05)
            master = sset.node_client(sset.node_at(new), socket_timeout=2)
            try:
                held = sum(
                    master.get(f"many{i}:leader") == group[i].instance_id.encode()
                    for i in range(count)
                )
            finally:
                master.close()
            assert held == count
            assert engine.renewer is renewer
            wait_until(lambda: renewer.leases == count, 10, what="every lease in the heap")
            wait_until(
                lambda floor=renewer.sent[0] + count: renewer.sent[0] >= floor,
                10,
                what=f"a round of renewals after {fault}",
            )
        assert threads() - before <= 5, threads() - before
    finally:
        for e in group:
            e.stop(timeout=STOP_WITHIN)
