"""Helpers for the native engine on Sentinel and Cluster: a contender in another
process, and waiting for an elector to lead on a given data node."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import time

import redis

import redlease
from redlease._testing import RedisServer


class ProcessContender:
    """An elector (Python engine) for ``name`` in another process, reporting each election.

    ``client_code`` is Python that binds ``client`` (redis, redis.sentinel and
    redis.cluster are imported).
    """

    def __init__(self, client_code: str, name: str, ttl: float) -> None:
        script = textwrap.dedent(
            """
            import sys, threading, redis, redis.sentinel, redis.cluster, redlease
            {client_code}
            def elected(token):
                print("elected", token, flush=True)
            e = redlease.Elector(client, {name!r}, ttl={ttl}, engine="python",
                                 observer=redlease.Observer(on_elected=elected))
            stop = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
            print("ready", flush=True)
            e.run(None, stop=stop)
            """
        ).format(client_code=client_code, name=name, ttl=ttl)
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


def leads_on(node: RedisServer, elector: redlease.Elector) -> int | None:
    """The elector's token when ``node`` holds its lease and a fence equal to it; else None."""
    token = elector.token()
    if token is None:
        return None
    name = elector.config.name
    c = node.client(socket_timeout=1, socket_connect_timeout=1, retry=None)
    try:
        holder = c.get(f"{name}:leader")
        fence = c.get(f"{name}:fence")
    except redis.RedisError:
        return None
    finally:
        c.close()
    if holder != elector.instance_id.encode() or fence is None or int(fence) != token:
        return None
    return token


def wait_leading_on(node: RedisServer, elector: redlease.Elector, timeout: float) -> int:
    """Wait until ``elector`` leads on ``node``; its token. AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        token = leads_on(node, elector)
        if token is not None:
            return token
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"{elector.config.name!r} not leading on {node!r} after {timeout} s "
                f"(token {elector.token()})"
            )
        time.sleep(0.02)


def close_all_engines() -> None:
    """Close the engine of every Elector still alive (its connections and Sentinel watcher).

    A stopped Elector keeps its engine for a later start; on a Sentinel client
    the engine's ``+switch-master`` watcher thread keeps retrying sentinels
    that a finished test has stopped. Tests on topologies close them after
    each test so later tests see no such thread.
    """
    from redlease import _elector
    from redlease._engine import failover

    for election in list(_elector._live_elections):
        with contextlib.suppress(Exception):
            election.engine.close()
    # Engines of electors already collected: their watchers outlive them.
    for watcher in list(failover._live_watchers):
        watcher.close()
