"""Chaos soak: contenders doing fenced work while faults are injected, then an invariant check.

    python benchmarks/chaos.py [--duration 60] [--seed 1] [--contenders 4] [--ttl 1.0]
                               [--engine both|native|python] [--mode elector|lock|semaphore]
                               [--permits N]
                               [--topology plain|sentinel] [--weights kind=w,...]
                               [--min-replicas N]
    python benchmarks/chaos.py --self-test

K contender processes (engines alternating native / python) contend for one
name. Whoever leads appends ``token:pid:seq`` to a Redis list every few
milliseconds through a fenced write, and every contender logs its own events
(elected with token, stepped down with reason, each write's outcome, errors)
to a file. Meanwhile faults are injected one at a time with random gaps:

- ``freeze-leader`` / ``freeze-follower``: SIGSTOP a contender for 0.3-3 TTLs;
- ``freeze-redis``: SIGSTOP the redis-server for 0.2-2 TTLs;
- ``kill-contender``: SIGKILL a contender and start a new one in its place;
- ``crash-redis``: SIGKILL the redis-server, restart it from its AOF
  (``appendfsync always``);
- ``partition-blackhole`` / ``partition-reset``: through the small TCP proxy
  this script puts between each contender and Redis, hold every byte both
  ways (delivered late, as TCP would, when the partition heals) or reset
  every connection, for 0.3-3 TTLs;
- ``failover`` (``--topology sentinel``): ``SENTINEL FAILOVER``;
- ``kill-master`` (sentinel): SIGKILL the master; once the sentinels have
  promoted the replica, start the killed node again (empty) and let the
  sentinels make it a replica;
- ``freeze-master`` (sentinel): SIGSTOP the master until the sentinels have
  promoted the replica, then SIGCONT it: for a few seconds the old master
  still says it is one, to whoever is still connected to it, until the
  sentinels demote it;
- ``freeze-replica`` (sentinel): SIGSTOP the replica for 0.3-3 TTLs.

Checked continuously (a sampler reading Redis directly; on Sentinel, the
master most sentinels name at each sample): the list's tokens never
decrease, the fence counter and the applied mark never go backwards, the
list never shrinks, on any one master (what a newly named master lacks of
the old one's is asynchronous replication's loss: counted and printed);
after every fault heals a leader writes again within 3 TTLs; no contender
dies unasked. Checked at the end, from the list and the
logs: no token claimed by two contenders, the applied mark >= every elected
token, no write landed twice, every write reported applied is in the list and
no write reported rejected is, every write carries a token its writer was
elected with, every contender exits (status 0) within 10 s of SIGTERM.

Prints faults by kind, terms, writes applied / rejected / failed, the time
until a successor was elected after each leader freeze, and the invariant
table. Exit status 1 on any violation, with its evidence (the log excerpt,
the tokens, the faults before it). Every process the script starts is killed
by pid at the end, also on Ctrl-C or an error. The same ``--seed`` gives the
same fault schedule (kinds, targets, durations, gaps); timings still vary.

``--mode semaphore``: the contenders take permits of one ``RedisLocker``
semaphore of ``--permits`` N (default 2) and append ``token:pid:seq`` while
they hold one (N holders write at once, so the list's order is not a
rule there). Checked besides: never more than N live permits at the
server (sampled by its clock every 50 ms), and permit tokens never given
twice and only growing for each contender.

``--inject-stale-write`` pushes one entry with token 1 straight into the
list half way through the run, bypassing the fence: the checker must catch it
(exit 1). ``--self-test`` runs the checker on crafted evidence with one
planted violation of each kind and exits 0 only if every one is caught.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

NAME = "chaos"
LIST_KEY = "chaos:log"
LEADER_KEY = f"{NAME}:leader"
FENCE_KEY = f"{NAME}:fence"
APPLIED_KEY = f"{NAME}:fence:applied"
# Lock mode: the lock's own keys, and the mark our own fenced script keeps
# (the lock gives a token; checking it at the store is the application's job).
LOCK_PREFIX = "chaos:lock:"
LOCK_NAME = "res"
LOCK_FENCE_KEY = f"{LOCK_PREFIX}fencing"
LOCK_MARK_KEY = "chaos:lock:mark"
# Semaphore mode: the permits' sorted set (owner -> expiry, server ms).
SEM_NAME = "pool"
SEM_KEY = f"{LOCK_PREFIX}sem:{SEM_NAME}"
APPEND_SCRIPT = "redis.call('RPUSH', KEYS[1], ARGV[1]) return 1"
# Live permits now, by the server's clock.
LIVE_PERMITS_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
"""

APPEND_BODY = "redis.call('RPUSH', KEYS[2], ARGV[2])"
# The README's "anywhere else" recipe, for a lock's token: compare with the
# mark and write in one atomic step; equal tokens pass.
LOCK_WRITE_SCRIPT = """
local mark = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < mark then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
"""

PLAIN_KINDS = (
    "freeze-leader",
    "freeze-follower",
    "freeze-redis",
    "kill-contender",
    "stop-contender",
    "stop-partitioned",
    "crash-redis",
    "partition-blackhole",
    "partition-reset",
)
SENTINEL_KINDS = (
    "freeze-leader",
    "freeze-follower",
    "kill-contender",
    "stop-contender",
    "failover",
    "kill-master",
    "freeze-master",
    "freeze-replica",
)
DEFAULT_WEIGHTS = {
    "freeze-leader": 3.0,
    "freeze-follower": 1.0,
    "freeze-redis": 2.0,
    "kill-contender": 2.0,
    "stop-contender": 1.0,
    "stop-partitioned": 1.0,
    "crash-redis": 1.0,
    "partition-blackhole": 2.0,
    "partition-reset": 1.0,
    "failover": 2.0,
    "kill-master": 1.0,
    "freeze-master": 1.0,
    "freeze-replica": 1.0,
}
EXIT_GRACE = 10.0  # seconds a contender has to exit after SIGTERM
HEAL_TTLS = 3.0  # a leader must write again within this many TTLs of a heal

INVARIANTS = {
    "order": "fenced list tokens never decrease",
    "unique-claim": "no token claimed by two contenders",
    "applied-mark": "applied mark >= every elected token",
    "fence-monotonic": "fence counter and applied mark never go backwards (sampled)",
    "list-kept": "the list never shrinks (sampled)",
    "leader-after-heal": "a leader writes within 3 TTLs after each fault heals",
    "once": "no write landed twice",
    "acknowledged": "writes reported applied are in the list, rejected ones are not",
    "own-token": "every write carries a token its writer was elected with",
    "permits": "never more than N live permits at the server (sampled)",
    "permit-tokens": "permit tokens never given twice, only growing per contender",
    "exit": "every contender exits (status 0) within 10 s of SIGTERM",
    "no-crash": "no contender crashed",
}


# -- the contender process -------------------------------------------------------------------


class EventLog:
    """Append-only JSON lines, one write(2) per event: a SIGKILL loses nothing already logged.

    No lock: an O_APPEND write of one line is atomic, and the SIGTERM handler
    logs too (a lock held by the interrupted main thread would deadlock it).
    """

    def __init__(self, path: str, slot: int) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._base = {"pid": os.getpid(), "slot": slot}

    def event(self, ev: str, **fields: Any) -> None:
        record = {"t": time.time(), "ev": ev, **self._base, **fields}
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


def _contender_client(args: argparse.Namespace, **extra: Any) -> redis.Redis:
    # Timeouts bound every round trip of the fenced writes to about a TTL.
    opts = {"socket_timeout": args.ttl, "socket_connect_timeout": args.ttl, **extra}
    if args.sentinels:
        from redis.sentinel import Sentinel

        addresses = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in args.sentinels.split(","))]
        manager = Sentinel(
            addresses,
            sentinel_kwargs={"socket_timeout": 1.0, "socket_connect_timeout": 1.0, "retry": None},
        )
        client: redis.Redis = manager.master_for(args.service, **opts)
        return client
    host, port = args.url.rsplit(":", 1)
    return redis.Redis(host=host, port=int(port), **opts)


def _write_error(exc: BaseException) -> dict[str, Any]:
    fields: dict[str, Any] = {"kind": type(exc).__name__, "msg": str(exc)[:160]}
    if hasattr(exc, "applied"):  # a replication guard's NotReplicated: outcome known
        fields["applied"] = bool(exc.applied)
    return fields


def contender_elector(args: argparse.Namespace, log: EventLog, stop: threading.Event) -> None:
    import redlease

    pid = os.getpid()
    seq = itertools.count(1)
    client = _contender_client(args)
    observer = redlease.Observer(
        on_elected=lambda token: log.event("elected", token=token),
        on_error=lambda exc: log.event("error", **_write_error(exc)),
    )
    elector = redlease.Elector(
        client,
        NAME,
        ttl=args.ttl,
        instance_id=f"c{args.slot}-{pid}",
        observer=observer,
        engine=args.engine,
        min_replicas=args.min_replicas,
    )

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        while not term.ended():
            n = next(seq)
            entry = f"{term.token}:{pid}:{n}"
            try:
                applied = fencer.eval(APPEND_BODY, keys=[LIST_KEY], args=[entry])
            except (redis.RedisError, redlease.NotReplicated) as exc:
                # NotReplicated: on the master (applied=True), not yet on enough replicas.
                log.event("write", token=term.token, seq=n, r="e", **_write_error(exc))
            else:
                log.event("write", token=term.token, seq=n, r="a" if applied else "r")
                if not applied:
                    # A newer term has written: this one is over, whatever the lease says.
                    log.event("stepped_down", token=term.token, reason="write rejected")
                    return
            term.wait(args.write_interval)
        log.event("stepped_down", token=term.token, reason=term.reason)

    elector.run(lead, stop=stop)


def contender_lock(args: argparse.Namespace, log: EventLog, stop: threading.Event) -> None:
    import redlease

    pid = os.getpid()
    seq = itertools.count(1)
    rng = random.Random(args.seed)
    client = _contender_client(args)
    # Our own script on a client that never retries: a write is sent at most once.
    writer = _contender_client(args, retry=Retry(NoBackoff(), 0))
    write = writer.register_script(LOCK_WRITE_SCRIPT)
    locker = redlease.RedisLocker(
        client, prefix=LOCK_PREFIX, engine=args.engine, min_replicas=args.min_replicas
    )
    while not stop.is_set():
        try:
            held = locker.acquire(
                LOCK_NAME,
                ttl=args.ttl,
                wait=args.ttl,
                retry_interval=args.ttl / 10,
                auto_renew=True,
            )
        except redlease.NotAcquired:
            continue
        except (redis.RedisError, redlease.NotReplicated) as exc:
            log.event("error", **_write_error(exc))
            stop.wait(args.ttl / 4)
            continue
        token = held.fencing_token
        log.event("elected", token=token)
        until = time.monotonic() + rng.uniform(1.0, 4.0) * args.ttl
        reason = "released"
        while time.monotonic() < until and not stop.is_set():
            if held.done.is_set():
                reason = "lost"
                break
            n = next(seq)
            entry = f"{token}:{pid}:{n}"
            try:
                applied = bool(write(keys=[LOCK_MARK_KEY, LIST_KEY], args=[token, entry]))
            except redis.RedisError as exc:
                log.event("write", token=token, seq=n, r="e", **_write_error(exc))
            else:
                log.event("write", token=token, seq=n, r="a" if applied else "r")
                if not applied:
                    reason = "write rejected"
                    break
            stop.wait(args.write_interval)
        try:
            held.release()
        except redlease.NotHeld:
            reason += ", release: not held"
        except redis.RedisError as exc:
            reason += f", release: {type(exc).__name__}"
        log.event("stepped_down", token=token, reason=reason)
    locker.close()


def contender_semaphore(args: argparse.Namespace, log: EventLog, stop: threading.Event) -> None:
    import redlease

    pid = os.getpid()
    seq = itertools.count(1)
    rng = random.Random(args.seed)
    client = _contender_client(args)
    # Written at most once, like the lock mode's: a client that never retries.
    writer = _contender_client(args, retry=Retry(NoBackoff(), 0))
    append = writer.register_script(APPEND_SCRIPT)
    locker = redlease.RedisLocker(
        client, prefix=LOCK_PREFIX, engine=args.engine, min_replicas=args.min_replicas
    )
    sem = locker.semaphore(SEM_NAME, args.permits)
    while not stop.is_set():
        try:
            held = sem.acquire(
                ttl=args.ttl, wait=args.ttl, retry_interval=args.ttl / 10, auto_renew=True
            )
        except redlease.NotAcquired:
            continue
        except (redis.RedisError, redlease.NotReplicated) as exc:
            log.event("error", **_write_error(exc))
            stop.wait(args.ttl / 4)
            continue
        token = held.fencing_token
        log.event("elected", token=token)
        until = time.monotonic() + rng.uniform(1.0, 4.0) * args.ttl
        reason = "released"
        while time.monotonic() < until and not stop.is_set():
            if held.done.is_set():
                reason = "lost"
                break
            n = next(seq)
            try:
                append(keys=[LIST_KEY], args=[f"{token}:{pid}:{n}"])
            except redis.RedisError as exc:
                log.event("write", token=token, seq=n, r="e", **_write_error(exc))
            else:
                log.event("write", token=token, seq=n, r="a")
            stop.wait(args.write_interval)
        try:
            held.release()
        except redlease.NotHeld:
            reason += ", release: not held"
        except redis.RedisError as exc:
            reason += f", release: {type(exc).__name__}"
        log.event("stepped_down", token=token, reason=reason)
    locker.close()


def contender_main(args: argparse.Namespace) -> int:
    log = EventLog(args.log, args.slot)
    stop = threading.Event()

    def on_term(signum: int, frame: Any) -> None:
        log.event("sigterm")
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    log.event("start", engine=args.engine, mode=args.mode)
    try:
        if args.mode == "elector":
            contender_elector(args, log, stop)
        elif args.mode == "semaphore":
            contender_semaphore(args, log, stop)
        else:
            contender_lock(args, log, stop)
    except BaseException as exc:
        log.event("crash", error=repr(exc), tb=traceback.format_exc())
        raise
    log.event("exit")
    return 0


# -- the partition proxy ----------------------------------------------------------------------


class Proxy:
    """A loopback TCP proxy in front of Redis for one contender slot; it can partition it.

    Modes: ``pass``; ``blackhole`` (nothing is forwarded either way, bytes wait in
    the buffers and are delivered late when the partition heals, as TCP's
    retransmissions would); ``reset`` (every connection is reset, new ones too).
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.mode = "pass"
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == "reset":
                _reset(down)
                continue
            try:
                up = socket.create_connection(self.target, timeout=1.0)
            except OSError:
                _reset(down)  # Redis is down: the client sees what it would see directly
                continue
            for s in (down, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.append((down, up))
            for src, dst in ((down, up), (up, down)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._closed:
                if self.mode == "blackhole":
                    time.sleep(0.01)
                    continue
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready or self.mode == "blackhole":
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):  # ValueError: reset by set_mode() under our feet
            pass
        self._drop(src, dst)

    def _drop(self, a: socket.socket, b: socket.socket) -> None:
        with self._lock:
            self._conns = [c for c in self._conns if a not in c]
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        if mode == "reset":
            with self._lock:
                conns, self._conns = self._conns, []
            for down, up in conns:
                _reset(down)
                _reset(up)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.set_mode("reset")
        self._thread.join(2)


def _reset(sock: socket.socket) -> None:
    """Close with RST (SO_LINGER 0), not FIN: the peer sees 'connection reset'."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(OSError):
        sock.close()


# -- the evidence and the checker ---------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    start: float
    end: float = 0.0
    target: str = ""
    victim_pid: int = 0
    heal_seconds: float | None = None  # heal -> a leader wrote again
    successor_seconds: float | None = None  # leader freezes: freeze -> another's election
    stepdown_seconds: float | None = None  # replaced leader: resume -> it stepped down


@dataclass
class Violation:
    rule: str
    message: str
    t: float | None = None
    evidence: list[str] = field(default_factory=list)


@dataclass
class Evidence:
    """Everything the checker judges; built from a run, or crafted by the self-test."""

    mode: str
    events: list[dict[str, Any]]
    entries: list[str]
    final_fence: int
    final_applied: int | None
    faults: list[Fault] = field(default_factory=list)
    exits: dict[int, tuple[int | None, float]] = field(default_factory=dict)
    live: list[Violation] = field(default_factory=list)  # found while running
    replicated: bool = False  # Sentinel: a failover may drop acknowledged writes
    lost_to_failover: int = 0  # set by check()
    lost_unconfirmed: int = 0  # of those, writes that raised NotReplicated (the writer knew)


def parse_entry(entry: str) -> tuple[int, int, int]:
    token, pid, seq = entry.split(":")
    return int(token), int(pid), int(seq)


def check(ev: Evidence) -> list[Violation]:
    """Judge a run: every violation of the invariants, with its evidence."""
    found = list(ev.live)
    if ev.mode == "semaphore":
        found += _check_permit_tokens(ev.events)
    else:
        found += _check_order(ev.entries)
    claims: dict[int, set[int]] = defaultdict(set)
    elected: dict[int, set[int]] = defaultdict(set)
    for e in ev.events:
        if e["ev"] == "elected":
            claims[e["token"]].add(e["pid"])
            elected[e["pid"]].add(e["token"])
        elif e["ev"] == "crash":
            found.append(
                Violation(
                    "no-crash",
                    f"contender {e['pid']} crashed: {e['error']}",
                    e["t"],
                    e.get("tb", "").splitlines()[-8:],
                )
            )
    for token, pids in sorted(claims.items()):
        if len(pids) > 1:
            found.append(
                Violation(
                    "unique-claim",
                    f"token {token} claimed by contenders {sorted(pids)}",
                    _first_t(ev.events, "elected", token),
                    _events_about(ev.events, token),
                )
            )
    top = max(claims, default=0)
    if ev.final_applied is not None and top > ev.final_applied:
        found.append(
            Violation(
                "applied-mark",
                f"applied mark {ev.final_applied} is below elected token {top}",
                _first_t(ev.events, "elected", top),
                _events_about(ev.events, top),
            )
        )
    if top > ev.final_fence:
        found.append(
            Violation(
                "fence-monotonic",
                f"fence counter {ev.final_fence} is below elected token {top}",
                _first_t(ev.events, "elected", top),
            )
        )
    found += _check_writes(ev, elected)
    for pid, (rc, seconds) in sorted(ev.exits.items()):
        if rc is None or seconds > EXIT_GRACE:
            found.append(
                Violation(
                    "exit", f"contender {pid} did not exit within {EXIT_GRACE:.0f} s of SIGTERM"
                )
            )
        elif rc != 0:
            found.append(Violation("no-crash", f"contender {pid} exited with status {rc}"))
    return found


def _check_permit_tokens(events: list[dict[str, Any]]) -> list[Violation]:
    """Semaphore mode: each contender's permit tokens only grow (uniqueness is unique-claim)."""
    found = []
    last: dict[int, int] = {}
    for e in sorted((e for e in events if e["ev"] == "elected"), key=lambda e: e["t"]):
        before = last.get(e["pid"])
        if before is not None and e["token"] <= before:
            found.append(
                Violation(
                    "permit-tokens",
                    f"contender {e['pid']} got permit token {e['token']} after {before}",
                    e["t"],
                )
            )
        last[e["pid"]] = e["token"]
    return found


def _check_order(entries: Sequence[str]) -> list[Violation]:
    found = []
    previous: tuple[int, str] | None = None
    for i, entry in enumerate(entries):
        token = parse_entry(entry)[0]
        if previous is not None and token < previous[0]:
            window = [f"[{j}] {entries[j]}" for j in range(max(0, i - 3), min(len(entries), i + 3))]
            found.append(
                Violation(
                    "order",
                    f"token decreased in the fenced list at index {i}: {previous[1]} then {entry}",
                    None,
                    window,
                )
            )
        previous = (token, entry)
    return found


def _check_writes(ev: Evidence, elected: dict[int, set[int]]) -> list[Violation]:
    found = []
    counts = Counter(ev.entries)
    for entry, n in counts.items():
        if n > 1:
            found.append(Violation("once", f"{entry} is in the list {n} times"))
    in_list = set(counts)
    # Grouped by (token, pid, outcome): one violation per term, with the seq range.
    missing: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for e in ev.events:
        if e["ev"] != "write":
            continue
        entry = f"{e['token']}:{e['pid']}:{e['seq']}"
        outcome = e["r"]
        if outcome == "e" and "applied" in e:
            outcome = "a" if e["applied"] else "r"
        if (outcome == "a" and entry not in in_list) or (outcome == "r" and entry in in_list):
            missing[(e["token"], e["pid"], outcome)].append(e)
    ev.lost_to_failover = ev.lost_unconfirmed = 0
    for (token, pid, outcome), writes in sorted(missing.items()):
        seqs = (
            f"seq {writes[0]['seq']}..{writes[-1]['seq']}"
            if len(writes) > 1
            else (f"seq {writes[0]['seq']}")
        )
        if outcome == "a":
            if ev.replicated:
                # Asynchronous replication: a demoted master's acknowledged writes
                # are gone (README, "Correctness boundary"). Counted, not a violation.
                ev.lost_to_failover += len(writes)
                # Those the replication guard had flagged (NotReplicated, applied).
                ev.lost_unconfirmed += sum(1 for w in writes if w["r"] == "e")
                continue
            what = "reported applied but missing from the list"
        else:
            what = "reported rejected but present in the list"
        found.append(
            Violation(
                "acknowledged",
                f"{len(writes)} write(s) of token {token} by contender {pid} ({seqs}) {what}",
                writes[0]["t"],
            )
        )
    for entry in in_list:
        token, pid, _ = parse_entry(entry)
        if token not in elected.get(pid, set()):
            found.append(
                Violation(
                    "own-token",
                    f"{entry}: contender {pid} wrote with token {token} it was never elected with",
                    None,
                    [f"contender {pid} was elected with {sorted(elected.get(pid, set()))[-5:]}"],
                )
            )
    return found


def _first_t(events: list[dict[str, Any]], kind: str, token: int) -> float | None:
    return next((e["t"] for e in events if e["ev"] == kind and e.get("token") == token), None)


def _events_about(events: list[dict[str, Any]], token: int, limit: int = 8) -> list[str]:
    return [_fmt_event(e) for e in events if e.get("token") == token and e["ev"] != "write"][:limit]


def _fmt_event(e: dict[str, Any]) -> str:
    rest = {k: v for k, v in e.items() if k not in ("t", "ev", "pid", "slot", "tb")}
    return f"{_clock(e['t'])} pid {e['pid']} {e['ev']} {rest}"


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1000):03d}"


# -- the soak --------------------------------------------------------------------------------------


@dataclass
class Contender:
    slot: int
    engine: str
    proc: subprocess.Popen[bytes]
    log: Path
    stderr: Path
    frozen: bool = False
    killed: bool = False  # by us, on purpose

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def instance_id(self) -> str:
        return f"c{self.slot}-{self.pid}"


class Interrupted(Exception):
    """SIGTERM to the soak itself: clean up like Ctrl-C."""


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ttl: float = args.ttl
        self.rng = random.Random(args.seed)
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="redlease-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.contenders: list[Contender] = []
        self.retired: list[Contender] = []
        self.proxies: list[Proxy] = []
        self.faults: list[Fault] = []
        self.live: list[Violation] = []
        self.server: Any = None
        self.sentinel: Any = None
        self._sampler_stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._spawned = 0
        self.kinds = SENTINEL_KINDS if args.topology == "sentinel" else PLAIN_KINDS
        self.weights = [args.weights.get(k, 0.0) for k in self.kinds]
        if not any(self.weights):
            raise SystemExit("every fault weight is 0: nothing to inject")
        self.samples = 0
        self.stops: dict[int, tuple[int | None, float]] = {}  # SIGTERMs during the run
        self.fence_seen: list[tuple[float, int]] = []  # (first seen at, counter)
        # Sentinel: what a newly named master lacked of the old one's (sampled).
        self.regressions_at_switch: list[str] = []

    # -- processes ---------------------------------------------------------------------------

    def engine_for(self, slot: int) -> str:
        if self.args.engine == "both":
            return "native" if slot % 2 == 0 else "python"
        return str(self.args.engine)

    def spawn(self, slot: int) -> Contender:
        self._spawned += 1
        engine = self.engine_for(slot)
        log = self.workdir / f"contender-{self._spawned}.jsonl"
        stderr = self.workdir / f"contender-{self._spawned}.err"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--contender",
            "--slot",
            str(slot),
            "--engine",
            engine,
            "--mode",
            self.args.mode,
            "--permits",
            str(self.args.permits),
            "--ttl",
            repr(self.ttl),
            "--write-interval",
            repr(self.args.write_interval),
            "--log",
            str(log),
            "--seed",
            str(self.rng.randrange(2**31)),
            "--min-replicas",
            str(self.args.min_replicas),
        ]
        if self.sentinel is not None:
            cmd += [
                "--sentinels",
                ",".join(f"{h}:{p}" for h, p in self.sentinel.sentinel_addresses()),
                "--service",
                self.sentinel.service,
            ]
        else:
            cmd += ["--url", f"127.0.0.1:{self.proxies[slot].port}"]
        with open(stderr, "wb") as err:
            # A session of its own: a Ctrl-C at the terminal reaches only this
            # script, which then ends every contender by pid.
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        c = Contender(slot, engine, proc, log, stderr)
        if slot < len(self.contenders):
            self.contenders[slot] = c
        else:
            self.contenders.append(c)
        # Ready once it logged "start": its SIGTERM handler is installed by then,
        # so a stop aimed at it is a graceful stop, not the default action.
        deadline = time.monotonic() + 30.0
        while proc.poll() is None and time.monotonic() < deadline:
            if log.exists() and log.stat().st_size > 0:
                break
            time.sleep(0.01)
        return c

    def kill_everything(self) -> None:
        """Every process this script started, by pid; then the servers and proxies."""
        self._sampler_stop.set()
        for c in [*self.contenders, *self.retired]:
            if c.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(c.pid, signal.SIGCONT)
                    os.kill(c.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    c.proc.wait(5)
        for p in self.proxies:
            p.close()
        if self.server is not None:
            self.server.stop()
        if self.sentinel is not None:
            self.sentinel.stop()

    # -- Redis ---------------------------------------------------------------------------------

    def start_redis(self) -> None:
        from redlease._testing import RedisServer, SentinelSet

        if self.args.topology == "sentinel":
            self.sentinel = SentinelSet(replicas=1, sentinels=3).start()
            return
        self.server = RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"]).start()
        for _ in range(self.args.contenders):
            self.proxies.append(Proxy(self.server.address))

    def direct(self, timeout: float = 0.5) -> redis.Redis:
        """A client that reaches Redis without any proxy (the checker's own view)."""
        opts = {"socket_timeout": timeout, "socket_connect_timeout": timeout, "retry": None}
        if self.sentinel is not None:
            client: redis.Redis = self.sentinel.master_for(**opts)
            return client
        return self.server.client(**opts)  # type: ignore[no-any-return]

    @property
    def fence_key(self) -> str:
        return FENCE_KEY if self.args.mode == "elector" else LOCK_FENCE_KEY

    # -- the continuous checks ------------------------------------------------------------------

    def sample(self) -> None:
        """Read the fence, the mark and the list every 50 ms; what goes backwards is a violation.

        On Sentinel every sample reads the master most sentinels name at that
        moment. A demoted master's last writes (after the replica's
        promotion, or never replicated before a kill) are lost by design of
        asynchronous replication, so a regression seen exactly where the
        named master changed is counted in ``regressions_at_switch``, and the
        checks go on from the new master's values; on one and the same
        master nothing may ever go backwards.
        """
        client: redis.Redis | None = None
        address: Any = None
        last_fence = last_applied = 0
        seen = 0
        last_entry: str | None = None
        while not self._sampler_stop.wait(0.05):
            switched = False
            if self.sentinel is not None:
                try:
                    named = self.sentinel.master_address()
                except Exception:  # no sentinel answers right now: sample later
                    continue
                if named != address:
                    if client is not None:
                        client.close()
                    client, address = self.sentinel.node_at(named).client(
                        socket_timeout=0.25, socket_connect_timeout=0.25, retry=None
                    ), named
                    switched = seen > 0 or last_fence > 0
            elif client is None:
                client = self.direct(0.25)
            assert client is not None
            try:
                fence, applied, length = (
                    client.pipeline(transaction=False)
                    .get(self.fence_key)
                    .get(APPLIED_KEY if self.args.mode == "elector" else LOCK_MARK_KEY)
                    .llen(LIST_KEY)
                    .execute()
                )
                new = client.lrange(LIST_KEY, seen, -1) if length > seen else []
                if self.args.mode == "semaphore":
                    live = int(client.eval(LIVE_PERMITS_SCRIPT, 1, SEM_KEY))
                    if live > self.args.permits:
                        self.live.append(
                            Violation(
                                "permits",
                                f"{live} live permits at the server, of {self.args.permits}",
                                time.time(),
                            )
                        )
            except redis.RedisError:
                continue
            now = time.time()
            self.samples += 1
            fence_n, applied_n = int(fence or 0), int(applied or 0)
            if switched and (fence_n < last_fence or applied_n < last_applied or length < seen):
                self.regressions_at_switch.append(
                    f"{time.strftime('%H:%M:%S', time.localtime(now))} master now {address}: "
                    f"fence {last_fence} -> {fence_n}, mark {last_applied} -> {applied_n}, "
                    f"list {seen} -> {length}"
                )
                last_fence, last_applied = fence_n, applied_n
                if length < seen:
                    seen = length
                    tail = client.lindex(LIST_KEY, -1) if length else None
                    last_entry = tail.decode() if tail is not None else None
                    new = []
            if fence_n < last_fence:
                self.live.append(
                    Violation(
                        "fence-monotonic", f"fence counter went from {last_fence} to {fence_n}", now
                    )
                )
            if applied_n < last_applied:
                self.live.append(
                    Violation(
                        "fence-monotonic",
                        f"applied mark went from {last_applied} to {applied_n}",
                        now,
                    )
                )
            if length < seen:
                self.live.append(
                    Violation("list-kept", f"the list shrank from {seen} to {length}", now)
                )
            if fence_n > last_fence:
                self.fence_seen.append((now, fence_n))
            last_fence, last_applied = max(last_fence, fence_n), max(last_applied, applied_n)
            for raw in new:
                entry = raw.decode()
                ordered = self.args.mode != "semaphore"  # N holders append at once
                if (
                    ordered
                    and last_entry is not None
                    and parse_entry(entry)[0] < parse_entry(last_entry)[0]
                ):
                    self.live.append(
                        Violation(
                            "order",
                            f"token decreased at list index {seen}: {last_entry} then {entry} "
                            "(seen while running)",
                            now,
                        )
                    )
                last_entry = entry
                seen += 1
        if client is not None:
            client.close()

    # -- faults ----------------------------------------------------------------------------------

    def live_contenders(self) -> list[Contender]:
        return [c for c in self.contenders if c.proc.poll() is None]

    def leader(self) -> Contender | None:
        """The contender leading now: the lease holder (elector), the last writer (lock)."""
        client = self.direct()
        try:
            if self.args.mode == "elector":
                holder = client.get(LEADER_KEY)
                for c in self.contenders:
                    if holder is not None and holder.decode() == c.instance_id:
                        return c
                return None
            last = client.lindex(LIST_KEY, -1)
            if last is None:
                return None
            pid = parse_entry(last.decode())[1]
            return next((c for c in self.contenders if c.pid == pid), None)
        except redis.RedisError:
            return None
        finally:
            client.close()

    def pick(self, prefer_leader: bool) -> Contender:
        leader = self.leader()
        others = [c for c in self.contenders if c is not leader]
        if prefer_leader and leader is not None:
            return leader
        if not prefer_leader:
            return self.rng.choice(others)
        return self.rng.choice(self.contenders)

    def inject(self, kind: str) -> Fault:
        ttl, rng = self.ttl, self.rng
        fault = Fault(kind, time.time())
        if kind in ("freeze-leader", "freeze-follower"):
            seconds = rng.uniform(0.3, 3.0) * ttl
            victim = self.pick(prefer_leader=kind == "freeze-leader")
            fault.target, fault.victim_pid = f"{victim.instance_id} ({victim.engine})", victim.pid
            fault.start = time.time()
            os.kill(victim.pid, signal.SIGSTOP)
            victim.frozen = True
            time.sleep(seconds)
            os.kill(victim.pid, signal.SIGCONT)
            victim.frozen = False
        elif kind == "freeze-redis":
            seconds = rng.uniform(0.2, 2.0) * ttl
            fault.target = "redis-server"
            fault.start = time.time()
            self.server.pause()
            time.sleep(seconds)
            self.server.resume()
        elif kind == "kill-contender":
            victim = self.pick(prefer_leader=rng.random() < 0.5)
            fault.target, fault.victim_pid = f"{victim.instance_id} ({victim.engine})", victim.pid
            fault.start = time.time()
            victim.killed = True
            os.kill(victim.pid, signal.SIGKILL)
            victim.proc.wait()
            self.retired.append(victim)
            self.spawn(victim.slot)
        elif kind in ("stop-contender", "stop-partitioned"):
            # A graceful stop (SIGTERM) must end the process within the grace
            # period even when Redis cannot be reached: release is bounded.
            victim = self.pick(prefer_leader=rng.random() < 0.7)
            fault.target, fault.victim_pid = f"{victim.instance_id} ({victim.engine})", victim.pid
            fault.start = time.time()
            proxy = self.proxies[victim.slot] if kind == "stop-partitioned" else None
            if proxy is not None:
                proxy.set_mode("blackhole")
            victim.killed = True  # its exit is expected; its status is checked here
            os.kill(victim.pid, signal.SIGTERM)
            sent = time.monotonic()
            try:
                rc: int | None = victim.proc.wait(EXIT_GRACE)
            except subprocess.TimeoutExpired:
                rc = None
            self.stops[victim.pid] = (rc, time.monotonic() - sent)
            if rc is None:
                os.kill(victim.pid, signal.SIGKILL)
                victim.proc.wait()
            if proxy is not None:
                proxy.set_mode("pass")
            self.retired.append(victim)
            self.spawn(victim.slot)
        elif kind == "crash-redis":
            fault.target = "redis-server"
            fault.start = time.time()
            self.server.kill()
            self.server.restart()
        elif kind in ("partition-blackhole", "partition-reset"):
            seconds = rng.uniform(0.3, 3.0) * ttl
            victim = self.pick(prefer_leader=rng.random() < 0.6)
            fault.target, fault.victim_pid = f"{victim.instance_id} ({victim.engine})", victim.pid
            proxy = self.proxies[victim.slot]
            fault.start = time.time()
            proxy.set_mode(kind.removeprefix("partition-"))
            time.sleep(seconds)
            proxy.set_mode("pass")
        elif kind == "failover":
            fault.target = "master"
            fault.start = time.time()
            from redlease._testing import TopologyError

            try:
                self.sentinel.failover()
                # The old master rejoins as a replica: the next failover needs it.
                self.sentinel.wait_settled()
            except TopologyError as exc:
                # The harness could not finish the failover; not the library's fault.
                fault.target = f"master (failover incomplete: {str(exc)[:80]})"
        elif kind == "kill-master":
            from redlease._testing import TopologyError

            fault.target = f"master {self.sentinel.master_address()}"
            fault.start = time.time()
            try:
                self.sentinel.kill_master(restart=True)
                self.sentinel.wait_settled()
            except TopologyError as exc:
                fault.target += f" (not settled: {str(exc)[:80]})"
        elif kind == "freeze-master":
            from redlease._testing import TopologyError

            old = self.sentinel.master_address()
            victim = self.sentinel.node_at(old)
            fault.target = f"master {old}"
            fault.start = time.time()
            self.sentinel.freeze(victim)
            try:
                self.sentinel.wait_new_master(old, None)
            except TopologyError as exc:
                fault.target += f" (no failover: {str(exc)[:80]})"
            finally:
                self.sentinel.thaw(victim)
            try:
                self.sentinel.wait_settled()
            except TopologyError as exc:
                fault.target += f" (not settled: {str(exc)[:80]})"
        elif kind == "freeze-replica":
            seconds = rng.uniform(0.3, 3.0) * ttl
            victim = self.sentinel.replicas()[0]
            fault.target = f"replica {victim.address}"
            fault.start = time.time()
            self.sentinel.freeze(victim)
            time.sleep(seconds)
            self.sentinel.thaw(victim)
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        fault.end = time.time()
        return fault

    def wait_for_leader(self, fault: Fault) -> None:
        """After a heal: some live contender's write lands within 3 TTLs."""
        limit = HEAL_TTLS * self.ttl
        client = self.direct()
        try:
            start_len = None
            while True:
                waited = time.time() - fault.end
                try:
                    if start_len is None:
                        start_len = client.llen(LIST_KEY)
                    elif client.llen(LIST_KEY) > start_len:
                        last = client.lindex(LIST_KEY, -1)
                        pid = parse_entry(last.decode())[1] if last else 0
                        if any(c.pid == pid for c in self.live_contenders()):
                            fault.heal_seconds = waited
                            return
                        start_len = client.llen(LIST_KEY)
                except redis.RedisError:
                    pass
                if waited > limit:
                    holder = None
                    with contextlib.suppress(redis.RedisError):
                        holder = client.get(LEADER_KEY)
                    self.live.append(
                        Violation(
                            "leader-after-heal",
                            f"no leader wrote within {limit:.1f} s after {fault.kind} "
                            f"({fault.target}) healed",
                            fault.end,
                            [f"lease holder now: {holder!r}"],
                        )
                    )
                    return
                time.sleep(0.02)
        finally:
            client.close()

    def watch_processes(self) -> None:
        for c in self.contenders:
            rc = c.proc.poll()
            if rc is not None and not c.killed:
                c.killed = True  # reported once
                tail = c.stderr.read_text(errors="replace").splitlines()[-10:]
                self.live.append(
                    Violation(
                        "no-crash",
                        f"contender {c.pid} died on its own (status {rc})",
                        time.time(),
                        tail,
                    )
                )
                self.retired.append(c)
                self.spawn(c.slot)

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        self.start_redis()
        for slot in range(args.contenders):
            self.spawn(slot)
        self._sampler = threading.Thread(target=self.sample, name="sampler", daemon=True)
        self._sampler.start()
        started = time.time()
        deadline = started + args.duration
        # Everyone up and someone leading before the first fault.
        first = Fault("start", started, started)
        self.wait_for_leader(first)
        injected_stale = False
        while time.time() < deadline:
            gap = self.rng.uniform(args.gap[0], args.gap[1]) * self.ttl
            kind = self.rng.choices(self.kinds, self.weights)[0]
            time.sleep(min(gap, max(0.0, deadline - time.time())))
            self.watch_processes()
            if (
                args.inject_stale_write
                and not injected_stale
                and time.time() > started + args.duration / 2
            ):
                injected_stale = True
                client = self.direct()
                if args.mode == "semaphore":
                    # Permits past N, live for a while: the sampler must see them.
                    far = int(client.time()[0] + 30) * 1000
                    extra = {f"intruder-{i}": far for i in range(args.permits + 1)}
                    client.zadd(SEM_KEY, extra)  # type: ignore[arg-type]
                    what = f"{args.permits + 1} permits past the semaphore"
                else:
                    client.rpush(LIST_KEY, "1:0:0")
                    what = "a stale entry 1:0:0"
                client.close()
                print(f"{_clock(time.time())} injected {what} (the checker must catch it)")
            if time.time() >= deadline:
                break
            fault = self.inject(kind)
            self.faults.append(fault)
            self.wait_for_leader(fault)
            self.watch_processes()
            if not args.quiet:
                heal = "-" if fault.heal_seconds is None else f"{fault.heal_seconds:.2f}s"
                print(
                    f"{_clock(fault.start)} {fault.kind:<20} {fault.target:<28} "
                    f"{fault.end - fault.start:5.2f}s  leader writing again after {heal}",
                    flush=True,
                )
        time.sleep(0.2)
        self._sampler_stop.set()
        self._sampler.join(5)
        # The list is read once every contender has stopped writing.
        exits = {**self.stops, **self.stop_contenders()}
        client = self.direct(2.0)
        entries = [e.decode() for e in client.lrange(LIST_KEY, 0, -1)]
        final_fence = int(client.get(self.fence_key) or 0)
        final_applied = int(client.get(APPLIED_KEY) or 0) if args.mode == "elector" else None
        client.close()
        events = self.read_events()
        successor_times(self.faults, events)
        evidence = Evidence(
            args.mode,
            events,
            entries,
            final_fence,
            final_applied,
            self.faults,
            exits,
            self.live,
            replicated=self.sentinel is not None,
        )
        violations = check(evidence)
        self.report(evidence, violations, time.time() - started)
        return 1 if violations else 0

    def stop_contenders(self) -> dict[int, tuple[int | None, float]]:
        sent = time.monotonic()
        running = [c for c in self.contenders if c.proc.poll() is None]
        for c in running:
            os.kill(c.pid, signal.SIGTERM)
        exits: dict[int, tuple[int | None, float]] = {}
        for c in running:
            try:
                rc: int | None = c.proc.wait(max(0.0, EXIT_GRACE - (time.monotonic() - sent)))
            except subprocess.TimeoutExpired:
                rc = None
            exits[c.pid] = (rc, time.monotonic() - sent)
        return exits

    def read_events(self) -> list[dict[str, Any]]:
        events = []
        for path in sorted(self.workdir.glob("contender-*.jsonl")):
            for line in path.read_text().splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
                    events.append(json.loads(line))
        events.sort(key=lambda e: e["t"])
        return events

    # -- the report -------------------------------------------------------------------------------

    def report(self, ev: Evidence, violations: list[Violation], elapsed: float) -> None:
        args = self.args
        writes = Counter(e["r"] for e in ev.events if e["ev"] == "write")
        errors = Counter(e.get("kind") for e in ev.events if e["ev"] == "write" and e["r"] == "e")
        terms = sum(1 for e in ev.events if e["ev"] == "elected")
        engines = "both (alternating)" if args.engine == "both" else args.engine
        print()
        print(
            f"chaos soak: {elapsed:.0f} s, seed {args.seed}, {args.contenders} contenders, "
            f"engines {engines}, mode {args.mode}, topology {args.topology}, TTL {self.ttl:g} s"
        )
        print(
            f"terms {terms}; writes applied {writes['a']}, rejected {writes['r']}, "
            f"failed {writes['e']} {dict(errors.most_common(4)) or ''}; "
            f"list length {len(ev.entries)}; last token {ev.final_fence}; "
            f"samples {self.samples}"
        )
        in_list = set(ev.entries)
        landed = sum(
            1
            for e in ev.events
            if e["ev"] == "write"
            and e["r"] == "e"
            and f"{e['token']}:{e['pid']}:{e['seq']}" in in_list
        )
        print(f"failed writes (outcome unknown to the writer) found in the list: {landed}")
        if ev.replicated:
            print(
                f"acknowledged writes lost to failovers (asynchronous replication, "
                f"README 'Correctness boundary'): {ev.lost_to_failover}, of which "
                f"{ev.lost_unconfirmed} raised NotReplicated (the replication guard)"
            )
        if ev.replicated:
            print(
                f"master switches where the new master lacked what the old one had (sampled; "
                f"the same boundary): {len(self.regressions_at_switch)}"
            )
            for line in self.regressions_at_switch[:10]:
                print(f"    {line}")
        report_unclaimed(ev, self.fence_seen)
        took = [seconds for rc, seconds in ev.exits.values() if rc is not None]
        if took:
            print(
                f"contenders stopped by SIGTERM: {len(ev.exits)} ({len(self.stops)} during the "
                f"run), exited after p50 {statistics.median(took):.2f} s, max {max(took):.2f} s"
            )
        print()
        print(
            f"| {'fault':<20} | {'injected':>8} | {'leader writing again after (p50 / max)':>40} |"
        )
        print(f"| {'-' * 20} | {'-' * 8}: | {'-' * 40}: |")
        by_kind: dict[str, list[Fault]] = defaultdict(list)
        for f in ev.faults:
            by_kind[f.kind].append(f)
        for kind in self.kinds:
            fs = by_kind.get(kind, [])
            heals = [f.heal_seconds for f in fs if f.heal_seconds is not None]
            span = f"{statistics.median(heals):.2f} s / {max(heals):.2f} s" if heals else "-"
            print(f"| {kind:<20} | {len(fs):>8} | {span:>40} |")
        freezes = [f for f in by_kind.get("freeze-leader", [])]
        taken = [f.successor_seconds for f in freezes if f.successor_seconds is not None]
        if freezes:
            print()
            kept = len(freezes) - len(taken)
            line = f"leader freezes: {len(taken)} replaced, {kept} kept the lease"
            if taken:
                line += (
                    f"; successor elected after p50 {statistics.median(taken):.2f} s, "
                    f"max {max(taken):.2f} s (TTL {self.ttl:g} s)"
                )
            print(line)
            down = [f.stepdown_seconds for f in freezes if f.stepdown_seconds is not None]
            if down:
                print(
                    f"replaced leaders stepped down after resuming: p50 "
                    f"{statistics.median(down):.3f} s, max {max(down):.3f} s"
                )
        print()
        broken = Counter(v.rule for v in violations)
        print(f"| {'invariant':<62} | {'result':<12} |")
        print(f"| {'-' * 62} | {'-' * 12} |")
        semaphore_rules = ("permits", "permit-tokens")
        for rule, text in INVARIANTS.items():
            if rule == "applied-mark" and ev.final_applied is None:
                result = "n/a (locks)"
            elif rule == "order" and ev.mode == "semaphore":
                result = "n/a (sem)"
            elif rule in semaphore_rules and ev.mode != "semaphore":
                result = "n/a"
            elif rule == "acknowledged" and ev.replicated and not broken[rule]:
                result = "held (*)"
            else:
                result = "held" if not broken[rule] else f"VIOLATED x{broken[rule]}"
            print(f"| {text:<62} | {result:<12} |")
        if ev.replicated:
            print("(*) but for writes a demoted master acknowledged, counted above")
        if not violations:
            print("\nall invariants held")
            return
        print(f"\n{len(violations)} violation(s); evidence:")
        for v in violations[:20]:
            print(f"\n* [{v.rule}] {v.message}")
            for line in v.evidence:
                print(f"    {line}")
            if v.t is not None:
                before = [f for f in ev.faults if f.start <= v.t][-3:]
                for f in before:
                    print(
                        f"    preceding fault: {_clock(f.start)} {f.kind} {f.target} "
                        f"({f.end - f.start:.2f} s)"
                    )
                near = [e for e in ev.events if abs(e["t"] - v.t) < 1.0 and e["ev"] != "write"][-8:]
                for e in near:
                    print(f"    log: {_fmt_event(e)}")
        print(f"\ncontender logs kept in {self.workdir}")


def report_unclaimed(ev: Evidence, fence_seen: list[tuple[float, int]]) -> None:
    """Tokens the counter handed out that no contender logged an election for, and when.

    An acquire that won at Redis but whose reply a fault swallowed (a timeout, a
    reset, a killed contender) uses a token nobody leads with; the fence is
    still sound. The sampler saw the counter move, so each such token is
    placed in time and next to the fault in progress.
    """
    claimed = {e["token"] for e in ev.events if e["ev"] == "elected"}
    unclaimed = [t for t in range(1, ev.final_fence + 1) if t not in claimed]
    if not unclaimed:
        return
    kinds: Counter[str] = Counter()
    for token in unclaimed:
        seen = next((t for t, n in fence_seen if n >= token), None)
        if seen is None:
            kinds["unsampled"] += 1
            continue
        during = [f for f in ev.faults if f.start - 0.1 <= seen <= f.end + 2.0]
        kinds[during[-1].kind if during else "no fault within 2 s"] += 1
    detail = ", ".join(f"{k} {n}" for k, n in kinds.most_common())
    print(f"tokens issued with no election logged: {len(unclaimed)} (seen during: {detail})")


def successor_times(faults: list[Fault], events: list[dict[str, Any]]) -> None:
    """For each leader freeze: seconds until a different contender was elected, if one was."""
    for i, f in enumerate(faults):
        if f.kind != "freeze-leader":
            continue
        horizon = faults[i + 1].start if i + 1 < len(faults) else float("inf")
        for e in events:
            if e["ev"] == "elected" and f.start < e["t"] < horizon and e["pid"] != f.victim_pid:
                f.successor_seconds = e["t"] - f.start
                break
        if f.successor_seconds is None:
            continue
        mine = [e for e in events if e["pid"] == f.victim_pid and e["t"] < f.start]
        states = [e["ev"] for e in mine if e["ev"] in ("elected", "stepped_down")]
        if not states or states[-1] != "elected":
            # The lease named it, but it was not leading (an acquire whose
            # reply a fault swallowed): nothing to step down from.
            continue
        for e in events:
            if e["ev"] == "stepped_down" and e["pid"] == f.victim_pid and e["t"] >= f.end:
                f.stepdown_seconds = e["t"] - f.end
                break


# -- the self-test -----------------------------------------------------------------------------


def self_test() -> int:
    """Plant one violation of each kind in otherwise clean evidence; each must be caught."""

    def clean() -> Evidence:
        t = 1000.0
        events = [
            {"t": t, "ev": "elected", "pid": 11, "slot": 0, "token": 1},
            {"t": t + 1, "ev": "write", "pid": 11, "slot": 0, "token": 1, "seq": 1, "r": "a"},
            {"t": t + 2, "ev": "elected", "pid": 22, "slot": 1, "token": 2},
            {"t": t + 3, "ev": "write", "pid": 11, "slot": 0, "token": 1, "seq": 2, "r": "r"},
            {"t": t + 4, "ev": "write", "pid": 22, "slot": 1, "token": 2, "seq": 1, "r": "a"},
            {"t": t + 5, "ev": "write", "pid": 22, "slot": 1, "token": 2, "seq": 2, "r": "e"},
        ]
        return Evidence(
            "elector", events, ["1:11:1", "2:22:1"], 2, 2, exits={11: (0, 0.1), 22: (0, 0.2)}
        )

    plants: dict[str, Any] = {}

    def plant(rule: str):  # type: ignore[no-untyped-def]
        def register(fn: Any) -> Any:
            plants[rule] = fn
            return fn

        return register

    @plant("order")
    def _(ev: Evidence) -> None:
        ev.entries.append("1:11:3")  # a stale write landed after token 2's

    @plant("unique-claim")
    def _(ev: Evidence) -> None:
        ev.events.append({"t": 1006.0, "ev": "elected", "pid": 33, "slot": 2, "token": 2})

    @plant("applied-mark")
    def _(ev: Evidence) -> None:
        ev.final_applied = 1

    @plant("once")
    def _(ev: Evidence) -> None:
        ev.entries.append("2:22:1")

    @plant("acknowledged")
    def _(ev: Evidence) -> None:
        ev.entries.append("1:11:2")  # reported rejected, yet written

    @plant("own-token")
    def _(ev: Evidence) -> None:
        ev.entries.append("2:11:9")

    @plant("exit")
    def _(ev: Evidence) -> None:
        ev.exits[22] = (None, EXIT_GRACE + 0.5)

    @plant("no-crash")
    def _(ev: Evidence) -> None:
        ev.events.append({"t": 1007.0, "ev": "crash", "pid": 22, "slot": 1, "error": "boom"})

    @plant("permit-tokens")
    def _(ev: Evidence) -> None:
        ev.mode = "semaphore"  # two permit holders at once; then one goes back in tokens
        ev.events.append({"t": 1008.0, "ev": "elected", "pid": 22, "slot": 1, "token": 1})

    @plant("permits")
    def _(ev: Evidence) -> None:
        # What the sampler reports when the server holds more live permits than N.
        ev.mode = "semaphore"
        ev.live.append(Violation("permits", "3 live permits at the server, of 2", 1009.0))

    ok = True
    baseline = check(clean())
    if baseline:
        print(f"FAIL clean evidence judged violated: {[v.message for v in baseline]}")
        ok = False
    else:
        print("ok   clean evidence passes")
    for rule, fn in plants.items():
        ev = clean()
        fn(ev)
        rules = {v.rule for v in check(ev)}
        caught = rule in rules
        ok &= caught
        print(f"{'ok  ' if caught else 'FAIL'} planted {rule!r} -> caught {sorted(rules)}")
    return 0 if ok else 1


# -- command line -----------------------------------------------------------------------------


def parse_weights(text: str) -> dict[str, float]:
    weights = dict(DEFAULT_WEIGHTS)
    if not text:
        return weights
    for part in text.split(","):
        kind, sep, value = part.partition("=")
        kind = kind.strip()
        if not sep or kind not in DEFAULT_WEIGHTS:
            raise argparse.ArgumentTypeError(
                f"a weight is KIND=NUMBER with KIND one of {', '.join(DEFAULT_WEIGHTS)}; "
                f"got {part!r}"
            )
        try:
            weights[kind] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"weight of {kind} must be a number, got {value!r}"
            ) from None
        if weights[kind] < 0:
            raise argparse.ArgumentTypeError(f"weight of {kind} must be >= 0, got {value!r}")
    return weights


def parse_gap(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition("-")
    try:
        gap = (float(lo), float(hi if sep else lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gap is MIN-MAX in TTLs, got {text!r}") from None
    if not 0 <= gap[0] <= gap[1]:
        raise argparse.ArgumentTypeError(f"--gap needs 0 <= MIN <= MAX, got {text!r}")
    return gap


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Exit status: 0 every invariant held, 1 a violation (evidence printed), "
        "2 the soak itself failed, 130 interrupted.",
    )
    p.add_argument("--duration", type=positive, default=60.0, help="seconds of faults (default 60)")
    p.add_argument("--seed", type=int, default=1, help="fault schedule seed (default 1)")
    p.add_argument("--contenders", type=int, default=4, help="contender processes (default 4)")
    p.add_argument("--ttl", type=positive, default=1.0, help="lease TTL in seconds (default 1.0)")
    p.add_argument(
        "--engine",
        choices=("both", "native", "python"),
        default="both",
        help="both: contenders alternate native / python (default)",
    )
    p.add_argument(
        "--mode",
        choices=("elector", "lock", "semaphore"),
        default="elector",
        help="contend with Elector (default), take RedisLocker locks, or semaphore permits",
    )
    p.add_argument(
        "--permits",
        type=int,
        default=2,
        help="the semaphore's permits, in semaphore mode (default 2)",
    )
    p.add_argument(
        "--topology",
        choices=("plain", "sentinel"),
        default="plain",
        help="plain: one redis-server with AOF (default); sentinel: 1 replica, 3 sentinels",
    )
    p.add_argument(
        "--weights",
        type=parse_weights,
        default=dict(DEFAULT_WEIGHTS),
        help="fault weights, e.g. 'crash-redis=0,freeze-leader=5' (others keep defaults)",
    )
    p.add_argument(
        "--gap",
        type=parse_gap,
        default=(1.0, 3.0),
        help="quiet time between faults, MIN-MAX in TTLs (default 1-3)",
    )
    p.add_argument(
        "--write-interval",
        type=positive,
        default=0.005,
        help="seconds between a leader's fenced writes (default 0.005)",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=0,
        help="the replication guard of every contender's elector or locker (default 0: off; "
        "Sentinel only)",
    )
    p.add_argument("--workdir", help="where contender logs go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the contender logs of a clean run")
    p.add_argument("--quiet", action="store_true", help="no line per fault")
    p.add_argument(
        "--inject-stale-write",
        action="store_true",
        help="push a stale entry past the fence mid-run: the checker must fail the run",
    )
    p.add_argument(
        "--self-test", action="store_true", help="check the checker on crafted evidence and exit"
    )
    # The contender process (this same script, started by the soak).
    p.add_argument("--contender", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--sentinels", help=argparse.SUPPRESS)
    p.add_argument("--service", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.contender:
        return contender_main(args)
    if args.self_test:
        return self_test()
    if args.contenders < 2:
        raise SystemExit(
            f"--contenders must be at least 2 (a leader and a follower), got {args.contenders}"
        )
    if args.min_replicas and args.topology != "sentinel":
        raise SystemExit(
            f"--min-replicas {args.min_replicas} needs --topology sentinel (the plain server "
            "has no replica)"
        )
    soak = Soak(args)

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted

    signal.signal(signal.SIGTERM, on_term)
    status = 2
    try:
        status = soak.run()
    except (KeyboardInterrupt, Interrupted):
        print("\ninterrupted: stopping every process started", file=sys.stderr)
        status = 130
    except Exception:
        # The soak itself failed (not an invariant): status 2, never 0 or 1.
        traceback.print_exc()
        status = 2
    finally:
        soak.kill_everything()
        if status == 0 and not args.keep and not args.workdir:
            shutil.rmtree(soak.workdir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
