"""``redlease demo``: contenders elect a leader, the leader freezes, the fence stops its write.

The contenders are child processes (``redlease._cli.demo_worker``) so one of
them can be frozen for real with SIGSTOP, the way a long GC pause or a
stalled VM freezes a leader: every thread stops, the lease runs out, a
successor is elected with a greater token. On SIGCONT the frozen leader
carries on where it was -- about to write with its old token -- and the fence
at Redis rejects that write.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import IO, Any

import redis

from .._keys import ElectionKeys
from .engineline import engine_line
from .redisurl import CliError, ReachableServer, errors, one_line, redis_target, reply_text


@dataclass
class Worker:
    """One contender process and what the demo knows about it."""

    label: str
    proc: subprocess.Popen[str]
    pid: int = 0
    engine: str = "?"
    exited: bool = False
    frozen: bool = False
    stderr_tail: list[str] = field(default_factory=list)


@dataclass
class TermRecord:
    """One leadership term as the demo saw it."""

    token: int
    holder: str
    applied: int = 0
    rejected: int = 0
    reason: str | None = None


class Timeline:
    """Prints events with the seconds since the demo started."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.t0 = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def say(self, who: str, text: str) -> None:
        self.out.write(f"{self.elapsed():6.2f}s  {who:<4} {text}\n")
        self.out.flush()


@dataclass
class Scenario:
    """The freeze-and-fence script the demo plays once during the run."""

    state: str = "warmup"  # warmup -> frozen -> woken -> done
    victim: Worker | None = None
    victim_token: int = 0
    frozen_at: float = 0.0
    successor_token: int = 0
    successor_wrote: bool = False
    woken_at: float = 0.0
    stale_rejected: bool = False
    resign_asked: bool = False


class Demo:
    """Runs the contenders, reacts to their events, and keeps the tally for the summary."""

    def __init__(
        self, target: ReachableServer, contenders: int, ttl: float, duration: float, out: IO[str]
    ) -> None:
        self.target = target
        self.contenders = contenders
        self.ttl = ttl
        self.duration = duration
        self.out = out
        self.name = f"redlease-demo-{secrets.token_hex(3)}"
        self.keys = ElectionKeys(self.name)
        self.value_key = f"{self.name}:value"
        self.events: queue.Queue[tuple[Worker, dict[str, Any] | None]] = queue.Queue()
        self.workers: list[Worker] = []
        self.terms: dict[int, TermRecord] = {}
        self.leader_writes: dict[str, int] = {}
        self.scenario = Scenario()
        self.timeline = Timeline(out)

    # -- processes -------------------------------------------------------------

    def spawn(self) -> None:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        for i in range(1, self.contenders + 1):
            label = f"c{i}"
            proc = subprocess.Popen(
                [
                    sys.executable, "-m", "redlease._cli.demo_worker",
                    self.target.url, self.name, label, repr(self.ttl),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=env,
                # Our own session: a Ctrl-C at the terminal reaches the demo,
                # which then stops the contenders in order.
                start_new_session=True,
            )
            worker = Worker(label=label, proc=proc, pid=proc.pid)
            self.workers.append(worker)
            threading.Thread(target=self._read_stdout, args=(worker,), daemon=True).start()
            threading.Thread(target=self._read_stderr, args=(worker,), daemon=True).start()

    def _read_stdout(self, worker: Worker) -> None:
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                self.events.put((worker, event))
        self.events.put((worker, None))

    def _read_stderr(self, worker: Worker) -> None:
        assert worker.proc.stderr is not None
        for line in worker.proc.stderr:
            if line.strip():
                worker.stderr_tail = [*worker.stderr_tail[-4:], line.rstrip()]

    def shutdown(self) -> None:
        """Stop every contender: wake the frozen, ask politely, then insist."""
        for worker in self.workers:
            if worker.frozen:
                self._signal(worker, signal.SIGCONT)
                worker.frozen = False
            stdin = worker.proc.stdin
            if stdin is not None:
                try:
                    stdin.write("stop\n")
                    stdin.close()
                except (BrokenPipeError, OSError, ValueError):
                    pass
        deadline = time.monotonic() + self.ttl + 3.0
        for worker in self.workers:
            try:
                worker.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()

    def _signal(self, worker: Worker, sig: signal.Signals) -> None:
        with suppress(ProcessLookupError):
            os.kill(worker.pid, sig)

    # -- the run -------------------------------------------------------------------

    def run(self) -> None:
        self.spawn()
        hard_stop = self.duration + 6 * self.ttl + 10.0
        while True:
            now = self.timeline.elapsed()
            if now >= self.duration and self.scenario.state == "done":
                break
            if now >= hard_stop:
                self.timeline.say("--", "giving up waiting for the freeze scenario to finish")
                break
            if all(w.exited for w in self.workers):
                break
            self._advance_scenario()
            try:
                worker, event = self.events.get(timeout=0.05)
            except queue.Empty:
                continue
            if event is None:
                self._exited(worker)
            else:
                self._handle(worker, event)
        self.timeline.say("--", "stopping the contenders")

    def drain(self) -> None:
        """Show what the contenders report while they step down and exit."""
        while True:
            try:
                worker, event = self.events.get(timeout=0.2)
            except queue.Empty:
                if all(w.proc.poll() is not None for w in self.workers):
                    return
                continue
            if event is None:
                self._exited(worker, quiet=True)
            elif event.get("event") in ("write", "elected", "stepped-down"):
                self._handle(worker, event)

    def _exited(self, worker: Worker, quiet: bool = False) -> None:
        worker.exited = True
        code = worker.proc.wait()
        if code != 0 and not quiet:
            why = worker.stderr_tail[-1] if worker.stderr_tail else "no output"
            self.timeline.say(worker.label, f"exited with status {code}: {why}")

    def _handle(self, worker: Worker, event: dict[str, Any]) -> None:
        kind = event.get("event")
        say = self.timeline.say
        who = worker.label
        if kind == "ready":
            worker.engine = str(event.get("engine"))
            say(who, f"contending (pid {worker.pid}, {worker.engine} engine)")
        elif kind == "elected":
            token = int(event["token"])
            self.terms[token] = TermRecord(token=token, holder=who)
            previous = [t for t in self.terms if t < token]
            note = ""
            if previous:
                note = f"  (> {max(previous)}: writes with older tokens are now rejected)"
            say(who, f"ELECTED leader, term token {token}{note}")
            if self.scenario.state == "frozen" and token > self.scenario.victim_token:
                self.scenario.successor_token = token
        elif kind == "follower":
            leader = event.get("leader")
            say(who, f"follower ({leader or 'another contender'} holds the lease)")
        elif kind == "write":
            self._write(worker, event)
        elif kind == "write-error":
            say(who, f"write with token {event.get('token')} failed: {event.get('error')}")
        elif kind == "stepped-down":
            ended, reason = event.get("token"), event.get("reason")
            if isinstance(ended, int) and ended in self.terms:
                self.terms[ended].reason = reason
            say(who, f"stepped down, term {ended} ended ({_reason(reason)})")
        elif kind == "error":
            say(who, f"redis error (handled): {event.get('error')}")

    def _write(self, worker: Worker, event: dict[str, Any]) -> None:
        token = int(event["token"])
        value = str(event.get("value"))
        term = self.terms.setdefault(token, TermRecord(token=token, holder=worker.label))
        if event.get("applied"):
            term.applied += 1
            self.timeline.say(worker.label, f'write "{value}"  applied (token {token})')
            if self.scenario.state == "frozen" and token == self.scenario.successor_token:
                self.scenario.successor_wrote = True
            return
        term.rejected += 1
        mark = event.get("mark")
        why = f"token {token} is stale"
        if mark is not None:
            why = f"token {token} < high-water mark {mark}"
        self.timeline.say(
            worker.label,
            f'write "{value}"  REJECTED by the fence: {why}. The stale write did not land.',
        )
        if worker is self.scenario.victim:
            self.scenario.stale_rejected = True

    def _advance_scenario(self) -> None:
        sc = self.scenario
        now = self.timeline.elapsed()
        if sc.state == "warmup":
            leader = self._current_leader()
            if leader is None or now < 0.2 * self.duration:
                return
            worker, term = leader
            if term.applied < 2:
                return
            self._signal(worker, signal.SIGSTOP)
            worker.frozen = True
            sc.victim, sc.victim_token, sc.frozen_at, sc.state = worker, term.token, now, "frozen"
            self.timeline.say(
                "--",
                f"FREEZE {worker.label} (pid {worker.pid}) with SIGSTOP: a stop-the-world pause "
                f"(think GC) longer than its {self.ttl:g} s lease. It still believes it leads "
                f"with token {term.token}.",
            )
        elif sc.state == "frozen":
            frozen_for = now - sc.frozen_at
            long_enough = frozen_for > self.ttl and sc.successor_token > 0 and sc.successor_wrote
            if long_enough or frozen_for > 4 * self.ttl + 5.0:
                assert sc.victim is not None
                self._signal(sc.victim, signal.SIGCONT)
                sc.victim.frozen = False
                sc.woken_at, sc.state = now, "woken"
                self.timeline.say(
                    "--",
                    f"WAKE {sc.victim.label} with SIGCONT after {frozen_for:.1f} s frozen; it "
                    f"carries on with its write, still holding token {sc.victim_token}",
                )
        elif sc.state == "woken" and (sc.stale_rejected or now - sc.woken_at > 2 * self.ttl + 2):
            sc.state = "done"
        elif sc.state == "done" and not sc.resign_asked and now >= 0.75 * self.duration:
            # A graceful handover for contrast: the lock is released at once,
            # the next term starts without waiting out a TTL.
            leader = self._current_leader()
            if leader is None or leader[0].proc.stdin is None:
                return
            sc.resign_asked = True
            worker = leader[0]
            self.timeline.say(
                "--",
                f"ask {worker.label} to resign: a graceful step-down releases the lease at once",
            )
            with suppress(BrokenPipeError, OSError, ValueError):
                assert worker.proc.stdin is not None
                worker.proc.stdin.write("resign\n")
                worker.proc.stdin.flush()

    def _current_leader(self) -> tuple[Worker, TermRecord] | None:
        if not self.terms:
            return None
        term = self.terms[max(self.terms)]
        for worker in self.workers:
            if worker.label == term.holder and not worker.exited:
                return worker, term
        return None

    # -- the end -------------------------------------------------------------------

    def summary(self, client: redis.Redis) -> list[str]:
        applied = sum(t.applied for t in self.terms.values())
        rejected = sum(t.rejected for t in self.terms.values())
        lines = ["", "summary"]
        first = True
        for token in sorted(self.terms):
            term = self.terms[token]
            text = f"token {token}: {term.holder}, {term.applied} write(s) applied"
            if term.rejected:
                text += f", {term.rejected} rejected"
            if term.reason:
                text += f" ({_reason(term.reason)})"
            lines.append(f"  {'terms' if first else '':<9} {text}")
            first = False
        if first:
            lines.append("  terms     none: no contender was elected")
        lines.append(f"  writes    {applied} applied, {rejected} rejected as stale")
        value = reply_text(client.get(self.value_key))
        fence = reply_text(client.get(self.keys.fence))
        mark = reply_text(client.get(self.keys.applied))
        lines.append(f'  survived  {self.value_key} = "{value}"')
        lines.append(f"  fence     counter {fence}, high-water mark {mark}")
        sc = self.scenario
        if sc.stale_rejected and sc.victim is not None:
            lines.append(
                f"  verdict   {sc.victim.label}'s write with stale token {sc.victim_token} was "
                f"rejected after token {sc.successor_token} was elected: the newer value survived"
            )
        return lines

    def forget_keys(self, client: redis.Redis) -> None:
        client.delete(*self.keys.all(), self.value_key)


def _reason(reason: object) -> str:
    return {
        "lost": "lease lost",
        "returned": "the leader stopped working",
        "resigned": "resigned",
        "stopped": "demo stopping",
    }.get(str(reason), str(reason))


@contextmanager
def _contenders(demo: Demo) -> Iterator[Demo]:
    try:
        yield demo
    finally:
        demo.shutdown()


def main(url: str | None, *, contenders: int, ttl: float, duration: float) -> int:
    """Run the demo; returns the exit status (CliError for setup failures)."""
    out = sys.stdout
    with redis_target(url) as target:
        demo = Demo(target, contenders, ttl, duration, out)
        out.write(
            f"redlease demo: {contenders} contender processes race for leadership of "
            f'"{demo.name}" (lease TTL {ttl:g} s, about {duration:g} s)\n'
            f"on {target.description}.\n"
            f'Each leader writes "<who>/term <token>/write <n>" to {demo.value_key} through '
            f"the fence every {ttl / 4:g} s.\n"
            f"{engine_line()}\n\n"
        )
        out.flush()
        with _contenders(demo):
            demo.run()
        demo.drain()
        client = target.client()
        try:
            for line in demo.summary(client):
                out.write(line + "\n")
            if not target.embedded:
                demo.forget_keys(client)
        except errors("RedisError") as exc:
            raise CliError(f"could not read the demo's final state: {one_line(exc)}") from None
        finally:
            client.close()
    if target.embedded:
        out.write("  cleanup   embedded redis-server stopped, its socket and files removed\n")
    else:
        out.write(f"  cleanup   the demo's keys ({demo.name}:*) deleted\n")
    out.flush()
    if not demo.scenario.stale_rejected:
        raise CliError("the frozen leader's stale write was never seen being rejected")
    return 0
