"""The Python engine's release-notice listener: a Python thread per server.

One subscription connection per server per process (``_Hub``), opened by
its first waiter's ``listen`` and closed a while after its last one leaves;
its thread reads the notices and runs each waiter's wake-up as they arrive.
A connection that drops is reconnected with backoff, and every waiter is
woken once when it comes back (its notices may have been lost). On a
cluster each channel is heard on the node that owns its slot, and moves
with it after a failover or a migration. A channel the server refuses (an
ACL user without it) marks its waiters ``refused``: they poll, the
connection and the other channels carry on. See ``notices`` for what a
notice means, and does not.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoPermissionError, RedisError, ResponseError

from ..._log import logger
from ..conn.boundedsocket import begin_round_trip, bounded_class
from ..conn.client import is_cluster, refresh_slot_map
from ..conn.connect import connection_factory
from ..process.forksafe import ForkSafeLock
from ..rules.timing import (
    NOTICE_BACKOFF_MIN,
    NOTICE_CONNECT_TIMEOUT,
    NOTICE_DEAD_AFTER,
    NOTICE_IDLE_CLOSE,
    NOTICE_PING_AFTER,
    NOTICE_READ_SLICE,
    notice_backoff,
)
from .notice import Wake, channel_of, sharded_notices

if TYPE_CHECKING:
    from ..contract.interface import Keeper


class Subscription:
    """One waiter's interest in one channel, heard by the Python listener thread.

    The wake-up runs on the listener thread as each notice arrives;
    ``wait()`` lets a waiter sleep until one does. ``cancel()`` ends it
    (idempotent). ``refused`` turns True when the server refuses the
    channel (an ACL user without it): nothing arrives then.
    """

    __slots__ = ("_fired", "_hub", "_pending", "_wake", "channel", "refused")

    def __init__(self, hub: _Hub | None, channel: str, wake: Wake) -> None:
        self._hub = hub
        self.channel = channel
        self._wake = wake
        self.refused = False
        # Made by the first wait(): a subscription whose wake-up does all the
        # work (thousands of driver-run electors) never pays for an Event.
        self._fired: threading.Event | None = None
        self._pending = False

    def _fire(self, payload: bytes | None) -> None:
        # On the listener thread.
        self._pending = True
        fired = self._fired
        if fired is not None:
            fired.set()
        self._wake(payload)

    def wait(self, timeout: float) -> bool:
        """Sleep until a notice arrived (True) or ``timeout`` seconds passed (False)."""
        fired = self._fired
        if fired is None:
            fired = self._fired = threading.Event()
        # After the Event exists: a notice from here on sets it too.
        if self._pending:
            self._pending = False
            fired.clear()
            return True
        got = fired.wait(timeout)
        fired.clear()
        self._pending = False
        return got

    def deliver(self) -> None:
        """Nothing to do: the listener thread ran the wake-up already."""

    def cancel(self) -> None:
        hub, self._hub = self._hub, None
        if hub is not None:
            hub.remove(self)


def listen(client: Any, lease_key: str, wake: Wake) -> Subscription:
    """Call ``wake(payload)`` (on the listener thread) whenever ``lease_key`` is released.

    ``wake`` must be quick and must not raise: it sets a flag and wakes a
    waiter. Never raises for Redis trouble: a listener that cannot connect
    keeps trying in the background, and the caller polls meanwhile.
    """
    channel = channel_of(lease_key)
    try:
        key, make = _server_of(client, channel)
    except Exception:  # a client we cannot read: no notices, polling only
        return Subscription(None, channel, wake)
    with _registry_lock:
        hub = hubs.get(key)
        if hub is None or not hub.add_ok():
            hub = hubs[key] = _Hub(key, make, client)
        sub = Subscription(hub, channel, wake)
        hub.add(sub)
    return sub


def _server_of(client: Any, channel: str) -> tuple[tuple[Any, ...], Callable[[], Any]]:
    """Which server carries ``channel``'s notices (a hashable key) and how to connect to it."""
    # RESP2: the listener reads plain [kind, channel, payload] arrays; each
    # message within a bound and a byte cap once it starts (see _read).
    make = connection_factory(client, channel, protocol=2, wrap=bounded_class)
    if is_cluster(client):
        node = client.get_node_from_key(channel)
        return ("cluster", str(node.host), int(node.port)), make
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if pool.__class__.__name__ == "SentinelConnectionPool":
        return ("sentinel", pool.service_name, id(pool.sentinel_manager)), make
    return (
        "direct",
        pool.connection_class.__name__,
        kwargs.get("host"),
        kwargs.get("port"),
        kwargs.get("path"),
        kwargs.get("username"),
    ), make


class _Hub:
    """One subscription connection and its listener thread, for one server."""

    def __init__(self, key: tuple[Any, ...], make: Callable[[], Any], client: Any) -> None:
        self._key = key
        self._make = make
        # A cluster client: after a failover or a migration the hub re-homes
        # each channel to the hub of the node that now owns its slot.
        self._cluster = client if is_cluster(client) else None
        self._subscribe = "SSUBSCRIBE" if sharded_notices(client) else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded_notices(client) else "UNSUBSCRIBE"
        self._lock = threading.Lock()  # channels, the connection, and every send on it
        self._channels: dict[str, list[Subscription]] = {}
        # The (S)SUBSCRIBE commands sent on this session and not answered yet,
        # oldest first: an error reply is the answer to the first of them.
        self._inflight: deque[tuple[str, str]] = deque()
        # The channels this session's server refused (the user may not use them).
        self._refused: set[str] = set()
        self._conn: Any = None
        self._broken = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failing = False
        self.connects = 0  # how many times a connection was (re)established
        self._live_since: float | None = None  # when the current session went live

    # -- registration (any thread) ------------------------------------------------

    def add_ok(self) -> bool:
        """False once the listener decided to shut down: register with a new hub."""
        return not self._closing

    def add(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._channels.setdefault(sub.channel, [])
            subs.append(sub)
            if sub.channel in self._refused:
                sub.refused = True
            if len(subs) == 1:
                self._send_subscribe(sub.channel)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="redlease-notices", daemon=True
                )
                self._thread.start()

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._channels.get(sub.channel)
            if subs is None or sub not in subs:
                return
            subs.remove(sub)
            if not subs:
                del self._channels[sub.channel]
                # A later waiter asks again (the user may have been granted it).
                self._refused.discard(sub.channel)
                self._send(self._unsubscribe, sub.channel)

    def _send(self, *args: str) -> bool:
        # Under self._lock. Sends race the listener's reads on purpose: a
        # socket carries a send and a receive at once, and only the listener
        # ever reads or closes. A failed send marks the connection broken.
        conn = self._conn
        if conn is None or self._broken:
            return False
        if getattr(conn, "_sock", None) is None:
            # A failed read already closed it: sending would silently open a
            # fresh connection with no subscriptions. Let the listener redo it.
            self._broken = True
            return False
        try:
            conn.send_command(*args)
        except (RedisError, OSError):
            self._broken = True
            return False
        return True

    def _send_subscribe(self, channel: str) -> None:
        # Under self._lock: one channel a command, so that a refusal names it.
        if self._send(self._subscribe, channel):
            self._inflight.append((self._subscribe, channel))

    # -- the listener thread ---------------------------------------------------------

    def _main(self) -> None:
        backoff = NOTICE_BACKOFF_MIN
        while True:
            if self._idle_exit():
                return
            try:
                self._live_since = None
                self._session()
                backoff = NOTICE_BACKOFF_MIN
            except Exception as exc:
                # Redis trouble above all, but whatever breaks a session ends
                # in a reconnect with backoff, never in a dead thread; the
                # waiters poll meanwhile.
                if not self._failing:  # one record per outage, not one per retry
                    self._failing = True
                    logger.debug("release notices from %s lost: %r; reconnecting", self._key, exc)
                self._drop()
                live = self._live_since
                lived = None if live is None else time.monotonic() - live
                pause, backoff = notice_backoff(backoff, lived)
                time.sleep(pause)
                if self._cluster is not None:
                    self._rehome(self._cluster)
            finally:
                self._drop()

    def _idle_exit(self) -> bool:
        with _registry_lock, self._lock:
            if self._channels:
                return False
            self._closing = True
            if hubs.get(self._key) is self:
                del hubs[self._key]
            self._thread = None
            return True

    def _session(self) -> None:
        conn = self._make()
        conn.socket_connect_timeout = NOTICE_CONNECT_TIMEOUT
        conn.socket_timeout = NOTICE_CONNECT_TIMEOUT
        conn.connect()
        with self._lock:
            self._conn, self._broken = conn, False
            self._inflight.clear()
            self._refused.clear()
            channels = list(self._channels)
            if channels:
                # One command per channel: the server may refuse one channel
                # (an ACL user without it) and not the others, and one
                # SSUBSCRIBE may only name one slot.
                commands = [(self._subscribe, channel) for channel in channels]
                conn.send_packed_command(conn.pack_commands(commands))
                self._inflight.extend(commands)
            reconnect = self.connects > 0
            self.connects += 1
        if self._failing:
            self._failing = False
            logger.debug("release notices from %s are back", self._key)
        if reconnect:
            # Notices sent while the connection was down are lost: let every
            # waiter try once now instead of at its next poll.
            self._wake(None, None)
        heard = pinged = self._live_since = time.monotonic()
        idle_since: float | None = None
        while True:
            if self._broken:
                raise ConnectionError("sending on the notice connection failed")
            # The wait for the next message is a round trip of its own, one
            # slice long: before 8.0, redis-py's parsers look for data by
            # reading from the socket, and under the bound of the last
            # message read, long passed on a quiet channel, they would read
            # nothing at all until the connection is found silent.
            begin_round_trip(conn, time.monotonic() + NOTICE_READ_SLICE)
            if conn.can_read(timeout=NOTICE_READ_SLICE):
                reply = self._read(conn)
                heard = time.monotonic()
                self._dispatch(reply)
                continue
            now = time.monotonic()
            with self._lock:
                empty = not self._channels
            if empty:
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= NOTICE_IDLE_CLOSE:
                    return
            else:
                idle_since = None
            if now - heard >= NOTICE_DEAD_AFTER:
                raise ConnectionError("the notice connection went silent")
            if now - heard >= NOTICE_PING_AFTER and now - pinged >= NOTICE_PING_AFTER:
                pinged = now
                with self._lock:
                    self._send("PING")

    def _rehome(self, client: Any) -> None:
        """Move each channel whose slot another node owns now to that node's hub."""
        refresh_slot_map(client)
        with self._lock:
            subs = [sub for group in self._channels.values() for sub in group]
        for sub in subs:
            try:
                key, make = _server_of(client, sub.channel)
            except Exception:
                return  # the cluster is not answering yet: try again after the next failure
            if key == self._key:
                continue
            logger.debug("release notices on %s move from %s to %s", sub.channel, self._key, key)
            self.remove(sub)
            with _registry_lock:
                hub = hubs.get(key)
                if hub is None or not hub.add_ok():
                    hub = hubs[key] = _Hub(key, make, client)
                sub._hub = hub
                hub.add(sub)
            with contextlib.suppress(Exception):
                sub._fire(None)  # its notices may have been lost on the way

    def _read(self, conn: Any) -> Any:
        # Bytes have arrived: the whole message follows within the bound, or
        # the connection is given up (and made again).
        begin_round_trip(conn, time.monotonic() + NOTICE_CONNECT_TIMEOUT)
        try:
            return conn.read_response()
        except ResponseError as exc:
            self._refused_by(exc)
            return None

    def _refused_by(self, exc: ResponseError) -> None:
        """An error reply: the answer to the oldest subscribe in flight (else it raises)."""
        with self._lock:
            command, channel = self._inflight.popleft() if self._inflight else ("", "")
            if command == "SSUBSCRIBE" and "unknown command" in str(exc).lower():
                if self._subscribe == "SSUBSCRIBE":
                    # A server without sharded pub/sub (before 7.0): its releases
                    # fall back to PUBLISH, so listen with SUBSCRIBE instead.
                    self._subscribe, self._unsubscribe = "SUBSCRIBE", "UNSUBSCRIBE"
                    for wanted in list(self._channels):
                        self._send_subscribe(wanted)
                return
            if not command or not isinstance(exc, NoPermissionError):
                raise exc
            # The user may not use this channel (ACL): its waiters poll.
            subs = self._channels.get(channel)
            if subs is None:
                return  # nobody waits there any more
            self._refused.add(channel)
            for sub in subs:
                sub.refused = True
        logger.debug("release notices on %s refused by %s: %s", channel, self._key, exc)

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if kind in (b"message", b"smessage") and len(reply) >= 3:
            self._wake(_text(reply[1]), reply[2])
        elif kind in (b"subscribe", b"ssubscribe"):
            with self._lock:
                if self._inflight:
                    self._inflight.popleft()
        elif kind == b"sunsubscribe":
            # Unasked for, this means the slot moved to another node: the
            # channel must be listened to there. Reconnect (and re-resolve).
            with self._lock:
                wanted = _text(reply[1]) in self._channels
            if wanted:
                raise ConnectionError("the notice channel's slot moved")

    def _wake(self, channel: str | None, payload: bytes | None) -> None:
        with self._lock:
            if channel is None:
                subs = [s for group in self._channels.values() for s in group]
            else:
                subs = list(self._channels.get(channel, ()))
        for sub in subs:
            with contextlib.suppress(Exception):
                sub._fire(payload)

    def _drop(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


_registry_lock = ForkSafeLock()
hubs: dict[tuple[Any, ...], _Hub] = {}
"""The process's listeners, by server: a waiter joins the one of its channel's server."""


def _forget_after_fork() -> None:
    # A forked child has none of the parent's listener threads; its own
    # waiters open their own connection.
    hubs.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


class PythonNotices:
    """Notices heard by the Python listener thread (the Python engine)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def listen(
        self,
        lease_key: str,
        wake: Wake,
        *,
        signal: Keeper | None = None,
        driven: bool = False,
    ) -> Subscription:
        """Subscribe ``wake`` to ``lease_key``'s releases; ``signal`` is notified too.

        ``wake`` runs on the listener thread as each notice arrives, which
        is all a driven run needs (``driven`` changes nothing here).
        """
        if signal is None:
            return listen(self._client, lease_key, wake)
        keeper = signal

        def wake_and_signal(payload: bytes | None) -> None:
            wake(payload)
            keeper.notify()

        return listen(self._client, lease_key, wake_and_signal)
