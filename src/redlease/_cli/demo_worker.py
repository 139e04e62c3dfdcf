"""One contender of ``redlease demo``, run as a child process so the demo can freeze it.

``python -m redlease._cli.demo_worker URL NAME INSTANCE_ID TTL`` runs an Elector
until a line ``stop`` (or end of file) arrives on stdin, so a contender never
outlives the demo that started it; a line ``resign`` hands leadership over.
It reports what happens as JSON lines on stdout; the demo turns them into
the timeline.

While leader it does what a real leader does: some work, then a fenced write
with its term's token, again and again. It deliberately does not ask "am I
still leader?" before writing: that check would race with a pause anyway,
which is the point the fence makes.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import redlease
from redlease._cli.redisurl import connect, errors
from redlease._keys import ElectionKeys


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout (the demo's only input from us)."""
    fields["event"] = event
    line = json.dumps(fields)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_out_lock = threading.Lock()


class Contender:
    """An Elector whose leader writes ``<id>/term <token>/write <n>`` through the fence."""

    def __init__(self, url: str, name: str, instance_id: str, ttl: float) -> None:
        self.client = connect(url, socket_timeout=5.0, socket_connect_timeout=3.0)
        self.keys = ElectionKeys(name)
        self.value_key = f"{name}:value"
        self.instance_id = instance_id
        self.write_every = ttl / 4
        self.stop = threading.Event()
        self.last_term: redlease.Term | None = None
        observer = redlease.Observer(
            on_elected=lambda token: emit("elected", token=token),
            on_stepped_down=self._stepped_down,
            on_follower=lambda: emit("follower", leader=self._leader()),
            on_error=lambda exc: emit("error", error=f"{type(exc).__name__}: {exc}"),
        )
        self.elector = redlease.Elector(
            self.client, name, ttl=ttl, instance_id=instance_id, observer=observer
        )

    def lead(self, term: redlease.Term, fencer: redlease.Fencer) -> None:
        self.last_term = term
        writes = 0
        while True:
            time.sleep(self.write_every)  # the leader's work; a pause lands here
            # Whether the term had ended is read before the write, never after:
            # a leader frozen right after a write must still make the next one
            # on waking (as a paused process does), and have it fenced out.
            ended_before = term.ended()
            if ended_before and term.reason != "lost":
                return  # resigned or stopped: a deliberate end, nothing left to write
            writes += 1
            value = f"{self.instance_id}/term {fencer.token}/write {writes}"
            try:
                applied = fencer.set(self.value_key, value)
            except errors("RedisError") as exc:
                emit("write-error", token=fencer.token, error=f"{type(exc).__name__}: {exc}")
                if ended_before or term.wait(self.write_every):
                    return
                continue
            if not applied:
                emit("write", token=fencer.token, value=value, applied=False, mark=self._mark())
                return  # a newer term exists: stop working at once
            emit("write", token=fencer.token, value=value, applied=True)
            if ended_before:
                return

    def _stepped_down(self) -> None:
        term = self.last_term
        emit(
            "stepped-down",
            token=term.token if term is not None else None,
            reason=term.reason if term is not None else None,
        )

    def _leader(self) -> str | None:
        try:
            value = self.client.get(self.keys.leader)
        except errors("RedisError"):
            return None
        return value.decode() if isinstance(value, bytes) else None

    def _mark(self) -> int | None:
        try:
            value = self.client.get(self.keys.applied)
        except errors("RedisError"):
            return None
        return int(value) if value is not None else None

    def watch_stdin(self) -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                break
            if command == "resign":
                self.elector.resign()
        self.stop.set()

    def run(self) -> None:
        emit("ready", pid=os.getpid(), engine=self.elector.engine)
        threading.Thread(target=self.watch_stdin, name="demo-stdin", daemon=True).start()
        self.elector.run(self.lead, stop=self.stop)
        emit("exit")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        usage = "usage: python -m redlease._cli.demo_worker URL NAME INSTANCE_ID TTL"
        print(usage, file=sys.stderr)
        return 2
    url, name, instance_id, ttl = argv
    try:
        Contender(url, name, instance_id, float(ttl)).run()
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
