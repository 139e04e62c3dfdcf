"""Helpers for the native engine on Sentinel and Cluster: waiting for an elector to
lead on a given data node, and closing what a test left open."""

from __future__ import annotations

import contextlib
import time

import redis

import redlease
from redlease._testing import RedisServer


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
    from redlease import _election
    from redlease._engine import failover

    for election in list(_election._live_elections):
        with contextlib.suppress(Exception):
            election.engine.close()
    # Engines of electors already collected: their listeners outlive them.
    for listener in list(failover._live_listeners):
        listener.close()
