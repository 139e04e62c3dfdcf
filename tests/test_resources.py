"""Terms and runs come and go without leaking threads or file descriptors.

Native renewer threads are OS threads: /proc/self/task counts them, where
threading.active_count() would not.
"""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
import weakref

import redis

import redlease
from helpers import wait_until
from redlease._testing import RedisServer


def threads_and_fds() -> tuple[int, int]:
    gc.collect()
    return len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def what_runs() -> set[str]:
    """This process's threads (by OS name, Python name where it has one) and open files."""
    python = {t.native_id: t.name for t in threading.enumerate()}
    seen = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue  # ended meanwhile
        seen.add(f"thread {comm} {python.get(int(tid), '')}".rstrip())
    for fd in os.listdir("/proc/self/fd"):
        try:
            seen.add(f"fd {fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            continue
    return seen


def settled_threads_and_fds(quiet: float = 2.5, timeout: float = 15.0) -> tuple[int, int]:
    """``threads_and_fds()`` once it held still for ``quiet`` seconds.

    Earlier tests leave threads that end on their own a little later (a
    release-notice listener closes 2 s after its last waiter; an engine's
    keeper thread when the engine is collected): a count taken while they
    wind down would see a fall that is not this test's doing.
    """
    deadline = time.monotonic() + timeout
    last, since = threads_and_fds(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = threads_and_fds()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def grew(before: tuple[int, int], after: tuple[int, int]) -> bool:
    return after[0] > before[0] or after[1] > before[1]


def test_many_terms_leak_no_threads_or_fds(client: redis.Redis, engine: str) -> None:
    # Counted while a term is held: at term 20 and at term 300. A leak grows
    # with the terms; what a run opens once and keeps (a second pooled
    # connection the first time two of its calls overlap) does not. So where
    # the first 280 terms grew, 280 more are counted: growth again is a leak.
    marks = (20, 300, 580)
    terms: list[int] = []
    gates = {n: threading.Semaphore(0) for n in marks}

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term.token)
        gate = gates.get(len(terms))
        if gate is not None:
            gate.acquire()  # hold this term while the main thread counts

    # Terms end by returning, so their pace is the acquire's, not the TTL's.
    # A TTL that outlives a stall of a loaded host keeps the held terms from
    # being lost: a lost term re-contends, and a run that contends listens
    # for notices, a listener that is no leak.
    e = redlease.Elector(
        client, "soak", ttl=0.5, renew_interval=0.1, acquire_interval=0.001, engine=engine
    )
    counts: list[tuple[int, int]] = []
    running: list[set[str]] = []
    lost: list[int] = []  # terms that began while a held one was being counted

    def count_at(n: int) -> None:
        wait_until(lambda: len(terms) >= n, timeout=60, what=f"{n} terms")
        counts.append(settled_threads_and_fds())
        running.append(what_runs())
        lost.append(len(terms) - n)

    e.start(lead)
    try:
        count_at(marks[0])
        gates[marks[0]].release()
        count_at(marks[1])
        if grew(counts[0], counts[1]):
            gates[marks[1]].release()
            count_at(marks[2])
    finally:
        for gate in gates.values():
            gate.release()
        e.stop()
    assert terms == sorted(set(terms)), "tokens must be unique and increasing"
    # A leak is growth in each span. A fall is something an earlier test left
    # winding down (a notice listener still retrying its stopped server), not
    # this run's.
    spans = [
        f"{counts[i]} to {counts[i + 1]} from term {marks[i]} to {marks[i + 1]}, "
        f"adding {sorted(running[i + 1] - running[i])}"
        for i in range(len(counts) - 1)
    ]
    detail = f"threads/fds went {'; then '.join(spans)} (terms begun while counting: {lost})"
    assert not all(grew(x, y) for x, y in itertools.pairwise(counts)), detail
    # And never by more than that one-off opening: a pooled connection, or
    # one listener's thread and connection.
    assert counts[-1][0] <= counts[0][0] + 1 and counts[-1][1] <= counts[0][1] + 1, detail


def test_start_stop_cycles_leak_no_threads_or_fds(client: redis.Redis, engine: str) -> None:
    e = redlease.Elector(client, "cycles", ttl=0.2, engine=engine)

    def cycle() -> None:
        e.start(None)
        wait_until(e.token, timeout=5, what="election")
        e.stop()

    settled_threads_and_fds()  # what earlier tests left winds down first
    for _ in range(5):
        cycle()
    # Settled on both sides: a notice listener closes 2 s after its last
    # waiter, so a count taken right after a cycle may still include it.
    before = settled_threads_and_fds()
    for _ in range(100):
        cycle()
    after = settled_threads_and_fds()
    assert not grew(before, after), (
        f"threads/fds went from {before} to {after} over 100 start/stop cycles"
    )


def test_a_stopped_and_dropped_elector_lets_its_engine_go(
    redis_server: RedisServer, engine: str
) -> None:
    # Its engine (natively: a renewer thread and connections) is freed once
    # nothing holds it, even while the process's driver sleeps with nothing
    # else to do: it once kept the last run it stepped until its next wake.
    client = redis_server.client(socket_timeout=5)
    e = redlease.Elector(client, "dropped", ttl=0.5, engine=engine)
    engine_ref = weakref.ref(e._core.engine)
    e.start(None)
    wait_until(e.token, timeout=5, what="election")
    e.stop()
    del e

    def gone() -> bool:
        gc.collect()
        return engine_ref() is None

    wait_until(gone, timeout=5, what="the engine freed")
    client.close()
