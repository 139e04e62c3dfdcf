"""Terms and runs come and go without leaking threads or file descriptors.

Native renewer threads are OS threads: /proc/self/task counts them, where
threading.active_count() would not.
"""

from __future__ import annotations

import gc
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
    # Counted three times, each while a term is held: at term 20, term 160
    # and term 301. A leak grows with the terms, so it shows in both spans of
    # 140 terms; what a run opens once and keeps (a second pooled connection
    # the first time two of its calls overlap) shows in one at most.
    hold_at = (20, 160)
    terms: list[int] = []
    gates = {n: threading.Semaphore(0) for n in hold_at}
    done = threading.Event()

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term.token)
        if len(terms) in gates:
            gates[len(terms)].acquire()  # hold this term while the main thread counts
        if len(terms) >= 300:
            done.set()
        if len(terms) > 300:
            term.wait()  # stay in term 301 while the main thread counts

    # Terms end by returning, so their pace is the acquire's, not the TTL's.
    # A TTL that outlives a stall of a loaded host keeps the held terms from
    # being lost: a lost term re-contends, and a run that contends listens
    # for notices, a listener that is no leak.
    e = redlease.Elector(
        client, "soak", ttl=0.5, renew_interval=0.1, acquire_interval=0.001, engine=engine
    )
    e.start(lead)
    counts: list[tuple[int, int]] = []
    running: list[set[str]] = []
    for n in hold_at:
        wait_until(lambda n=n: len(terms) >= n, timeout=60, what=f"{n} terms")
        counts.append(settled_threads_and_fds())
        running.append(what_runs())
        gates[n].release()
    assert done.wait(60), f"only {len(terms)} terms in 60 s"
    wait_until(lambda: len(terms) > 300, timeout=30, what="term 301")  # counted mid-term too
    held = len(terms)
    counts.append(settled_threads_and_fds())
    running.append(what_runs())
    e.stop()
    assert terms == sorted(set(terms)), "tokens must be unique and increasing"
    # A leak is growth in both spans. A fall is something an earlier test
    # left winding down (a notice listener still retrying its stopped
    # server), not this run's.
    early, mid, late = counts
    assert not (grew(early, mid) and grew(mid, late)), (
        f"threads/fds went from {early} to {mid} to {late} over terms 20, 160 and 301 "
        f"({len(terms) - held} more terms while counting); added from term 20 to 160: "
        f"{sorted(running[1] - running[0])}; from 160 to 301: {sorted(running[2] - running[1])}"
    )
    # And never by more than that one-off opening: a pooled connection, or
    # one listener's thread and connection.
    assert late[0] <= early[0] + 1 and late[1] <= early[1] + 1, (
        f"threads/fds went from {early} to {late} over 280 terms; added: "
        f"{sorted(running[2] - running[0])}"
    )


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
    assert after[0] <= before[0] and after[1] <= before[1], (
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
