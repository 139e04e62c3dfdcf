"""Partition group members stepped by the process's driver, on both engines.

A member's looks at its group and its round trips run on the driver that
steps every election and lock watchdog of the process; a member with
callbacks has one thread of its own for them, and a slow callback holds
up that member's callbacks and nobody else's.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import redlease
from helpers import stays, wait_until
from redlease import Partitions
from redlease._engine import driver
from test_fork import in_child

NAME = "driven"
TTL = 0.5


def make(
    client: Any, engine: str, member_id: str, partitions: Any = 4, name: str = NAME, **options: Any
) -> Partitions:
    options.setdefault("ttl", TTL)
    return Partitions(client, name, partitions, member_id=member_id, engine=engine, **options)


def balanced(members: list[Partitions], n: int) -> bool:
    owned = [m.owned() for m in members]
    every = [p for each in owned for p in each]
    floor, ceil = n // len(members), -(-n // len(members))
    return len(set(every)) == len(every) == n and all(floor <= len(o) <= ceil for o in owned)


def _tasks() -> set[str]:
    return set(os.listdir("/proc/self/task"))  # native threads included


def test_callbacks_run_in_order_on_one_thread_neither_the_callers_nor_the_drivers(
    plain: redis.Redis, engine: str, started: Callable[[Any], Any]
) -> None:
    seen: list[tuple[str, str, object, threading.Thread]] = []

    def assigned(partition: str, token: int) -> None:
        seen.append(("assigned", partition, token, threading.current_thread()))

    def revoked(partition: str, reason: str) -> None:
        seen.append(("revoked", partition, reason, threading.current_thread()))

    first = started(make(plain, engine, "m1", on_assigned=assigned, on_revoked=revoked))
    wait_until(lambda: len(seen) == 4, what="four assigned")
    second = started(make(plain, engine, "m2"))
    wait_until(lambda: balanced([first, second], 4), what="balanced")
    wait_until(lambda: len(seen) == 6, what="two revoked")
    kept = set(first.owned())
    first.stop()
    threads = {thread for *_, thread in seen}
    assert len(threads) == 1
    (thread,) = threads
    assert thread is not threading.current_thread() and thread is not driver().thread
    assert not thread.is_alive()  # the run's thread ends with the run
    for partition in "0123":
        events = [(event, detail) for event, p, detail, _ in seen if p == partition]
        reason = "stopped" if partition in kept else "rebalanced"
        assert events == [("assigned", 1), ("revoked", reason)], partition


def test_members_without_callbacks_add_no_thread(
    plain: redis.Redis, engine: str, started: Callable[[Any], Any]
) -> None:
    # One member first: the driver, the renewer and the notice listener exist from then on.
    members = [started(make(plain, engine, "m00", 64))]
    wait_until(lambda: len(members[0].owned()) == 64, what="the first member owns all")
    threads, tasks = set(threading.enumerate()), _tasks()
    members += [started(make(plain, engine, f"m{i:02d}", 64)) for i in range(1, 21)]
    wait_until(lambda: balanced(members, 64), timeout=20, what="21 members balanced")
    assert set(threading.enumerate()) - threads == set()
    assert _tasks() - tasks == set()  # native threads neither
    # With a callback, a member has its thread: one each, ended by its stop().
    noisy = [
        started(make(plain, engine, f"n{i}", 64, on_assigned=lambda p, t: None)) for i in (1, 2)
    ]
    wait_until(lambda: balanced(members + noisy, 64), timeout=20, what="23 members balanced")
    added = set(threading.enumerate()) - threads
    assert sorted(t.name for t in added) == [f"redlease-partitions-{NAME}"] * 2
    for member in noisy:
        member.stop()
    assert not any(t.is_alive() for t in added)


def test_a_slow_on_revoked_stalls_neither_an_elector_nor_another_group(
    plain: redis.Redis, engine: str, started: Callable[[Any], Any]
) -> None:
    elector = redlease.Elector(plain, "driven-leader", ttl=TTL, engine=engine).start()
    try:
        wait_until(lambda: elector.token, what="the elector leads")
        token = elector.token
        in_revoke = threading.Event()
        returned = threading.Event()
        revoking: list[str] = []

        def slow(partition: str, reason: str) -> None:
            if reason == "rebalanced":
                revoking.append(partition)
                in_revoke.set()
                time.sleep(3 * TTL)
                returned.set()

        slowpoke = started(make(plain, engine, "slow", on_revoked=slow))
        wait_until(lambda: len(slowpoke.owned()) == 4, what="slow owns all")
        newcomer = started(make(plain, engine, "new"))
        assert in_revoke.wait(10)
        # While on_revoked sleeps: the partition is still the slow member's at Redis (its
        # lease renewed), the elector keeps its term, another group balances.
        others = [started(make(plain, engine, "o1", 6, name="other"))]
        others.append(started(make(plain, engine, "o2", 6, name="other")))
        while not returned.is_set():
            holders = plain.mget([f"{NAME}:p:{p}:leader" for p in revoking])
            assert returned.is_set() or holders == [b"slow"] * len(revoking)
            assert elector.token == token and elector.is_leader
            time.sleep(0.02)
        assert balanced(others, 6), "the other group balanced during the slow callback"
        wait_until(lambda: balanced([slowpoke, newcomer], 4), what="handed over at last")
        assert elector.token == token
    finally:
        elector.stop()


def test_stop_while_a_callback_runs_returns_after_it_and_releases(
    plain: redis.Redis, engine: str
) -> None:
    entered, let_go = threading.Event(), threading.Event()
    returned: list[str] = []

    def assigned(partition: str, token: int) -> None:
        entered.set()
        let_go.wait(10)
        returned.append(partition)

    member = make(plain, engine, "m1", 2, on_assigned=assigned).start()
    assert entered.wait(10)
    stopping = threading.Thread(target=member.stop)
    stopping.start()
    try:
        assert stays(stopping.is_alive, 2 * TTL), "stop() returned while a callback ran"
        assert plain.zscore(f"{NAME}:members", "m1") is not None
    finally:
        let_go.set()
    stopping.join(10)
    assert not stopping.is_alive()
    assert sorted(returned) == ["0", "1"]
    assert member.owned() == {}
    assert member.assignment() == {"0": None, "1": None}
    assert member.members() == []


def test_a_stop_with_a_timeout_is_bounded_by_it_while_a_callback_blocks(
    plain: redis.Redis, engine: str
) -> None:
    let_go = threading.Event()
    member = make(plain, engine, "m1", 2, on_assigned=lambda p, t: let_go.wait(10)).start()
    wait_until(lambda: len(member.owned()) == 2, what="owned")
    member.stop(0.2)  # returns, the run ending on its own once the callback returns
    let_go.set()
    wait_until(lambda: member.members() == [], what="left once the callback returned")
    assert member.assignment() == {"0": None, "1": None}
    member.start()  # the run is over: a new one may start
    wait_until(lambda: len(member.owned()) == 2, what="owned again")
    member.stop()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_cannot_end_or_step_the_parents_member(
    plain: redis.Redis, engine: str, started: Callable[[Any], Any]
) -> None:
    told: list[str] = []
    member = started(make(plain, engine, "m1", 2, on_revoked=lambda p, r: told.append(p)))
    wait_until(lambda: len(member.owned()) == 2, what="owned")
    tokens = member.owned()

    def child() -> dict[str, object]:
        member.stop()  # the parent's run is no run here: nothing of it runs
        return {"told": told, "running": member._core.running}

    assert in_child(child) == {"told": [], "running": False}
    time.sleep(3 * TTL)  # only the parent's renewals can keep the leases
    assert member.owned() == tokens
    assert member.assignment() == {"0": "m1", "1": "m1"}
    member.stop()
    assert sorted(told) == ["0", "1"]
