"""Semaphores and fair waiting, measured against a private redis-server: a table per engine.

    python benchmarks/semaphores.py [--engine native|python|both] [--handovers 200]
                                    [--waiters 1000]

Three figures, each against its target:

- round trips to take a free permit: the server's own count of commands
  (``INFO commandstats``) around one ``try_acquire`` (target: one EVALSHA);
- release-to-admission latency of a waiter that sleeps on the release notice
  (its retry interval is 5 s, so only the notice can wake it in time): p50
  and p99 over ``--handovers`` handovers between two threads (target: p50
  <= 5 ms);
- ``--waiters`` fair waiters (threads of this process) on one permit: whether
  they were served in the order they came, how long the whole queue took,
  and how many connections this process added at the server beyond the
  notice connection (target: in order, at most one connection per waiting
  process beyond the notice connection; here they share the engine's).

Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import redis

import redlease
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer


def round_trips(server: RedisServer, engine: str) -> int:
    """Commands the client sent for one ``try_acquire`` of a free permit, as MONITOR saw them.

    (Not the commands its script ran: MONITOR marks those as Lua's.)
    """
    client = server.client()
    seen: list[str] = []
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with server.client().monitor() as monitor:
            ready.set()
            while not done.is_set():
                command = monitor.next_command()
                if command.get("client_type") != "lua" and "PING" not in command["command"]:
                    seen.append(str(command["command"]))

    with redlease.RedisLocker(client, prefix=f"rt-{engine}:", engine=engine) as locker:
        sem = locker.semaphore("pool", 3)
        sem.try_acquire(ttl=5.0).release()  # scripts loaded, connections made
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        ready.wait(5)
        time.sleep(0.2)
        seen.clear()
        permit = sem.try_acquire(ttl=5.0)
        time.sleep(0.2)
        used = len(seen)
        done.set()
        permit.release()  # the watcher's last wait ends on this
        watcher.join(5)
    client.close()
    return used


def handover_latency(client: redis.Redis, engine: str, count: int) -> list[float]:
    """Seconds from a release to the waiter's admission, ``count`` times."""
    with redlease.RedisLocker(client, prefix=f"ho-{engine}:", engine=engine) as locker:
        sem = locker.semaphore("pool", 1)
        took: list[float] = []
        for _ in range(count):
            held = sem.try_acquire(ttl=30.0)
            admitted: list[float] = []

            def wait(admitted: list[float] = admitted) -> None:
                permit = sem.acquire(ttl=30.0, wait=20.0, retry_interval=5.0)
                admitted.append(time.perf_counter())
                permit.release()

            waiter = threading.Thread(target=wait)
            waiter.start()
            time.sleep(0.02)  # its first attempt failed; it sleeps on the notice
            released = time.perf_counter()
            held.release()
            waiter.join(30)
            if admitted:
                took.append(admitted[0] - released)
        return took


def fair_queue(server: RedisServer, engine: str, waiters: int) -> tuple[bool, float, int]:
    """``waiters`` fair waiters: served in order, the seconds it took, connections added."""
    client = server.client()
    observer = server.client()
    before = len(observer.client_list())
    with redlease.RedisLocker(client, prefix=f"fq-{engine}:", engine=engine) as locker:
        sem = locker.semaphore("pool", 1)
        holder = sem.try_acquire(ttl=60.0)
        served: list[int] = []
        guard = threading.Lock()

        def wait(i: int) -> None:
            permit = sem.acquire(ttl=30.0, wait=600.0, retry_interval=2.0, fair=True)
            with guard:
                served.append(i)
            permit.release()

        queue = f"fq-{engine}:queue:sem:pool"
        threads = []
        for i in range(waiters):
            thread = threading.Thread(target=wait, args=(i,), daemon=True)
            thread.start()
            threads.append(thread)
            # Each has its place in the queue before the next comes.
            while observer.zcard(queue) < i + 1:
                time.sleep(0.0005)
        time.sleep(1.0)
        added = len(observer.client_list()) - before
        started = time.monotonic()
        holder.release()
        for thread in threads:
            thread.join(600)
        took = time.monotonic() - started
    client.close()
    observer.close()
    return served == list(range(waiters)), took, added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("native", "python", "both"), default="both")
    parser.add_argument("--handovers", type=int, default=200)
    parser.add_argument("--waiters", type=int, default=1000)
    args = parser.parse_args()
    engines = ["native", "python"] if args.engine == "both" else [args.engine]
    if "native" in engines and not native_engine_available():
        engines.remove("native")
    rows = []
    with RedisServer() as server:
        client = server.client()
        for engine in engines:
            trips = round_trips(server, engine)
            took = sorted(handover_latency(client, engine, args.handovers))
            p50 = statistics.median(took) * 1000
            p99 = took[min(len(took) - 1, int(len(took) * 0.99))] * 1000
            ordered, queue_s, added = fair_queue(server, engine, args.waiters)
            rows.append((engine, trips, p50, p99, len(took), ordered, queue_s, added))
        client.close()
    print("| engine | commands per free permit (target 1) | release -> admitted p50 / p99 "
          "(target p50 <= 5 ms) | fair waiters served in order | queue drained in | "
          "connections added by the waiting process |")
    print("| --- | ---: | ---: | --- | ---: | ---: |")
    for engine, trips, p50, p99, n, ordered, queue_s, added in rows:
        print(
            f"| {engine} | {trips} | {p50:.2f} / {p99:.2f} ms ({n} handovers) | "
            f"{'yes' if ordered else 'NO'} ({args.waiters:,}) | {queue_s:.2f} s | {added} |"
        )


if __name__ == "__main__":
    main()
