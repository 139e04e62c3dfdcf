"""Resources over many terms and many runs: threads, file descriptors, RSS.

    python benchmarks/soak_terms.py [--terms 10000] [--runs 1000] [--engine native|python]

Phase 1: one run, ``--terms`` leadership terms (the leader function returns
at once, so each term is elect -> renew -> step down -> release). Phase 2:
``--runs`` start/stop cycles of an elector (a keeper, with its thread and
connection, made and closed each time). Native threads show up in
/proc/self/task, so leaked renewer threads are counted too. Prints a table;
asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import redis

import redlease
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer
from resources import snapshot


def soak_terms(client: redis.Redis, engine: str, terms: int, report: list[str]) -> None:
    done = threading.Event()
    count = [0]
    marks = {terms // 10 * i for i in range(1, 11)} | {1}

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        fencer.set("soak:value", term.token)
        count[0] += 1
        if count[0] in marks:
            tasks, fds, rss = snapshot()
            report.append(f"{'terms':<6} {count[0]:>7} {tasks:>8} {fds:>5} {rss:>9.1f}")
        if count[0] >= terms:
            done.set()

    e = redlease.Elector(
        client, "soak", ttl=0.1, renew_interval=0.03, acquire_interval=0.001, engine=engine
    )
    started = time.monotonic()
    e.start(lead)
    done.wait()
    e.stop()
    report.append(f"  {terms} terms in {time.monotonic() - started:.1f} s")


def soak_runs(client: redis.Redis, engine: str, runs: int, report: list[str]) -> None:
    marks = {runs // 10 * i for i in range(1, 11)} | {1}
    e = redlease.Elector(client, "soak-runs", ttl=0.1, engine=engine)
    started = time.monotonic()
    for i in range(1, runs + 1):
        e.start(None)
        while e.token() is None:
            time.sleep(0.0005)
        e.stop()
        if i in marks:
            tasks, fds, rss = snapshot()
            report.append(f"{'runs':<6} {i:>7} {tasks:>8} {fds:>5} {rss:>9.1f}")
    report.append(f"  {runs} start/stop runs in {time.monotonic() - started:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--terms", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1_000)
    default = "native" if native_engine_available()[0] else "python"
    parser.add_argument("--engine", choices=("native", "python"), default=default)
    args = parser.parse_args()

    with RedisServer(unix=True) as server:
        client = server.client()
        tasks, fds, rss = snapshot()
        report = [
            f"engine {args.engine}",
            f"{'phase':<6} {'count':>7} {'threads':>8} {'fds':>5} {'RSS MiB':>9}",
            f"{'start':<6} {0:>7} {tasks:>8} {fds:>5} {rss:>9.1f}",
        ]
        soak_terms(client, args.engine, args.terms, report)
        soak_runs(client, args.engine, args.runs, report)
        client.close()
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
