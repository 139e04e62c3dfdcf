"""Release notices: wake waiting contenders and lock waiters the moment a lease is released.

Releasing a lease (an elector's ``release.lua``, a lock's ``lock_release.lua``)
publishes on ``<lease key>:released`` — ``SPUBLISH`` on a Redis Cluster 7+,
so the notice travels in the name's slot, else ``PUBLISH``. Waiters listen
here: one subscription connection per server per process, shared by every
elector and lock waiter of the process, opened by the first listener and
closed a while after the last one leaves.

A notice only wakes a waiter early; it never decides anything. The waiter
still acquires by its script, and keeps polling at its own interval, so a
notice lost to a dropped connection (reconnected with backoff, every waiter
woken once when it comes back), to a server that does not publish (another
language's contender) or to a failover costs one poll interval, not safety.

Each engine picks its listener (``Engine.notices``). On the Python engine
it is the Python thread here (``PythonNotices``). On the native engine it
is a native thread per server that never takes the GIL (``NativeNotices``,
the core's ``NoticeHub``): it wakes a waiter through an eventfd the waiter
sleeps on with the GIL released, so a notice reaches a follower while
another thread holds the GIL. On a Redis Cluster that is one hub per node
that owns a listened-to name's slot (SSUBSCRIBE there); when the node stops
carrying the channel (the slot moved, the node is gone) the hub tells the
channel's waiters to look again, and each re-homes its subscription, in
Python, to the slot's owner in a refreshed slot map.
A run the process's driver steps (``Elector.start()``, the asyncio
elector) has no thread to sleep on: its subscription rings the driver's
doorbell instead (``DriverNotices``), and the driver wakes just the runs
whose notices arrived. Either way every waiter of a process shares the one
connection per server, and sees the same ``Subscription`` interface:
``wait`` for a notice, ``deliver`` queued ones to its wake-up on its own
thread, ``cancel``.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError, ResponseError

from ._engine.client import is_cluster
from ._engine.python import _connection_factory
from ._log import logger

if TYPE_CHECKING:
    from ._engine.base import Keeper
    from ._engine.client import Endpoint

RELEASED_SUFFIX = ":released"
"""A lease key's notice channel is the key plus this suffix (see ``lua/release.lua``)."""

_READ_SLICE = 0.25  # how long one read waits before the listener looks around
_PING_AFTER = 5.0  # a silent connection is pinged after this long ...
_DEAD_AFTER = 10.0  # ... and dropped when nothing at all arrived for this long
_IDLE_CLOSE = 2.0  # a listener with no channels closes its connection after this long
_BACKOFF_MIN = 0.05
_BACKOFF_MAX = 1.0
_CONNECT_TIMEOUT = 5.0


def channel_of(lease_key: str) -> str:
    """The channel a release of ``lease_key`` is announced on."""
    return lease_key + RELEASED_SUFFIX


def sharded(client: Any) -> bool:
    """Whether releases through ``client`` announce in the key's slot (a cluster)."""
    return is_cluster(client)


class Subscription:
    """One waiter's interest in one channel, heard by the Python listener thread.

    The wake-up runs on the listener thread as each notice arrives;
    ``wait()`` lets a waiter sleep until one does. ``cancel()`` ends it
    (idempotent).
    """

    __slots__ = ("_fired", "_hub", "_pending", "_wake", "channel")

    def __init__(self, hub: _Hub | None, channel: str, wake: Wake) -> None:
        self._hub = hub
        self.channel = channel
        self._wake = wake
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


Wake = Callable[[bytes | None], object]
"""A waiter's wake-up: called with the notice's payload (the releasing
elector's instance id; ``b"1"`` for a lock), or None when notices may have
been lost (the connection came back) and every waiter should look."""


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
        hub = _hubs.get(key)
        if hub is None or not hub.add_ok():
            hub = _hubs[key] = _Hub(key, make, client)
        sub = Subscription(hub, channel, wake)
        hub.add(sub)
    return sub


def _server_of(client: Any, channel: str) -> tuple[tuple[Any, ...], Callable[[], Any]]:
    """Which server carries ``channel``'s notices (a hashable key) and how to connect to it."""
    # RESP2: the listener reads plain [kind, channel, payload] arrays.
    make = _connection_factory(client, channel, protocol=2)
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
        self._subscribe = "SSUBSCRIBE" if sharded(client) else "SUBSCRIBE"
        self._unsubscribe = "SUNSUBSCRIBE" if sharded(client) else "UNSUBSCRIBE"
        self._lock = threading.Lock()  # channels, the connection, and every send on it
        self._channels: dict[str, list[Subscription]] = {}
        self._conn: Any = None
        self._broken = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failing = False
        self.connects = 0  # how many times a connection was (re)established

    # -- registration (any thread) ------------------------------------------------

    def add_ok(self) -> bool:
        """False once the listener decided to shut down: register with a new hub."""
        return not self._closing

    def add(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._channels.setdefault(sub.channel, [])
            subs.append(sub)
            if len(subs) == 1:
                self._send(self._subscribe, sub.channel)
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
                self._send(self._unsubscribe, sub.channel)

    def _send(self, *args: str) -> None:
        # Under self._lock. Sends race the listener's reads on purpose: a
        # socket carries a send and a receive at once, and only the listener
        # ever reads or closes. A failed send marks the connection broken.
        conn = self._conn
        if conn is None or self._broken:
            return
        if getattr(conn, "_sock", None) is None:
            # A failed read already closed it: sending would silently open a
            # fresh connection with no subscriptions. Let the listener redo it.
            self._broken = True
            return
        try:
            conn.send_command(*args)
        except (RedisError, OSError):
            self._broken = True

    # -- the listener thread ---------------------------------------------------------

    def _main(self) -> None:
        backoff = _BACKOFF_MIN
        while True:
            if self._idle_exit():
                return
            try:
                self._session()
                backoff = _BACKOFF_MIN
            except Exception as exc:
                # Redis trouble above all, but whatever breaks a session ends
                # in a reconnect with backoff, never in a dead thread; the
                # waiters poll meanwhile.
                if not self._failing:  # one record per outage, not one per retry
                    self._failing = True
                    logger.debug("release notices from %s lost: %r; reconnecting", self._key, exc)
                self._drop()
                time.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                if self._cluster is not None:
                    self._rehome(self._cluster)
            finally:
                self._drop()

    def _idle_exit(self) -> bool:
        with _registry_lock, self._lock:
            if self._channels:
                return False
            self._closing = True
            if _hubs.get(self._key) is self:
                del _hubs[self._key]
            self._thread = None
            return True

    def _session(self) -> None:
        conn = self._make()
        conn.socket_connect_timeout = _CONNECT_TIMEOUT
        conn.socket_timeout = _CONNECT_TIMEOUT
        conn.connect()
        with self._lock:
            self._conn, self._broken = conn, False
            channels = list(self._channels)
            if channels and self._subscribe == "SSUBSCRIBE":
                # One SSUBSCRIBE per channel: a node's channels may be in
                # different slots, and one command may only name one slot.
                commands = [(self._subscribe, channel) for channel in channels]
                conn.send_packed_command(conn.pack_commands(commands))
            elif channels:
                conn.send_command(self._subscribe, *channels)
            reconnect = self.connects > 0
            self.connects += 1
        if self._failing:
            self._failing = False
            logger.debug("release notices from %s are back", self._key)
        if reconnect:
            # Notices sent while the connection was down are lost: let every
            # waiter try once now instead of at its next poll.
            self._wake(None, None)
        heard = pinged = time.monotonic()
        idle_since: float | None = None
        while True:
            if self._broken:
                raise ConnectionError("sending on the notice connection failed")
            if conn.can_read(timeout=_READ_SLICE):
                reply = self._read(conn)
                heard = time.monotonic()
                self._dispatch(reply)
                continue
            now = time.monotonic()
            with self._lock:
                empty = not self._channels
            if empty:
                idle_since = idle_since if idle_since is not None else now
                if now - idle_since >= _IDLE_CLOSE:
                    return
            else:
                idle_since = None
            if now - heard >= _DEAD_AFTER:
                raise ConnectionError("the notice connection went silent")
            if now - heard >= _PING_AFTER and now - pinged >= _PING_AFTER:
                pinged = now
                with self._lock:
                    self._send("PING")

    def _rehome(self, client: Any) -> None:
        """Move each channel whose slot another node owns now to that node's hub."""
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()
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
                hub = _hubs.get(key)
                if hub is None or not hub.add_ok():
                    hub = _hubs[key] = _Hub(key, make, client)
                sub._hub = hub
                hub.add(sub)
            with contextlib.suppress(Exception):
                sub._fire(None)  # its notices may have been lost on the way

    def _read(self, conn: Any) -> Any:
        try:
            return conn.read_response()
        except ResponseError as exc:
            if self._subscribe != "SSUBSCRIBE" or "unknown command" not in str(exc).lower():
                raise
            # A server without sharded pub/sub (before 7.0): its releases
            # fall back to PUBLISH, so listen with SUBSCRIBE instead.
            with self._lock:
                self._subscribe, self._unsubscribe = "SUBSCRIBE", "UNSUBSCRIBE"
                channels = list(self._channels)
                if channels:
                    self._send("SUBSCRIBE", *channels)
            return None

    def _dispatch(self, reply: Any) -> None:
        if not isinstance(reply, list) or len(reply) < 2:
            return
        kind = reply[0]
        if kind in (b"message", b"smessage") and len(reply) >= 3:
            self._wake(_text(reply[1]), reply[2])
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


_registry_lock = threading.Lock()
_hubs: dict[tuple[Any, ...], _Hub] = {}


def _forget_after_fork() -> None:
    # A forked child has none of the parent's listener threads; its own
    # waiters open their own connection.
    # The native hubs are inert in a child (the core sees to it); they are
    # kept referenced so that none is torn down here. The driver's notices
    # go with the parent's driver.
    global _registry_lock, _driver_notices, _refresh_lock
    _inherited_hubs.extend(_native_hubs.values())
    _registry_lock = threading.Lock()
    _refresh_lock = threading.Lock()
    _rehomer.after_fork()
    _hubs.clear()
    _native_hubs.clear()
    _driver_notices = None


os.register_at_fork(after_in_child=_forget_after_fork)


# -- the engines' listeners ------------------------------------------------------------


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


class NativeSubscription:
    """One waiter's interest in one channel, heard by a native ``NoticeHub`` thread.

    The native thread queues each notice and writes the waiter's eventfds;
    the waiter sleeps in ``wait()`` with the GIL released, and its wake-up
    runs on its own thread, in ``deliver()`` (``wait()`` delivers too).
    """

    __slots__ = (
        "_cancelled",
        "_fd",
        "_home",
        "_router",
        "_sub",
        "_tag",
        "_wake",
        "channel",
    )

    def __init__(
        self,
        sub: Any,
        channel: str,
        wake: Wake,
        router: DriverNotices | None = None,
        tag: int = 0,
        *,
        home: NativeNotices | None = None,
        fd: int = -1,
    ) -> None:
        self._sub = sub
        self._wake = wake
        self.channel = channel
        # A driven run's: where it is routed from, under ``tag`` (left on cancel).
        self._router = router
        self._tag = tag
        # On a cluster: who finds the node of the channel's slot when it moves,
        # and the signal fd a subscription there writes too.
        self._home = home
        self._fd = fd
        self._cancelled = False

    @property
    def notices(self) -> int:
        """How many notices reached this subscription so far."""
        return int(self._sub.notices)

    @property
    def last_notice(self) -> float:
        """When the latest notice reached it natively (``time.monotonic()``), 0.0 before any."""
        return float(self._sub.last_notice)

    def wait(self, timeout: float) -> bool:
        """Sleep (GIL released) until a notice arrived (True) or ``timeout`` passed (False)."""
        if not self._sub.wait(timeout):
            return False
        self.deliver()
        return True

    def deliver(self) -> None:
        """Run the wake-up for every notice queued since the last call, on this thread."""
        sub = self._sub
        payloads = sub.take()
        if self._home is not None and sub.take_moved():
            # Rare: its cluster node stopped carrying the channel (one of
            # the payloads is a "look again"). Listen where the slot is now,
            # found by a thread of its own (a slot-map refresh is a round
            # trip, and the map may take a moment to name the new owner):
            # neither the waiter's poll nor the driver waits for it.
            _rehomer.submit(self)
        for payload in payloads:
            self._wake(payload)

    def cancel(self) -> None:
        if self._home is not None:
            with _registry_lock:  # not while rehome() swaps the subscription
                self._cancelled = True
                sub = self._sub
        else:
            sub = self._sub
        sub.cancel()
        router, self._router = self._router, None
        if router is not None:
            router.forget(self._tag)


class NativeNotices:
    """Notices heard by a native thread: one ``NoticeHub`` per server per process.

    ``cluster``: the user's ``RedisCluster`` client, for a cluster
    ``endpoint``: a channel is heard on the node that owns its slot, found
    in the client's slot map (refreshed when a node stops carrying it).
    """

    def __init__(self, endpoint: Endpoint, cluster: Any = None) -> None:
        self._endpoint = endpoint
        self._cluster = cluster

    def _hub(self, channel: str) -> Any:
        """The hub that hears ``channel``. Under ``_registry_lock``."""
        if self._cluster is None:
            return native_hub(self._endpoint)
        node = self._cluster.get_node_from_key(channel)
        direct = replace(self._endpoint, host=str(node.host), port=int(node.port), cluster_nodes=())
        return native_hub(direct, sharded=True)

    def rehome(self, sub: NativeSubscription, asked: float, last: bool) -> bool:
        """Move ``sub`` to the hub of the node that owns its channel's slot now.

        On the ``_Rehomer``'s thread, after its node stopped carrying the
        channel, as seen at ``asked``. The slot map is refreshed first,
        unless a refresh began after ``asked`` (one for all the waiters that
        ask at the same moment). False: the map names the same node still
        (it may not know of the move yet), ask again a little later; on the
        ``last`` try the channel is subscribed again there instead (if the
        slot did leave, the node's MOVED answer starts this over). A
        cluster that does not answer leaves it where it is: its hub tells it
        to look again at its next failed reconnect.
        """
        from ._engine._native import _core

        _refresh_slots(self._cluster, asked)
        channel = sub.channel
        old = None
        with _registry_lock:
            if sub._cancelled:
                return True
            try:
                hub = self._hub(channel)
            except Exception as exc:
                logger.debug("release notices on %s: no owner of the slot yet: %r", channel, exc)
                return True
            current = sub._sub
            if hub is current.hub:
                if not last:
                    return False
                if hub.subscribed:
                    hub.resubscribe(channel.encode("utf-8"))
                return True
            router = sub._router
            bell = router.bell if router is not None else None
            try:
                sub._sub = _core.NoticeSub(hub, channel.encode("utf-8"), sub._fd, bell, sub._tag)
            except Exception as exc:
                logger.debug("release notices on %s cannot move: %r", channel, exc)
                return True
            old = current
        logger.debug("release notices on %s move to %s", channel, hub.target)
        old.cancel()
        return True

    def listen(
        self,
        lease_key: str,
        wake: Wake,
        *,
        signal: Keeper | None = None,
        driven: bool = False,
    ) -> NativeSubscription:
        """Subscribe ``wake`` to ``lease_key``'s releases; ``signal``'s fd is written too.

        ``driven``: the waiter is a run of the process's driver, which
        delivers its notices (on the driver thread) when they arrive.
        """
        from ._engine._native import _core

        channel = channel_of(lease_key)
        fd = signal.fileno() if signal is not None else -1
        home = self if self._cluster is not None else None
        try:
            with _registry_lock:
                hub = self._hub(channel)
                if driven:
                    return driver_notices().listen(hub, channel, wake, fd, home)
                sub = _core.NoticeSub(hub, channel.encode("utf-8"), fd)
        except Exception as exc:  # no thread, no descriptor left: no notices, polling only
            logger.debug("release notices on %s unavailable: %r", channel, exc)
            return NativeSubscription(_Unheard(), channel, wake)
        return NativeSubscription(sub, channel, wake, home=home, fd=fd)


_REHOME_TRIES = 12  # a slot map naming the old node still is asked again this often ...
_REHOME_EVERY = 0.25  # ... this many seconds apart


class _Rehomer:
    """The thread that re-homes cluster subscriptions (started on demand, ends when idle)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # id(sub) -> (sub, when its move was seen, tries so far, when to try next)
        self._pending: dict[int, tuple[NativeSubscription, float, int, float]] = {}
        self._thread: threading.Thread | None = None

    def submit(self, sub: NativeSubscription) -> None:
        now = time.monotonic()
        with self._cond:
            # A move seen again restarts its tries (the node may be gone now).
            self._pending[id(sub)] = (sub, now, 0, now)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._main, name="redlease-rehome", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _main(self) -> None:
        while True:
            with self._cond:
                if not self._pending:
                    self._thread = None
                    return
                now = time.monotonic()
                due = [entry for entry in self._pending.values() if entry[3] <= now]
                if not due:
                    self._cond.wait(min(entry[3] for entry in self._pending.values()) - now)
                    continue
                for entry in due:
                    del self._pending[id(entry[0])]
            for sub, asked, tries, _ in due:
                self._try(sub, asked, tries)

    def _try(self, sub: NativeSubscription, asked: float, tries: int) -> None:
        home = sub._home
        try:
            if home is None or home.rehome(sub, asked, last=tries + 1 >= _REHOME_TRIES):
                return
        except Exception as exc:  # it stays where it was: it polls, and is told again
            logger.warning("release notices on %s could not move: %r", sub.channel, exc)
            return
        now = time.monotonic()
        with self._cond:
            # Unless seen moving again meanwhile (that entry starts over).
            self._pending.setdefault(id(sub), (sub, now, tries + 1, now + _REHOME_EVERY))

    def after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._pending.clear()
        self._thread = None


_rehomer = _Rehomer()
_refresh_lock = threading.Lock()
_refreshed: dict[int, float] = {}  # id(cluster client) -> when its last slot-map refresh began


def _refresh_slots(client: Any, asked: float) -> None:
    """Refresh ``client``'s slot map, unless a refresh began after ``asked`` already."""
    with _refresh_lock:
        if _refreshed.get(id(client), 0.0) >= asked:
            return
        _refreshed[id(client)] = time.monotonic()
        try:
            client.nodes_manager.initialize()
        except Exception as exc:  # the cluster is not answering: the lookup uses the old map
            logger.debug("the cluster's slot map could not be refreshed: %r", exc)


class DriverNotices:
    """The native notices of the driver's runs: the reader thread rings the driver's doorbell.

    Each driven run's ``NoticeSub`` rings one ``NoticeBell`` on the driver's
    doorbell, on the native reader thread, without the GIL. After every
    wake-up the driver asks here which subscriptions fired (the bell names
    them by tag, each once) and delivers their notices, on the driver
    thread: the wake-up pokes the run, as the Python listener's does.
    """

    def __init__(self) -> None:
        from ._driver import driver
        from ._engine._native import _core

        self._lock = threading.Lock()  # the routing table; held only to look up or change it
        self._subs: dict[int, NativeSubscription] = {}
        self._tags = itertools.count(1)
        drv = driver()
        self.bell = _core.NoticeBell(drv.doorbell())
        drv.on_ring(self.deliver)

    def listen(
        self,
        hub: Any,
        channel: str,
        wake: Wake,
        signal_fd: int,
        home: NativeNotices | None = None,
    ) -> NativeSubscription:
        from ._engine._native import _core

        tag = next(self._tags)
        # Under the lock until routed: a notice that comes first waits for it in deliver().
        with self._lock:
            sub = _core.NoticeSub(hub, channel.encode("utf-8"), signal_fd, self.bell, tag)
            routed = self._subs[tag] = NativeSubscription(
                sub, channel, wake, self, tag, home=home, fd=signal_fd
            )
        return routed

    def forget(self, tag: int) -> None:
        with self._lock:
            self._subs.pop(tag, None)

    def deliver(self) -> None:
        """On the driver thread: run the wake-up of each subscription that fired."""
        tags = self.bell.take()
        if not tags:
            return
        with self._lock:
            fired = [self._subs.get(tag) for tag in tags]
        for sub in fired:
            if sub is not None:  # else cancelled meanwhile
                with contextlib.suppress(Exception):
                    sub.deliver()

    def routed(self) -> int:
        """How many subscriptions are routed (a test hook)."""
        with self._lock:
            return len(self._subs)


_driver_notices: DriverNotices | None = None


def driver_notices() -> DriverNotices:
    """The process's ``DriverNotices`` (made on first use). Under ``_registry_lock``."""
    global _driver_notices
    if _driver_notices is None:
        _driver_notices = DriverNotices()
    return _driver_notices


class _Unheard:
    """A native subscription that could not be made: every wait runs to its timeout."""

    notices = 0

    def wait(self, timeout: float) -> bool:
        time.sleep(max(timeout, 0.0))
        return False

    def take(self) -> list[bytes | None]:
        return []

    def cancel(self) -> None:
        pass


_native_hubs: dict[Any, Any] = {}
_inherited_hubs: list[Any] = []


def native_hub(endpoint: Endpoint, *, sharded: bool = False) -> Any:
    """The process's ``NoticeHub`` for ``endpoint``'s server (made on first use). Under the lock.

    ``sharded``: the server is a cluster node (``endpoint`` its direct address).
    """
    from ._engine._native import _core

    # Pub/sub ignores the database, and the connection needs no name of its own.
    key = (replace(endpoint, db=0, client_name=None), sharded)
    for other, idle in list(_native_hubs.items()):
        if other != key and idle.idle:
            # Nobody listened there for a while and its thread has ended:
            # let its descriptors go too.
            idle.close()
            del _native_hubs[other]
    hub = _native_hubs.get(key)
    if hub is None or hub.closed:
        hub = _native_hubs[key] = _core.NoticeHub(_core.Target(key[0]), sharded)
    return hub


def native_hubs() -> list[Any]:
    """Every native hub of this process (a test hook)."""
    with _registry_lock:
        return list(_native_hubs.values())


def _close_native_hubs() -> None:
    # At interpreter exit: stop and join every native reader thread.
    with _registry_lock:
        hubs = list(_native_hubs.values())
        _native_hubs.clear()
    for hub in hubs:
        with contextlib.suppress(Exception):
            hub.close()


atexit.register(_close_native_hubs)
