"""How fast a partitioned group balances after a join, a graceful leave and a kill.

    python benchmarks/partitions.py [--quick] [--partitions N[,N...]] [--members M]
                                    [--ttl S] [--rounds R] [--plot FILE.png]

For each partition count (64 and 1,024 unless ``--partitions`` says; 16 and
64 with ``--quick``), ``--members`` members (8) of one group share the
partitions on a private redis-server, all in this process on the native
engine (the Python engine where the extension is not built; the output says
which). Each round measures, on the monotonic clock, the time from a change
until every partition is owned and each member owns floor(N/M) or ceil(N/M):

- join: the last member's ``start()``, the others balanced;
- leave: one member's ``stop()`` (graceful: it revokes, releases, leaves);
- kill: a member running in a process of its own is sent SIGKILL; its
  partitions are free only once their leases ran out (one ttl).

Every member here is made (its ``Partitions`` built) before the clock
starts, as it would be in a process of its own: building one is no change
of the group, and in this process it would hold the GIL the others need.

Then every member is restarted in turn, one after another (``stop()``, a new
member in its place, balanced again before the next), while a reader asks
Redis who holds each partition (``assignment()``) every ~10 ms: the longest
any partition may have gone unowned, and the most unowned at once. With
``--plot FILE.png`` (matplotlib) that rolling restart is drawn, partitions
owned per member over time, one panel per partition count.

Also measured: the threads the members added to this process (bound: at
most 4, whatever the number of members: members without callbacks are
stepped by the process's one driver thread), and the time from the first
``start()`` until all members are balanced (bound: 3 x ttl + 5 s). Prints a
table, the targets met or not, and one line ``JSON {...}`` with every figure.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

import redlease
from redlease._cli.bench import native_engine_available, percentile
from redlease._testing import RedisServer

NAME = "bench-partitions"
SAMPLE_EVERY = 0.01
"""Seconds between two looks of the rolling restart's reader."""

DWELL = 0.25
"""Seconds the rolling restart waits, once balanced, before it restarts the next member."""

BALANCE_BOUND_TTLS = 3
"""The issue's bound: balanced within 3 x ttl of a change."""

START_SLACK = 5.0
"""The issue's bound for the first start of every member: 3 x ttl + 5 s."""

THREADS_BOUND = 4
"""Threads the members may add, however many (members without callbacks have none of their own)."""

GIVE_UP_TTLS = 30
"""A change that is not balanced after this many ttls is reported as not balanced."""


# -- the command line -----------------------------------------------------------------------


def counts(text: str) -> list[int]:
    """``--partitions N[,N...]``: whole numbers of partitions, each from 1 to 65,536."""
    found = []
    for part in text.split(","):
        try:
            n = int(part.strip().replace("_", ""))
        except ValueError:
            n = 0
        if not 1 <= n <= 65536:
            raise redlease.ConfigError(
                "--partitions takes whole numbers of partitions from 1 to 65536, separated by "
                f"commas (e.g. 64,1024), got {part.strip()!r} in {text!r}"
            )
        found.append(n)
    return found


def options(argv: Sequence[str]) -> argparse.Namespace:
    """The command line, checked: every bad value is a ConfigError naming the rule and it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", help="partition counts, e.g. 64,1024 (the default)")
    parser.add_argument("--members", type=int, default=8, help="members of the group (8)")
    parser.add_argument("--ttl", type=float, help="every lease's ttl in seconds (default 2.0)")
    parser.add_argument("--rounds", type=int, help="join/leave/kill rounds per size (default 3)")
    parser.add_argument(
        "--quick", action="store_true", help="16 and 64 partitions, 1 round, ttl 1 s"
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw the rolling restart here")
    opts = parser.parse_args(argv)
    opts.sizes = counts(opts.partitions or ("16,64" if opts.quick else "64,1024"))
    if opts.rounds is None:
        opts.rounds = 1 if opts.quick else 3
    if opts.ttl is None:
        opts.ttl = 1.0 if opts.quick else 2.0
    if opts.rounds < 1:
        raise redlease.ConfigError(f"--rounds must be at least 1, got {opts.rounds}")
    if opts.members < 2:
        raise redlease.ConfigError(
            f"--members must be at least 2 (one joins, leaves, is killed), got {opts.members}"
        )
    if not (math.isfinite(opts.ttl) and opts.ttl >= 0.1):
        raise redlease.ConfigError(
            f"--ttl must be a finite number of seconds of at least 0.1, got {opts.ttl}"
        )
    if opts.plot is not None and not opts.plot.endswith(".png"):
        raise redlease.ConfigError(f"--plot takes a .png file name, got {opts.plot!r}")
    return opts


# -- the group ------------------------------------------------------------------------------


def thread_names() -> list[str]:
    """The name of every thread of this process, native ones included."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # gone meanwhile
    return sorted(names)


def added(before: Sequence[str]) -> list[str]:
    """The names of the threads this process has now and did not have ``before``."""
    now = thread_names()
    for name in before:
        if name in now:
            now.remove(name)
    return now


def share_ok(sizes: Sequence[int], n: int) -> bool:
    """Each of ``sizes`` is floor(n/m) or ceil(n/m), m = how many, and they add up to n."""
    m = len(sizes)
    return sum(sizes) == n and all(n // m <= s <= -(-n // m) for s in sizes)


def balanced(members: Sequence[redlease.Partitions], n: int) -> bool:
    """Every partition owned by exactly one of ``members``, each owning its share."""
    owned = [m.owned() for m in members]
    every = {p for each in owned for p in each}
    return len(every) == n and share_ok([len(each) for each in owned], n)


def assigned_balanced(reader: redlease.Partitions, live: int, n: int) -> bool:
    """As Redis says: every partition held, by ``live`` holders, each holding its share."""
    holders = reader.assignment().values()
    if None in holders:
        return False
    per_member = Counter(holders)
    return len(per_member) == live and share_ok(list(per_member.values()), n)


def wait_for(
    predicate: Callable[[], bool], since: float, give_up: float, every: float = 0.002
) -> float:
    """Seconds from ``since`` until ``predicate()`` holds; NaN once ``give_up`` s passed."""
    while not predicate():
        if time.monotonic() - since > give_up:
            return float("nan")
        time.sleep(every)
    return time.monotonic() - since


_MEMBER = textwrap.dedent(
    """
    import sys, redis, redlease
    port, name, n, ttl, member_id, engine = sys.argv[1:]
    redlease.Partitions(redis.Redis(port=int(port)), name, int(n), ttl=float(ttl),
                        member_id=member_id, engine=engine).start()
    print("ready", flush=True)
    sys.stdin.read()
    """
)


class ProcessMember:
    """A member in a process of its own, to be killed."""

    def __init__(
        self, port: int, name: str, n: int, ttl: float, member_id: str, engine: str
    ) -> None:
        args = [str(port), name, str(n), str(ttl), member_id, engine]
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MEMBER, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.kill()
            raise RuntimeError(f"the member process did not start (it said {line!r})")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


class Group:
    """``members`` members of one group in this process, numbered as they come."""

    def __init__(self, client: redis.Redis, n: int, ttl: float, engine: str) -> None:
        self.name = f"{NAME}-{n}"
        self.client = client
        self.n = n
        self.ttl = ttl
        self.engine = engine
        self.members: list[redlease.Partitions] = []
        self.made = 0
        self.reader = self.member("reader")  # never started: asks Redis who holds what

    def member(self, member_id: str | None = None) -> redlease.Partitions:
        if member_id is None:
            self.made += 1
            member_id = f"m{self.made:02d}"
        return redlease.Partitions(
            self.client, self.name, self.n, ttl=self.ttl, member_id=member_id, engine=self.engine
        )

    def join(self, member: redlease.Partitions | None = None) -> redlease.Partitions:
        """Start ``member`` (or a new one) and count it in."""
        member = (member or self.member()).start()
        self.members.append(member)
        return member

    def give_up(self) -> float:
        return GIVE_UP_TTLS * self.ttl + START_SLACK

    def until_balanced(self, since: float) -> float:
        return wait_for(lambda: balanced(self.members, self.n), since, self.give_up())

    def stop_all(self) -> None:
        for member in self.members:
            member.stop()
        self.members = []


# -- what is measured -----------------------------------------------------------------------


@dataclass
class Rolling:
    """A rolling restart of every member: what the reader saw."""

    seconds: float = 0.0
    looks: int = 0
    longest_unowned_s: float = 0.0
    most_unowned: int = 0
    restarts_balanced: int = 0
    # (seconds since the start, the member stopped, the member started) per restart
    restarts: list[tuple[float, str, str]] = field(default_factory=list)
    # each member's place in the group: a new member takes the place of the one it replaced
    places: dict[str, int] = field(default_factory=dict)
    # (seconds since the start, {member: partitions held}, partitions unowned) per look
    timeline: list[tuple[float, dict[str, int], int]] = field(default_factory=list)


@dataclass
class Size:
    partitions: int
    members: int
    engine: str
    ttl_s: float
    start_to_balanced_s: float = float("nan")
    threads_added: int = 0
    threads: list[str] = field(default_factory=list)
    join_s: list[float] = field(default_factory=list)
    leave_s: list[float] = field(default_factory=list)
    kill_s: list[float] = field(default_factory=list)
    rolling: Rolling = field(default_factory=Rolling)


class Sampler:
    """Asks ``reader.assignment()`` every ``SAMPLE_EVERY`` s on a thread of its own."""

    def __init__(self, reader: redlease.Partitions) -> None:
        self.reader = reader
        self.looks: list[tuple[float, float, dict[str, str | None]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="assignment-reader", daemon=True)

    def run(self) -> None:
        while not self.done.is_set():
            sent = time.monotonic()
            try:
                assignment = self.reader.assignment()
            except redis.RedisError:
                continue  # a look lost: the next one counts
            self.looks.append((sent, time.monotonic(), assignment))
            self.done.wait(SAMPLE_EVERY)

    def longest_unowned(self) -> float:
        """The longest any partition may have had no owner: from the sending of the last
        look that saw it owned to the answer of the first that saw it owned again."""
        longest = 0.0
        for partition in self.reader.partitions:
            owned_since: float | None = None
            gap = False
            for sent, answered, assignment in self.looks:
                if assignment[partition] is None:
                    gap = True
                    continue
                if gap and owned_since is not None:
                    longest = max(longest, answered - owned_since)
                gap, owned_since = False, sent
        return longest


def rolling_restart(group: Group) -> Rolling:
    """Restart every member in turn while the reader looks; the timeline and its figures.

    Each restart is a ``stop()`` and a new member's ``start()``, then a wait
    until balanced and ``DWELL`` s more (as a deployment waits for a health
    check), so that each step shows in the timeline.
    """
    sampler = Sampler(group.reader)
    started = time.monotonic()
    sampler.thread.start()
    time.sleep(DWELL)
    rolling = Rolling(places={m.member_id: i for i, m in enumerate(group.members)})
    for index in range(len(group.members)):
        new = group.member()  # made first, as it would be in a process of its own
        at = time.monotonic() - started
        old = group.members[index]
        old.stop()
        group.members[index] = new.start()
        rolling.restarts.append((at, old.member_id, new.member_id))
        rolling.places[new.member_id] = index
        if not math.isnan(group.until_balanced(time.monotonic())):
            rolling.restarts_balanced += 1
        time.sleep(DWELL)
    sampler.done.set()
    sampler.thread.join(10)
    rolling.seconds = time.monotonic() - started
    rolling.looks = len(sampler.looks)
    rolling.longest_unowned_s = sampler.longest_unowned()
    for sent, _answered, assignment in sampler.looks:
        held = Counter(holder for holder in assignment.values() if holder is not None)
        unowned = sum(1 for holder in assignment.values() if holder is None)
        rolling.timeline.append((sent - started, dict(held), unowned))
        rolling.most_unowned = max(rolling.most_unowned, unowned)
    return rolling


def measure(
    server: RedisServer, n: int, opts: argparse.Namespace, engine: str, before: Sequence[str]
) -> Size:
    """Every figure of one partition count; ``before``: this process's threads before any
    member (the engine's shared threads, once started, count for every size)."""
    client = server.client(socket_timeout=5)
    row = Size(n, opts.members, engine, opts.ttl)
    group = Group(client, n, opts.ttl, engine)
    # Every member is made before the clock starts, as each would be in a process of its
    # own: a member's making is no change of the group, and here it would hold the GIL.
    made = [group.member() for _ in range(opts.members)]
    first = time.monotonic()
    for member in made:
        group.join(member)
    row.start_to_balanced_s = group.until_balanced(first)
    time.sleep(opts.ttl / 2)  # renewals under way
    row.threads = added(before)
    row.threads_added = len(row.threads)
    for _ in range(opts.rounds):
        # A leave, then a join back to M members.
        leaving = group.members.pop(0)
        since = time.monotonic()
        leaving.stop()
        row.leave_s.append(group.until_balanced(since))
        newcomer = group.member()
        since = time.monotonic()
        group.join(newcomer)
        row.join_s.append(group.until_balanced(since))
        # A kill: M - 1 members here and one in a process of its own.
        group.members.pop(0).stop()
        group.until_balanced(time.monotonic())
        group.made += 1
        _host, port = server.address
        doomed = ProcessMember(port, group.name, n, opts.ttl, f"m{group.made:02d}", engine)
        try:
            ready = wait_for(
                lambda: assigned_balanced(group.reader, opts.members, n),
                time.monotonic(),
                group.give_up(),
                every=SAMPLE_EVERY,
            )
            since = time.monotonic()
            doomed.kill()
            took = group.until_balanced(since)
            row.kill_s.append(took if not math.isnan(ready) else float("nan"))
        finally:
            doomed.kill()
        group.join()
        group.until_balanced(time.monotonic())
    row.rolling = rolling_restart(group)
    group.stop_all()
    client.close()
    return row


def measure_each(
    server: RedisServer, opts: argparse.Namespace, engine: str, before: Sequence[str]
) -> list[Size]:
    """``measure`` of every size, one after another.

    A size's client, and with it its engine (its renewer thread among what that
    holds), goes once the cyclic collector frees it (redis-py's client is itself
    in reference cycles): collected between sizes, each size counts its own
    threads, not the last one's too.
    """
    rows = []
    for n in opts.sizes:
        rows.append(measure(server, n, opts, engine, before))
        gc.collect()
    return rows


# -- the report -----------------------------------------------------------------------------


def cell(samples: Sequence[float]) -> str:
    """``p50 / max`` in ms (``-`` without samples, ``not balanced`` when one never was)."""
    if not samples:
        return "-"
    if any(math.isnan(s) for s in samples):
        return "not balanced"
    return f"{percentile(samples, 50) * 1000:,.0f} / {max(samples) * 1000:,.0f}"


@dataclass
class Target:
    what: str
    bound: str
    measured: str
    met: bool


def targets(rows: Sequence[Size]) -> list[Target]:
    found = []
    for row in rows:
        bound = BALANCE_BOUND_TTLS * row.ttl_s
        start_bound = bound + START_SLACK
        changes = [*row.join_s, *row.leave_s, *row.kill_s]
        worst = max(changes) if changes and not any(math.isnan(c) for c in changes) else math.nan
        where = f"{row.partitions} partitions"
        found += [
            Target(
                f"{where}: all balanced after the first start",
                f"<= {start_bound:.1f} s",
                f"{row.start_to_balanced_s:.2f} s",
                row.start_to_balanced_s <= start_bound,
            ),
            Target(
                f"{where}: balanced after every join, leave, kill",
                f"<= {bound:.1f} s",
                f"{worst:.2f} s",
                worst <= bound,
            ),
            Target(
                f"{where}: threads added by {row.members} members",
                f"<= {THREADS_BOUND}",
                str(row.threads_added),
                row.threads_added <= THREADS_BOUND,
            ),
            Target(
                f"{where}: rolling restart, longest unowned",
                f"< {row.ttl_s:.1f} s",
                f"{row.rolling.longest_unowned_s * 1000:,.0f} ms",
                row.rolling.longest_unowned_s < row.ttl_s
                and row.rolling.restarts_balanced == row.members,
            ),
        ]
    return found


def print_report(rows: Sequence[Size], found: Sequence[Target]) -> None:
    first = rows[0]
    print(
        f"{first.members} members in one process, engine {first.engine}, ttl {first.ttl_s} s; "
        "time from the change until balanced, p50 / max in ms"
    )
    print(
        f"{'partitions':>10}  {'first start':>12}  {'join':>16}  {'graceful leave':>16}  "
        f"{'kill (SIGKILL)':>16}  {'threads added':>13}"
    )
    for row in rows:
        print(
            f"{row.partitions:>10,}  {row.start_to_balanced_s * 1000:>10,.0f} ms  "
            f"{cell(row.join_s):>16}  {cell(row.leave_s):>16}  {cell(row.kill_s):>16}  "
            f"{row.threads_added:>13}"
        )
    for row in rows:
        named = Counter(row.threads)
        listed = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in sorted(named.items()))
        print(f"threads added with {row.partitions:,} partitions: {listed or 'none'}")
    print()
    print("rolling restart of every member, one after another (a reader looks every 10 ms)")
    print(
        f"{'partitions':>10}  {'took':>9}  {'looks':>6}  {'longest unowned':>16}  "
        f"{'most unowned at once':>20}"
    )
    for row in rows:
        r = row.rolling
        print(
            f"{row.partitions:>10,}  {r.seconds:>7.2f} s  {r.looks:>6}  "
            f"{r.longest_unowned_s * 1000:>13,.0f} ms  {r.most_unowned:>20}"
        )
    print()
    print(f"{'target':<58}{'bound':>12}{'measured':>12}  verdict")
    for t in found:
        print(f"{t.what:<58}{t.bound:>12}{t.measured:>12}  {'met' if t.met else 'not met'}")


def plot(rows: Sequence[Size], path: str) -> None:
    """Partitions owned per member over time across each size's rolling restart, stacked.

    Each member's band keeps its member's place in the group, and a new
    member's band takes the place of the one it replaced, so a band that
    thickens shows partitions taken over and one that appears shows a
    newcomer taking its share.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(rows), 1, figsize=(11, 4 * len(rows)), squeeze=False)
    for ax, row in zip(axes[:, 0], rows, strict=True):
        timeline = row.rolling.timeline
        times = [at for at, _, _ in timeline]
        places = row.rolling.places
        members = sorted(places, key=lambda m: (places[m], m))
        palette = plt.get_cmap("tab20")
        bands = [[held.get(m, 0) for _, held, _ in timeline] for m in members]
        colors: list[Any] = [palette(i % 20) for i in range(len(members))]
        bands.append([unowned for _, _, unowned in timeline])
        colors.append("black")
        labels = [f"{m} (place {places[m] + 1})" for m in members]
        ax.stackplot(times, *bands, labels=[*labels, "unowned"], colors=colors, step="post")
        for at, old, new in row.rolling.restarts:
            ax.axvline(at, color="grey", linewidth=0.6, linestyle=":")
            ax.annotate(
                f"{old} -> {new}",
                (at, row.partitions),
                rotation=90,
                fontsize="x-small",
                va="top",
                ha="right",
                xytext=(-2, -4),
                textcoords="offset points",
            )
        ax.set_xlim(0, row.rolling.seconds)
        ax.set_ylim(0, row.partitions)
        ax.set_title(
            f"{row.partitions} partitions over {row.members} members ({row.engine} engine, ttl "
            f"{row.ttl_s} s), every member restarted in turn: longest unowned "
            f"{row.rolling.longest_unowned_s * 1000:.0f} ms, at most {row.rolling.most_unowned} "
            "unowned at once",
            fontsize="medium",
        )
        ax.set_xlabel("seconds")
        ax.set_ylabel("partitions owned, per member")
        ax.legend(ncol=1, fontsize="x-small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report_json(rows: Sequence[Size], found: Sequence[Target]) -> dict[str, Any]:
    sizes = []
    for row in rows:
        data = asdict(row)
        data["rolling"].pop("timeline")  # drawn by --plot, too long for one line
        data["rolling"].pop("places")
        sizes.append(data)
    return {
        "sizes": sizes,
        "targets": [asdict(t) for t in found],
    }


def main(argv: Sequence[str] | None = None) -> int:
    try:
        opts = options(sys.argv[1:] if argv is None else argv)
    except redlease.ConfigError as exc:
        print(f"partitions.py: {exc}", file=sys.stderr)
        return 2
    native, why_not = native_engine_available()
    engine = "native" if native else "python"
    if not native:
        print(f"the native engine cannot run here ({why_not}): the Python engine instead")
    before = thread_names()
    with RedisServer() as server:
        rows = measure_each(server, opts, engine, before)
    found = targets(rows)
    print_report(rows, found)
    if opts.plot is not None:
        plot(rows, opts.plot)
        print(f"\nplot: {opts.plot}")
    print("JSON " + json.dumps(report_json(rows, found)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
