"""Many leases, one keeper: thousands of electors in one process on a fixed set of threads.

Every started elector of a process runs on one driver thread, and every
lease of an engine is renewed by one renewer (natively: one native thread
and one connection per engine). Each lease still keeps its own deadline:
a frozen server ends only the leases on it, a renewal answering 0 ends only
its own lease. Counts are of OS threads (/proc/self/task) and open fds.
"""

from __future__ import annotations

import gc
import json
import os
import textwrap
import time
from collections.abc import Iterator

import pytest
import redis

import redlease
from helpers import (
    HeldDriver,
    ReportingProcess,
    gil_call_size,
    hold_gil_at_least,
    require_native,
    wait_until,
)
from redlease._testing import RedisServer

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

THREADS_ADDED_MAX = 4
"""The issue's bound: threads (and server connections) added for any number of electors."""


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def fds() -> int:
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


def server_clients(rc: redis.Redis) -> int:
    return int(rc.info("clients")["connected_clients"])


def electors(
    client: redis.Redis, engine: str, count: int, prefix: str = "p", **kwargs: object
) -> list[redlease.Elector]:
    kwargs.setdefault("ttl", 1.0)
    return [
        redlease.Elector(client, f"{prefix}{i}", engine=engine, **kwargs)  # type: ignore[arg-type]
        for i in range(count)
    ]


def start_all(group: list[redlease.Elector], timeout: float = 30.0) -> dict[str, int]:
    for e in group:
        e.start(None)
    wait_until(lambda: all(e.token() for e in group), timeout, what="every elector leading")
    return {e.config.name: e.token() or 0 for e in group}


def stop_all(group: list[redlease.Elector]) -> None:
    for e in group:
        e.stop()


@pytest.fixture
def stopper() -> Iterator[list[redlease.Elector]]:
    """Electors a test adds here are stopped after it, whatever happened."""
    made: list[redlease.Elector] = []
    yield made
    stop_all(made)


class StealingProcess(ReportingProcess):
    """Python-engine electors for ``names`` in another process, printing every election."""

    def __init__(self, port: int, names: list[str], ttl: float) -> None:
        script = textwrap.dedent(
            """
            import json, sys, redis, redlease
            client = redis.Redis(host="127.0.0.1", port={port}, socket_timeout=2)
            def elected(name):
                return lambda token: print("elected", name, token, flush=True)
            group = [
                redlease.Elector(client, name, ttl={ttl}, acquire_interval=0.02, engine="python",
                                 observer=redlease.Observer(on_elected=elected(name)))
                for name in json.loads(sys.argv[1])
            ]
            for e in group:
                e.start(None)
            print("ready", flush=True)
            sys.stdin.read()
            for e in group:
                e.stop()
            """
        ).format(port=port, ttl=ttl)
        super().__init__(script, json.dumps(names))


def test_2000_native_electors_renew_through_a_gil_hog_and_a_follower_steals_none(
    redis_server: RedisServer, client: redis.Redis, stopper: list[redlease.Elector]
) -> None:
    require_native()
    group = electors(client, "native", 2000, ttl=1.0)
    stopper.extend(group)
    tokens = start_all(group)
    sample = [f"p{i}" for i in range(0, 2000, 100)]
    thief = StealingProcess(redis_server.port, sample, ttl=1.0)
    try:
        time.sleep(0.3)  # the follower is polling
        held = hold_gil_at_least(gil_call_size(1.5), 1.45)
        assert held >= 1.4  # longer than the TTL's renewal budget: only a native renewer keeps up
        time.sleep(0.3)
    finally:
        thief.close(wait=20)
    assert thief.elections() == []
    assert {e.config.name: e.token() for e in group} == tokens
    renewals = [e._core.run.keeper.renewals for e in group if e._core.run]  # type: ignore[attr-defined]
    assert len(renewals) == 2000 and min(renewals) >= 3


def test_a_frozen_server_ends_only_the_leases_on_it_at_their_deadlines(
    engine: str, stopper: list[redlease.Elector]
) -> None:
    with RedisServer() as frozen_server, RedisServer() as serving_server:
        frozen_client, serving_client = frozen_server.client(), serving_server.client()
        on_frozen = electors(frozen_client, engine, 50, "f", ttl=1.0)
        on_serving = electors(serving_client, engine, 50, "s", ttl=1.0)
        stopper.extend(on_frozen + on_serving)
        start_all(on_frozen)
        tokens = start_all(on_serving)
        renewed = [e._core.run.keeper.renewed_at for e in on_frozen]  # type: ignore[union-attr]
        frozen_server.pause()
        paused_at = time.monotonic()
        try:
            lost_at: dict[str, float] = {}
            while len(lost_at) < len(on_frozen) and time.monotonic() - paused_at < 5.0:
                for e in on_frozen:
                    if e.config.name not in lost_at and not e.token():
                        lost_at[e.config.name] = time.monotonic()
                time.sleep(0.005)
            serving_tokens = {e.config.name: e.token() or 0 for e in on_serving}
        finally:
            frozen_server.resume()
        assert len(lost_at) == len(on_frozen), "every lease on the frozen server ends"
        # Each at its own deadline: no earlier than a TTL after its last good
        # renewal, and not long after (generous: the machine is shared).
        for e, last in zip(on_frozen, renewed, strict=True):
            ended = lost_at[e.config.name]
            assert ended >= last + 1.0 - 0.02, (e.config.name, ended - last)
            assert ended <= paused_at + 1.0 + 0.5, (e.config.name, ended - paused_at)
        assert serving_tokens == tokens, "the leases on the serving server never noticed"
        stop_all(stopper)
        frozen_client.close()
        serving_client.close()


def test_a_lease_whose_renewal_answers_0_ends_alone(
    client: redis.Redis, engine: str, stopper: list[redlease.Elector]
) -> None:
    group = electors(client, engine, 50, ttl=1.0, renew_interval=0.1)
    stopper.extend(group)
    tokens = start_all(group)
    victim = group[7]
    run = victim._core.run
    assert run is not None
    keeper = run.keeper
    # Somebody else's lease now: the victim's next renewal answers 0.
    client.set("p7:leader", "someone else", px=60_000)
    wait_until(lambda: keeper.state == redlease._engine.LOST, 2.0, what="the victim's loss")
    assert victim.token() is None
    time.sleep(0.3)  # three more renewals of everybody else
    others = {e.config.name: e.token() for e in group if e is not victim}
    assert others == {name: token for name, token in tokens.items() if name != "p7"}


@pytest.mark.parametrize("count", [300])
def test_threads_fds_and_connections_stay_bounded_over_10_rounds_of_start_and_stop_all(
    redis_server: RedisServer, engine: str, count: int, stopper: list[redlease.Elector]
) -> None:
    client = redis_server.client()
    observer = redis_server.client()
    client.ping()
    before_threads, before_fds = threads(), fds()
    before_clients = server_clients(observer)
    group = electors(client, engine, count, ttl=1.0)
    stopper.extend(group)
    peak_threads = peak_clients = 0
    after_first: tuple[int, int] | None = None
    for _ in range(10):
        start_all(group)
        peak_threads = max(peak_threads, threads() - before_threads)
        peak_clients = max(peak_clients, server_clients(observer) - before_clients)
        stop_all(group)
        assert not any(e.token() for e in group)
        if after_first is None:
            after_first = threads(), fds()
    assert peak_threads <= THREADS_ADDED_MAX
    assert peak_clients <= THREADS_ADDED_MAX
    # Nothing grows from round to round (a thread may take a moment to go).
    wait_until(lambda: threads() <= after_first[0], 2.0, what="no thread left over")  # type: ignore[index]
    assert fds() <= after_first[1] + 2  # type: ignore[index]
    assert fds() - before_fds <= 16
    assert not observer.keys("p*:leader")
    client.close()
    observer.close()


def test_a_forked_child_has_no_keeper_thread_and_no_lease(
    client: redis.Redis, engine: str, stopper: list[redlease.Elector]
) -> None:
    group = electors(client, engine, 100, ttl=1.0)
    stopper.extend(group)
    tokens = start_all(group)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        try:
            time.sleep(0.2)
            seen = {
                "threads": threads(),
                "tokens": [e.token() for e in group],
                "writes": [e.fencer().set("fork:value", "child") for e in group[:5]],
            }
            for e in group[:5]:
                e.stop()
            payload = json.dumps(seen).encode()
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)}).encode()
        os.write(write_fd, payload)
        os._exit(0)
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    seen = json.loads(b"".join(chunks))
    assert seen == {"threads": 1, "tokens": [None] * 100, "writes": [False] * 5}
    time.sleep(1.2)  # past a TTL: only the parent's renewals keep the leases
    assert {e.config.name: e.token() for e in group} == tokens
    assert all(client.get(f"p{i}:leader") == group[i].instance_id.encode() for i in range(5))
    assert client.get("fork:value") is None


def test_many_auto_renewed_locks_share_the_keeper_and_each_watchdog_still_sees_its_loss(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client()
    observer = redis_server.client()
    client.ping()
    before_threads, before_clients = threads(), server_clients(observer)
    locker = redlease.RedisLocker(client, engine=engine)
    try:
        held = [locker.acquire(f"job{i}", ttl=1.0, auto_renew=True) for i in range(300)]
        assert threads() - before_threads <= THREADS_ADDED_MAX
        assert server_clients(observer) - before_clients <= THREADS_ADDED_MAX
        time.sleep(1.2)  # past a TTL: only renewals keep them
        assert not any(lock.done.is_set() for lock in held)
        observer.delete(locker.key("job42"))
        assert held[42].done.wait(3.0), "the watchdog of the lost lock fires"
        assert [i for i, lock in enumerate(held) if lock.done.is_set()] == [42]
        for i, lock in enumerate(held):
            if i != 42:
                lock.release()
    finally:
        locker.close()
        client.close()
        observer.close()


def test_followers_that_poll_together_share_a_round_trip_and_each_reads_its_own_reply(
    redis_server: RedisServer, engine: str
) -> None:
    from redlease._engine.process.driver import driver

    client = redis_server.client()
    holders = [redlease.Elector(client, f"batched-{i}", ttl=2.0, engine=engine) for i in range(100)]
    for h in holders[:50]:
        h.start(None)  # the first half of the names have a leader already
    wait_until(lambda: all(h.token() for h in holders[:50]), timeout=10, what="50 leaders")
    followers = [
        redlease.Elector(client, f"batched-{i}", ttl=2.0, engine=engine) for i in range(100)
    ]
    held = HeldDriver()
    try:
        driver().poke(held)
        assert held.holding.wait(10.0)
        before = driver().batched_acquires
        for f in followers:
            f.start(None)  # each first step due now, the driver still held
        held.release()
        # The free half is won by the followers; the held half stays with its leaders.
        wait_until(lambda: all(f.token() for f in followers[50:]), timeout=10, what="50 elections")
        assert not any(f.token() for f in followers[:50])
        assert all(h.token() for h in holders[:50])
        leaders = {i: client.get(f"batched-{i}:leader") for i in range(100)}
        assert all(v == holders[i].instance_id.encode() for i, v in leaders.items() if i < 50)
        assert all(v == followers[i].instance_id.encode() for i, v in leaders.items() if i >= 50)
        # Their first acquires went out together, not one round trip each.
        assert driver().batched_acquires - before >= len(followers)
    finally:
        held.release()
        for e in followers + holders:
            e.stop()
        client.close()


def test_an_evicted_leader_among_many_started_ones_is_re_elected_and_the_others_keep_their_terms(
    client: redis.Redis, engine: str, stopper: list[redlease.Elector]
) -> None:
    # The driver looks only at the leases whose keeper reported a change:
    # the one loss among 200 quiet leases must still reach its run.
    stepped_down: list[str] = []
    group = [
        redlease.Elector(
            client, f"w{i}", ttl=1.0, renew_interval=0.1, engine=engine,
            observer=redlease.Observer(on_stepped_down=lambda i=i: stepped_down.append(f"w{i}")),
        )
        for i in range(200)
    ]  # fmt: skip
    stopper.extend(group)
    tokens = start_all(group)
    victim = group[123]
    redlease.evict(client, "w123")  # its next renewal answers 0
    wait_until(
        lambda: (victim.token() or 0) > tokens["w123"], 5.0, what="the victim's new term"
    )
    assert stepped_down == ["w123"]
    others = {e.config.name: e.token() for e in group if e is not victim}
    assert others == {name: token for name, token in tokens.items() if name != "w123"}


def test_a_native_renewer_lists_each_woken_watched_lease_once_and_no_unwatched_one(
    client: redis.Redis,
) -> None:
    require_native()
    from redlease._election.election import _RENEW
    from redlease._engine import shared_engine

    engine = shared_engine(client, "native")
    watched = [engine.keeper((_RENEW, (f"l{i}",), ("me", 1000)), interval=0.3, ttl=1.0)
               for i in range(3)]  # fmt: skip
    unwatched = engine.keeper((_RENEW, ("l-other",), ("me", 1000)), interval=0.3, ttl=1.0)
    try:
        renewer = unwatched.renewer
        renewer.take_changed()  # whatever other tests left
        for keeper in watched:
            keeper.watch_changes(True)
        for _ in range(3):
            watched[0].notify()
            watched[2].notify()
            unwatched.notify()
        handles, everything = renewer.take_changed()
        assert not everything
        assert sorted(handles) == sorted([watched[0].handle, watched[2].handle])
        assert renewer.take_changed() == ([], False)  # taken: the list starts empty again
        watched[1].notify()
        watched[1].watch_changes(False)  # unwatched before it was taken: not named
        watched[0].notify()
        assert renewer.take_changed() == ([watched[0].handle], False)
    finally:
        for keeper in [*watched, unwatched]:
            keeper.close()
