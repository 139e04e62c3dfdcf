"""Fair waiting under load: arrival order kept for short retry intervals and busy hosts.

Many waiters in one process, with retry intervals of 10 ms and 50 ms, on a
quiet host, beside a pure-Python thread that competes for the GIL, and beside
processes that keep every CPU busy; locks and semaphores, on ``MemoryLocker``
and on ``RedisLocker`` with both engines. A waiter's place lives max(3 x its
retry interval, 100 ms) after each attempt or renewal: one that gives up is
passed at once, a dead one within that life.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from helpers import fair_acquirer as acquirer
from helpers import wait_until
from redlease._locks.fair import place_ms
from redlease._testing import RedisServer
from redlease.lock import Locker, MemoryLocker, RedisLocker

WAITERS = 12


@pytest.fixture
def locker(fair_locker: Locker) -> Locker:
    return fair_locker


def queue_key(kind: str) -> str:
    return f"fair:queue:{'key' if kind == 'lock' else 'sem'}:job"


def places(locker: Locker, kind: str) -> int:
    """How many places the queue of "job" holds now, as the store says."""
    store_kind = "key" if kind == "lock" else "sem"
    if isinstance(locker, MemoryLocker):
        with locker._store._cond:
            return len(locker._store._queues.get((store_kind, "job"), {}))
    assert isinstance(locker, RedisLocker)
    return int(locker._client.zcard(queue_key(kind)))


@contextlib.contextmanager
def busy(load: str) -> Iterator[None]:
    """A busy host: "gil" a pure-Python loop thread beside the waiters (it holds the
    GIL whenever they do not), "cpu" one spinning process per CPU, "quiet" nothing."""
    stop = threading.Event()
    spinners: list[subprocess.Popen[bytes]] = []
    thread: threading.Thread | None = None
    switch = sys.getswitchinterval()
    if load == "gil":

        def spin() -> None:
            n = 0
            while not stop.is_set():
                n += 1

        # The GIL changes hands every 1 ms, not 5: on the Python engine the renewer
        # that keeps the places is a Python thread too, and with a dozen threads
        # taking 5 ms turns on a loaded 2-core host it can wait past a place's
        # 100 ms life (the native engine's renewer never waits for the GIL).
        sys.setswitchinterval(0.001)
        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
    if load == "cpu":
        for _ in range(len(os.sched_getaffinity(0))):
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield
    finally:
        stop.set()
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        if thread is not None:
            thread.join(10)
        sys.setswitchinterval(switch)


@contextlib.contextmanager
def stall_watch(locker: Locker) -> Iterator[list[float]]:
    """The longest this process or its redis-server stood still, in seconds (``[gap]``).

    A thread that sleeps 5 ms at a time, competing for the GIL and the CPU as
    the waiters do, and pings the locker's server each time (places live by
    the server's clock, and a waiter's attempt needs its reply), records the
    longest gap between two of its rounds.
    """
    ping = locker._client.ping if isinstance(locker, RedisLocker) else (lambda: None)
    longest = [0.0]
    stop = threading.Event()

    def watch() -> None:
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.005)
            ping()
            now = time.monotonic()
            longest[0] = max(longest[0], now - last)
            last = now

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield longest
    finally:
        stop.set()
        thread.join(10)


def in_turn(locker: Locker, kind: str, interval: float, load: str) -> list[int]:
    """The order ``serve_in_turn`` served its waiters in, run again (three runs at most)
    when the order was not kept and the process or its server was stalled past a place's life.

    Fairness is promised to waiters that attempt within their place's life; a
    host that freezes the whole process, or its redis-server, longer than that (a
    loaded CI machine) makes a live waiter look dead, and it is passed, as it should be.
    """
    life = place_ms(interval) / 1000
    for _ in range(3):
        with stall_watch(locker) as stalled:
            served = serve_in_turn(locker, kind, interval, load)
        if served == list(range(WAITERS)) or stalled[0] < life:
            break
    return served


def serve_in_turn(locker: Locker, kind: str, interval: float, load: str) -> list[int]:
    """``WAITERS`` fair waiters, each queued before the next begins; the order they are served."""
    acquire = acquirer(locker, kind)
    holder = acquire(ttl=30.0)
    served: list[int] = []
    failed: list[BaseException] = []

    def waiter(i: int) -> None:
        try:
            held = acquire(ttl=30.0, wait=30.0, retry_interval=interval, fair=True)
        except BaseException as exc:  # reported by the test, not lost in the thread
            failed.append(exc)
            return
        served.append(i)
        time.sleep(0.005)
        held.release()

    threads = []
    with busy(load):
        for i in range(WAITERS):
            thread = threading.Thread(target=waiter, args=(i,), daemon=True)
            thread.start()
            threads.append(thread)
            wait_until(lambda n=i + 1: places(locker, kind) >= n, 10, what=f"waiter {i} queued")
        time.sleep(3 * interval)  # every waiter has waited a few attempts
        holder.release()
        for thread in threads:
            thread.join(30)
    assert not failed, failed
    return served


@pytest.mark.parametrize("load", ["quiet", "gil", "cpu"])
@pytest.mark.parametrize("interval", [0.01, 0.05])
def test_lock_waiters_are_served_in_arrival_order(
    locker: Locker, interval: float, load: str
) -> None:
    assert in_turn(locker, "lock", interval, load) == list(range(WAITERS))
    assert places(locker, "lock") == 0


@pytest.mark.parametrize("load", ["gil", "cpu"])
def test_semaphore_waiters_are_served_in_arrival_order(locker: Locker, load: str) -> None:
    assert in_turn(locker, "semaphore", 0.01, load) == list(range(WAITERS))
    assert places(locker, "semaphore") == 0


def test_waiters_that_begin_together_are_served_in_the_order_they_began(
    locker: Locker,
) -> None:
    # No pause for each to queue: a waiter is dated from when its acquire began.
    acquire = acquirer(locker, "lock")
    holder = acquire(ttl=30.0)
    served: list[int] = []
    began: dict[int, float] = {}

    def waiter(i: int) -> None:
        began[i] = time.monotonic()
        # Places of 300 ms (3 retry intervals), not the shortest 100 ms: a place
        # lives by the server's clock, and a redis-server or renewer that stands
        # still for 100 ms on a loaded host lets places lapse and be passed.
        held = acquire(ttl=30.0, wait=30.0, retry_interval=0.1, fair=True)
        served.append(i)
        held.release()

    threads = []
    for i in range(WAITERS):
        thread = threading.Thread(target=waiter, args=(i,), daemon=True)
        thread.start()
        threads.append(thread)
        # 30 ms from this waiter's own start to the next's: a thread started is
        # not yet running, and on a loaded host it may begin just before the next.
        wait_until(lambda i=i: i in began, 10, interval=0.001, what=f"waiter {i} began")
        time.sleep(0.03)
    wait_until(lambda: places(locker, "lock") == WAITERS, 10, what="every waiter queued")
    holder.release()
    for thread in threads:
        thread.join(30)
    assert served == sorted(began, key=began.__getitem__)


def test_the_place_lives_three_retry_intervals_and_at_least_100_ms() -> None:
    assert place_ms(0.001) == 100
    assert place_ms(0.01) == 100
    assert place_ms(0.05) == 150
    assert place_ms(0.1) == 300
    assert place_ms(2.0) == 6000


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_waiter_that_gives_up_is_passed_at_once(locker: Locker, kind: str) -> None:
    acquire = acquirer(locker, kind)
    holder = acquire(ttl=30.0)
    gave_up = threading.Event()
    got: list[float] = []

    def impatient() -> None:
        # First in the queue, with a place that would live 6 s.
        with contextlib.suppress(Exception):
            acquire(ttl=30.0, wait=0.3, retry_interval=2.0, fair=True)
        gave_up.set()

    def patient() -> None:
        held = acquire(ttl=30.0, wait=30.0, retry_interval=2.0, fair=True)
        got.append(time.monotonic())
        held.release()

    first = threading.Thread(target=impatient, daemon=True)
    first.start()
    wait_until(lambda: places(locker, kind) == 1, 10, what="the first waiter queued")
    second = threading.Thread(target=patient, daemon=True)
    second.start()
    wait_until(lambda: places(locker, kind) == 2, 10, what="the second waiter queued")
    assert gave_up.wait(10), "the impatient waiter did not give up"
    assert places(locker, kind) == 1
    released = time.monotonic()
    holder.release()  # the release notice goes to the queue's first: the patient one
    second.join(15)
    assert got, "the second waiter was not served"
    assert got[0] - released < 1.0, f"served {got[0] - released:.2f} s after the release"


@pytest.mark.parametrize("kind", ["lock", "semaphore"])
def test_a_dead_place_is_skipped_within_its_life(locker: Locker, kind: str) -> None:
    # A place first in the queue that nobody renews: a waiter that died.
    acquire = acquirer(locker, kind)
    holder = acquire(ttl=30.0)
    life = place_ms(0.01) / 1000
    if isinstance(locker, MemoryLocker):
        store_kind = "key" if kind == "lock" else "sem"
        with locker._store._cond:
            now = time.monotonic()
            queue = locker._store._queues.setdefault((store_kind, "job"), {})
            queue["dead"] = (now - 60.0, now + life)
    else:
        assert isinstance(locker, RedisLocker)
        client = locker._client
        seconds, micros = client.time()
        now_ms = seconds * 1000 + micros // 1000
        client.zadd(queue_key(kind), {"dead": (now_ms - 60_000) * 1000})
        alive = queue_key(kind).replace(":queue:", ":queue-alive:")
        client.zadd(alive, {"dead": now_ms + int(life * 1000)})
    written = time.monotonic()
    got: list[float] = []

    def waiter() -> None:
        held = acquire(ttl=30.0, wait=30.0, retry_interval=0.01, fair=True)
        got.append(time.monotonic())
        held.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    holder.release()
    thread.join(15)
    assert got, "the waiter behind the dead place was not served"
    assert got[0] - written < life + 1.0, f"held up {got[0] - written:.2f} s"
    assert places(locker, kind) == 0


_STALLED = textwrap.dedent(
    """
    import sys, redis, redlease
    locker = redlease.RedisLocker(
        redis.Redis(port=int(sys.argv[1])), prefix="fair:", engine=sys.argv[2]
    )
    print("waiting", flush=True)
    held = locker.acquire("job", ttl=30, wait=60, retry_interval=0.1, fair=True)
    print("acquired", flush=True)
    sys.stdin.readline()
    held.release()
    """
)


def test_a_stopped_waiter_that_comes_back_keeps_its_place(
    redis_server: RedisServer, engine: str
) -> None:
    # Stopped past its place's life (300 ms: 3 x retry_interval) its place lapses;
    # when it runs again, its next attempt takes back the place it had, dated from
    # when it began waiting. (Not the shortest life, 100 ms: a loaded host can hold a
    # resumed process still that long, and its place would lapse again.)
    client = redis_server.client()
    with RedisLocker(client, prefix="fair:", engine=engine) as locker:
        holder = locker.acquire("job", ttl=30.0)
        stalled = subprocess.Popen(
            [sys.executable, "-c", _STALLED, str(redis_server.port), engine],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert stalled.stdout is not None and stalled.stdin is not None
            assert stalled.stdout.readline().strip() == "waiting"
            wait_until(lambda: client.zcard(queue_key("lock")) == 1, 10, what="queued")
            got: list[float] = []

            def second() -> None:
                held = locker.acquire("job", ttl=30.0, wait=30.0, retry_interval=0.1, fair=True)
                got.append(time.monotonic())
                held.release()

            waiter = threading.Thread(target=second, daemon=True)
            waiter.start()
            wait_until(lambda: client.zcard(queue_key("lock")) == 2, 10, what="both queued")
            os.kill(stalled.pid, signal.SIGSTOP)
            wait_until(lambda: client.zcard(queue_key("lock")) == 1, 10, what="a place lapsed")
            os.kill(stalled.pid, signal.SIGCONT)
            wait_until(lambda: client.zcard(queue_key("lock")) == 2, 10, what="it came back")
            holder.release()
            assert stalled.stdout.readline().strip() == "acquired"  # before the second
            assert not got
            stalled.stdin.write("\n")
            stalled.stdin.flush()
            waiter.join(15)
            assert got, "the second waiter was not served after the first"
        finally:
            stalled.kill()
            stalled.wait()
    client.close()
