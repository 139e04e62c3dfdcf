"""The native engine's release notices are read by a native thread that never takes the GIL.

A follower on the native engine sleeps on an eventfd with the GIL released;
the notice that wakes it is read and handed over by a native thread, so the
wake-up happens while another thread of the process holds the GIL. The
behaviour every engine shares (handover, reconnect, sharing one connection)
is specified in test_notices.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import redlease
from helpers import (
    BlackHole,
    gil_call_size,
    hold_gil,
    release_during_a_gil_hold,
    require_native,
    wait_until,
)
from redlease._engine import make_engine
from redlease._engine.notices.nativenotices import NativeSubscription
from redlease._testing import RedisServer
from redlease._testing.notices import driver_notices, native_hubs, python_hubs

pytestmark = pytest.mark.skipif(not hasattr(os, "eventfd"), reason="needs os.eventfd (Linux)")


@pytest.fixture
def native_engine(client: redis.Redis) -> Iterator[Any]:
    require_native()
    engine = make_engine(client, "native")
    try:
        yield engine
    finally:
        engine.close()


class EventFd:
    """A bare eventfd standing in for a keeper's: ``fileno()`` is all a signal needs."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        os.close(self.fd)


def subscribed(client: redis.Redis, channel: str) -> bool:
    return bool(client.pubsub_numsub(channel)[0][1])


def notice_tasks() -> set[int]:
    """Kernel thread ids of this process's native notice readers (by their thread name)."""
    found = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() == "redlease-notice":
                    found.add(int(tid))
        except OSError:
            continue
    return found


# A process that publishes one release notice, then watches (through /proc)
# the eventfd of the waiting process until the notice's write shows there.
_PUBLISHER = textwrap.dedent(
    """
    import sys, time, redis
    port, channel, pid, fd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    r = redis.Redis(port=port)
    r.ping()
    print("ready", flush=True)
    sys.stdin.readline()
    time.sleep(0.3)  # well inside the other process's GIL-holding call
    sent = time.monotonic()
    r.publish(channel, b"released-by-x")
    while True:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            info = f.read()
        if "eventfd-count:" in info and not info.split("eventfd-count:")[1].split()[0].strip("0"):
            time.sleep(0.0005)
            continue
        print(f"{sent} {time.monotonic() - sent}", flush=True)
        break
    """
)


def test_a_native_follower_is_woken_while_another_thread_holds_the_gil(
    native_engine: Any, client: redis.Redis, redis_server: RedisServer
) -> None:
    signal = EventFd()
    got: list[bytes | None] = []
    sub = native_engine.notices(client).listen("held", got.append, signal=signal)
    publisher = subprocess.Popen(
        [sys.executable, "-c", _PUBLISHER, str(redis_server.port), "held:released",
         str(os.getpid()), str(signal.fd)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert publisher.stdout is not None and publisher.stdin is not None
        assert publisher.stdout.readline().strip() == "ready"
        wait_until(lambda: subscribed(client, "held:released"), timeout=5, what="the subscription")
        n = gil_call_size(1.5)
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        hog_started = time.monotonic()
        held = hold_gil(n)  # no Python thread runs until this returns
        sent, woken_after = map(float, publisher.stdout.readline().split())
    finally:
        publisher.kill()
        publisher.wait()
    hog_ended = hog_started + held
    # The eventfd was written while the GIL was still held, within a bound.
    assert woken_after < 0.25, f"the waiter's eventfd was written {woken_after:.3f} s after"
    assert sent + woken_after < hog_ended, "the notice arrived only after the GIL-holding call"
    # And the notice itself is handed over on the waiter's own thread.
    assert sub.wait(5)
    assert got == [b"released-by-x"]
    sub.cancel()
    signal.close()


def test_the_native_notice_wait_returns_while_another_thread_holds_the_gil(
    native_engine: Any, client: redis.Redis, redis_server: RedisServer
) -> None:
    sub = native_engine.notices(client).listen("waiting", lambda _p: None)
    wait_until(lambda: subscribed(client, "waiting:released"), timeout=5, what="the subscription")
    returned: list[float] = []

    def wait() -> None:
        if sub.wait(10):
            returned.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)  # the waiter sleeps in the native wait, GIL released
    publisher = redis.Redis(port=redis_server.port)
    n = gil_call_size(1.0)
    publisher.publish("waiting:released", b"x")
    hold_gil(n)
    hog_ended = time.monotonic()
    waiter.join(10)
    publisher.close()
    sub.cancel()
    # The wait returned as soon as the GIL came free, not a poll interval
    # later: measured from the hog's end, since on a loaded machine the call
    # lasts longer than it was sized for.
    assert returned and returned[0] - hog_ended < 0.5


def test_the_native_listener_is_a_native_thread_not_a_python_one(
    native_engine: Any, client: redis.Redis
) -> None:
    python_threads = {t.ident for t in threading.enumerate()}
    sub = native_engine.notices(client).listen("threads", lambda _p: None)
    wait_until(lambda: subscribed(client, "threads:released"), timeout=5, what="the subscription")
    new = notice_tasks()
    assert len(new) == 1, f"expected the process's one native notice thread, found {new}"
    assert {t.ident for t in threading.enumerate()} == python_threads
    assert all(t.native_id not in new for t in threading.enumerate())
    # No Python notice thread of its own (one another test's Python engine left to idle
    # out is not this listener's: the thread set above is unchanged).
    started = [t for t in threading.enumerate() if t.ident not in python_threads]
    assert not any(t.name == "redlease-notices" for t in started)
    sub.cancel()


def test_native_waiters_of_one_server_share_one_hub_and_one_connection(
    native_engine: Any, client: redis.Redis
) -> None:
    listener = native_engine.notices(client)
    subs = [listener.listen(f"many-{i}", lambda _p: None) for i in range(5)]
    for i in range(5):
        wait_until(lambda i=i: subscribed(client, f"many-{i}:released"), timeout=5, what="subs")
    port = client.connection_pool.connection_kwargs["port"]
    hubs = [h for h in native_hubs() if not h.closed and h.target.port == port]
    assert len(hubs) == 1
    assert len([c for c in client.client_list() if "P" in c["flags"]]) == 1
    for sub in subs:
        sub.cancel()
    wait_until(lambda: not subscribed(client, "many-0:released"), timeout=5, what="unsubscribe")


def test_one_native_reader_reads_every_server_and_a_server_that_never_answers_stalls_none(
    native_engine: Any, client: redis.Redis, redis_server: RedisServer
) -> None:
    from redlease._engine._native import _core
    from redlease._engine.conn.client import Endpoint
    from redlease._engine.notices.nativenotices import hub_key, registry

    got: list[bytes | None] = []
    sub = native_engine.notices(client).listen("one-reader", got.append)
    wait_until(lambda: subscribed(client, "one-reader:released"), timeout=5, what="subscribed")
    hole = BlackHole()
    # A second server that accepts and never answers its AUTH: the connect
    # waits out its 5 s bound on the connector thread, not on the reader.
    with registry.lock:
        stuck = registry.hub(
            hub_key(Endpoint("127.0.0.1", hole.port, None, 0, None, "pw", None), sharded=False)
        )
    waiter = _core.NoticeSub(stuck, b"nowhere:released")
    try:
        wait_until(lambda: hole.accepted >= 1, 5, what="the connect to the silent server")
        assert stuck.reader is sub.hub.reader
        assert stuck.reader.connecting and stuck.reader.hubs >= 2
        for i in range(3):
            client.publish("one-reader:released", f"n{i}".encode())
            assert sub.wait(2.0), "a notice was held up by the server that never answers"
        assert got == [b"n0", b"n1", b"n2"]
        assert not stuck.subscribed and hole.accepted == 1
        assert len(notice_tasks()) == 1
        # Closing the stuck hub cancels its connect at once.
        started = time.monotonic()
        with registry.lock:
            stuck.close()
        assert time.monotonic() - started < 1.0
        # The stuck hub is let go (the process's connector thread ends too once no hub of
        # the process wants a session; another test's hub may still want one).
        wait_until(lambda: not stuck.running, 5, what="the stuck hub let go")
    finally:
        waiter.cancel()
        with registry.lock:
            stuck.close()
        hole.close()
        sub.cancel()


def test_a_forked_child_inherits_no_running_notice_thread(
    native_engine: Any, client: redis.Redis, redis_server: RedisServer
) -> None:
    sub = native_engine.notices(client).listen("forked", lambda _p: None)
    wait_until(lambda: subscribed(client, "forked:released"), timeout=5, what="the subscription")
    assert notice_tasks()
    pid = os.fork()
    if pid == 0:  # the child: no reader thread, no hub; its own listen works
        code = 1
        try:
            if not notice_tasks() and not native_hubs():
                own = make_engine(redis.Redis(port=redis_server.port), "native")
                mine = own.notices(client).listen("forked-child", lambda _p: None)
                r = redis.Redis(port=redis_server.port)
                # Generous bounds: this runs under the sanitizers too. Exit 3: the
                # child's listener never subscribed; 2: it did, the notice never came.
                deadline = time.monotonic() + 20
                while not subscribed(r, "forked-child:released"):
                    if time.monotonic() > deadline:
                        os._exit(3)
                    time.sleep(0.01)
                r.publish("forked-child:released", b"x")
                code = 0 if mine.wait(10) else 2
                mine.cancel()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's listener is untouched by the child.
    assert subscribed(client, "forked:released")
    sub.cancel()


def test_a_process_with_a_native_listener_exits_promptly(redis_server: RedisServer) -> None:
    require_native()
    code = textwrap.dedent(
        f"""
        import redis
        from redlease._engine import make_engine
        client = redis.Redis(port={redis_server.port})
        engine = make_engine(client, "native")
        sub = engine.notices(client).listen("exiting", lambda _p: None)
        import time; time.sleep(0.3)
        print("listening", flush=True)
        """
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "listening"
    assert time.monotonic() - started < 10


def test_the_native_listener_ends_when_no_waiter_is_left_and_a_new_waiter_restarts_it(
    native_engine: Any, client: redis.Redis
) -> None:
    # The process's one reader thread serves every hub: one an earlier test of
    # this worker left listening ends a couple of seconds after its last waiter,
    # and this test starts once it has.
    wait_until(lambda: not notice_tasks(), timeout=20, what="an earlier test's reader's end")
    listener = native_engine.notices(client)
    first = listener.listen("idle", lambda _p: None)
    wait_until(lambda: subscribed(client, "idle:released"), timeout=5, what="the subscription")
    reader = notice_tasks()
    first.cancel()
    # The connection is closed and the thread ends a couple of seconds later.
    wait_until(lambda: not (notice_tasks() & reader), timeout=10, what="the reader's end")
    assert not [c for c in client.client_list() if "P" in c["flags"]]
    got: list[bytes | None] = []
    second = listener.listen("idle", got.append)
    wait_until(lambda: subscribed(client, "idle:released"), timeout=5, what="the new subscription")
    client.publish("idle:released", b"again")
    assert second.wait(5)
    assert got == [b"again"]
    second.cancel()


# A leader in another process (Python engine): it leads, then on "go" waits a
# moment (well inside the waiting process's GIL-holding call), checks the
# driver's doorbell of the waiting process is quiet, releases (the release
# script publishes the notice), and watches the doorbell until it is rung.
_RELEASER = textwrap.dedent(
    """
    import sys, time, redis, redlease
    port, name, pid, fd = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

    def doorbell() -> int:
        with open(f"/proc/{pid}/fdinfo/{fd}") as f:
            return int(f.read().split("eventfd-count:")[1].split()[0], 16)

    leader = redlease.Elector(redis.Redis(port=port), name, ttl=30, engine="python",
                              instance_id="the-other-process")
    leader.start()
    while not leader.token():
        time.sleep(0.01)
    print("leading", flush=True)
    sys.stdin.readline()
    time.sleep(0.3)
    before = doorbell()
    released = time.monotonic()
    leader.stop()
    while doorbell() == 0:
        time.sleep(0.0005)
    print(before, released, time.monotonic(), flush=True)
    """
)


def test_a_started_follower_hears_its_notice_natively_while_another_thread_holds_the_gil(
    client: redis.Redis, redis_server: RedisServer
) -> None:
    require_native()
    from redlease._engine.process.driver import driver

    doorbell = driver().doorbell()
    releaser = subprocess.Popen(
        [sys.executable, "-c", _RELEASER, str(redis_server.port), "driven-held",
         str(os.getpid()), str(doorbell)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    elected: list[float] = []
    # Without a notice this follower would take over only at its next poll,
    # some 13 s after the release (the leader's TTL is 30 s).
    follower = redlease.Elector(
        client,
        "driven-held",
        ttl=30,
        acquire_interval=15,
        engine="native",
        observer=redlease.Observer(on_elected=lambda _t: elected.append(time.monotonic())),
    )
    try:
        assert releaser.stdout is not None and releaser.stdin is not None
        assert releaser.stdout.readline().strip() == "leading"
        follower.start()
        wait_until(lambda: subscribed(client, "driven-held:leader:released"), 5, what="subscribed")
        time.sleep(0.2)  # its first acquire lost: the driver sleeps until the next poll
        run = follower._core.run
        assert run is not None and run.driven is not None
        notices = run.driven.notices
        # The started run listens through the native reader, not a Python listener.
        assert isinstance(notices, NativeSubscription)
        assert not python_hubs()
        hog_started, hog_ended, before, released, rung = release_during_a_gil_hold(releaser)
        wait_until(lambda: elected, timeout=10, what="the follower's election")
    finally:
        releaser.kill()
        releaser.wait()
        follower.stop()
    assert hog_started < released, "the release came before the GIL-holding call"
    # Read and routed while the GIL was held: the native reader took the
    # notice and rang the driver's doorbell, which nothing else in this
    # process could write meanwhile (it was quiet just before the release).
    assert before == 0, "the driver's doorbell was already rung before the release"
    assert released < notices.last_notice < hog_ended, "the notice was read after the GIL came free"
    assert rung < hog_ended, "the driver's doorbell was rung only after the GIL came free"
    # And the follower took over as soon as the GIL was free, not at its next poll.
    assert elected[0] - hog_ended < 2.0, f"took over {elected[0] - hog_ended:.3f} s after the hold"


def test_started_runs_stop_listening_on_stop_and_the_reader_ends_after_the_last(
    client: redis.Redis,
) -> None:
    require_native()
    before = notice_tasks()
    leader = redlease.Elector(client, "started-many", ttl=30, engine="native")
    leader.start()
    wait_until(leader.token, timeout=5, what="the leader")
    followers = [
        redlease.Elector(client, "started-many", ttl=30, acquire_interval=15, engine="native")
        for _ in range(20)
    ]
    for follower in followers:
        follower.start()
    # The routing is made by the first driven run that listens, after its first
    # acquire lost (unless an earlier test of this process made it already).
    routing = wait_until(driver_notices, timeout=5, what="the driver's notice routing")
    # The followers listen; the leader does not while it leads.
    wait_until(lambda: routing.routed() >= 20, timeout=5, what="every follower routed")
    routed = routing.routed()  # these 20, and any other test's left over
    wait_until(lambda: subscribed(client, "started-many:leader:released"), 5, what="subscribed")
    reader = notice_tasks() - before
    assert len(reader) == 1
    assert len([c for c in client.client_list() if "P" in c["flags"]]) == 1
    rings = routing.bell.rings
    leader.stop()  # one notice: every follower is woken, one of them takes over
    elected = wait_until(
        lambda: next((f for f in followers if f.token()), None), timeout=5, what="a successor"
    )
    assert routing.bell.rings - rings == len(followers)
    for follower in followers:
        follower.stop()
    assert elected.token() is None
    assert routing.routed() == routed - 20
    wait_until(
        lambda: not subscribed(client, "started-many:leader:released"), 5, what="unsubscribed"
    )
    # No waiter left: the connection closes and the reader ends a while later.
    wait_until(lambda: not (notice_tasks() & reader), timeout=10, what="the reader's end")
    assert not [c for c in client.client_list() if "P" in c["flags"]]
