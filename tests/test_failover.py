"""The Elector, on both engines, through the failovers of real deployments.

Each test elects two electors on the topology (one inside ``run()``, one
started with ``start()``), makes sure their keys reached the replica, then
fails the master over (Sentinel ``SENTINEL FAILOVER`` or a crash; Cluster
``CLUSTER FAILOVER`` of the names' slot or a live migration of that slot).
Both must then lead on the new master within the topology's failover time
(until the harness sees the new master serve), the TTL and a generous margin
of five TTLs: the new master holds their lease and a fence equal to their
token. A term that survived the switch keeps its token;
a term that was lost is followed by one with a greater token, and the old
token is fenced out on the new master. ``run()`` and ``stop()`` must return
within a few seconds afterwards. The tests taking ``family`` run with a
redis-py client and with a valkey-py one; for the latter every redis-py error
reported through ``on_error`` must be valkey-py's of the same name too.

Select them with ``pytest -m failover``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis

import redlease
from helpers import Events, RunThread, Terms, elected_token, wait_until
from redlease._testing import ClusterSet, RedisServer, SentinelSet, key_slot
from topology_helpers import assert_in_family

pytestmark = [pytest.mark.failover, pytest.mark.topology, pytest.mark.usefixtures("engines_closed")]


TTL = 1.0


# Allowed after the topology has failed over: the TTL and a generous margin.
MARGIN = 5.0
STOP_WITHIN = 5.0


@dataclass
class Contender:
    """One elector on the topology, with what it went through."""

    elector: redlease.Elector
    events: Events
    runner: RunThread | None = None
    terms: Terms = field(default_factory=Terms)
    first_token: int = 0

    @property
    def name(self) -> str:
        return self.elector.config.name

    def report(self) -> str:
        kinds = self.events.kinds()
        errors = [f"{type(e).__name__}: {e}" for e in self.events.values("error")]
        return f"{self.name}: events={kinds} errors={errors[:8]} (of {len(errors)})"


def _contenders(client: Any, names: tuple[str, ...], engine: str) -> list[Contender]:
    out = []
    for i, name in enumerate(names):
        events = Events()
        elector = redlease.Elector(client, name, ttl=TTL, engine=engine, observer=events.observer())
        contender = Contender(elector, events)
        if i == 0:
            contender.runner = RunThread(elector, contender.terms)
        else:
            elector.start(contender.terms)
        out.append(contender)
    for contender in out:
        contender.first_token = elected_token(contender.elector, timeout=10)
    return out


def _leads_on(node: RedisServer, contender: Contender) -> int | None:
    """The contender's token when ``node`` holds its lease and its fence; else None."""
    token = contender.elector.token()
    if token is None:
        return None
    c = node.client(socket_timeout=1, socket_connect_timeout=1, retry=None)
    try:
        holder = c.get(f"{contender.name}:leader")
        fence = c.get(f"{contender.name}:fence")
    except redis.RedisError:
        return None
    finally:
        c.close()
    if holder != contender.elector.instance_id.encode() or fence is None:
        return None
    return token if int(fence) == token else None


def _through(
    contenders: list[Contender],
    fault: Callable[[], RedisServer],
    fenced_write: Callable[[Contender, int, int], tuple[bool, bool]],
    family: str = "redis",
) -> None:
    """Run ``fault`` (which returns the new master), then check the contenders followed it.

    The errors reported through ``on_error`` meanwhile are of ``family``, the clients'.
    """
    started = time.monotonic()
    try:
        new_master = fault()
        fault_took = time.monotonic() - started

        def everyone_leads() -> bool:
            return all(_leads_on(new_master, c) for c in contenders)

        allowed = TTL + MARGIN
        try:
            wait_until(everyone_leads, timeout=allowed, interval=0.05)
        except AssertionError:
            state = [
                f"{c.name}: token={c.elector.token()} leads_on_new={_leads_on(new_master, c)}"
                for c in contenders
            ]
            raise AssertionError(
                f"not leading on the new master {new_master!r} {allowed} s after the "
                f"failover (which took {fault_took:.1f} s); {state}; "
                + "; ".join(c.report() for c in contenders)
            ) from None
        followed = time.monotonic() - started
        for c in contenders:
            token = _leads_on(new_master, c)
            assert token is not None
            lost = c.events.count("stepped_down") > 0
            if lost:
                assert token > c.first_token, c.report()
            else:
                assert token == c.first_token, c.report()
            current_ok, stale_ok = fenced_write(c, token, c.first_token)
            assert current_ok, f"a fenced write with the current token failed; {c.report()}"
            if lost:
                assert not stale_ok, f"the lost term's token still writes; {c.report()}"
            for error in c.events.values("error"):
                if isinstance(error, redis.RedisError):
                    assert_in_family(error, family)
        tokens = [
            (c.first_token, c.elector.token(), c.events.count("stepped_down")) for c in contenders
        ]
        print(
            f"fault {fault_took:.2f} s, both leading on the new master {followed:.2f} s after; "
            f"(token before, after, terms lost): {tokens}"
        )
    finally:
        _stop_all(contenders)


def _stop_all(contenders: list[Contender]) -> None:
    slow = []
    for c in contenders:
        began = time.monotonic()
        if c.runner is not None:
            c.runner.stop(timeout=STOP_WITHIN)
            if c.runner.alive:
                slow.append(f"{c.name}: run() still running {STOP_WITHIN} s after stop")
            elif c.runner.error is not None:
                slow.append(f"{c.name}: run() raised {c.runner.error!r}")
        else:
            c.elector.stop(timeout=STOP_WITHIN)
            if time.monotonic() - began >= STOP_WITHIN:
                slow.append(f"{c.name}: stop() did not return within {STOP_WITHIN} s")
    assert not slow, slow


# -- Sentinel ------------------------------------------------------------------------------


def _sentinel_fence(topology: SentinelSet) -> Callable[[Contender, int, int], tuple[bool, bool]]:
    def write(c: Contender, token: int, old: int) -> tuple[bool, bool]:
        current = c.elector.fence_set(token, f"{c.name}:state", "current")
        stale = old != token and c.elector.fence_set(old, f"{c.name}:state", "stale")
        value = topology.master().client().get(f"{c.name}:state")
        return current and value == b"current", stale

    return write


def _sentinel_contenders(
    topology: SentinelSet, engine: str, family: str = "redis"
) -> list[Contender]:
    client = topology.master_for(family=family, socket_timeout=1, socket_connect_timeout=1)
    contenders = _contenders(client, ("fo-run", "fo-start"), engine)
    # Both leases and fences on the replica before the fault: what is lost
    # to asynchronous replication is not what these tests are about.
    assert topology.master().client().wait(1, 2000) >= 1
    return contenders


def test_elector_follows_a_sentinel_failover(
    sentinel_set_fresh: SentinelSet, engine: str, family: str
) -> None:
    topology = sentinel_set_fresh
    contenders = _sentinel_contenders(topology, engine, family)

    def fault() -> RedisServer:
        return topology.node_at(topology.failover())

    _through(contenders, fault, _sentinel_fence(topology), family)


def test_elector_follows_a_sentinel_failover_over_tls(
    tls_sentinel_set_fresh: SentinelSet, engine: str, family: str
) -> None:
    """The same, with every process TLS-only: sentinels, master, replica and replication."""
    topology = tls_sentinel_set_fresh
    contenders = _sentinel_contenders(topology, engine, family)
    assert all(c.elector.engine == engine for c in contenders)

    def fault() -> RedisServer:
        return topology.node_at(topology.failover())

    _through(contenders, fault, _sentinel_fence(topology), family)


def _longest_overlap(a: redlease.Elector, b: redlease.Elector, duration: float) -> float:
    """The longest stretch, within ``duration``, during which both believe they lead."""
    longest, since = 0.0, None
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        now = time.monotonic()
        if a.token() is not None and b.token() is not None:
            since = now if since is None else since
            longest = max(longest, now - since)
        else:
            since = None
        time.sleep(0.01)
    return longest


def test_no_second_leader_after_a_sentinel_failover(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    topology = sentinel_set_fresh
    [leader] = _contenders(topology.master_for(socket_timeout=1), ("fo-one",), engine)
    assert topology.master().client().wait(1, 2000) >= 1
    newcomer_events = Events()
    newcomer = redlease.Elector(
        topology.master_for(socket_timeout=1),
        leader.name,
        ttl=TTL,
        engine=engine,
        observer=newcomer_events.observer(),
    )
    try:
        topology.failover()
        newcomer.start()
        # A leader may believe it leads until its lease deadline: up to a TTL.
        overlap = _longest_overlap(leader.elector, newcomer, TTL + MARGIN)
    finally:
        newcomer.stop(timeout=STOP_WITHIN)
        _stop_all([leader])
    assert overlap <= TTL + 0.2, (
        f"two leaders of {leader.name!r} for {overlap:.2f} s; {leader.report()}; "
        f"newcomer: events={newcomer_events.kinds()}"
    )


def test_elector_follows_a_sentinel_master_crash(
    sentinel_set_fresh: SentinelSet, engine: str
) -> None:
    topology = sentinel_set_fresh
    contenders = _sentinel_contenders(topology, engine)

    def fault() -> RedisServer:
        return topology.node_at(topology.kill_master())

    _through(contenders, fault, _sentinel_fence(topology))


# -- Cluster -------------------------------------------------------------------------------

TAG = "{fo}"
NAMES = (f"{TAG}:run", f"{TAG}:start")


def _cluster_contenders(cluster: ClusterSet, engine: str, family: str = "redis") -> list[Contender]:
    client = cluster.client(family=family, socket_timeout=1, socket_connect_timeout=1)
    contenders = _contenders(client, NAMES, engine)
    assert cluster.master_for_slot(key_slot(TAG)).client().wait(1, 2000) >= 1
    return contenders


def _cluster_fence(cluster: ClusterSet) -> Callable[[Contender, int, int], tuple[bool, bool]]:
    def write(c: Contender, token: int, old: int) -> tuple[bool, bool]:
        current = c.elector.fence_set(token, f"{c.name}:state", "current")
        stale = old != token and c.elector.fence_set(old, f"{c.name}:state", "stale")
        owner = cluster.master_for_slot(key_slot(TAG))
        return current and owner.client().get(f"{c.name}:state") == b"current", stale

    return write


def test_elector_follows_a_cluster_failover_of_its_slot(
    cluster_set_fresh: ClusterSet, engine: str, family: str
) -> None:
    cluster = cluster_set_fresh
    contenders = _cluster_contenders(cluster, engine, family)

    def fault() -> RedisServer:
        return cluster.failover(key_slot(TAG))

    _through(contenders, fault, _cluster_fence(cluster), family)


def test_elector_follows_a_cluster_failover_of_its_slot_over_tls(
    tls_cluster_set_fresh: ClusterSet, engine: str, family: str
) -> None:
    """The same on a TLS-only cluster (tls-cluster, tls-replication)."""
    cluster = tls_cluster_set_fresh
    contenders = _cluster_contenders(cluster, engine, family)
    assert all(c.elector.engine == engine for c in contenders)

    def fault() -> RedisServer:
        return cluster.failover(key_slot(TAG))

    _through(contenders, fault, _cluster_fence(cluster), family)


def test_elector_follows_a_migration_of_its_slot(
    cluster_set_fresh: ClusterSet, engine: str, family: str
) -> None:
    cluster = cluster_set_fresh
    contenders = _cluster_contenders(cluster, engine, family)
    slot = key_slot(TAG)

    def fault() -> RedisServer:
        target = next(m for m in cluster.masters() if m is not cluster.master_for_slot(slot))
        assert cluster.migrate_slot(slot, target) >= 6  # leader, fence, applied x 2
        return target

    _through(contenders, fault, _cluster_fence(cluster), family)


def test_elector_keeps_leading_while_its_slot_is_mid_migration(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    """A resharding that moved the lease's keys but has not finished: clients get ASK."""
    cluster = cluster_set_fresh
    contenders = _cluster_contenders(cluster, engine)
    slot = key_slot(TAG)
    target = next(m for m in cluster.masters() if m is not cluster.master_for_slot(slot))
    migration = cluster.begin_migration(slot, target)
    try:
        migration.move_keys()  # every key moved; the slot still belongs to the source
        held = time.monotonic()
        stays_leading = [
            c.name
            for c in contenders
            if c.elector.token() == c.first_token and c.events.count("stepped_down") == 0
        ]
        time.sleep(3 * TTL)
        lost = [c.report() for c in contenders if c.events.count("stepped_down")]
        assert not lost, f"terms lost {time.monotonic() - held:.1f} s into the migration: {lost}"
        assert len(stays_leading) == 2
    finally:
        migration.finish()
        _stop_all(contenders)
