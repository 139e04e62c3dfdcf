"""Fence regressions across Sentinel failovers, with and without the replication guard.

    python benchmarks/failover_guard.py [--failovers N] [--engine native|python]
                                        [--runs plain,guard,guard-all,guard-nohold]
                                        [--steady]

Each run starts its own Sentinel set through the test harness: a master, two
replicas and three sentinels. One elector (TTL 1 s) leads and writes through
the fence every few milliseconds. Then N failovers, alternating ``SENTINEL
FAILOVER`` and kill -9 of the master (restarted empty, to rejoin as a
replica).

The data nodes carry fixed ``replica-priority`` values (1, 50 and 100; lower
is preferred), so the sentinels promote the replica of lowest priority, and
that is the replica held back: before each failover it is frozen (SIGSTOP)
and its replication link cut on the master (``CLIENT KILL ADDR``: a frozen
process's kernel would still take the stream in), while the other replica
keeps replicating and acknowledging. The leader resigns meanwhile so that a
new term is elected (or refused) while the replica to be promoted is behind
(not with ``--steady``: the leader keeps its term). Then the held-back
replica is thawed and the fault strikes at once: it is promoted without
what it missed. Each failover records whether the promoted node was the one
held back.

A *fence regression* is the fence counter or the ``applied`` mark on the
master going below a value that a confirmed election (a term this instance
started) or a confirmed fenced write (one that returned True) returned, or
an election returning a token an earlier confirmed election had already
returned: a token handed out twice, or a stale write the fence would let
through. A sampler reads both every 20 ms from the node most sentinels name
as the master, and compares them with what had been confirmed before each
read. The table counts the failovers with at least one regression, by kind
of fault.

Runs (``--runs``, comma-separated, in order):
``plain`` (no guard, one replica held back), ``guard`` (``min_replicas=1``,
one replica held back: the acknowledgement comes from the replica that is
NOT promoted, so this shows what ``min_replicas=1`` does not cover),
``guard-all`` (``min_replicas=2``, every replica must confirm: the held-back
one included), ``guard-nohold`` (``min_replicas=1``, nothing held back: the
same faults on a healthy set), ``plain-nohold`` (no guard, nothing held
back).

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

import redlease
from redlease._testing import RedisServer, SentinelSet

NAME = "guarded"
FENCE_KEY = f"{NAME}:fence"
APPLIED_KEY = f"{NAME}:fence:applied"
DATA_KEY = f"{NAME}:data"
TTL = 1.0
HOLD_BACK = 0.4


PRIORITIES = (100, 1, 50)  # replica-priority of the data nodes, in start order


@dataclass
class RunSpec:
    label: str
    min_replicas: int
    hold_back: bool = True


RUNS = {
    "plain": RunSpec("no guard, promoted replica held back", 0),
    "guard": RunSpec("min_replicas=1, promoted replica held back", 1),
    "guard-all": RunSpec("min_replicas=2, promoted replica held back", 2),
    "guard-nohold": RunSpec("min_replicas=1, nothing held back", 1, hold_back=False),
    "plain-nohold": RunSpec("no guard, nothing held back", 0, hold_back=False),
}


@dataclass
class Ledger:
    """What the application was told, and what the master said afterwards."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    token: int = 0  # the highest confirmed election
    applied: int = 0  # the highest token of a confirmed write
    failover: int = 0  # index of the failover in progress (regressions count against it)
    regressed: set[int] = field(default_factory=set)
    evidence: list[str] = field(default_factory=list)
    elections: int = 0
    writes: int = 0
    unconfirmed_writes: int = 0
    unconfirmed_elections: int = 0
    failed_writes: int = 0

    def elected(self, token: int) -> None:
        with self.lock:
            self.elections += 1
            if token <= self.token:
                self._regress(f"election returned token {token} after {self.token}")
            self.token = max(self.token, token)

    def wrote(self, token: int) -> None:
        with self.lock:
            self.writes += 1
            self.applied = max(self.applied, token)

    def outcomes(self) -> tuple[int, int]:
        with self.lock:
            return self.elections, self.unconfirmed_elections

    def confirmed(self) -> tuple[int, int]:
        with self.lock:
            return self.token, max(self.token, self.applied)

    def check(self, fence: int, applied: int, seen: tuple[int, int]) -> None:
        with self.lock:
            if fence < seen[0]:
                self._regress(f"fence counter {fence} below confirmed election {seen[0]}")
            if applied < seen[1]:
                self._regress(f"applied mark {applied} below confirmed {seen[1]}")

    def _regress(self, what: str) -> None:
        # Caller holds the lock.
        if self.failover not in self.regressed:
            self.regressed.add(self.failover)
            self.evidence.append(f"failover {self.failover}: {what}")


def writer(ledger: Ledger) -> Any:
    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        seq = 0
        while not term.ended():
            seq += 1
            try:
                if fencer.set(DATA_KEY, f"{fencer.token}:{seq}"):
                    ledger.wrote(fencer.token)
            except redlease.NotReplicated:
                with ledger.lock:
                    ledger.unconfirmed_writes += 1
            except redis.RedisError:
                with ledger.lock:
                    ledger.failed_writes += 1
                term.wait(0.01)
            term.wait(0.003)

    return lead


def sampler(sset: SentinelSet, ledger: Ledger, stop: threading.Event) -> None:
    """Compare the master the sentinels name with what was confirmed, until ``stop``.

    Each read goes to the node most sentinels name at that moment, and
    counts only if they still name it once it answered: after a ``SENTINEL
    FAILOVER`` the old master answers as a master for seconds more, and its
    data is what the failover throws away.
    """
    clients: dict[int | None, Any] = {}
    while not stop.is_set():
        seen = ledger.confirmed()
        try:
            node = sset.master()
            client = clients.get(node.port)
            if client is None:
                client = clients[node.port] = node_client(sset, node)
            if client.execute_command("ROLE")[0] not in (b"master", "master"):
                raise redis.RedisError("not a master yet")
            fence, applied = client.mget(FENCE_KEY, APPLIED_KEY)
            if sset.master_address()[1] != node.port:
                # Named no more by the time it answered (a killed master
                # restarted empty was named when asked, not when read).
                raise redis.RedisError("not the master any more")
        except (redis.RedisError, OSError, redlease.RedleaseError):
            stop.wait(0.02)
            continue
        ledger.check(int(fence or 0), int(applied or 0), seen)
        stop.wait(0.02)
    for client in clients.values():
        client.close()


def node_client(sset: SentinelSet, node: RedisServer) -> Any:
    return sset.node_client(node, socket_timeout=2, socket_connect_timeout=2)


def set_priorities(sset: SentinelSet) -> dict[int, int]:
    """Give each data node its fixed ``replica-priority``, now and after any restart."""
    priorities = {}
    for node, priority in zip(sset.data_nodes, PRIORITIES, strict=True):
        client = node_client(sset, node)
        client.config_set("replica-priority", priority)
        client.close()
        node.add_args("--replica-priority", str(priority))  # kept across restart()
        assert node.port is not None
        priorities[node.port] = priority
    # A sentinel reads a replica's priority from its INFO (every 10 s): wait for it.
    want = {port: p for port, p in priorities.items() if port != sset.master_address()[1]}
    _wait(lambda: _sentinel_priorities(sset) == want, 30, "the sentinels to see the priorities")
    return priorities


def _sentinel_priorities(sset: SentinelSet) -> dict[int, int] | None:
    seen: dict[int, int] | None = None
    for sentinel in sset.sentinels:
        client = sset.sentinel_client(sentinel, socket_timeout=2)
        try:
            replies = client.sentinel_slaves(sset.service)
        finally:
            client.close()
        view = {}
        for reply in replies:
            fields = {_text(k): _text(v) for k, v in reply.items()}
            view[int(fields["port"])] = int(fields["slave-priority"])
        if seen is not None and view != seen:
            return None
        seen = view
    return seen


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def hold_back(sset: SentinelSet, node: RedisServer) -> None:
    """Freeze ``node`` and cut its replication link on the master; the other replica goes on."""
    replica = node_client(sset, node)
    links = replica.client_list(_type="master")
    replica.close()
    sset.freeze(node)
    master = node_client(sset, sset.master())
    try:
        for link in links:
            master.client_kill_filter(addr=link["laddr"])
    finally:
        master.close()


def one_run(spec: RunSpec, failovers: int, engine: str, reelect: bool) -> dict[str, Any]:
    ledger = Ledger()
    promoted_held = 0
    with SentinelSet(replicas=2, sentinels=3) as sset:
        priorities = set_priorities(sset)
        client = sset.master_for(socket_timeout=2, socket_connect_timeout=2)
        observer = redlease.Observer(
            on_elected=ledger.elected, on_error=lambda exc: _count(ledger, exc)
        )
        elector = redlease.Elector(
            client,
            NAME,
            ttl=TTL,
            acquire_interval=0.05,  # re-contend at once after a resign or a refusal
            engine=engine,
            min_replicas=spec.min_replicas,
            replica_timeout=0.1,
            observer=observer,
        )
        stop = threading.Event()
        watch = threading.Thread(target=sampler, args=(sset, ledger, stop), daemon=True)
        started = time.monotonic()
        with elector.start(writer(ledger)):
            watch.start()
            for i in range(1, failovers + 1):
                _wait(lambda: elector.token() is not None, 30, "a leader")
                sset.wait_settled()
                # The replica the sentinels will promote: the lowest priority.
                victim = min(sset.replicas(), key=lambda n: priorities[n.port or 0])
                time.sleep(0.2)  # some confirmed writes before the fault
                with ledger.lock:
                    ledger.failover = i
                kill = i % 2 == 0
                if spec.hold_back:
                    hold_back(sset, victim)
                time.sleep(HOLD_BACK / 2)
                # A new term elected while the replica to be promoted is behind:
                # confirmed at once without the guard; with it, confirmed only
                # when enough replicas that are not held back acknowledge it.
                if reelect:
                    before = ledger.outcomes()
                    elector.resign()
                    _wait(lambda b=before: ledger.outcomes() != b, 5, "the re-election's outcome")
                time.sleep(HOLD_BACK / 2)
                old_address = sset.master_address()
                if spec.hold_back:
                    sset.thaw(victim)  # eligible again, still behind
                if kill:
                    old = sset.node_at(old_address)
                    old.kill()
                    new = sset.wait_new_master(old_address, None)
                    # Empty, as documented: not from the snapshot a full sync
                    # left behind when it last was a replica (stale tokens).
                    for snapshot in old.dir.glob("*.rdb"):
                        snapshot.unlink()
                    old.restart()
                else:
                    new = sset.failover()
                promoted_held += new[1] == victim.port
                fault = "kill -9" if kill else "SENTINEL FAILOVER"
                regressed = " REGRESSED" if i in ledger.regressed else ""
                which = "preferred" if new[1] == victim.port else "other"
                if spec.hold_back:
                    which = "held-back" if new[1] == victim.port else "other"
                print(
                    f"  {spec.label}: failover {i}/{failovers} ({fault}, {which} replica "
                    f"promoted){regressed}",
                    flush=True,
                )
            # Let the last failover's aftermath reach the sampler.
            _wait(lambda: elector.token() is not None, 30, "a leader")
            time.sleep(1.0)
            stop.set()
            watch.join(5)
        client.close()
    kills = {i for i in range(1, failovers + 1) if i % 2 == 0}
    return {
        "spec": spec,
        "failovers": failovers,
        "promoted_held": promoted_held,
        "regressed": len(ledger.regressed),
        "regressed_kill": len(ledger.regressed & kills),
        "regressed_manual": len(ledger.regressed - kills),
        "kills": len(kills),
        "evidence": ledger.evidence,
        "elections": ledger.elections,
        "unconfirmed_elections": ledger.unconfirmed_elections,
        "writes": ledger.writes,
        "unconfirmed_writes": ledger.unconfirmed_writes,
        "failed_writes": ledger.failed_writes,
        "seconds": time.monotonic() - started,
    }


def _count(ledger: Ledger, exc: Exception) -> None:
    if isinstance(exc, redlease.NotReplicated):
        with ledger.lock:
            ledger.unconfirmed_elections += 1


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failovers", type=int, default=50, help="failovers per run (default 50)")
    parser.add_argument("--engine", default="native", choices=("native", "python"))
    parser.add_argument(
        "--runs",
        default="plain,guard,guard-all,guard-nohold",
        help=f"comma-separated, of {', '.join(RUNS)}",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help="no forced re-election while replication is held back: the leader keeps its term",
    )
    args = parser.parse_args()
    results = []
    for key in args.runs.split(","):
        spec = RUNS[key.strip()]
        schedule = "steady leader" if args.steady else "re-election while held back"
        print(
            f"run: {spec.label} ({args.failovers} failovers, {args.engine} engine, {schedule})",
            flush=True,
        )
        results.append(one_run(spec, args.failovers, args.engine, not args.steady))
        print(_row(results[-1]), flush=True)
    print()
    print(
        "| run | failovers with a fence regression | of them after SENTINEL FAILOVER "
        "| after kill -9 | held-back replica promoted | terms confirmed "
        "| elections not confirmed | writes confirmed "
        "| writes not confirmed | writes failed | seconds |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(_row(r))
    for r in results:
        for line in r["evidence"]:
            print(f"  {r['spec'].label}: {line}")


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['spec'].label} | {r['regressed']} of {r['failovers']} "
        f"| {r['regressed_manual']} of {r['failovers'] - r['kills']} "
        f"| {r['regressed_kill']} of {r['kills']} "
        f"| {r['promoted_held'] if r['spec'].hold_back else '-'} | {r['elections']} "
        f"| {r['unconfirmed_elections']} | {r['writes']} | {r['unconfirmed_writes']} "
        f"| {r['failed_writes']} | {r['seconds']:.0f} |"
    )


if __name__ == "__main__":
    main()
