"""The pure-Python engine: redis-py connections and a Python renewal thread.

It is the reference the native engine is measured against, and the engine
for clients the native one cannot serve (TLS, Sentinel, Cluster). Its
renewals run on a Python thread, so they are late whenever another thread
holds the GIL for long: that is the limitation the native engine removes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, NoScriptError, RedisError, ResponseError, TimeoutError
from redis.retry import Retry

from ._client import is_cluster
from ._engine import ACTIVE, ENDED, IDLE, LOST, EncodableT
from ._scripts import Script

_LATENESS_SAMPLES = 65536
_MAX_PENDING_ERRORS = 256
_MIN_STEP = 0.002


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
        return max(deadline - time.monotonic(), _MIN_STEP)

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


Renew = Callable[[float], Any]
"""One renewal bounded by the given seconds: returns 1 (renewed) or 0 (lost), or raises."""


class PythonKeeper:
    """The Keeper protocol on a Python thread (see ``_engine.Keeper``).

    What a renewal is comes from ``renew``: a script on a connection of its
    own for the Python engine, an in-memory refresh for ``MemoryLocker``. The
    state machine, the deadline, the schedule and the bookkeeping are the
    same for both. ``on_close`` frees what ``renew`` uses.
    """

    def __init__(
        self,
        renew: Renew,
        *,
        interval: float,
        ttl: float,
        on_close: Callable[[], object] | None = None,
    ) -> None:
        self._renew: Renew | None = renew
        self._on_close = on_close
        self._interval = interval
        self._ttl = ttl
        self._cond = threading.Condition()
        self._state = IDLE
        self._token = 0
        self._generation = 0
        self._deadline = 0.0
        self._next = 0.0
        self._closed = False
        self._errors: deque[Exception] = deque(maxlen=_MAX_PENDING_ERRORS)
        self._lateness: deque[float] = deque(maxlen=_LATENESS_SAMPLES)
        self._wakeup = threading.Event()
        self._rfd, self._wfd = os.pipe()
        os.set_blocking(self._rfd, False)
        os.set_blocking(self._wfd, False)
        self._thread: threading.Thread | None = None
        _live_keepers.add(self)

    @property
    def token(self) -> int:
        return self._token

    @property
    def state(self) -> int:
        return self._state

    def begin(self, token: int, acquired_at: float) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("keeper is closed")
            self._generation += 1
            self._deadline = acquired_at + self._ttl
            self._next = time.monotonic()
            self._token = token
            self._state = ACTIVE
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="redlease-renewer", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._generation += 1
            self._cond.notify_all()
        self.notify()

    def wait(self, timeout: float | None) -> bool:
        woken = self._wakeup.wait(timeout)
        self._wakeup.clear()
        try:
            while os.read(self._rfd, 64):
                pass
        except (BlockingIOError, OSError):
            pass
        return woken

    def notify(self) -> None:
        self._wakeup.set()
        # EAGAIN: a wake-up is already pending; EBADF: the keeper is closed.
        with contextlib.suppress(OSError):
            os.write(self._wfd, b"\x01")

    def pop_errors(self) -> list[Exception]:
        with self._cond:
            errors = list(self._errors)
            self._errors.clear()
        return errors

    def lateness(self) -> list[float]:
        with self._cond:
            return list(self._lateness)

    def fileno(self) -> int:
        return self._rfd

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._token = 0
            if self._state == ACTIVE:
                self._state = ENDED
            self._generation += 1
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if self._on_close is not None:
            self._on_close()
        for fd in (self._rfd, self._wfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        _live_keepers.discard(self)

    def _next_slot(self, scheduled: float) -> float:
        # On schedule: the next absolute deadline. Behind schedule (a slow or
        # failed round trip): go again at once; the lease deadline bounds us.
        # The native keeper follows the same rule.
        return max(scheduled + self._interval, time.monotonic())

    def _lose(self) -> None:
        # Caller holds the condition. The token goes first so that readers on
        # other threads stop using it before anything else happens.
        self._token = 0
        self._state = LOST
        self._generation += 1
        self.notify()

    def _main(self) -> None:
        try:
            self._loop()
        except BaseException:
            # This thread also enforces the lease deadline: if it dies, the
            # term must not outlive it with a token nobody keeps valid.
            with self._cond:
                if self._state == ACTIVE:
                    self._lose()
            raise

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._state != ACTIVE:
                    self._cond.wait()
                if self._closed:
                    return
                now = time.monotonic()
                if now >= self._deadline:
                    self._lose()
                    continue
                if now < self._next:
                    self._cond.wait(min(self._next, self._deadline) - now)
                    continue
                generation = self._generation
                scheduled = self._next
                deadline = self._deadline
            sent = time.monotonic()
            self._lateness.append(sent - scheduled)
            renew = self._renew
            try:
                if renew is None:
                    raise RuntimeError("keeper is closed")
                reply = renew(max(min(self._interval, deadline - sent), _MIN_STEP))
            except Exception as exc:  # any failure at all is a failed renewal
                with self._cond:
                    if generation == self._generation:
                        self._errors.append(exc)
                        self._next = self._next_slot(scheduled)
                        self.notify()
                continue
            with self._cond:
                if generation != self._generation:
                    continue
                if reply == 1:
                    self._deadline = sent + self._ttl
                    self._next = self._next_slot(scheduled)
                else:
                    self._lose()

    def _after_fork_in_child(self) -> None:
        # The renewal thread does not exist in the child, and the lease is the
        # parent's: the child must never renew or release it.
        self._cond = threading.Condition()
        self._closed = True
        self._token = 0
        if self._state == ACTIVE:
            self._state = ENDED
        self._thread = None
        self._renew = self._on_close = None


_live_keepers: weakref.WeakSet[PythonKeeper] = weakref.WeakSet()


def _reset_after_fork() -> None:
    for keeper in list(_live_keepers):
        keeper._after_fork_in_child()


os.register_at_fork(after_in_child=_reset_after_fork)


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


__all__ = ["BoundedConnection", "PythonEngine", "PythonKeeper"]
