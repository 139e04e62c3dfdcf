"""A Sentinel ``+switch-master`` notice ends only the terms the old master granted.

The notice can arrive late: after the renewal was answered READONLY and the
elector already won a new term on the new master. Ending that new, valid term
would put the name through an election for nothing. The notice is delivered
here the way the engine's sentinel watcher delivers it, on a real Sentinel set.
"""

from __future__ import annotations

import pytest

from helpers import (
    LOOPBACK,
    ClosedPort,
    Events,
    Terms,
    elected_token,
    make_elector,
    require_native,
    stays,
    wait_until,
)
from redlease._engine import is_failover_reply
from redlease._testing import SentinelSet

pytestmark = [pytest.mark.topology, pytest.mark.usefixtures("engines_closed")]


def _announce(elector: object, old: tuple[str, int], new: tuple[str, int]) -> None:
    # What the watcher calls when a sentinel publishes "+switch-master".
    elector._core.engine._switches._switched(old, new)  # type: ignore[attr-defined]


def test_a_late_switch_notice_leaves_a_term_won_on_the_new_master(
    sentinel_set: SentinelSet, engine: str
) -> None:
    master = sentinel_set.master_address()
    [replica] = [(master[0], node.port) for node in sentinel_set.replicas()]
    events = Events()
    elector = make_elector(
        sentinel_set.master_for(socket_timeout=1), engine, name="late-switch",
        observer=events.observer(),
    )
    elector.start(Terms())
    try:
        token = elected_token(elector, timeout=10)
        # The switch that made today's master the master, heard after this term began.
        _announce(elector, replica, master)
        assert stays(lambda: elector.token() == token, 1.5), events.kinds()
        assert events.count("stepped_down") == 0
    finally:
        elector.stop(timeout=5)


def test_a_switch_notice_ends_a_term_the_old_master_granted(
    sentinel_set: SentinelSet, engine: str
) -> None:
    master = sentinel_set.master_address()
    [replica] = [(master[0], node.port) for node in sentinel_set.replicas()]
    events = Events()
    elector = make_elector(
        sentinel_set.master_for(socket_timeout=1), engine, name="old-switch",
        ttl=10.0, observer=events.observer(),
    )
    elector.start(Terms())
    try:
        elected_token(elector, timeout=10)
        _announce(elector, master, replica)
        # Ended at once, long before the 10 s lease could run out.
        wait_until(lambda: events.count("stepped_down") >= 1, 2.0, what="the term to end")
    finally:
        elector.stop(timeout=5)


def _repoint_sentinels(topology: SentinelSet, new: tuple[str, int]) -> None:
    """Have every sentinel name ``new`` as the master, with no switch announced."""
    for node in topology.sentinels:
        client = topology.sentinel_client(node)
        try:
            client.execute_command("SENTINEL", "REMOVE", topology.service)
            client.execute_command("SENTINEL", "MONITOR", topology.service, new[0], new[1], 2)
        finally:
            client.close()


def test_native_renewal_refused_as_not_the_master_is_not_resent_to_the_new_master(
    sentinel_set_fresh: SentinelSet, closed_port: ClosedPort
) -> None:
    # The server refuses the renewal before running it (MASTERDOWN; a READONLY
    # that Redis gives before the script runs takes the same path), the reply
    # a routed command would follow to wherever the sentinels now point. A
    # renewal must not follow it: the lease was granted on this server.
    require_native()
    topology = sentinel_set_fresh
    old = topology.master_address()
    [promoted] = topology.replicas()
    events = Events()
    terms = Terms()
    # TTL 6 s: only the refused renewal can end the term within a few renew intervals.
    elector = make_elector(
        topology.master_for(socket_timeout=1), "native", name="no-resend",
        ttl=6.0, renew_interval=0.5, observer=events.observer(),
    )
    elector.start(terms)
    try:
        terms.wait_for(1, timeout=10)
        term = terms.terms[0]
        demoted = topology.node_at(old).client()
        assert demoted.wait(1, 2000) >= 1  # the lease reached the replica
        # The sentinels now name the replica, which holds the lease too (no
        # switch is announced); the old master follows a master it cannot
        # reach and refuses commands (MASTERDOWN) on the keeper's open connection.
        promoted.client().execute_command("REPLICAOF", "NO", "ONE")
        _repoint_sentinels(topology, (old[0], promoted.port))
        demoted.config_set("replica-serve-stale-data", "no")
        demoted.execute_command("REPLICAOF", LOOPBACK, closed_port.port)
        # Sent again to the new master, the renewal would succeed there and keep the term.
        assert term.wait(3.0), f"the term outlived a refused renewal: {events.kinds()}"
        assert term.reason == "lost"
        errors = events.values("error")
        assert any(is_failover_reply(x) for x in errors), [str(x) for x in errors]
    finally:
        elector.stop(timeout=5)
