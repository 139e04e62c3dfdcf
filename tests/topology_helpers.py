"""Helpers for the native engine on Sentinel and Cluster: waiting for an elector to
lead on a given data node, closing what a test left open, and checking that an
error a valkey-py client's caller sees is valkey-py's."""

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


# redis-py names whose valkey-py counterpart is spelled otherwise.
_VALKEY_NAMES = {"RedisError": "ValkeyError", "RedisClusterException": "ValkeyClusterException"}


def assert_in_family(exc: BaseException, family: str, *names: str) -> None:
    """For ``family == "valkey"``, ``exc`` is an instance of ``valkey.exceptions.<name>``.

    For each of ``names``; without any, the name of the nearest redis-py
    exception class along ``exc``'s class (``RedisError`` is ``ValkeyError``
    there). Nothing is checked for ``"redis"``; valkey-py is imported only
    for ``"valkey"``.
    """
    if family != "valkey":
        return
    import valkey.exceptions

    if not names:
        near = next(
            (k.__name__ for k in type(exc).__mro__ if k.__module__ == "redis.exceptions"), None
        )
        assert near is not None, f"{exc!r} is no redis-py error, so not valkey-py's either"
        names = (near,)
    for name in names:
        cls = getattr(valkey.exceptions, _VALKEY_NAMES.get(name, name))
        assert isinstance(exc, cls), (
            f"{exc!r} is not a valkey.exceptions.{cls.__name__} "
            f"(its classes: {[k.__module__ + '.' + k.__qualname__ for k in type(exc).__mro__]})"
        )


def close_all_engines() -> None:
    """Close the engine of every Elector still alive (its connections and Sentinel watcher),
    and forget it.

    A stopped Elector keeps its engine for a later start; on a Sentinel client
    the engine's ``+switch-master`` watcher thread keeps retrying sentinels
    that a finished test has stopped. Tests on topologies close them after
    each test so later tests see no such thread.
    """
    from redlease._engine.conn import failover
    from redlease._engine.engines import select

    # Every Elector's engine is a shared one (one per client and engine kind).
    with select._shared_lock:
        # A copy first: a client collected meanwhile drops its entry (``_forget``).
        entries = list(select._shared.values())
        engines = [e for _, shared in entries for e in list(shared.values())]
    for engine in engines:
        with contextlib.suppress(Exception):
            engine.close()
    # A closed engine is never handed out again: the next Elector on a client a
    # module shares (its cluster's, say) gets a new one.
    with select._shared_lock:
        for _, shared in entries:
            for kind, engine in list(shared.items()):
                if engine in engines:
                    shared.pop(kind, None)
    # Engines of electors already collected: their listeners outlive them.
    for listener in list(failover._live_listeners):
        listener.close()
