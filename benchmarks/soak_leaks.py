"""Everything at once for minutes: does RSS stay flat, do fds and threads come back?

    python benchmarks/soak_leaks.py [--minutes 10] [--engine native|python]

For ``--minutes`` on one private redis-server, in one process:

- terms: three electors contend for one name; the leader's term lasts
  0.2 s and returns, so leadership changes hands all the time (each
  release is a notice to the other two);
- fenced writes from threads: four threads write through their leader's
  fencer, or get rejected with a stale token, as fast as they can;
- fenced writes from asyncio tasks: 32 tasks on one loop, through an
  ``aio.Elector``'s fencer, and short-lived asyncio clients made and
  closed every few seconds;
- locks: a thread takes, refreshes and releases a lock with a watchdog;
- reconnects: every 5 s every client connection of the server is killed
  (``CLIENT KILL TYPE normal``), so every connection of ours is made again.

RSS, open fds and threads are printed at the start, every minute and at the
end, after everything was stopped (with the baseline taken once the first
round of connections exists). Asserts nothing: read the table.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

import redlease
import redlease.aio
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer
from resources import snapshot


class Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.terms = 0
        self.applied = 0
        self.rejected = 0
        self.errors = 0
        self.locks = 0
        self.kills = 0

    def add(self, **fields: int) -> None:
        with self.lock:
            for name, n in fields.items():
                setattr(self, name, getattr(self, name) + n)


def contenders(client: redis.Redis, engine: str, counts: Counts) -> list[redlease.Elector]:
    """Three electors on one name; each term writes once, lasts 0.2 s and returns."""
    electors: list[redlease.Elector] = []

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        counts.add(terms=1)
        try:
            fencer.set("soak:leader-wrote", term.token)
        except redis.RedisError:
            counts.add(errors=1)
        term.wait(0.2)

    for i in range(3):
        e = redlease.Elector(
            client, "soak", ttl=0.5, instance_id=f"soak-{i}", engine=engine,
            observer=redlease.Observer(on_error=lambda _exc: counts.add(errors=1)),
        )  # fmt: skip
        electors.append(e.start(lead))
    return electors


def writer(
    client: redis.Redis, electors: list[redlease.Elector], stop: threading.Event, counts: Counts
) -> None:
    while not stop.is_set():
        token = next((t for e in electors if (t := e.token()) is not None), None) or 1
        try:
            applied = electors[0].fence_set(token, "soak:threads", token)
            counts.add(applied=int(applied), rejected=int(not applied))
        except redis.RedisError:
            counts.add(errors=1)
            time.sleep(0.01)


def locker_loop(client: redis.Redis, engine: str, stop: threading.Event, counts: Counts) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    while not stop.is_set():
        try:
            with locker.hold("soak-lock", ttl=0.3) as held:
                held.refresh()
                stop.wait(0.05)
            counts.add(locks=1)
        except (redis.RedisError, redlease.RedleaseError):
            counts.add(errors=1)
            stop.wait(0.01)
    locker.close()


async def tasks_loop(url: str, engine: str, stop: threading.Event, counts: Counts) -> None:
    async def one_client_round() -> None:
        client = redis.asyncio.Redis.from_url(url, socket_timeout=5)
        e = redlease.aio.Elector(client, "soak-aio", engine=engine)
        fencer = redlease.aio.Fencer(e, 1)
        deadline = time.monotonic() + 3.0

        async def task() -> None:
            while time.monotonic() < deadline and not stop.is_set():
                try:
                    applied = await fencer.set("soak:tasks", 1)
                    counts.add(applied=int(applied), rejected=int(not applied))
                except redis.RedisError:
                    counts.add(errors=1)
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(task() for _ in range(32)))
        await e.stop()
        await client.aclose()

    while not stop.is_set():
        await one_client_round()


def killer(admin: redis.Redis, stop: threading.Event, counts: Counts) -> None:
    while not stop.wait(5.0):
        try:
            admin.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
            counts.add(kills=1)
        except redis.RedisError:
            counts.add(errors=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    default = "native" if native_engine_available()[0] else "python"
    parser.add_argument("--engine", choices=("native", "python"), default=default)
    args = parser.parse_args()
    rows = [f"engine {args.engine}, {args.minutes:g} minutes",
            f"{'at':<10} {'threads':>8} {'fds':>5} {'RSS MiB':>9}"]  # fmt: skip

    def row(label: str) -> None:
        threads, fds, rss = snapshot()
        rows.append(f"{label:<10} {threads:>8} {fds:>5} {rss:>9.1f}")
        print(rows[-1], flush=True)

    print("\n".join(rows), flush=True)
    with RedisServer() as server:
        url = f"redis://127.0.0.1:{server.address[1]}"
        row("before")
        counts = Counts()
        stop = threading.Event()
        client = server.client(socket_timeout=5)
        admin = server.client(socket_timeout=5)
        electors = contenders(client, args.engine, counts)
        threads: list[threading.Thread] = [
            *(threading.Thread(target=writer, args=(client, electors, stop, counts))
              for _ in range(4)),
            threading.Thread(target=locker_loop, args=(client, args.engine, stop, counts)),
            threading.Thread(target=killer, args=(admin, stop, counts)),
            threading.Thread(
                target=lambda: asyncio.run(tasks_loop(url, args.engine, stop, counts))
            ),
        ]  # fmt: skip
        for t in threads:
            t.start()
        time.sleep(10)
        row("baseline")
        started = time.monotonic()
        minute = 1
        while time.monotonic() - started < args.minutes * 60:
            time.sleep(1)
            if time.monotonic() - started >= minute * 60:
                row(f"minute {minute}")
                minute += 1
        stop.set()
        for t in threads:
            t.join(30)
        for elector in electors:
            elector.stop()
        del elector
        row("running")  # everything stopped, the engines still open
        client.close()
        admin.close()
        del electors, threads
        # Notice listeners linger 2 s after their last waiter; an engine goes
        # with the last elector that held it, once the collector finds it.
        settle = time.monotonic() + 15
        while time.monotonic() < settle and snapshot()[0] > 2:
            time.sleep(0.5)
        row("after")
        leftover = sorted(
            Path(f"/proc/self/task/{t}/comm").read_text().strip()
            for t in os.listdir("/proc/self/task")
        )
        fds = sorted(
            os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")
        )  # fmt: skip
        print(f"threads left: {', '.join(leftover)}")
        print(f"fds left: {', '.join(fds)}")
    summary: Any = counts
    print(
        f"terms {summary.terms}, fenced writes applied {summary.applied:,} rejected "
        f"{summary.rejected:,}, locks {summary.locks:,}, connection kills {summary.kills}, "
        f"errors handled {summary.errors:,}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
