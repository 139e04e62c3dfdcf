"""Why the native engine exists: a lease must not wait for the GIL.

A leader whose process holds the GIL in one long C call keeps its lease on
the native engine (the renewer is a native thread that never takes the GIL)
and loses it on the pure-Python engine (its renewer is a Python thread).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator

import pytest
import redis

import redlease
from helpers import gil_call_size, hold_gil, require_native, wait_until
from redlease._engine import LOST
from redlease._testing import RedisServer

NAME = "gil"
TTL = 0.3


class Contender:
    """An elector for the same name in another process, reporting each election."""

    def __init__(self, server: RedisServer) -> None:
        script = textwrap.dedent(
            f"""
            import sys, threading, redis, redlease
            client = redis.Redis(host="127.0.0.1", port={server.port}, socket_timeout=2)
            def elected(token):
                print("elected", token, flush=True)
            e = redlease.Elector(client, {NAME!r}, ttl={TTL}, engine="python",
                                 observer=redlease.Observer(on_elected=elected))
            stop = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
            print("ready", flush=True)
            e.run(None, stop=stop)
            """
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        assert self.proc.stdout.readline().strip() == "ready"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def elections(self) -> list[str]:
        return [line for line in self.lines if line.startswith("elected")]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


@pytest.fixture
def contenders(redis_server: RedisServer) -> Iterator[Callable[[], Contender]]:
    """Start a contender once we lead (it must not win the first election)."""
    started: list[Contender] = []

    def start() -> Contender:
        started.append(Contender(redis_server))
        return started[-1]

    try:
        yield start
    finally:
        for c in started:
            c.close()


def lead_with(client: redis.Redis, engine: str) -> tuple[redlease.Elector, list[redlease.Term]]:
    terms: list[redlease.Term] = []

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term)
        term.wait()

    e = redlease.Elector(client, NAME, ttl=TTL, engine=engine)
    e.start(lead)
    wait_until(lambda: terms, timeout=5, what="our election")
    return e, terms


def test_native_leader_keeps_its_lease_through_a_long_gil_holding_call(
    client: redis.Redis, contenders: Callable[[], Contender]
) -> None:
    require_native()
    n = gil_call_size(1.5)
    e, terms = lead_with(client, "native")
    contender = contenders()
    try:
        token = terms[0].token
        held = hold_gil(n)  # five TTLs without the GIL
        assert held > 3 * TTL, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        assert not terms[0].ended()
        assert client.get(f"{NAME}:leader") == e.instance_id.encode()
        assert contender.elections() == [], "the other process took over during the call"
    finally:
        e.stop()


def test_python_leader_loses_its_lease_through_the_same_call(
    client: redis.Redis, contenders: Callable[[], Contender]
) -> None:
    n = gil_call_size(1.5)
    e, terms = lead_with(client, "python")
    contender = contenders()
    try:
        held = hold_gil(n)
        assert held > 3 * TTL
        wait_until(contender.elections, timeout=5, what="the other process to take over")
        assert terms[0].wait(5)
        assert terms[0].reason == "lost"
    finally:
        e.stop()


def test_native_term_is_lost_at_its_deadline_while_the_gil_is_held(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    require_native()
    n = gil_call_size(1.5)
    e, terms = lead_with(client, "native")
    try:
        run = e._election.run
        assert run is not None
        keeper = run.keeper
        redis_server.pause()
        held = hold_gil(n)
        # No Python code ran during the call, and nothing in Python marks a
        # native term lost: if it is LOST now, the native thread did it while
        # the GIL was held.
        state_after_call = keeper.state
        assert held > 3 * TTL
        assert state_after_call == LOST
        assert e.token() is None
        assert terms[0].wait(5)
        assert terms[0].reason == "lost"
    finally:
        redis_server.resume()
        e.stop()
