"""Many leases in one process: thousands of electors and locks on a fixed set of threads.

    python benchmarks/many_leases.py [--quick] [--electors N] [--locks N] [--seconds S]
    python benchmarks/many_leases.py --cluster [--electors N] [--seconds S]
    python benchmarks/many_leases.py --leases N[,N...] [--cluster] [--stop-each K|all]

Each scenario runs against a private redis-server started here and reports,
from one run, what the issue's targets name:

- N token-driven electors (``start(None)``, distinct names) on one client,
  native engine: time from the first ``start()`` until all lead; threads,
  server connections and RSS added; renew lateness p99 (as measured by each
  lease's keeper: send time minus scheduled time) idle and while the main
  thread holds the GIL in ~1.5 s C calls; the time ``stop()`` of all takes.
- the same on the Python engine (its lateness under a GIL hog is reported
  as it is: a Python renewer cannot run while the GIL is held);
- M auto-renewed ``RedisLocker`` locks held at once (native);
- one elector alone: renew lateness p99 and fenced writes per second.

``--quick`` runs a small version (1,000 electors, 200 locks, short windows).
``--cluster`` runs N native electors (2,000 unless ``--electors`` says) on a
3-master cluster of the test harness (a replica each), names on distinct hash
tags so that every master holds some, beside the same on one plain server,
and prints the issue's targets next to what was measured: all leading within
2 s, at most 4 threads added, renewals on at most one connection per master,
stop-all within 1 s, none lost.

``--leases 1000,10000,100000`` runs only this, once per size: N token-driven
native electors on one plain server (ttl 5 s, renewals every 1 s) and, with
``--cluster``, on the 3-master cluster (ttl 30 s, the lock's default, and the
default renewal interval, 10 s; a size over 100,000 there only): the time
until all lead; the time ``redlease.stop_all``
takes for all but a sample (their releases share round trips), and per
``stop()`` of the sample stopped one by one first (each waits for its own
release's round trip, while the leases not stopped yet keep renewing);
each also per lease. The sample is ``STOP_SAMPLE`` leases (a tenth of
them at fewer) unless ``--stop-each`` names how many (``all``: every
lease is stopped one by one, and stop_all stops none); threads, server
connections and RSS added (and KiB per lease), the servers' CPU while every
lease leads (their renewals: in percent of one CPU, in microseconds per
renewal, renewals per script call and the server's microseconds per call,
from ``INFO cpu`` and ``INFO commandstats``), and the client's and the
servers' CPU per lease-second (CPU time over lease count times seconds; the
servers' less what they spent per second before any lease existed). On
the cluster every lease first renews for ``--hold`` seconds (120 unless it
says) with its token watched: a lease whose token changed or ended meanwhile
is counted lost, and the CPU figures are read over that hold. Then the issue's
targets, marked met or not met, held per
lease at every size (100,000 leading within 10 s is 100 us a lease; stop-all
within 5 s, 50 us; 100,000 ``stop()`` calls one by one within 5 s, 50 us
a stop; 10,000 leading on the cluster within 2 s, 200 us; at most
4 threads added; at most 3 KiB a lease, at 100,000 leases; on the cluster
from 1,000,000 leases: all leading within 60 s, at most 2.5 KiB a lease and
at most 6 threads added; none lost over the hold), and one line ``JSON {...}``
with every figure. The electors share a handful of connections whatever N is, so
the server's ``maxclients`` is not what bounds N; the soft open-file limit is
raised to the hard one all the same, for the server's sake.
Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import redis

import redlease
from redlease._cli.bench import LatenessWindow, native_engine_available, percentile
from redlease._testing import ClusterSet, RedisServer

TTL = 5.0
RENEW = 1.0
CLUSTER_TTL = redlease.LOCK_DEFAULT_TTL
"""The ``--leases --cluster`` rows' ttl (their renewal interval is the default, a third)."""
HOLD = 120.0
"""Seconds the ``--leases --cluster`` rows renew, watched for losses, unless ``--hold`` says."""


def gil_call_size(seconds: float) -> int:
    """An n for which ``sum(range(n))`` holds the GIL for about ``seconds``."""
    n = 1_000_000
    while True:
        start = time.perf_counter()
        sum(range(n))
        spent = time.perf_counter() - start
        if spent >= 0.05:
            return max(1, int(n * seconds / spent))
        n *= 4


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # gone meanwhile
    return names


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def server_clients(observer: redis.Redis) -> int:
    return int(observer.info("clients")["connected_clients"])


@dataclass
class Row:
    scenario: str
    count: int
    to_lead: float = float("nan")
    threads: int = 0
    connections: int = 0
    rss: float = 0.0
    p99_idle: float = float("nan")
    p99_gil: float = float("nan")
    stop_all: float = float("nan")
    stopped_all: int = 0
    """How many leases ``stop_all`` timed (``--leases``: all but the one-by-one sample)."""
    stop_each: float = float("nan")
    """``--leases``: microseconds per ``stop()`` of the sample stopped one by one."""
    stopped_each: int = 0
    """``--leases``: how many leases were stopped one by one (the sample)."""
    stop_each_total: float = float("nan")
    """``--leases``: seconds the sample's ``stop()`` calls took, one after another."""
    extra: dict[str, str] = field(default_factory=dict)


Readers = tuple[Callable[[], list[float]], Callable[[], int]]
"""One lease's renew lateness readers: its samples and its count of them."""


def take_all(windows: list[LatenessWindow]) -> list[float]:
    return [sample for window in windows for sample in window.take()]


def windows(leases: list[Readers], seconds: float) -> tuple[float, float]:
    """p99 renew lateness (ms) over an idle window, then over a GIL-hog window.

    Each window is read once, at its end: at one renewal every ``RENEW``
    seconds a lease holds every sample of it.
    """
    opened = [LatenessWindow(*readers) for readers in leases]
    time.sleep(seconds)
    idle = take_all(opened)
    opened = [LatenessWindow(*readers) for readers in leases]
    n = gil_call_size(1.5)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        sum(range(n))  # one C call holding the GIL for ~1.5 s
    # A renewal held up by the hog is counted when it is finally sent.
    time.sleep(RENEW)
    gil = take_all(opened)
    return p99_ms(idle), p99_ms(gil)


def p99_ms(samples: list[float]) -> float:
    return percentile(samples, 99) * 1000 if samples else float("nan")


LEAD_BOUND = 120.0
"""Seconds a scenario waits for all its electors to lead before it reports what it has."""


def lead_all(group: list[redlease.Elector]) -> float:
    """Start every elector token-driven; seconds until all lead (or ``LEAD_BOUND`` passed)."""
    started = time.monotonic()
    for e in group:
        e.start(None)
    # Asked in order, each until it leads: the last one found leading is the
    # moment all do. One look per elector (and one per wait), not a pass over
    # all that still wait every few milliseconds, which at 100,000 would take
    # the GIL from the driver that makes them lead.
    waiting = iter(group)
    e = next(waiting, None)
    while e is not None and time.monotonic() - started <= LEAD_BOUND:
        if e.token():
            e = next(waiting, None)
        else:
            time.sleep(0.002)
    return time.monotonic() - started


def stop_each(group: list[redlease.Elector]) -> float:
    """Seconds ``stop()`` of every elector, one after another, takes."""
    started = time.monotonic()
    for e in group:
        e.stop()
    return time.monotonic() - started


def electors_scenario(port: int, engine: str, count: int, seconds: float) -> Row:
    client = redis.Redis(port=port)
    observer = redis.Redis(port=port)
    client.ping()
    gc.collect()
    base_threads, base_conns, base_rss = threads(), server_clients(observer), rss_mib()
    group = [
        redlease.Elector(client, f"e{i}", ttl=TTL, renew_interval=RENEW, engine=engine)
        for i in range(count)
    ]
    row = Row(f"{engine} electors", count, to_lead=lead_all(group))
    row.threads = threads() - base_threads
    row.connections = server_clients(observer) - base_conns
    row.rss = rss_mib() - base_rss
    leases = [(e.renew_lateness, e.renew_lateness_count) for e in group]
    row.p99_idle, row.p99_gil = windows(leases, seconds)
    kept = sum(1 for e in group if e.token())
    row.extra["kept through the hog"] = f"{kept}/{count}"
    row.stop_all = stop_each(group)
    client.close()
    observer.close()
    return row


def locks_scenario(port: int, count: int, seconds: float) -> Row:
    client = redis.Redis(port=port)
    observer = redis.Redis(port=port)
    client.ping()
    gc.collect()
    base_threads, base_conns, base_rss = threads(), server_clients(observer), rss_mib()
    locker = redlease.RedisLocker(client, engine="native")
    started = time.monotonic()
    held = [locker.acquire(f"job{i}", ttl=TTL, auto_renew=True) for i in range(count)]
    row = Row("native RedisLocker locks", count, to_lead=time.monotonic() - started)
    row.threads = threads() - base_threads
    row.connections = server_clients(observer) - base_conns
    row.rss = rss_mib() - base_rss
    keepers = [lock._keeper for lock in held]
    leases = [(k.lateness, k.lateness_count) for k in keepers]
    row.p99_idle, row.p99_gil = windows(leases, seconds)
    row.extra["kept through the hog"] = (
        f"{sum(1 for lock in held if not lock.done.is_set())}/{count}"
    )
    started = time.monotonic()
    for lock in held:
        lock.release()
    row.stop_all = time.monotonic() - started
    locker.close()
    client.close()
    observer.close()
    return row


def single_scenario(port: int, engine: str, seconds: float) -> Row:
    client = redis.Redis(port=port)
    e = redlease.Elector(client, f"alone-{engine}", ttl=2.0, renew_interval=0.05, engine=engine)
    e.start(None)
    while not e.token():
        time.sleep(0.001)
    row = Row(f"{engine} one elector alone", 1)
    window = LatenessWindow(e.renew_lateness, e.renew_lateness_count)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 5.0))  # 100 renewals: fewer than the 128 it holds
        window.take()
    row.p99_idle = percentile(window.samples, 99) * 1000
    token = e.token() or 0
    writes = 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        e.fence_set(token, "bench:value", writes)
        writes += 1
    row.extra["fenced writes/s"] = f"{writes / (time.monotonic() - started):,.0f}"
    e.stop()
    client.close()
    return row


CLUSTER_CLIENT_NAME = "many-leases-bench"


def renewal_clients(renewer: object, node: redis.Redis) -> int:
    """How many of ``node``'s clients are connections of the renewer (by their local address)."""
    local = set()
    for _, fd in renewer.connections:  # type: ignore[attr-defined]
        with socket.socket(fileno=os.dup(fd)) as sock:
            host, port = sock.getsockname()[:2]
            local.add(f"{host}:{port}")
    return sum(1 for c in node.client_list() if c.get("addr") in local)


def named_connections(node: redis.Redis) -> int:
    return sum(1 for c in node.client_list() if c.get("name") == CLUSTER_CLIENT_NAME)


def added_thread_names(before: list[str]) -> str:
    """The names of the threads this process has now and did not have ``before``."""
    added = thread_names()
    for name in before:
        if name in added:
            added.remove(name)
    return ", ".join(sorted(added))


def cluster_scenario(port: int, count: int, seconds: float) -> Row:
    from redis.cluster import RedisCluster

    client = RedisCluster(
        host="127.0.0.1", port=port, socket_timeout=2, client_name=CLUSTER_CLIENT_NAME
    )
    masters = [redis.Redis(host=n.host, port=n.port) for n in client.get_primaries()]
    gc.collect()
    base_threads, base_rss = threads(), rss_mib()
    base_names = thread_names()
    base_conns = [named_connections(m) for m in masters]
    group = [
        redlease.Elector(client, f"{{c{i}}}", ttl=TTL, renew_interval=RENEW, engine="native")
        for i in range(count)
    ]
    row = Row("native electors, 3-master cluster", count, to_lead=lead_all(group))
    row.threads = threads() - base_threads
    row.extra["threads"] = added_thread_names(base_names)
    row.connections = sum(
        named_connections(m) - b for m, b in zip(masters, base_conns, strict=True)
    )
    row.rss = rss_mib() - base_rss
    tokens = {e.config.name: e.token() for e in group}
    time.sleep(RENEW * 1.5)
    renewer = group[0]._core.run.keeper.renewer  # type: ignore[attr-defined]
    renewing = [renewal_clients(renewer, m) for m in masters]
    row.extra["renewal conns per master"] = "/".join(str(n) for n in renewing)
    leases = [(e.renew_lateness, e.renew_lateness_count) for e in group]
    row.p99_idle, row.p99_gil = windows(leases, seconds)
    kept = sum(1 for e in group if e.token() == tokens[e.config.name])
    row.extra["kept through the hog"] = f"{kept}/{count}"
    row.stop_all = stop_each(group)
    client.close()
    for m in masters:
        m.close()
    return row


PLAIN_LEASES = "native electors, plain server"
CLUSTER_LEASES = "native electors, 3-master cluster"


def leases_scenario(
    port: int, count: int, cluster: bool, each: int | None = None, hold: float = HOLD
) -> Row:
    """``count`` token-driven native electors: the time to lead and to stop, and what they add.

    On one plain server, or (``cluster``) on the 3-master cluster whose node
    listens on ``port``, names on distinct hash tags so that every master
    holds some. ``each``: how many are stopped one by one (None: ``stop_sample``).
    On the cluster the leases first renew for ``hold`` seconds, watched for losses.
    """
    client: redis.Redis | redis.RedisCluster
    if cluster:
        on_cluster = redis.RedisCluster(
            host="127.0.0.1", port=port, socket_timeout=2, client_name=CLUSTER_CLIENT_NAME
        )
        masters = [redis.Redis(host=n.host, port=n.port) for n in on_cluster.get_primaries()]
        client = on_cluster
    else:
        client = redis.Redis(port=port)
        masters = [redis.Redis(port=port)]

    def connections() -> int:
        if cluster:
            return sum(named_connections(m) for m in masters)
        return server_clients(masters[0])

    client.ping()
    idle = idle_cpu(masters)
    gc.collect()
    base_threads, base_conns, base_rss = threads(), connections(), rss_mib()
    base_names = thread_names()
    if cluster:
        group = [
            redlease.Elector(client, f"{{c{i}}}", ttl=CLUSTER_TTL, engine="native")
            for i in range(count)
        ]
    else:
        group = [
            redlease.Elector(client, f"e{i}", ttl=TTL, renew_interval=RENEW, engine="native")
            for i in range(count)
        ]
    row = Row(CLUSTER_LEASES if cluster else PLAIN_LEASES, count, to_lead=lead_all(group))
    row.threads = threads() - base_threads
    row.connections = connections() - base_conns
    row.rss = rss_mib() - base_rss
    row.extra["leading"] = f"{sum(1 for e in group if e.token())}/{count}"
    row.extra["threads"] = added_thread_names(base_names)
    renewer = group[0]._core.run.keeper.renewer  # type: ignore[attr-defined]
    tokens = [e.token() for e in group]
    window = hold if cluster else RENEWING_WINDOW
    cost = server_cpu(masters, window, renewer, count, idle)
    if cluster:
        lost = sum(1 for e, token in zip(group, tokens, strict=True) if e.token() != token)
        row.extra["lost"] = str(lost)
    row.extra["renewing_s"] = f"{window:g}"
    row.extra["server_cpu"] = f"{cost.percent:.0f}"
    row.extra["client_us_per_lease_s"] = f"{cost.client_us_per_lease_s:.3f}"
    row.extra["server_us_per_lease_s"] = f"{cost.server_us_per_lease_s:.3f}"
    row.extra["cpu_us_per_renewal"] = f"{cost.us_per_renewal:.2f}"
    row.extra["renewals_per_call"] = f"{cost.renewals_per_call:.1f}"
    row.extra["us_per_call"] = f"{cost.us_per_call:.1f}"
    # A sample stopped one by one (each stop() waits for its own release's
    # round trip), then the rest with one redlease.stop_all (their releases
    # share round trips).
    one_by_one = stop_sample(count) if each is None else min(each, count)
    sample, rest = group[:one_by_one], group[one_by_one:]
    row.stop_each_total, row.stopped_each = stop_each(sample), len(sample)
    row.stop_each = us_per_lease(row.stop_each_total, max(len(sample), 1))
    started = time.monotonic()
    redlease.stop_all(rest)
    row.stop_all, row.stopped_all = time.monotonic() - started, len(rest)
    client.close()
    for m in masters:
        m.close()
    return row


RENEWING_WINDOW = 2.0
"""Seconds over which the server's CPU is read while every lease leads (and renews)."""

STOP_SAMPLE = 1000
"""At most this many leases (a tenth of them at fewer) are stopped one by one."""


def stop_sample(count: int) -> int:
    """How many of ``count`` leases are stopped one by one before the rest stop together."""
    return min(STOP_SAMPLE, count // 10)


@dataclass
class ServerCost:
    """What renewing every lease cost the servers over a window (``server_cpu``)."""

    percent: float  # of one CPU, every master added up
    us_per_renewal: float  # INFO cpu (user + sys), less idle, per renewal the renewer wrote
    renewals_per_call: float  # renewals per script call (INFO commandstats, EVALSHA)
    us_per_call: float  # the servers' own time per script call (commandstats usec_per_call)
    client_us_per_lease_s: float  # this process's CPU (user + sys) per lease-second
    server_us_per_lease_s: float  # the servers' CPU (user + sys) per lease-second, less idle


IDLE_WINDOW = 3.0
"""Seconds over which the servers' own CPU is read before any lease exists."""


def masters_cpu(masters: list[redis.Redis]) -> float:
    """CPU seconds (user + sys) every master has used so far, added up (``INFO cpu``)."""
    total = 0.0
    for m in masters:
        info = m.info("cpu")
        total += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return total


def idle_cpu(masters: list[redis.Redis]) -> float:
    """The servers' CPU per second with no lease: their own upkeep (a cluster's bus, cron)."""
    before, started = masters_cpu(masters), time.monotonic()
    time.sleep(IDLE_WINDOW)
    return (masters_cpu(masters) - before) / (time.monotonic() - started)


def server_cpu(
    masters: list[redis.Redis], seconds: float, renewer: object, leases: int, idle: float = 0.0
) -> ServerCost:
    """What the servers (every master, added up) and this process spent over ``seconds`` renewing.

    Read from ``INFO cpu`` and ``INFO commandstats`` while all the leases lead:
    what renewing them costs the server, which every other call (a stop's
    release among them) waits behind; per renewal written by ``renewer``
    (``Renewer.sent()``) and per EVALSHA call the servers ran. Both sides'
    CPU also per lease-second, ``leases`` leading throughout: flat across
    sizes when a lease costs the same however many there are. ``idle``: the
    servers' CPU per second with no lease (``idle_cpu``), taken off the
    per-lease-second figure, which is then what the leases add.
    """

    def used() -> tuple[float, int, int]:
        cpu, calls, usec = masters_cpu(masters), 0, 0
        for m in masters:
            stats = m.info("commandstats").get("cmdstat_evalsha", {})
            calls += int(stats.get("calls", 0))
            usec += int(stats.get("usec", 0))
        return cpu, calls, usec

    def own() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    sent_before = renewer.sent[0]  # type: ignore[attr-defined]
    (cpu0, calls0, usec0), own0, started = used(), own(), time.monotonic()
    time.sleep(seconds)
    own1 = own()
    cpu1, calls1, usec1 = used()
    elapsed = time.monotonic() - started
    lease_seconds = max(leases, 1) * elapsed
    net = max(cpu1 - cpu0 - idle * elapsed, 0.0)  # what renewing added to the servers' upkeep
    renewals = max(renewer.sent[0] - sent_before, 1)  # type: ignore[attr-defined]
    calls = max(calls1 - calls0, 1)
    return ServerCost(
        percent=(cpu1 - cpu0) / elapsed * 100,
        us_per_renewal=net * 1e6 / renewals,
        renewals_per_call=renewals / calls,
        us_per_call=(usec1 - usec0) / calls,
        client_us_per_lease_s=(own1 - own0) * 1e6 / lease_seconds,
        server_us_per_lease_s=net * 1e6 / lease_seconds,
    )


def lease_sizes(text: str) -> list[int]:
    """``--leases N[,N...]``: whole numbers of leases, each at least 1."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part.strip().replace("_", ""))
        except ValueError:
            size = 0
        if size < 1:
            raise redlease.ConfigError(
                "--leases takes whole numbers of leases of at least 1, separated by commas "
                f"(e.g. 1000,10000,100000), got {part.strip()!r} in {text!r}"
            )
        sizes.append(size)
    return sizes


def stop_each_count(text: str | None, count: int) -> int | None:
    """``--stop-each K|all``: how many of ``count`` leases stop one by one (None: the sample)."""
    if text is None:
        return None
    if text.strip() == "all":
        return count
    try:
        each = int(text.strip().replace("_", ""))
    except ValueError:
        each = -1
    if each < 0:
        raise redlease.ConfigError(
            f"--stop-each takes a whole number of leases (0 or more) or 'all', got {text!r}"
        )
    return each


def where_of(row: Row) -> str:
    return "cluster" if row.scenario == CLUSTER_LEASES else "plain"


def us_per_lease(seconds: float, count: int) -> float:
    return seconds / count * 1e6 if count else float("nan")


def kib_per_lease(row: Row) -> float:
    return row.rss * 1024 / row.count


# The targets, per lease where it names a size, so that every size
# is held to the same rate: 100,000 leading within 10 s is 100 us a lease.
PLAIN_LEAD_US = 100.0
PLAIN_STOP_US = 50.0
CLUSTER_LEAD_US = 200.0
MAX_THREADS = 4
MAX_KIB = 3.0
MEMORY_AT = 100_000
"""The size from which the memory bound is checked (the issue's size)."""
MILLION = 1_000_000
"""The cluster size from which the million-lease targets are held."""
MILLION_LEAD_S = 60.0
MILLION_MAX_KIB = 2.5
MILLION_MAX_THREADS = 6


@dataclass
class Check:
    """One target of a ``--leases`` row: ``measured`` against ``bound`` (at most, or at least)."""

    what: str
    bound: float
    measured: float
    unit: str = ""
    note: str = ""
    at_least: bool = False

    @property
    def met(self) -> bool:
        return self.measured >= self.bound if self.at_least else self.measured <= self.bound

    def text(self, value: float) -> str:
        number = f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"
        return f"{number} {self.unit}".strip()


PLAIN_STOP_EACH_US = 50.0
"""One ``stop()`` at a time, the rest renewing: 100,000 within 5 s."""


def lease_targets(row: Row) -> list[Check]:
    """What the issue asks of one ``--leases`` row."""
    leading = int(row.extra["leading"].partition("/")[0])
    lead_us = us_per_lease(row.to_lead, row.count)
    checks = [Check("all leading", row.count, leading, at_least=True)]
    if row.scenario == CLUSTER_LEASES:
        checks.append(Check("lost while renewing", 0, int(row.extra["lost"])))
        if row.count >= MILLION:
            checks += [
                Check("threads added", MILLION_MAX_THREADS, row.threads),
                Check("all leading within", MILLION_LEAD_S, row.to_lead, "s"),
                Check("memory, per lease", MILLION_MAX_KIB, kib_per_lease(row), "KiB"),
            ]
            return checks
        checks.append(Check("threads added", MAX_THREADS, row.threads))
        checks.append(Check("to lead, per lease", CLUSTER_LEAD_US, lead_us, "us", "10,000 in 2 s"))
        return checks
    checks.append(Check("threads added", MAX_THREADS, row.threads))
    checks.append(Check("to lead, per lease", PLAIN_LEAD_US, lead_us, "us", "100,000 in 10 s"))
    if row.stopped_all:
        checks.append(
            Check(
                "stop all, per lease",
                PLAIN_STOP_US,
                us_per_lease(row.stop_all, row.stopped_all),
                "us",
                "100,000 in 5 s",
            )
        )
    if row.stopped_each:
        checks.append(
            Check(
                "stop() one by one, per stop",
                PLAIN_STOP_EACH_US,
                row.stop_each,
                "us",
                "100,000 in 5 s",
            )
        )
    if row.count >= MEMORY_AT:
        # The bound is the for 100,000 leases; below that the process's
        # fixed costs (buffers, connections, the threads' stacks) are a share of
        # the figure that the table still prints for every size.
        checks.append(Check("memory, per lease", MAX_KIB, kib_per_lease(row), "KiB"))
    return checks


def ratio(large: Row, small: Row, figure: str) -> str:
    """``large``'s ``figure`` over ``small``'s, as ``1.23x`` (``-`` when ``small``'s is 0)."""
    below = float(small.extra[figure])
    return f"{float(large.extra[figure]) / below:.2f}x" if below > 0 else "-"


def print_leases(rows: list[Row]) -> None:
    """The ``--leases`` table, the spread of the per-lease times, the targets; one JSON line."""
    print(
        "| server | leases | all leading | us/lease | stop_all | of | us/lease "
        "| stop() one by one | of | us/stop | threads added | server conns added | RSS added "
        "| KiB/lease | server CPU renewing | CPU us/renewal | renewals/call | us/call "
        "| client CPU us/lease-s | server CPU us/lease-s | lost |"
    )
    print(
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for r in rows:
        lead_us = us_per_lease(r.to_lead, r.count)
        stop_us = us_per_lease(r.stop_all, r.stopped_all) if r.stopped_all else float("nan")
        print(
            f"| {where_of(r)} | {r.count:,} | {r.to_lead:.2f} s | {lead_us:.1f} "
            f"| {r.stop_all:.2f} s | {r.stopped_all:,} | {stop_us:.1f} "
            f"| {r.stop_each_total:.2f} s | {r.stopped_each:,} | {r.stop_each:.1f} "
            f"| {r.threads} | {r.connections} | {r.rss:.0f} MiB | {kib_per_lease(r):.2f} "
            f"| {r.extra['server_cpu']}% | {r.extra['cpu_us_per_renewal']} "
            f"| {r.extra['renewals_per_call']} | {r.extra['us_per_call']} "
            f"| {r.extra['client_us_per_lease_s']} | {r.extra['server_us_per_lease_s']} "
            f"| {r.extra.get('lost', '')} |"
        )
    print(
        "\nstop_all: redlease.stop_all of every lease but a sample (their releases share "
        "round trips); stop() one by one: the sample stopped one by one first, each waiting "
        "for its own release's round trip while the rest renew (--stop-each all: every "
        "lease).\nserver CPU renewing: what the servers spent while every "
        f"lease led (plain: ttl {TTL:g} s, renewals every {RENEW:g} s; cluster: ttl "
        f"{CLUSTER_TTL:g} s, renewals every {CLUSTER_TTL / 3:g} s), in percent of one CPU; a "
        "lone release waits behind those renewals.\nCPU us/lease-s: CPU time over leases "
        "times seconds, read over that window (the cluster's: its hold, every lease's token "
        "watched; lost: leases whose token changed or ended); the servers' less their own "
        f"upkeep, read over {IDLE_WINDOW:g} s before any lease existed."
    )
    for scenario in (PLAIN_LEASES, CLUSTER_LEASES):
        sized = sorted((r for r in rows if r.scenario == scenario), key=lambda r: r.count)
        sized = [r for r in sized if r.stopped_all]
        if len(sized) > 1 and sized[0].count < sized[-1].count:
            small, large = sized[0], sized[-1]
            lead = (large.to_lead / large.count) / (small.to_lead / small.count)
            stop = (large.stop_all / large.stopped_all) / (small.stop_all / small.stopped_all)
            client = ratio(large, small, "client_us_per_lease_s")
            server = ratio(large, small, "server_us_per_lease_s")
            print(
                f"\n{scenario}: per lease at {large.count:,} against {small.count:,}: "
                f"to lead {lead:.2f}x, to stop {stop:.2f}x, client CPU per lease-second "
                f"{client}, server CPU per lease-second {server} (flat is 1.00x)"
            )
    print("\n| leases | target | bound | measured | met |")
    print("| --- | --- | ---: | ---: | --- |")
    targets = []
    for r in rows:
        for c in lease_targets(r):
            bound = f"{'>=' if c.at_least else '<='} {c.text(c.bound)}"
            bound += f" ({c.note})" if c.note else ""
            verdict = "met" if c.met else "not met"
            print(
                f"| {where_of(r)} {r.count:,} | {c.what} | {bound} | {c.text(c.measured)} "
                f"| {verdict} |"
            )
            targets.append(
                {"server": where_of(r), "leases": r.count, "target": c.what, "bound": c.bound,
                 "at_least": c.at_least, "unit": c.unit, "measured": c.measured, "met": c.met}
            )  # fmt: skip
    leases = [
        {
            "server": where_of(r),
            "leases": r.count,
            "leading": int(r.extra["leading"].partition("/")[0]),
            "to_lead_s": r.to_lead,
            "stop_all_s": r.stop_all,
            "stop_all_leases": r.stopped_all,
            "us_per_lease_to_lead": us_per_lease(r.to_lead, r.count),
            "us_per_lease_to_stop": us_per_lease(r.stop_all, r.stopped_all),
            "us_per_stop_one_by_one": r.stop_each,
            "stopped_one_by_one": r.stopped_each,
            "stop_one_by_one_s": r.stop_each_total,
            "threads_added": r.threads,
            "thread_names_added": r.extra["threads"],
            "server_connections_added": r.connections,
            "rss_added_mib": r.rss,
            "kib_per_lease": kib_per_lease(r),
            "server_cpu_renewing_pct": float(r.extra["server_cpu"]),
            "server_cpu_us_per_renewal": float(r.extra["cpu_us_per_renewal"]),
            "renewals_per_call": float(r.extra["renewals_per_call"]),
            "server_us_per_call": float(r.extra["us_per_call"]),
            "renewing_s": float(r.extra["renewing_s"]),
            "client_cpu_us_per_lease_s": float(r.extra["client_us_per_lease_s"]),
            "server_cpu_us_per_lease_s": float(r.extra["server_us_per_lease_s"]),
            "lost": int(r.extra["lost"]) if "lost" in r.extra else None,
        }
        for r in rows
    ]
    print("\nJSON " + json.dumps({"leases": leases, "targets": targets}))


def raise_open_files() -> None:
    """Lift this process's soft open-file limit to its hard one (redis-server inherits it).

    The native electors share a handful of connections whatever their number
    (the table's "server conns added"), so nothing here grows with N; but a
    server started with ``--maxclients 20000`` wants that many descriptors,
    and a soft limit of 1024 would make it lower its own maxclients.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def print_targets(row: Row) -> None:
    """The issue's targets for the cluster run, beside what was measured."""
    per_master = [int(n) for n in row.extra["renewal conns per master"].split("/")]
    kept, _, of = row.extra["kept through the hog"].partition("/")
    checks = [
        (f"{row.count:,} native electors all leading", "<= 2 s", f"{row.to_lead:.2f} s",
         row.to_lead <= 2.0),
        ("threads added", "<= 4", str(row.threads), row.threads <= 4),
        ("renewal connections per master", "<= 1", "/".join(map(str, per_master)),
         max(per_master) <= 1),
        ("stop all", "<= 1 s", f"{row.stop_all:.2f} s", row.stop_all <= 1.0),
        ("lost (GIL hog included)", "0", str(int(of) - int(kept)), kept == of),
    ]  # fmt: skip
    print("| cluster target | bound | measured | met |")
    print("| --- | ---: | ---: | --- |")
    for what, bound, measured, met in checks:
        print(f"| {what} | {bound} | {measured} | {'yes' if met else 'NO'} |")


def print_table(rows: list[Row]) -> None:
    head = (
        "| scenario | count | all leading / held | threads added | server conns added "
        "| RSS added | lateness p99 idle | lateness p99 GIL hog | stop all | notes |"
    )
    print(head)
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        notes = "; ".join(f"{k}: {v}" for k, v in r.extra.items())
        print(
            f"| {r.scenario} | {r.count:,} | {r.to_lead:.2f} s | {r.threads} | {r.connections} "
            f"| {r.rss:.0f} MiB | {r.p99_idle:.2f} ms | {r.p99_gil:.2f} ms | {r.stop_all:.2f} s "
            f"| {notes} |"
            if r.count > 1
            else f"| {r.scenario} | 1 | | | | | {r.p99_idle:.2f} ms | | | {notes} |"
        )


SCENARIOS = ("native", "python", "locks", "alone-native", "alone-python")
ALL_SCENARIOS = (*SCENARIOS, "cluster", "leases", "leases-cluster")


def run_scenario(name: str, port: int, args: argparse.Namespace) -> Row:
    if name in ("native", "python"):
        count = args.electors if name == "native" else args.python_electors
        return electors_scenario(port, name, count, args.seconds)
    if name == "cluster":
        return cluster_scenario(port, args.electors, args.seconds)
    if name in ("leases", "leases-cluster"):
        each = stop_each_count(args.stop_each, args.electors)
        hold = HOLD if args.hold is None else args.hold
        return leases_scenario(port, args.electors, name == "leases-cluster", each, hold)
    if name == "locks":
        return locks_scenario(port, args.locks, args.seconds)
    return single_scenario(port, name.split("-")[1], args.seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small, short run")
    parser.add_argument(
        "--leases",
        metavar="N[,N...]",
        help="only time N native electors to lead and to stop, and what they add, per N",
    )
    parser.add_argument(
        "--stop-each",
        metavar="K|all",
        help="--leases: stop K leases (all: every one) one by one, not the default sample",
    )
    parser.add_argument(
        "--hold",
        type=float,
        default=None,
        metavar="S",
        help=f"--leases --cluster: seconds every lease renews, watched for losses ({HOLD:g})",
    )
    parser.add_argument("--electors", type=int, default=None)
    parser.add_argument("--python-electors", type=int, default=None)
    parser.add_argument("--locks", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="each lateness window")
    parser.add_argument(
        "--cluster", action="store_true", help="native electors on a 3-master cluster"
    )
    parser.add_argument("--scenario", choices=ALL_SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.electors = args.electors or (1000 if args.quick else 2000 if args.cluster else 10_000)
    args.python_electors = args.python_electors or args.electors
    args.locks = args.locks or (200 if args.quick else 1000)
    args.seconds = args.seconds or (2.0 if args.quick else 5.0)
    if args.scenario:
        # One scenario in a process of its own, so that threads, connections
        # and RSS are counted from a clean baseline.
        print(json.dumps(asdict(run_scenario(args.scenario, args.port, args))))
        return 0
    try:
        sizes = lease_sizes(args.leases) if args.leases is not None else []
        stop_each_count(args.stop_each, 1)
    except redlease.ConfigError as exc:
        print(f"many_leases.py: {exc}", file=sys.stderr)
        return 2
    available, why = native_engine_available()
    if not available:
        print(f"the native engine is unavailable: {why}", file=sys.stderr)
        return 1
    rows: list[Row] = []
    if args.hold is not None and not args.hold > 0:
        print(f"many_leases.py: --hold must be a positive number of seconds, got {args.hold!r}",
              file=sys.stderr)  # fmt: skip
        return 2
    passed = [a for a in sys.argv[1:] if a not in ("--quick", "--cluster")]
    if sizes:
        leases_rows(sizes, args.cluster, passed)
        return 0
    if args.quick:
        passed.append("--quick")
    if args.cluster:
        passed += ["--electors", str(args.electors)]
        with ClusterSet() as topology:
            seed = topology.masters()[0].port
            rows.append(scenario_row("cluster", seed, passed))
        with RedisServer(args=["--maxclients", "20000"]) as server:
            rows.append(scenario_row("native", server.port, passed))
        print_table(rows)
        print()
        print_targets(rows[0])
        return 0
    with RedisServer(args=["--maxclients", "20000"]) as server:
        for name in SCENARIOS:
            rows.append(scenario_row(name, server.port, passed))
            server.client().flushall()
    print_table(rows)
    return 0


PLAIN_MAX = 100_000
"""With ``--cluster``, larger sizes run on the cluster only: one plain server renewing a
million leases every second is not what the plain rows measure."""


def leases_rows(sizes: list[int], cluster: bool, passed: list[str]) -> None:
    """``--leases``: each size on a plain server, then (``cluster``) on the cluster; the table.

    With ``cluster``, a size over ``PLAIN_MAX`` runs on the cluster only.
    """
    raise_open_files()
    rows: list[Row] = []
    plain = [size for size in sizes if not cluster or size <= PLAIN_MAX]
    with RedisServer(args=["--maxclients", "20000"]) as server:
        for size in plain:
            passed_size = [*passed, "--electors", str(size)]
            rows.append(scenario_row("leases", server.address[1], passed_size))
            server.client().flushall()
    if cluster:
        with ClusterSet() as topology:
            seed = topology.masters()[0].address[1]
            for size in sizes:
                passed_size = [*passed, "--electors", str(size)]
                rows.append(scenario_row("leases-cluster", seed, passed_size))
                for master in topology.masters():
                    master.client().flushall()
    print_leases(rows)


def scenario_row(name: str, port: int, passed: list[str]) -> Row:
    """Run one scenario in a process of its own and read its row."""
    out = subprocess.run(
        [sys.executable, __file__, *passed, "--scenario", name, "--port", str(port)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Row(**json.loads(out.strip().splitlines()[-1]))


if __name__ == "__main__":
    sys.exit(main())
