"""The pure-Python engine: redis-py connections and a Python renewal thread.

It is the reference the native engine is measured against, and the engine
for clients the native one cannot serve (TLS, Sentinel, Cluster). Its
renewals run on a Python thread, so they are late whenever another thread
holds the GIL for long: that is the limitation the native engine removes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, NoScriptError, RedisError, ResponseError, TimeoutError
from redis.retry import Retry

from .._scripts import Script
from .base import MIN_STEP, EncodableT
from .client import is_cluster
from .keeper import PythonKeeper


def _connection_factory(client: Any, key: str | bytes | None) -> Callable[[], Any]:
    """A factory of standalone redis-py connections like ``client``'s, with no retries.

    The user's client keeps its own settings for its own commands; ours get a
    per-call deadline instead of whatever retry policy the client carries.
    """
    if is_cluster(client):
        node = client.get_default_node() if key is None else client.get_node_from_key(key)
        pool = node.redis_connection.connection_pool
    else:
        pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    for private in ("maint_notifications_pool_handler", "maint_notifications_config"):
        kwargs.pop(private, None)
    if pool.__class__.__name__ == "SentinelConnectionPool":
        kwargs["connection_pool"] = pool
    kwargs.update(
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        retry_on_error=[],
        health_check_interval=0,
        decode_responses=False,
    )
    cls = pool.connection_class

    def make() -> Any:
        return cls(**kwargs)

    return make


class BoundedConnection:
    """One connection whose every round trip, connect included, has a deadline.

    Not thread-safe by itself; callers serialize. After any error the
    connection is dropped and reopened on the next call.
    """

    def __init__(self, client: Any, key: str | bytes | None = None) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._key = key
        self._make = _connection_factory(client, key)
        self._conn: Any = None

    def execute(self, args: Sequence[Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        conn = self._conn
        try:
            if conn is None:
                conn = self._conn = self._make()
            remaining = self._remaining(deadline)
            conn.socket_timeout = remaining
            conn.socket_connect_timeout = remaining
            conn.connect()
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                sock.settimeout(self._remaining(deadline))
            conn.send_command(*args)
            return conn.read_response(timeout=self._remaining(deadline))
        except ResponseError as exc:
            if self._cluster and str(exc).startswith(("MOVED", "ASK")):
                self._reroute()
            raise
        except (RedisError, OSError) as exc:
            if self._cluster:
                self._reroute()  # drops too; the slot may have moved
            else:
                self.drop()
            if isinstance(exc, RedisError):
                raise
            raise ConnectionError(str(exc)) from exc

    @staticmethod
    def _remaining(deadline: float) -> float:
        # Time spent waiting for the GIL between steps is not a round trip the
        # server is slow with: past the deadline, each remaining step still
        # gets a short wait of its own instead of failing unsent. A hung
        # server still costs at most the deadline plus a few of these.
        return max(deadline - time.monotonic(), MIN_STEP)

    def _reroute(self) -> None:
        self.drop()
        with contextlib.suppress(RedisError):
            self._client.nodes_manager.initialize()
        self._make = _connection_factory(self._client, self._key)

    def eval_script(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        timeout: float,
    ) -> Any:
        """EVALSHA, and EVAL once on NOSCRIPT, within one overall deadline."""
        deadline = time.monotonic() + timeout
        try:
            return self.execute(("EVALSHA", script.sha, len(keys), *keys, *args), timeout)
        except NoScriptError:
            return self.execute(
                ("EVAL", script.source, len(keys), *keys, *args), self._remaining(deadline)
            )

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # A dying socket must not mask the error that killed it.
            with contextlib.suppress(Exception):
                conn.disconnect()


class PythonEngine:
    """The Engine protocol on redis-py (see ``_engine.Engine``)."""

    name = "python"

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._conns: dict[object, BoundedConnection] = {}

    def call(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        timeout: float,
    ) -> Any:
        deadline = time.monotonic() + timeout
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError("redlease: control connection busy past the deadline")
        try:
            key = keys[0] if keys and is_cluster(self._client) else None
            # One connection per cluster node, not per key: lock names are unbounded.
            route = self._client.get_node_from_key(key).name if key is not None else None
            conn = self._conns.get(route)
            if conn is None:
                conn = self._conns[route] = BoundedConnection(self._client, key)
            return conn.eval_script(script, keys, args, BoundedConnection._remaining(deadline))
        finally:
            self._lock.release()

    def write(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
    ) -> Any:
        client = self._client
        try:
            return client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(script.source, len(keys), *keys, *args)

    def keeper(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        *,
        interval: float,
        ttl: float,
    ) -> PythonKeeper:
        keys, args = tuple(keys), tuple(args)
        conn = BoundedConnection(self._client, keys[0] if keys else None)

        def renew(timeout: float) -> Any:
            return conn.eval_script(script, keys, args, timeout)

        return PythonKeeper(renew, interval=interval, ttl=ttl, on_close=conn.drop)

    def close(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                conn.drop()
            self._conns.clear()


__all__ = ["BoundedConnection", "PythonEngine"]
