"""Leadership pushed: a release wakes the waiting contenders and lock waiters at once.

Every test checks what a user sees: how soon a waiting instance takes over
after a release, compared with the poll interval it would otherwise wait
out. The bounds are generous (the tight figures live in
``benchmarks/handover.py``); each is still far below the poll interval, so a
missing notice fails the test. Subscriptions are observed from Redis itself
(``PUBSUB NUMSUB``), never from inside the library.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster, key_slot

import redlease
import redlease.aio
from helpers import Events, elected_token, lock_handover, stays, wait_until
from redlease._engine.rules.timing import NOTICE_CATCH_UP
from redlease._scripts import load as load_script
from redlease._testing import ClusterSet, RedisServer, SentinelSet
from tls_helpers import require_native_tls

pytestmark = pytest.mark.usefixtures("engines_closed")

# With the default TTL (5 s) a follower polls every ~2.5 s and a lock waiter
# below polls every 5 s: a takeover within this bound came from the notice.
PUSHED = 0.5


def subscribers(client: Any, channel: str) -> int:
    """How many connections of the server listen on ``channel``."""
    return int(client.pubsub_numsub(channel)[0][1])


def wait_subscribed(client: Any, channel: str, count: int = 1) -> None:
    wait_until(
        lambda: subscribers(client, channel) >= count,
        timeout=5,
        what=f"{count} subscriber(s) on {channel}",
    )


def follower_ready(elector: redlease.Elector, events: Events, client: Any) -> None:
    """Wait until ``elector`` follows and its release notices are subscribed."""
    wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower role")
    wait_subscribed(client, f"{elector.config.name}:leader:released")


def timed_handover(release: Any, successor: redlease.Elector) -> float:
    start = time.monotonic()
    release()
    wait_until(successor.token, timeout=10, interval=0.001, what="the successor's election")
    return time.monotonic() - start


# -- handover on a single server ------------------------------------------------------


def test_a_follower_takes_over_at_once_when_the_leader_resigns(
    client: redis.Redis, engine: str
) -> None:
    leader = redlease.Elector(client, "pushed", engine=engine)  # default TTL: 5 s
    events = Events()
    follower = redlease.Elector(client, "pushed", engine=engine, observer=events.observer())
    with leader:
        elected_token(leader)
        with follower:
            follower_ready(follower, events, client)
            took = timed_handover(leader.resign, follower)
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_a_follower_takes_over_at_once_when_the_leader_stops(
    client: redis.Redis, engine: str
) -> None:
    leader = redlease.Elector(client, "stopped", engine=engine)
    events = Events()
    follower = redlease.Elector(client, "stopped", engine=engine, observer=events.observer())
    leader.start()
    elected_token(leader)
    with follower:
        follower_ready(follower, events, client)
        took = timed_handover(leader.stop, follower)
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_a_follower_whose_notice_connection_was_quiet_for_long_still_takes_over_at_once(
    client: redis.Redis, engine: str
) -> None:
    # A listener bounds the reading of each message it gets; the quiet wait
    # for the next one must not inherit that bound (past it, the connection
    # would hear nothing until it is found silent and reconnected).
    leader = redlease.Elector(client, "quiet", ttl=30, engine=engine)
    events = Events()
    follower = redlease.Elector(
        client, "quiet", ttl=30, acquire_interval=15, engine=engine, observer=events.observer()
    )
    with leader:
        elected_token(leader)
        with follower:
            follower_ready(follower, events, client)
            time.sleep(6.5)  # past the 5 s bound of the last message read (the subscribe)
            took = timed_handover(leader.resign, follower)
    assert took < PUSHED, f"handover took {took:.3f} s; the follower's next poll was 8 s away"


def test_a_successor_that_resigns_at_once_hands_back_at_once(
    client: redis.Redis, engine: str
) -> None:
    elected: list[tuple[str, float]] = []
    events = Events()

    def elector(me: str, **extra: Any) -> redlease.Elector:
        def on_elected(_token: int) -> None:
            elected.append((me, time.monotonic()))
            if me == "b" and len(elected) == 2:
                b.resign()  # b's first term ends as soon as it begins

        observer = redlease.Observer(on_elected=on_elected, **extra)
        return redlease.Elector(client, "back", instance_id=me, engine=engine, observer=observer)

    a = elector("a")
    b = elector("b", on_follower=lambda: events.record("follower"))
    with a:
        elected_token(a)
        with b:
            follower_ready(b, events, client)
            start = time.monotonic()
            a.resign()  # a rests for ~2.5 s unless b's release wakes it
            wait_until(lambda: len(elected) >= 3, timeout=10, what="a's second term")
    assert [who for who, _ in elected[:3]] == ["a", "b", "a"]
    took = elected[2][1] - start
    assert took < PUSHED, f"a took the lease back after {took:.3f} s"


def test_a_follower_that_replaces_a_stopped_one_at_once_still_takes_over_at_once(
    client: redis.Redis, engine: str
) -> None:
    # A channel given up is unsubscribed a moment later, not at once: one
    # wanted again meanwhile must stay subscribed (the UNSUBSCRIBE goes
    # first, the SUBSCRIBE after it).
    leader = redlease.Elector(client, "replaced", engine=engine)
    events = Events()
    first = redlease.Elector(client, "replaced", engine=engine, observer=events.observer())
    second_events = Events()
    second = redlease.Elector(
        client, "replaced", engine=engine, observer=second_events.observer()
    )
    with leader:
        elected_token(leader)
        first.start()
        follower_ready(first, events, client)
        first.stop()
        with second:
            follower_ready(second, second_events, client)
            time.sleep(0.3)  # past the moment the first one's UNSUBSCRIBE is sent
            assert subscribers(client, "replaced:leader:released") == 1
            took = timed_handover(leader.resign, second)
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_a_started_leader_stops_listening_while_it_leads_and_listens_again_after_its_term(
    client: redis.Redis, engine: str
) -> None:
    # The lease is its own while it leads: no notice is news to it, and its
    # stop then releases with nobody of this process listening.
    channel = "quiet-leader:leader:released"
    leader = redlease.Elector(client, "quiet-leader", engine=engine)
    with leader:
        first = elected_token(leader)
        wait_until(lambda: subscribers(client, channel) == 0, timeout=5, what="no subscriber")
        leader.resign()  # resting after its term: a successor's release must wake it
        wait_subscribed(client, channel)
        # It listens again before it releases, so its old term may still be
        # showing here: wait for the next one.
        wait_until(lambda: (leader.token() or 0) > first, timeout=10, what="its next term")
        wait_until(lambda: subscribers(client, channel) == 0, timeout=5, what="no subscriber")


def test_a_killed_notice_connection_still_hands_over_and_comes_back(
    client: redis.Redis, engine: str
) -> None:
    leader = redlease.Elector(client, "killed", ttl=1.0, engine=engine)
    events = Events()
    follower = redlease.Elector(
        client, "killed", ttl=1.0, engine=engine, observer=events.observer()
    )
    with leader:
        elected_token(leader)
        with follower:
            follower_ready(follower, events, client)
            assert client.client_kill_filter(_type="pubsub") >= 1
            took = timed_handover(leader.resign, follower)
            # The notice may be lost with the connection: polling (every
            # ~0.5 s at this TTL) takes over, well within one TTL.
            assert took < 1.0
            wait_subscribed(client, "killed:leader:released")  # reconnected


def test_a_release_before_a_new_follower_listens_is_found_by_its_second_look(
    client: redis.Redis, engine: str
) -> None:
    # A started run listens only once it follows: a release between its first
    # acquire and its subscription is heard by nobody. Here the holder lets go
    # (silently) at the very moment the run learns it follows, before it
    # subscribes; its second look, not its poll some 13 s away, takes over.
    client.set("late:leader", "a-silent-holder", px=30_000)
    events = Events()
    follower = redlease.Elector(
        client,
        "late",
        ttl=30,
        acquire_interval=15,
        engine=engine,
        observer=events.observer(
            on_follower=lambda: (client.delete("late:leader"), events.record("follower"))
        ),
    )
    with follower:
        started = time.monotonic()
        wait_until(follower.token, timeout=10, interval=0.005, what="the follower's election")
        took = time.monotonic() - started
    assert events.count("follower") == 1
    assert took < 3.0, f"took over {took:.3f} s after it started"


def acquires_seen(
    server: RedisServer, iid: str, ttl_ms: int, seconds: float, on: threading.Event
) -> list[float]:
    """The server's times (MONITOR) of every acquire by ``iid`` for ``seconds``; ``on``
    is set once MONITOR is on."""
    # An acquire is the only script a follower sends with (instance id, TTL in
    # ms) as its arguments (MONITOR as redis-py reads it: unquoted).
    tail = f" {iid} {ttl_ms}"
    seen: list[float] = []
    watcher = server.client(socket_timeout=seconds + 5)
    try:
        with watcher.monitor() as monitor:
            on.set()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                command = monitor.next_command()
                text = command["command"]
                if text.startswith(("EVALSHA ", "EVAL ")) and text.endswith(tail):
                    seen.append(float(command["time"]))
    finally:
        watcher.close()
    return seen


def test_a_new_followers_second_look_keeps_its_acquire_cadence(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    # Acquire cadence: a follower's acquires are at least 0.9 x acquire_interval
    # apart. The second look after its first subscription is a read of the
    # lease, not an acquire 50 ms after the first.
    client.set("cadence:leader", "a-holder", px=30_000)
    # Loaded beforehand: every acquire is one EVALSHA, none a NOSCRIPT and its EVAL.
    client.script_load(load_script("acquire").source)
    interval = 0.1
    follower = redlease.Elector(client, "cadence", ttl=5, acquire_interval=interval, engine=engine)
    iid, ttl_ms = follower.config.instance_id, follower.config.ttl_ms
    times: list[float] = []
    on = threading.Event()
    watching = threading.Thread(
        target=lambda: times.extend(acquires_seen(redis_server, iid, ttl_ms, 1.5, on)),
        daemon=True,
    )
    watching.start()
    assert on.wait(5)
    with follower:
        watching.join(10)
        assert not follower.token()
    assert len(times) >= 5, times  # it kept polling
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # The server stamps commands to the microsecond: the tolerance is its clock's.
    assert min(gaps) >= 0.9 * interval - 0.001, [round(g, 4) for g in gaps]


def test_a_started_follower_looks_again_when_its_notice_connection_comes_back(
    client: redis.Redis, engine: str
) -> None:
    # A holder that never announces its release: only the "look again" after
    # a reconnect (notices may have been lost meanwhile) wakes the follower.
    client.set("again:leader", "a-silent-holder", px=30_000)
    events = Events()
    follower = redlease.Elector(
        client, "again", ttl=30, acquire_interval=15, engine=engine, observer=events.observer()
    )
    with follower:
        follower_ready(follower, events, client)
        # Past its second look, which follows its first subscription.
        time.sleep(NOTICE_CATCH_UP * 6)
        client.delete("again:leader")
        assert stays(lambda: not follower.token(), 0.3)  # no notice: it waits for its poll
        killed = time.monotonic()
        assert client.client_kill_filter(_type="pubsub") >= 1
        wait_until(follower.token, timeout=10, interval=0.005, what="the follower's election")
        took = time.monotonic() - killed
        follower.resign()  # a leader does not listen; resting after its term, it does
        wait_subscribed(client, "again:leader:released")  # listening again
    # Its next poll was some 13 s away.
    assert took < 3.0, f"took over {took:.3f} s after the connection was killed"


def test_a_follower_whose_notices_are_refused_still_takes_over_by_polling(
    client: redis.Redis, engine: str
) -> None:
    # This user may not subscribe: every notice is lost, polling remains.
    client.acl_setuser(
        "nosub", enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
        commands=["+@all", "-@pubsub", "+publish"],
    )  # fmt: skip
    kwargs = client.connection_pool.connection_kwargs
    muted = redis.Redis(
        host=kwargs["host"], port=kwargs["port"], username="nosub", password="pw", socket_timeout=5
    )
    leader = redlease.Elector(client, "muted", ttl=1.0, engine=engine)
    events = Events()
    follower = redlease.Elector(muted, "muted", ttl=1.0, engine=engine, observer=events.observer())
    with leader:
        elected_token(leader)
        with follower:
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower role")
            # Only the leader's own listener (another user, another connection) is in.
            assert stays(lambda: subscribers(client, "muted:leader:released") <= 1, 0.3)
            took = timed_handover(leader.resign, follower)
    assert took < 1.0, f"polling every ~0.5 s should take over within 1 s, took {took:.3f} s"
    muted.close()


def test_every_waiter_of_a_process_shares_one_subscription_connection(
    client: redis.Redis, engine: str
) -> None:
    # Every kind of waiter at once: started runs (steps of the driver), a
    # run() on a thread of its own, and a lock waiter.
    electors = [redlease.Elector(client, "shared", engine=engine) for _ in range(3)]
    events = Events()
    threaded = redlease.Elector(client, "shared", engine=engine, observer=events.observer())
    stop_threaded = threading.Event()
    runner = threading.Thread(target=threaded.run, kwargs={"stop": stop_threaded})
    locker = redlease.RedisLocker(client, engine=engine)
    held = locker.acquire("shared-lock", ttl=30)
    waiter = threading.Thread(
        target=lambda: locker.acquire("shared-lock", ttl=30, wait=20).release()
    )
    for e in electors:
        e.start()
    try:
        elected = wait_until(
            lambda: next((e for e in electors if e.token()), None), timeout=5, what="a leader"
        )
        runner.start()
        waiter.start()
        wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the threaded follower")
        wait_subscribed(client, "shared:leader:released")
        wait_subscribed(client, locker.key("shared-lock") + ":released")
        time.sleep(0.2)
        assert subscribers(client, "shared:leader:released") == 1
        pubsub_clients = [c for c in client.client_list() if "P" in c["flags"]]
        # One connection for the whole process on either engine: on the
        # native engine the started runs hear their notices through the
        # native reader too (it rings the driver), as the threads do.
        assert len(pubsub_clients) == 1
        # And that one connection still carries every kind's notices.
        elected.stop()
        wait_until(
            lambda: threaded.token() or any(e.token() for e in electors if e is not elected),
            timeout=PUSHED * 2,
            what="a successor woken by the notice",
        )
    finally:
        held.release()
        waiter.join(10)
        stop_threaded.set()
        runner.join(10)
        for e in electors:
            e.stop()
        locker.close()
    assert not waiter.is_alive() and not runner.is_alive()


def test_a_follower_over_tls_takes_over_at_once(tls_server: RedisServer, engine: str) -> None:
    if engine == "native":
        require_native_tls()
    tls_engine = engine
    client = tls_server.client(socket_timeout=5)
    leader = redlease.Elector(client, "tls-push", engine=tls_engine)
    events = Events()
    follower = redlease.Elector(client, "tls-push", engine=tls_engine, observer=events.observer())
    with leader:
        elected_token(leader)
        with follower:
            follower_ready(follower, events, client)
            took = timed_handover(leader.resign, follower)
    client.close()
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


# -- who leads: leader() and on_new_leader -------------------------------------------


def test_leader_of_an_empty_name_is_none(client: redis.Redis, engine: str) -> None:
    assert redlease.Elector(client, "nobody", engine=engine).leader() is None


def test_leader_names_the_holder_and_its_remaining_ttl(client: redis.Redis, engine: str) -> None:
    leader = redlease.Elector(client, "who", ttl=2.0, instance_id="node-a", engine=engine)
    asker = redlease.Elector(client, "who", ttl=2.0, instance_id="node-b", engine=engine)
    with leader:
        elected_token(leader)
        seen = asker.leader()
        assert isinstance(seen, redlease.Leader)
        assert seen.instance_id == "node-a"
        assert 0 < seen.ttl_ms <= 2000
    assert asker.leader() is None  # released on stop


def test_aio_leader_names_the_holder(client: redis.Redis, engine: str) -> None:
    kwargs = client.connection_pool.connection_kwargs

    async def main() -> tuple[redlease.Leader | None, redlease.Leader | None]:
        aclient = redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])
        e = redlease.aio.Elector(aclient, "aio-who", ttl=1.0, instance_id="aio-a", engine=engine)
        before = await e.leader()
        async with e:
            while e.token() is None:
                await asyncio.sleep(0.005)
            during = await e.leader()
        await aclient.aclose()
        return before, during

    before, during = asyncio.run(main())
    assert before is None
    assert during is not None and during.instance_id == "aio-a"


def test_on_new_leader_reports_each_holder_in_order_across_three_handovers(
    client: redis.Redis, engine: str
) -> None:
    seen: dict[str, list[str]] = {"a": [], "b": []}
    follower_events = Events()

    def elector(me: str, **extra: Any) -> redlease.Elector:
        observer = redlease.Observer(on_new_leader=seen[me].append, **extra)
        return redlease.Elector(
            client, "seen", ttl=1.0, instance_id=me, engine=engine, observer=observer
        )

    a = elector("a")
    b = elector("b", on_follower=lambda: follower_events.record("follower"))
    with a:
        elected_token(a)
        with b:
            follower_ready(b, follower_events, client)
            for resigning, successor in ((a, b), (b, a), (a, b)):
                resigning.resign()
                wait_until(successor.token, timeout=5, what=f"{successor.instance_id} leads")
            wait_until(lambda: len(seen["a"]) >= 4, timeout=5, what="a to see b lead again")
            assert seen["b"] == ["a", "b", "a", "b"]
            assert seen["a"] == ["a", "b", "a", "b"]


def test_on_new_leader_includes_this_instance_and_is_not_repeated(
    client: redis.Redis, engine: str
) -> None:
    seen: list[str] = []
    e = redlease.Elector(
        client, "self", ttl=0.3, instance_id="me", engine=engine,
        observer=redlease.Observer(on_new_leader=seen.append),
    )  # fmt: skip
    with e:
        elected_token(e)
        time.sleep(0.5)  # renewals, no new holder
    assert seen == ["me"]


# -- lock waiters ----------------------------------------------------------------------


def test_a_waiting_lock_acquire_gets_a_released_lock_at_once(
    client: redis.Redis, engine: str
) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    took = lock_handover(
        locker, "job", lambda: wait_subscribed(client, locker.key("job") + ":released")
    )
    locker.close()
    assert took < PUSHED, f"the waiter took {took:.3f} s; polling alone waits up to 5 s"


def test_a_lock_waiter_stops_listening_once_it_gives_up(client: redis.Redis, engine: str) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    held = locker.acquire("busy", ttl=30)
    with pytest.raises(redlease.NotAcquired):
        locker.acquire("busy", ttl=30, wait=0.3, retry_interval=0.1)
    channel = locker.key("busy") + ":released"
    wait_until(lambda: subscribers(client, channel) == 0, timeout=5, what="the unsubscribe")
    held.release()
    locker.close()


# -- Sentinel and Cluster ----------------------------------------------------------------


def test_sentinel_follower_takes_over_at_once(sentinel_set: SentinelSet, engine: str) -> None:
    client = sentinel_set.master_for(socket_timeout=2)
    leader = redlease.Elector(client, "sentinel-push", engine=engine)
    events = Events()
    follower = redlease.Elector(client, "sentinel-push", engine=engine, observer=events.observer())
    with leader:
        elected_token(leader)
        with follower:
            follower_ready(follower, events, client)
            took = timed_handover(leader.resign, follower)
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_cluster_follower_takes_over_at_once_by_a_notice_in_the_names_slot(
    cluster_set: ClusterSet, engine: str
) -> None:
    client: RedisCluster = cluster_set.client(socket_timeout=2)
    name = "{pushed}"
    channel = f"{name}:leader:released"
    node = client.get_node_from_key(channel)

    version = client.execute_command("INFO", "server", target_nodes=node)["redis_version"]
    # Redis 7 carries the notice in the slot (SSUBSCRIBE on the slot's owner);
    # before 7 a cluster broadcasts a PUBLISH, heard on the same node.
    sharded = int(str(version).split(".")[0]) >= 7
    numsub = "PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB"

    def shard_subscribers() -> int:
        reply = client.execute_command(numsub, channel, target_nodes=node)
        if isinstance(reply, dict):
            return int(reply.get(channel.encode(), reply.get(channel, 0)))
        if reply and isinstance(reply[0], (list, tuple)):
            reply = reply[0]  # [(channel, count)]
        return int(reply[1])

    leader = redlease.Elector(client, name, engine=engine)
    events = Events()
    follower = redlease.Elector(client, name, engine=engine, observer=events.observer())
    with leader:
        elected_token(leader)
        with follower:
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower")
            wait_until(lambda: shard_subscribers() >= 1, timeout=5, what="a listener on the owner")
            took = timed_handover(leader.resign, follower)
    client.close()
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_cluster_lock_waiter_gets_a_released_lock_at_once(
    cluster_set: ClusterSet, engine: str
) -> None:
    client: RedisCluster = cluster_set.client(socket_timeout=2)
    locker = redlease.RedisLocker(client, prefix="{pushlocks}:", engine=engine)
    held = locker.acquire("job", ttl=30)
    got: list[float] = []

    def waiter() -> None:
        second = locker.acquire("job", ttl=30, wait=20, retry_interval=5)
        got.append(time.monotonic())
        second.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.3)  # the waiter's first attempt failed and it listens
    released_at = time.monotonic()
    held.release()
    thread.join(10)
    locker.close()
    client.close()
    assert got, "the waiter never got the lock"
    assert got[0] - released_at < PUSHED


def listeners_on(node: redis.Redis, channel: str) -> int:
    """Subscribers of ``channel`` on one cluster node (sharded on Redis 7+)."""
    sharded = int(str(node.info("server")["redis_version"]).split(".")[0]) >= 7
    reply = node.execute_command("PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB", channel)
    if isinstance(reply, dict):
        return int(next(iter(reply.values()), 0))
    if reply and isinstance(reply[0], (list, tuple)):
        reply = reply[0]
    return int(reply[1])


def test_cluster_notices_follow_the_names_slot_when_its_master_dies(
    cluster_set_fresh: ClusterSet, engine: str
) -> None:
    client: RedisCluster = cluster_set_fresh.client(socket_timeout=2)
    name = "{moving}"
    slot = client.keyslot(name)
    errors: dict[str, list[float]] = {"a": [], "b": []}

    def elector(me: str) -> redlease.Elector:
        observer = redlease.Observer(on_error=lambda _exc: errors[me].append(time.monotonic()))
        return redlease.Elector(client, name, instance_id=me, engine=engine, observer=observer)

    def settled() -> bool:
        # A leader again, and neither instance in its error backoff (capped at the TTL).
        last = max([0.0, *errors["a"], *errors["b"]])
        return bool(a.token() or b.token()) and time.monotonic() - last > 5.5

    a, b = elector("a"), elector("b")  # TTL 5 s: a follower polls every ~2.5 s
    with a:
        elected_token(a)
        with b:
            time.sleep(0.3)  # b follows and listens on the slot's master
            cluster_set_fresh.kill_master(slot)  # the listener must move to the new master
            wait_until(settled, timeout=30, interval=0.1, what="a leader, errors over")
            owner = cluster_set_fresh.master_for_slot(slot).client()
            wait_until(
                lambda: listeners_on(owner, f"{name}:leader:released"),
                timeout=10,
                what="the listener re-homed to the new master",
            )
            owner.close()
            leader, follower = (a, b) if a.token() else (b, a)
            took = timed_handover(leader.resign, follower)
    client.close()
    assert took < PUSHED, f"handover after the failover took {took:.3f} s"


def test_aio_lock_waiter_gets_a_released_lock_at_once(client: redis.Redis, engine: str) -> None:
    kwargs = client.connection_pool.connection_kwargs

    async def main() -> float:
        aclient = redis.asyncio.Redis(host=kwargs["host"], port=kwargs["port"])
        locker = redlease.aio.RedisLocker(aclient, engine=engine)
        held = await locker.acquire("aio-job", ttl=30)
        waiter = asyncio.ensure_future(locker.acquire("aio-job", ttl=30, wait=20, retry_interval=5))
        channel = "redlease:lock:key:aio-job:released"  # the default prefix
        while subscribers(client, channel) < 1:
            await asyncio.sleep(0.01)
        released_at = time.monotonic()
        await held.release()
        second = await asyncio.wait_for(waiter, 10)
        took = time.monotonic() - released_at
        await second.release()
        await locker.close()
        await aclient.aclose()
        return took

    took = asyncio.run(main())
    assert took < PUSHED, f"the aio waiter took {took:.3f} s; polling alone waits up to 5 s"


def test_cluster_notices_of_names_in_different_slots_of_one_node_come_back_after_a_reconnect(
    cluster7_set_fresh: ClusterSet, engine: str
) -> None:
    # On Redis 7 one SSUBSCRIBE may name channels of one slot only: a
    # listener that subscribes again after a reconnect must ask per channel.
    cluster = cluster7_set_fresh
    client: RedisCluster = cluster.client(socket_timeout=2)
    by_node: dict[int, list[str]] = {}
    for i in range(200):
        name = f"{{slots{i}}}"
        port = cluster.master_for_slot(key_slot(name.encode())).port or 0
        by_node.setdefault(port, []).append(name)
        if len(by_node[port]) == 2:
            names = by_node[port]
            node = cluster.master_for_slot(key_slot(names[0].encode()))
            break
    assert key_slot(names[0].encode()) != key_slot(names[1].encode())
    node_client = node.client()

    def subscribed(channel: str) -> bool:
        reply = node_client.execute_command("PUBSUB", "SHARDNUMSUB", channel)
        if isinstance(reply, dict):
            count = reply.get(channel.encode(), reply.get(channel, 0))
        elif reply and isinstance(reply[0], (list, tuple)):
            count = reply[0][1]  # [(channel, count)]
        else:
            count = reply[1]  # [channel, count]
        return int(count) >= 1

    pairs = []
    try:
        for name in names:
            leader = redlease.Elector(client, name, engine=engine, ttl=10.0)
            events = Events()
            follower = redlease.Elector(
                client, name, engine=engine, ttl=10.0, observer=events.observer()
            )
            leader.start()
            elected_token(leader)
            follower.start()
            wait_until(lambda e=events: e.count("follower") >= 1, timeout=5, what="a follower")
            pairs.append((leader, follower))
        channels = [f"{name}:leader:released" for name in names]
        wait_until(lambda: all(subscribed(c) for c in channels), 5, what="both subscribed")
        assert node_client.client_kill_filter(_type="pubsub") >= 1
        wait_until(
            lambda: all(subscribed(c) for c in channels), 10, what="both subscribed again"
        )
        for leader, follower in pairs:
            took = timed_handover(leader.resign, follower)
            # Polling alone would wait up to half the 10 s TTL.
            assert took < PUSHED, f"handover took {took:.3f} s"
    finally:
        for leader, follower in pairs:
            follower.stop()
            leader.stop()
        node_client.close()
        client.close()
