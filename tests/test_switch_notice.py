"""A Sentinel ``+switch-master`` notice ends only the terms the old master granted.

The notice can arrive late: after the renewal was answered READONLY and the
elector already won a new term on the new master. Ending that new, valid term
would put the name through an election for nothing. The notice is delivered
here the way the engine's sentinel watcher delivers it, on a real Sentinel set.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import Events, Terms, elected_token, make_elector, stays, wait_until
from redlease._testing import SentinelSet
from topology_helpers import close_all_engines

pytestmark = [pytest.mark.topology]


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


def _announce(elector: object, old: tuple[str, int], new: tuple[str, int]) -> None:
    # What the watcher calls when a sentinel publishes "+switch-master".
    elector._election.engine._switches._switched(old, new)  # type: ignore[attr-defined]


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
