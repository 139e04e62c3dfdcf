"""On the native engine a Redis Cluster's release notices are read natively too.

A notice travels in its name's slot (SSUBSCRIBE on the slot's master), and
the native engine hears it on a native reader per node that owns a
listened-to slot, without the GIL: a follower is woken while another thread
of the process holds the GIL, as on a single server. When the slot moves (a
migration, a failover) the subscription moves with it. The behaviour both
engines share on a cluster is specified in test_notices.py.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

import redlease
from helpers import (
    BlackHole,
    Events,
    elected_token,
    lock_handover,
    release_during_a_gil_hold,
    require_native,
    wait_until,
)
from redlease._engine.notices.nativenotices import NativeSubscription
from redlease._testing import ClusterSet
from redlease._testing.notices import native_hubs, python_hubs
from tls_helpers import require_native_tls
from topology_helpers import close_all_engines

pytestmark = pytest.mark.skipif(not hasattr(os, "eventfd"), reason="needs os.eventfd (Linux)")

# A follower polls every ~2.5 s at the default TTL (5 s): a takeover within
# this bound came from the notice.
PUSHED = 0.5


@pytest.fixture(autouse=True)
def _native_and_closed() -> Iterator[None]:
    require_native()
    yield
    close_all_engines()


def listeners_on(cluster: ClusterSet, slot: int, channel: str) -> int:
    """Subscribers of ``channel`` on the master of ``slot`` (sharded on Redis 7+)."""
    node = cluster.master_for_slot(slot).client()
    try:
        sharded = int(str(node.info("server")["redis_version"]).split(".")[0]) >= 7
        reply = node.execute_command("PUBSUB SHARDNUMSUB" if sharded else "PUBSUB NUMSUB", channel)
    finally:
        node.close()
    if isinstance(reply, dict):
        return int(next(iter(reply.values()), 0))
    if reply and isinstance(reply[0], (list, tuple)):
        reply = reply[0]
    return int(reply[1])


def sharded(cluster: ClusterSet) -> bool:
    """Whether the cluster's servers have sharded pub/sub (Redis 7+)."""
    node = cluster.masters()[0].client()
    try:
        return int(str(node.info("server")["redis_version"]).split(".")[0]) >= 7
    finally:
        node.close()


def native_cluster_hubs() -> list[Any]:
    """The native hubs of this process that listen on a cluster node."""
    return native_hubs(sharded=True)


def timed_handover(release: Any, successor: redlease.Elector) -> float:
    start = time.monotonic()
    release()
    wait_until(successor.token, timeout=10, interval=0.001, what="the successor's election")
    return time.monotonic() - start


# A leader in another process (Python engine, the cluster through one of its
# nodes): it leads, then on "go" waits a moment (well inside the waiting
# process's GIL-holding call) and releases; with a doorbell fd it checks the
# waiting process's driver doorbell is quiet before and watches it until rung.
_RELEASER = textwrap.dedent(
    """
    import sys, time, redlease
    from redis.cluster import RedisCluster
    port, name, pid, fd = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])

    def doorbell() -> int:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            return int(f.read().split("eventfd-count:")[1].split()[0], 16)

    leader = redlease.Elector(RedisCluster(host="127.0.0.1", port=port), name, ttl=30,
                              engine="python", instance_id="the-other-process")
    leader.start()
    while not leader.token():
        time.sleep(0.01)
    print("leading", flush=True)
    sys.stdin.readline()
    time.sleep(0.3)
    before = doorbell() if fd >= 0 else 0
    released = time.monotonic()
    leader.stop()
    while fd >= 0 and doorbell() == 0:
        time.sleep(0.0005)
    print(before, released, time.monotonic(), flush=True)
    """
)


def _releaser(cluster: ClusterSet, name: str, doorbell: int = -1) -> subprocess.Popen[str]:
    port = cluster.masters()[0].port
    return subprocess.Popen(
        [sys.executable, "-c", _RELEASER, str(port), name, str(os.getpid()), str(doorbell)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _woken_during_a_gil_hold(
    cluster: ClusterSet, name: str, driven: bool
) -> tuple[float, float, float, float, float, list[float]]:
    """A follower (threaded or started) of a leader in another process, woken while the GIL is held.

    Returns when its subscription's latest notice was read natively, the
    hold's start and end, the release time, the time the doorbell was seen
    rung (0.0 when not watched) and when the follower was elected.
    """
    from redlease._engine.process.driver import driver

    doorbell = driver().doorbell() if driven else -1
    client: RedisCluster = cluster.client(socket_timeout=2)
    releaser = _releaser(cluster, name, doorbell)
    elected: list[float] = []
    # Without a notice this follower would take over only at its next poll,
    # some 13 s after the release (the leader's TTL is 30 s).
    follower = redlease.Elector(
        client,
        name,
        ttl=30,
        acquire_interval=15,
        engine="native",
        observer=redlease.Observer(on_elected=lambda _t: elected.append(time.monotonic())),
    )
    stop = threading.Event()
    runner = threading.Thread(target=follower.run, kwargs={"stop": stop}, daemon=True)
    slot = client.keyslot(name)
    try:
        assert releaser.stdout is not None and releaser.stdin is not None
        assert releaser.stdout.readline().strip() == "leading"
        if driven:
            follower.start()
        else:
            runner.start()
        wait_until(
            lambda: listeners_on(cluster, slot, f"{name}:leader:released") >= 1,
            timeout=5,
            what="a listener on the slot's master",
        )
        time.sleep(0.2)  # its first acquire lost: the follower sleeps until the next poll
        run = follower._core.run
        assert run is not None
        notices = run.driven.notices if driven else run.notices
        # Heard by a native reader on the slot's master, not by a Python listener.
        assert isinstance(notices, NativeSubscription)
        assert not python_hubs()
        assert native_cluster_hubs()
        hog_started, hog_ended, before, released, rung = release_during_a_gil_hold(releaser)
        wait_until(lambda: elected, timeout=10, what="the follower's election")
        # Before it stops: its own release, when it stops, is a notice too.
        read = notices.last_notice
    finally:
        releaser.kill()
        releaser.wait()
        stop.set()
        if driven:
            follower.stop()
        else:
            runner.join(10)
        client.close()
    assert before == 0, "the driver's doorbell was already rung before the release"
    return read, hog_started, hog_ended, released, rung, elected


def test_a_threaded_cluster_follower_hears_its_notice_natively_while_the_gil_is_held(
    cluster_set: ClusterSet,
) -> None:
    read, hog_started, hog_ended, released, _, elected = _woken_during_a_gil_hold(
        cluster_set, "{gil-run}", driven=False
    )
    assert hog_started < released, "the release came before the GIL-holding call"
    # Read by the native reader (and the follower's eventfd written) while
    # the GIL was held: a Python listener could not have run meanwhile.
    assert released < read < hog_ended, (
        f"the notice was read after the GIL came free: hold {hog_started:.3f}-{hog_ended:.3f},"
        f" released {released:.3f}, read {read:.3f}"
    )
    assert elected[0] - hog_ended < 2.0, f"took over {elected[0] - hog_ended:.3f} s after the hold"


def test_a_started_cluster_follower_hears_its_notice_natively_while_the_gil_is_held(
    cluster_set: ClusterSet,
) -> None:
    read, hog_started, hog_ended, released, rung, elected = _woken_during_a_gil_hold(
        cluster_set, "{gil-start}", driven=True
    )
    assert hog_started < released, "the release came before the GIL-holding call"
    assert released < read < hog_ended, "the notice was read after the GIL came free"
    assert rung < hog_ended, "the driver's doorbell was rung only after the GIL came free"
    assert elected[0] - hog_ended < 2.0, f"took over {elected[0] - hog_ended:.3f} s after the hold"


def _pair(client: RedisCluster, name: str) -> tuple[redlease.Elector, redlease.Elector, Events]:
    """Two native electors of ``name``: ``a`` to lead first, ``b`` to follow (its events)."""
    events = Events()
    a = redlease.Elector(client, name, instance_id="a", engine="native")
    b = redlease.Elector(client, name, instance_id="b", engine="native", observer=events.observer())
    return a, b, events


@pytest.mark.parametrize("topology", ["cluster_set", "tls_cluster_set"])
def test_a_native_cluster_handover_after_resign_is_pushed(
    topology: str, request: pytest.FixtureRequest
) -> None:
    if topology.startswith("tls"):
        require_native_tls()
    # On a TLS cluster the reader connects to the slot's master over TLS too.
    cluster_set: ClusterSet = request.getfixturevalue(topology)
    client = cluster_set.client(socket_timeout=2)
    name = "{native-pushed}"
    slot = client.keyslot(name)
    a, b, events = _pair(client, name)
    with a:
        elected_token(a)
        with b:
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower")
            wait_until(
                lambda: listeners_on(cluster_set, slot, f"{name}:leader:released") >= 1,
                timeout=5,
                what="a listener on the slot's master",
            )
            assert native_cluster_hubs() and not python_hubs()
            # SSUBSCRIBE on Redis 7+; SUBSCRIBE after "unknown command" before.
            expected = sharded(cluster_set)
            for hub in native_cluster_hubs():
                wait_until(lambda hub=hub: hub.sharded == expected, 5, what="the subscribe command")
            took = timed_handover(a.resign, b)
    client.close()
    assert took < PUSHED, f"handover took {took:.3f} s; polling alone waits up to 2.5 s"


def test_a_native_cluster_lock_waiter_hears_the_release_natively(cluster_set: ClusterSet) -> None:
    client = cluster_set.client(socket_timeout=2)
    locker = redlease.RedisLocker(client, prefix="{native-locks}:", engine="native")

    def listening() -> None:
        wait_until(native_cluster_hubs, timeout=5, what="the waiter's native hub")
        time.sleep(0.3)  # the waiter's first attempt failed and it listens

    took = lock_handover(locker, "job", listening)
    assert not python_hubs(), "the lock waiter listened through the Python listener"
    locker.close()
    client.close()
    assert took < PUSHED


@contextlib.contextmanager
def _following(elector: redlease.Elector, threaded: bool) -> Iterator[None]:
    """``elector`` runs meanwhile: on a thread of its own (``run()``) or started."""
    if not threaded:
        with elector:
            yield
        return
    stop = threading.Event()
    runner = threading.Thread(target=elector.run, kwargs={"stop": stop}, daemon=True)
    runner.start()
    try:
        yield
    finally:
        stop.set()
        runner.join(10)
    assert not runner.is_alive(), "the run did not end"


def _follows_the_slot(
    cluster: ClusterSet, name: str, move: Any, *, threaded: bool = False
) -> float:
    """Handover time after ``move(slot)`` moved the slot elsewhere (returning its new owner).

    ``threaded``: the follower runs ``run()`` on a thread, else it is started.
    """
    client = cluster.client(socket_timeout=2)
    slot = client.keyslot(name)
    channel = f"{name}:leader:released"
    a, b, events = _pair(client, name)
    with a:
        elected_token(a)
        with _following(b, threaded):
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower")
            wait_until(
                lambda: listeners_on(cluster, slot, channel) >= 1, timeout=5, what="a listener"
            )
            first = cluster.master_for_slot(slot)
            owner = move(slot)
            assert owner is not first
            if sharded(cluster):
                # Before 7 a PUBLISH reaches every node: the listener stays put.
                wait_until(
                    lambda: listeners_on(cluster, slot, channel) >= 1,
                    timeout=15,
                    what="the listener re-homed to the slot's new master",
                )
            wait_until(lambda: bool(a.token() or b.token()), timeout=30, what="a leader again")
            time.sleep(0.5)
            leader, follower = (a, b) if a.token() else (b, a)
            took = timed_handover(leader.resign, follower)
    assert not python_hubs(), "a Python listener was used"
    client.close()
    return took


@pytest.mark.parametrize("follower", ["started", "threaded"])
def test_a_native_cluster_notice_arrives_after_the_slot_migrates(
    cluster_set_fresh: ClusterSet, follower: str
) -> None:
    def migrate(slot: int) -> Any:
        owner = cluster_set_fresh.master_for_slot(slot)
        target = next(m for m in cluster_set_fresh.masters() if m is not owner)
        cluster_set_fresh.migrate_slot(slot, target)
        return target

    took = _follows_the_slot(
        cluster_set_fresh, "{migrating}", migrate, threaded=follower == "threaded"
    )
    assert took < PUSHED, f"handover after the migration took {took:.3f} s"


def test_a_native_cluster_notice_arrives_after_a_failover_of_the_slots_master(
    cluster_set_fresh: ClusterSet,
) -> None:
    took = _follows_the_slot(cluster_set_fresh, "{failing-over}", cluster_set_fresh.failover)
    assert took < PUSHED, f"handover after the failover took {took:.3f} s"


def test_a_lost_native_cluster_subscription_still_hands_over(cluster_set: ClusterSet) -> None:
    client = cluster_set.client(socket_timeout=2)
    name = "{native-lost}"
    slot = client.keyslot(name)
    channel = f"{name}:leader:released"
    a, b, events = _pair(client, name)
    with a:
        elected_token(a)
        with b:
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower")
            wait_until(lambda: listeners_on(cluster_set, slot, channel) >= 1, 5, what="listening")
            run = b._core.run
            assert run is not None and run.driven is not None
            hub = run.driven.notices._sub.hub  # the reader on the slot's master
            connects = hub.connects
            owner = cluster_set.master_for_slot(slot).client()
            owner.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
            owner.close()
            # The reader reconnects and subscribes again on its own.
            wait_until(lambda: hub.connects > connects, timeout=10, what="a reconnect")
            wait_until(lambda: listeners_on(cluster_set, slot, channel) >= 1, 5, what="back")
            took = timed_handover(a.resign, b)
            assert took < PUSHED, f"handover after the reconnect took {took:.3f} s"
            # With the reader gone for good the follower still takes over, by polling.
            hub.close()
            started = time.monotonic()
        # b stops: its release is announced, but nobody hears it.
        wait_until(a.token, timeout=10, interval=0.01, what="the takeover by polling")
        polled = time.monotonic() - started
    client.close()
    assert polled < 8.0, f"takeover by polling took {polled:.3f} s (poll interval ~2.5 s)"


def _threads_named(name: str) -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/comm") as f:
            count += f.read().strip() == name
    return count


def test_one_native_reader_serves_every_master_and_a_node_that_never_answers_holds_none_up(
    cluster_set: ClusterSet,
) -> None:
    from redlease._engine._native import _core
    from redlease._engine.conn.client import Endpoint
    from redlease._engine.notices.nativenotices import hub_key, registry

    client = cluster_set.client(socket_timeout=2)
    # One name per master: a follower of each listens on that master.
    names: dict[int, str] = {}
    for i in range(200):
        name = f"{{one-reader-{i}}}"
        names.setdefault(cluster_set.master_for_slot(client.keyslot(name)).port, name)
    assert len(names) == len(cluster_set.masters())
    pairs = [_pair(client, name) for name in names.values()]
    hole = BlackHole()
    stuck: Any = None
    with contextlib.ExitStack() as stack:
        for a, b, events in pairs:
            stack.enter_context(a)
            elected_token(a)
            stack.enter_context(b)
            wait_until(lambda ev=events: ev.count("follower") >= 1, 5, what="a follower")
        for name in names.values():
            channel = f"{name}:leader:released"
            slot = client.keyslot(name)
            wait_until(
                lambda s=slot, c=channel: listeners_on(cluster_set, s, c) >= 1,
                5,
                what="a listener on every master",
            )
        hubs = [h for h in native_cluster_hubs() if h.subscribed]
        assert len(hubs) >= len(names), "a hub per master"
        # Every master's session is read by one thread, the process's reader.
        assert len({id(h.reader) for h in hubs}) == 1
        assert _threads_named("redlease-notice") == 1
        # A node that accepts and never answers: its hub's connect (its
        # handshake sends AUTH) blocks for the connect bound (5 s),
        # on the connector thread ...
        with registry.lock:
            stuck = registry.hub(
                hub_key(
                    Endpoint("127.0.0.1", hole.port, None, 0, None, "secret", None), sharded=True
                )
            )
        waiter = _core.NoticeSub(stuck, b"{never}:released")
        wait_until(lambda: hole.accepted >= 1, 5, what="the connect to the silent node")
        # ... while every master's handover is still pushed, by the reader.
        for a, b, _ in pairs:
            assert stuck.reader.connecting and not stuck.subscribed
            took = timed_handover(a.resign, b)
            assert took < PUSHED, f"handover took {took:.3f} s beside a node that never answers"
        assert stuck.connects == 0
        assert _threads_named("redlease-notice") == 1
        assert _threads_named("redlease-nconn") <= 1
        waiter.cancel()
    with registry.lock:
        stuck.close()
    hole.close()
    client.close()
