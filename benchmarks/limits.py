"""The host's own limit beside both engines and redis-py, in one run, as ratios to that limit.

    python benchmarks/limits.py [--rounds R] [--seconds S] [--quick] [--no-pin]

One private redis-server on loopback TCP. Where the host lets this process
use two CPUs or more, redis-server (every thread of it) is pinned to one and
this process (every thread, so every thread it starts later) to another, so
that each round trip crosses between the same two CPUs in every round of
every contender; the output says whether that happened. Every contender runs
the same fenced SET script (``lua/fence_guard.lua`` + ``fence_set.lua`` +
``fence_epilogue.lua``) and every write applies (token 1 under a name nobody
elected, or the elector's own token).

Each figure has a limit: what a client that does nothing but send these
writes and read their replies reaches on this host, its loopback, its kernel
and its redis-server. No client can beat it, so a client's figure is read as
a share of it:

- sync fenced write, one thread: the same EVALSHA encoded once, written to a
  blocking socket, its reply counted by its bytes, nothing parsed (``raw socket``), against
  ``Elector.fence_set`` on each engine and redis-py's ``evalsha``: writes/s,
  and this process's CPU per write (``time.process_time()`` over as many
  writes as a turn does, divided by their number; user and kernel time of
  every thread), both taken in turns of 0.1 s as the pipelines are, the
  best turn of each contender;
- pipelines of 100 fenced SETs, one thread (the contenders taking turns of
  0.1 s, so that load from elsewhere falls on all of them alike): the 100
  EVALSHAs encoded once, sent in one ``sendall`` and their replies counted
  by their bytes into one buffer made once (``raw pipelined socket``),
  against ``Elector.fence_pipeline(token)`` on each engine and redis-py's
  ``pipeline(transaction=False)`` of the same EVALSHAs: writes/s.
  The engines' pipelines are measured twice: queued by one ``set_many`` of
  the 100, and by 100 ``set`` calls, each with a target of its own, beside
  the same limit and redis-py figure;
- asyncio, one task: the EVALSHA encoded once, sent on a bare socket the
  event loop watches, one future per write (``bare asyncio socket``),
  against ``aio.Fencer.set`` on each engine and ``redis.asyncio``'s
  ``evalsha``: writes/s, in turns of 0.1 s as above;
- asyncio, 64 tasks on one loop, and 8 threads sharing one ``Elector``:
  writes/s on each engine and redis-py (its pool), no limit measured.

The measuring functions are those of ``bench_fence_pipeline.py`` and
``bench_aio_writes.py``. Each figure is the best of ``--rounds`` rounds of
``--seconds`` (a shared host only ever makes a round slower). Prints one
table of figures, one of the targets (met / not met), then one
line ``JSON {...}`` with every figure. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.utils

import redlease
from bench_aio_writes import BARE, SCRIPT, asyncio_rows, sync_rows, turn_order
from bench_fence_pipeline import (
    NAME,
    TOKEN,
    RawSocket,
    best_rate,
    cpu_per_call_us,
    pipeline_many_op,
    pipeline_op,
    redis_py_pipeline_op,
)
from redlease._testing import RedisServer

BATCH = 100
TASKS = 64
THREADS = 8
APPLIED = f"{NAME}:fence:applied"
"""The fence high-water mark of the name every sync and pipeline contender writes under."""

ONE_KEY = f"{NAME}:one"
VALUE = "value"
"""The value every contender writes (the raw sockets' pre-encoded one)."""

LIMIT = "limit"
CONTENDERS = (LIMIT, "native", "python", "redis-py")
"""The columns of every figure; in the asyncio rows ``redis-py`` is ``redis.asyncio``."""

Figure = dict[str, float | None]


def native_ratio(figure: Figure) -> float | None:
    """The native engine's share of the limit (None where either was not measured)."""
    native, limit = figure["native"], figure[LIMIT]
    return None if native is None or not limit else native / limit


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: ``native / limit`` of ``figure`` against ``bound``."""

    figure: str
    what: str
    bound: float
    at_least: bool

    def measured(self, figures: dict[str, Figure]) -> float | None:
        return native_ratio(figures[self.figure])

    def met(self, figures: dict[str, Figure]) -> bool | None:
        ratio = self.measured(figures)
        if ratio is None:
            return None
        return ratio >= self.bound if self.at_least else ratio <= self.bound


TARGETS = (
    Target(
        "pipeline_writes_per_s", "pipelines of 100 (set_many), native / raw pipelined", 0.90, True
    ),
    Target(
        "pipeline_set_writes_per_s",
        f"pipelines of 100 ({BATCH} set()s), native / raw pipelined",
        0.90,
        True,
    ),
    Target("sync_cpu_us_per_write", "sync CPU per write, native / raw socket", 1.10, False),
    Target(
        "asyncio_1_task_writes_per_s", "asyncio 1 task, native / bare asyncio socket", 1.00, True
    ),
)

ROWS = (
    ("sync_writes_per_s", "sync fenced write, writes/s", "{:,.0f}"),
    ("sync_cpu_us_per_write", "sync client CPU per write, us", "{:.1f}"),
    ("pipeline_writes_per_s", f"pipelines of {BATCH}, set_many, writes/s", "{:,.0f}"),
    ("pipeline_set_writes_per_s", f"pipelines of {BATCH}, {BATCH} set()s, writes/s", "{:,.0f}"),
    ("asyncio_1_task_writes_per_s", "asyncio, 1 task, writes/s", "{:,.0f}"),
    ("asyncio_64_tasks_writes_per_s", f"asyncio, {TASKS} tasks, writes/s", "{:,.0f}"),
    ("threads_8_writes_per_s", f"{THREADS} threads sharing one Elector, writes/s", "{:,.0f}"),
)
"""The table's rows: the figure's JSON key, its label, how its cells are printed."""

LIMITS = {
    "sync_writes_per_s": "raw socket",
    "sync_cpu_us_per_write": "raw socket",
    "pipeline_writes_per_s": "raw pipelined socket",
    "pipeline_set_writes_per_s": "raw pipelined socket",
    "asyncio_1_task_writes_per_s": BARE,
}


def options(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, checked: a round count of at least 1, a finite positive length."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per contender (default 3)")
    parser.add_argument("--seconds", type=float, help="length of one round (default 1.0)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 0.2 s")
    parser.add_argument(
        "--no-pin",
        action="store_true",
        help="leave client and server where the scheduler puts them",
    )
    opts = parser.parse_args(argv)
    if opts.rounds is None:
        opts.rounds = 1 if opts.quick else 3
    if opts.seconds is None:
        opts.seconds = 0.2 if opts.quick else 1.0
    if opts.rounds < 1:
        raise redlease.ConfigError(f"--rounds must be at least 1, got {opts.rounds}")
    if not (math.isfinite(opts.seconds) and opts.seconds > 0):
        raise redlease.ConfigError(
            f"--seconds must be a finite number of seconds above 0, got {opts.seconds}"
        )
    return opts


def pin(server_pid: int) -> tuple[int, int] | None:
    """Put every thread of redis-server on one CPU and every thread of this process on another.

    Returns ``(client_cpu, server_cpu)``, or None when this process may use
    fewer than two CPUs. Threads started later inherit their starter's CPU.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    client_cpu, server_cpu = cpus[0], cpus[1]
    for pid, cpu in ((server_pid, server_cpu), (os.getpid(), client_cpu)):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task), {cpu})
    return client_cpu, server_cpu


def native_unavailable() -> str:
    """Why the native engine cannot run here ("" when it can), asked as a user would.

    An Elector on ``engine="native"`` raises ConfigError when the extension is
    not built; a plain ``redis.Redis()`` it can always serve, and nothing connects.
    """
    try:
        redlease.Elector(redis.Redis(), f"{NAME}-probe", engine="native")
    except redlease.ConfigError as exc:
        return str(exc)
    return ""


def checked(op: Callable[[], object], applied: object) -> Callable[[], object]:
    """``op``, after one call showed that its write applies (a rejected one costs less)."""
    got = op()
    if got != applied:
        raise RuntimeError(f"a fenced write of this benchmark did not apply: {got!r}")
    return op


def fence_set_op(e: redlease.Elector) -> Callable[[], object]:
    def op() -> object:
        return e.fence_set(TOKEN, ONE_KEY, VALUE)

    return op


def sync_figures(
    server: RedisServer, client: redis.Redis, engines: list[str], seconds: float, rounds: int
) -> tuple[Figure, Figure, Figure, Figure]:
    """Writes/s and CPU per write (total, user, kernel) of one fenced write at a time."""
    ops: dict[str, Callable[[], object]] = {}
    for name in engines:
        ops[name] = checked(fence_set_op(redlease.Elector(client, NAME, engine=name)), True)

    def redis_py() -> object:
        return client.evalsha(SCRIPT.sha, 2, APPLIED, ONE_KEY, TOKEN, VALUE)

    ops["redis-py"] = checked(redis_py, 1)
    raw = RawSocket(server, [ONE_KEY])
    ops[LIMIT] = checked(raw.op, 1)
    raw.check()
    rates: Figure = dict.fromkeys(CONTENDERS)
    cpu: Figure = dict.fromkeys(CONTENDERS)
    user: Figure = dict.fromkeys(CONTENDERS)
    kernel: Figure = dict.fromkeys(CONTENDERS)
    rates.update(interleaved_rates(ops, 1, seconds, rounds))
    turns = max(1, round(seconds / SLICE))
    for _ in range(rounds * turns):
        # In turns too, each as many writes as a turn of the rate did: a burst
        # of load from elsewhere falls on every contender's CPU figure alike.
        for name, op in ops.items():
            calls = max(200, int(float(rates[name] or 0.0) * seconds / turns))
            measured = cpu_per_call_us(op, calls, 1)
            if cpu[name] is None or measured[0] < float(cpu[name] or 0.0):
                cpu[name], user[name], kernel[name] = measured
    raw.close()
    return rates, cpu, user, kernel


def pipeline_figures(
    server: RedisServer, client: redis.Redis, engines: list[str], seconds: float, rounds: int
) -> tuple[Figure, Figure]:
    """Fenced writes/s of pipelines of ``BATCH``, built and executed back to back:
    queued by one ``set_many``, and by ``BATCH`` calls of ``set`` (the limit's and
    redis-py's figures, measured once, in both)."""
    ops: dict[str, Callable[[], object]] = {}
    by_set: dict[str, Callable[[], object]] = {}
    for name in engines:
        e = redlease.Elector(client, NAME, engine=name)
        ops[name] = checked(pipeline_many_op(e, BATCH), [True] * BATCH)
        by_set[name] = checked(pipeline_op(e, BATCH), [True] * BATCH)
    ops["redis-py"] = checked(redis_py_pipeline_op(client, BATCH), [1] * BATCH)
    raw = RawSocket(server, [f"{NAME}:value:{i}" for i in range(BATCH)])
    ops[LIMIT] = checked(raw.op, BATCH)
    raw.check()
    every = interleaved_rates(
        {**ops, **{f"{name} set": op for name, op in by_set.items()}}, BATCH, seconds, rounds
    )
    raw.close()
    rates: Figure = dict.fromkeys(CONTENDERS)
    set_rates: Figure = dict.fromkeys(CONTENDERS)
    for name in ops:
        rates[name] = every[name]
    for name in by_set:
        set_rates[name] = every[f"{name} set"]
    set_rates[LIMIT], set_rates["redis-py"] = rates[LIMIT], rates["redis-py"]
    return rates, set_rates


SLICE = 0.1
"""Seconds of one turn of a contender in ``interleaved_rates``."""


def interleaved_rates(
    ops: dict[str, Callable[[], object]], per_call: int, seconds: float, rounds: int
) -> dict[str, float]:
    """The best rate of each op over ``rounds`` x ``seconds``, the ops taking turns of ``SLICE``.

    Every op runs as long as ``best_rate`` would run it, but in turns of
    about 0.1 s (a few hundred pipelines), each op's turn after the
    other's (in ``turn_order``: who goes first rotates), and its figure is
    its best turn. A burst of load from
    elsewhere on a shared host then slows a turn of every contender alike
    instead of all the rounds of one of them, so their ratios keep meaning
    something; and the more turns, the likelier each contender meets a
    quiet one (load only ever makes a turn slower).
    """
    turns = max(1, round(seconds / SLICE))
    best = dict.fromkeys(ops, 0.0)
    for n in range(rounds * turns):
        for name in turn_order(list(ops), n):
            best[name] = max(best[name], best_rate(ops[name], per_call, seconds / turns, 1))
    return best


def asyncio_and_thread_figures(
    server: RedisServer, engines: list[str], seconds: float, rounds: int
) -> tuple[Figure, Figure, Figure, float | None]:
    """Asyncio 1 task and ``TASKS`` tasks, ``THREADS`` threads; native renew lateness p99 (ms)."""
    every, lateness = asyncio.run(asyncio_rows(server, engines, TASKS, seconds, rounds, SLICE))
    one: Figure = dict.fromkeys(CONTENDERS)
    many: Figure = dict.fromkeys(CONTENDERS)
    for name in engines:
        one[name], many[name] = max(every[name][1]), max(every[name][TASKS])
    one["redis-py"] = max(every["redis.asyncio"][1])
    many["redis-py"] = max(every["redis.asyncio"][TASKS])
    one[LIMIT] = max(every[BARE][1])
    threaded = sync_rows(server, engines, THREADS, seconds, rounds)
    shared: Figure = dict.fromkeys(CONTENDERS)
    for name in [*engines, "redis-py"]:
        shared[name] = max(threaded[name])
    ms = sorted(x * 1000 for x in lateness)
    p99 = ms[max(1, math.ceil(0.99 * len(ms))) - 1] if ms else None  # nearest rank
    return one, many, shared, p99


def cell(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def print_report(
    opts: argparse.Namespace,
    pinned: tuple[int, int] | None,
    why_unpinned: str,
    native_why: str,
    figures: dict[str, Figure],
) -> None:
    parser_name = "hiredis" if redis.utils.HIREDIS_AVAILABLE else "its pure-Python parser"
    print("fenced SET, TCP loopback, one private redis-server")
    if pinned is not None:
        print(f"pinned: this process on CPU {pinned[0]}, redis-server on CPU {pinned[1]}")
    else:
        print(f"not pinned: {why_unpinned}")
    if native_why:
        print(native_why)
    print(f"redis-py with {parser_name}; best of {opts.rounds} rounds x {opts.seconds:g} s\n")
    head = f"{'figure':<46}{'limit':>11}{'native':>11}{'native/limit':>14}"
    head += f"{'python':>11}{'redis-py':>11}"
    print(head)
    print("-" * len(head))
    for key, label, form in ROWS:
        f = figures[key]
        print(
            f"{label:<46}{cell(f[LIMIT], form):>11}{cell(f['native'], form):>11}"
            f"{cell(native_ratio(f), '{:.2f}'):>14}"
            f"{cell(f['python'], form):>11}{cell(f['redis-py'], form):>11}"
        )
    print(
        f"\nthe limit: sync, {LIMITS['sync_writes_per_s']}; pipelines, "
        f"{LIMITS['pipeline_writes_per_s']}; asyncio 1 task, {BARE}."
    )
    print("redis-py: redis.asyncio in the asyncio rows; one shared redis.Redis for the threads.\n")
    head = f"{'target':<54}{'bound':>8}{'measured':>10}  met"
    print(head)
    print("-" * len(head))
    for t in TARGETS:
        ratio, met = t.measured(figures), t.met(figures)
        bound = f"{'>=' if t.at_least else '<='} {t.bound:.2f}"
        verdict = "not measured" if met is None else "met" if met else "not met"
        print(f"{t.what:<54}{bound:>8}{cell(ratio, '{:.2f}'):>10}  {verdict}")


def report_json(
    opts: argparse.Namespace,
    pinned: tuple[int, int] | None,
    figures: dict[str, Figure],
    lateness_p99: float | None,
) -> dict[str, Any]:
    return {
        "rounds": opts.rounds,
        "seconds": opts.seconds,
        "pinned": pinned is not None,
        "client_cpu": pinned[0] if pinned else None,
        "server_cpu": pinned[1] if pinned else None,
        "hiredis": bool(redis.utils.HIREDIS_AVAILABLE),
        "figures": figures,
        "ratios": {key: native_ratio(f) for key, f in figures.items() if key in LIMITS},
        "targets": {
            t.figure: {
                "bound": t.bound,
                "at_least": t.at_least,
                "measured": t.measured(figures),
                "met": t.met(figures),
            }
            for t in TARGETS
        },
        "native_renew_lateness_p99_ms_under_64_tasks": lateness_p99,
    }


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts = options(sys.argv[1:] if argv is None else argv)
    except redlease.ConfigError as exc:
        print(f"limits.py: {exc}", file=sys.stderr)
        return 2
    native_why = native_unavailable()
    engines = ["python"] if native_why else ["native", "python"]
    with RedisServer() as server:
        pinned = None
        if opts.no_pin:
            why_unpinned = "--no-pin"
        else:
            pinned = pin(server.pid)
            why_unpinned = f"this process may use only CPUs {sorted(os.sched_getaffinity(0))}"
        client = server.client()
        client.script_load(SCRIPT.source)
        rates, cpu, user, kernel = sync_figures(server, client, engines, opts.seconds, opts.rounds)
        pipelines, pipelines_by_set = pipeline_figures(
            server, client, engines, opts.seconds, opts.rounds
        )
        one, many, shared, p99 = asyncio_and_thread_figures(
            server, engines, opts.seconds, opts.rounds
        )
        client.close()
    figures = {
        "sync_writes_per_s": rates,
        "sync_cpu_us_per_write": cpu,
        "sync_cpu_user_us_per_write": user,
        "sync_cpu_kernel_us_per_write": kernel,
        "pipeline_writes_per_s": pipelines,
        "pipeline_set_writes_per_s": pipelines_by_set,
        "asyncio_1_task_writes_per_s": one,
        "asyncio_64_tasks_writes_per_s": many,
        "threads_8_writes_per_s": shared,
    }
    print_report(opts, pinned, why_unpinned, native_why, figures)
    print("JSON " + json.dumps(report_json(opts, pinned, figures, p99)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
