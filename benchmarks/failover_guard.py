"""Fence regressions across Sentinel failovers, with and without the replication guard.

    python benchmarks/failover_guard.py [--failovers N] [--engine native|python]
                                        [--runs guard,plain,...]

Each run starts its own Sentinel set through the test harness: a master, two
replicas and three sentinels. One elector (TTL 1 s) leads and writes through
the fence every few milliseconds. Then N failovers, alternating ``SENTINEL
FAILOVER`` and kill -9 of the master (restarted empty, to rejoin as a
replica). Before each one, replication is held back: replicas are frozen
(SIGSTOP), the leader resigns so that a new term is elected while they are,
and the fault strikes while they are still frozen (they are thawed at once
after a kill -9, and just before a ``SENTINEL FAILOVER``, which needs them).

A *fence regression* is the fence counter or the ``applied`` mark on the
master going below a value that a confirmed election (a term this instance
started) or a confirmed fenced write (one that returned True) returned: a
token that could be handed out twice, or a stale write that the fence would
let through. A sampler reads both from the master every 20 ms and compares
them with what had been confirmed before each read. The table counts the
failovers with at least one regression.

Runs (``--runs``, comma-separated, in order):

- ``guard``: ``min_replicas=1``, both replicas held back;
- ``plain``: no guard, both replicas held back;
- ``guard-one``: ``min_replicas=1``, only the replica the sentinels will
  promote held back (made the favourite with ``replica-priority``), so the
  other one confirms: what WAIT cannot see;
- ``guard-all``: ``min_replicas=2``, the same hold-back as ``guard-one``.

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
from redlease._testing._sentinel_events import pairs

NAME = "guarded"
FENCE_KEY = f"{NAME}:fence"
APPLIED_KEY = f"{NAME}:fence:applied"
DATA_KEY = f"{NAME}:data"
TTL = 1.0
HOLD_BACK = 0.4
PRIORITY_FAVOURITE = 10
PRIORITY_OTHER = 100


@dataclass
class RunSpec:
    label: str
    min_replicas: int
    hold: str  # "all" or "favourite"


RUNS = {
    "guard": RunSpec("min_replicas=1, both replicas held back", 1, "all"),
    "plain": RunSpec("no guard, both replicas held back", 0, "all"),
    "guard-one": RunSpec("min_replicas=1, the promoted replica held back", 1, "favourite"),
    "guard-all": RunSpec("min_replicas=2, the promoted replica held back", 2, "favourite"),
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
    client: Any = sset.master_for(socket_timeout=0.5, socket_connect_timeout=0.5)
    while not stop.is_set():
        seen = ledger.confirmed()
        try:
            fence, applied = client.mget(FENCE_KEY, APPLIED_KEY)
        except redis.RedisError:
            stop.wait(0.02)
            continue
        ledger.check(int(fence or 0), int(applied or 0), seen)
        stop.wait(0.02)
    client.close()


def node_client(sset: SentinelSet, node: RedisServer) -> Any:
    return sset.node_client(node, socket_timeout=2, socket_connect_timeout=2)


def favour(sset: SentinelSet, favourite: RedisServer) -> None:
    """Make ``favourite`` the replica the sentinels promote next, and wait until they know."""
    for node in sset.replicas():
        prio = PRIORITY_FAVOURITE if node is favourite else PRIORITY_OTHER
        c = node_client(sset, node)
        c.config_set("replica-priority", prio)
        c.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(_knows_priority(sset, s, favourite) for s in sset.sentinels):
            return
        time.sleep(0.25)
    raise RuntimeError("the sentinels did not learn the replica priorities")


def _knows_priority(sset: SentinelSet, sentinel: RedisServer, favourite: RedisServer) -> bool:
    c: Any = sset.sentinel_client(sentinel)
    try:
        for reply in c.execute_command("SENTINEL", "REPLICAS", sset.service):
            fields = pairs(reply)
            want = PRIORITY_FAVOURITE if int(fields["port"]) == favourite.port else PRIORITY_OTHER
            if int(fields.get("slave-priority", -1)) != want:
                return False
        return True
    finally:
        c.close()


def one_run(spec: RunSpec, failovers: int, engine: str) -> dict[str, Any]:
    ledger = Ledger()
    with SentinelSet(replicas=2, sentinels=3) as sset:
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
                replicas = sset.replicas()
                victims = replicas
                if spec.hold == "favourite":
                    favourite = replicas[0]
                    favour(sset, favourite)
                    victims = [favourite]
                time.sleep(0.2)  # some confirmed writes before the fault
                with ledger.lock:
                    ledger.failover = i
                kill = i % 2 == 0
                for node in victims:
                    sset.freeze(node)
                time.sleep(HOLD_BACK / 2)
                # A new term elected while replication is held back: confirmed
                # at once without the guard, refused (NotReplicated) with it
                # unless a replica that is not held back confirms it.
                before = ledger.outcomes()
                elector.resign()
                _wait(lambda b=before: ledger.outcomes() != b, 5, "the re-election's outcome")
                time.sleep(HOLD_BACK / 2)
                if kill:
                    old_address = sset.master_address()
                    old = sset.node_at(old_address)
                    old.kill()
                    for node in victims:
                        sset.thaw(node)
                    sset._wait_new_master(old_address, None)
                    old.restart()
                else:
                    for node in victims:
                        sset.thaw(node)
                    sset.failover()
                fault = "kill -9" if kill else "SENTINEL FAILOVER"
                regressed = " REGRESSED" if i in ledger.regressed else ""
                print(f"  {spec.label}: failover {i}/{failovers} ({fault}){regressed}", flush=True)
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
        "--runs", default="guard,plain", help=f"comma-separated, of {', '.join(RUNS)}"
    )
    args = parser.parse_args()
    results = []
    for key in args.runs.split(","):
        spec = RUNS[key.strip()]
        print(f"run: {spec.label} ({args.failovers} failovers, {args.engine} engine)", flush=True)
        results.append(one_run(spec, args.failovers, args.engine))
        print(_row(results[-1]), flush=True)
    print()
    print(
        "| run | failovers with a fence regression | of them after SENTINEL FAILOVER "
        "| after kill -9 | terms confirmed | elections not confirmed | writes confirmed "
        "| writes not confirmed | writes failed | seconds |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(_row(r))
    for r in results:
        for line in r["evidence"]:
            print(f"  {r['spec'].label}: {line}")


def _row(r: dict[str, Any]) -> str:
    return (
        f"| {r['spec'].label} | {r['regressed']} of {r['failovers']} "
        f"| {r['regressed_manual']} of {r['failovers'] - r['kills']} "
        f"| {r['regressed_kill']} of {r['kills']} | {r['elections']} "
        f"| {r['unconfirmed_elections']} | {r['writes']} | {r['unconfirmed_writes']} "
        f"| {r['failed_writes']} | {r['seconds']:.0f} |"
    )


if __name__ == "__main__":
    main()
