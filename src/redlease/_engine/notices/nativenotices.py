"""The native engine's release-notice listener: the Python side of the core's ``NoticeHub``.

One subscription connection per server (``NoticeHub``), all read by one
native thread of the process without the GIL, which writes the waiters'
eventfds; a waiter sleeps on its own with the GIL
released and runs its wake-up on its own thread (``NativeSubscription``).
A run the process's driver steps has no thread to sleep on: its
subscription rings the driver's doorbell (``DriverNotices``). On a Redis
Cluster a channel is heard on the hub of the node that owns its slot, and
a thread of its own (``_Rehomer``) moves it when that node stops carrying
it. The hubs of the process, and the lock under which a subscription's hub
is looked up or changed, are the ``registry``. See ``notices`` for what a
notice means, and does not.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import sys
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..._log import logger
from ..conn.client import refresh_slot_map
from ..process.driver import driver
from ..rules.timing import NOTICE_REHOME_EVERY, NOTICE_REHOME_TRIES
from .notice import Wake, channel_of

if TYPE_CHECKING:
    from typing import TypeAlias

    from ..conn.client import Endpoint
    from ..contract.interface import Keeper

    HubKey: TypeAlias = tuple[Endpoint, bool]


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

    @property
    def refused(self) -> bool:
        """True once the server refused its channel (an ACL user without it): it only polls."""
        return bool(self._sub.refused)

    @property
    def hub(self) -> Any:
        """The ``NoticeHub`` it listens on now."""
        return self._sub.hub

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` ran (a cluster subscription's; under the registry's lock)."""
        return self._cancelled

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

    def rehome(self, asked: float, last: bool) -> bool:
        """On the ``_Rehomer``'s thread: listen where the slot is now (see ``NativeNotices``)."""
        home = self._home
        return home is None or home.rehome(self, asked, last)

    def listen_on(self, hub: Any) -> Any:
        """Listen on ``hub`` from now on; the old core subscription, for the caller to cancel.

        Under the registry's lock. Its signal fd and its route (a driven
        run's bell and tag) come along. Raises when the new one cannot be
        made (it stays where it was).
        """
        _core = native_core()
        router = self._router
        bell = router.bell if router is not None else None
        old = self._sub
        self._sub = _core.NoticeSub(hub, self.channel.encode("utf-8"), self._fd, bell, self._tag)
        return old

    def cancel(self) -> None:
        if self._home is not None:
            with registry.lock:  # not while rehome() swaps the subscription
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
        # The registry's key of each server this listener hears, made once
        # (a server's, or each cluster node's by its address): a listen, one
        # per waiter, only looks it up.
        self._key = None if cluster is not None else hub_key(endpoint, sharded=False)
        self._node_keys: dict[tuple[str, int], HubKey] = {}

    def _hub(self, channel: str) -> Any:
        """The hub that hears ``channel``. Under the registry's lock."""
        if self._key is not None:
            return registry.hub(self._key)
        node = self._cluster.get_node_from_key(channel)
        address = (str(node.host), int(node.port))
        key = self._node_keys.get(address)
        if key is None:
            direct = replace(self._endpoint, host=address[0], port=address[1], cluster_nodes=())
            key = self._node_keys[address] = hub_key(direct, sharded=True)
        return registry.hub(key)

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
        refresh_slot_map(self._cluster, asked)
        channel = sub.channel
        with registry.lock:
            if sub.cancelled:
                return True
            try:
                hub = self._hub(channel)
            except Exception as exc:
                logger.debug("release notices on %s: no owner of the slot yet: %r", channel, exc)
                return True
            if hub is sub.hub:
                if not last:
                    return False
                if hub.subscribed:
                    hub.resubscribe(channel.encode("utf-8"))
                return True
            try:
                old = sub.listen_on(hub)
            except Exception as exc:
                logger.debug("release notices on %s cannot move: %r", channel, exc)
                return True
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
        channel = channel_of(lease_key)
        fd = signal.fileno() if signal is not None else -1
        home = self if self._cluster is not None else None
        try:
            with registry.lock:
                hub = self._hub(channel)
                if driven:
                    return registry.driver_notices().listen(hub, channel, wake, fd, home)
                sub = native_core().NoticeSub(hub, channel.encode("utf-8"), fd)
        except Exception as exc:  # no thread, no descriptor left: no notices, polling only
            logger.debug("release notices on %s unavailable: %r", channel, exc)
            return NativeSubscription(_Unheard(), channel, wake)
        return NativeSubscription(sub, channel, wake, home=home, fd=fd)


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
        try:
            if sub.rehome(asked, last=tries + 1 >= NOTICE_REHOME_TRIES):
                return
        except Exception as exc:  # it stays where it was: it polls, and is told again
            logger.warning("release notices on %s could not move: %r", sub.channel, exc)
            return
        now = time.monotonic()
        with self._cond:
            # Unless seen moving again meanwhile (that entry starts over).
            self._pending.setdefault(id(sub), (sub, now, tries + 1, now + NOTICE_REHOME_EVERY))

    def after_fork(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._pending.clear()
        self._thread = None


_rehomer = _Rehomer()
class DriverNotices:
    """The native notices of the driver's runs: the reader thread rings the driver's doorbell.

    Each driven run's ``NoticeSub`` rings one ``NoticeBell`` on the driver's
    doorbell, on the native reader thread, without the GIL. After every
    wake-up the driver asks here which subscriptions fired (the bell names
    them by tag, each once) and delivers their notices, on the driver
    thread: the wake-up pokes the run, as the Python listener's does.
    """

    def __init__(self) -> None:
        _core = native_core()
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
        _core = native_core()
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
            if not self._subs and sys.getsizeof(self._subs) > 4096:
                self._subs = {}  # the room of 100,000 runs that all lead now

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


class _Unheard:
    """A native subscription that could not be made: every wait runs to its timeout."""

    notices = 0
    refused = False

    def wait(self, timeout: float) -> bool:
        time.sleep(max(timeout, 0.0))
        return False

    def take(self) -> list[bytes | None]:
        return []

    def cancel(self) -> None:
        pass


_HUB_SWEEP_EVERY = 1.0
"""Seconds between two looks for idle hubs to close (besides each time a hub is made)."""


class Registry:
    """The process's native notice hubs, its driver's routing, and the lock they change under.

    One ``NoticeHub`` per server (a cluster node's is ``sharded``), made on
    first use; every subscription's hub is looked up, and a cluster
    subscription's changed, under ``lock``.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.driver: DriverNotices | None = None  # made by the first driven run's listen
        # Each server's hub, by its ``hub_key``; changed under ``lock``.
        self.hubs: dict[HubKey, Any] = {}
        self._sweep_at = 0.0  # when the next listen looks for idle hubs to close
        self._inherited: list[Any] = []

    def hub(self, key: HubKey) -> Any:
        """The ``NoticeHub`` for the server of ``key`` (see ``hub_key``), made on first use.

        Under ``lock``.
        """
        hub = self.hubs.get(key)
        now = time.monotonic()
        if hub is None or hub.closed or now >= self._sweep_at:
            # Asking a hub whether it is idle takes its lock, which its
            # reader holds while it subscribes: not on every listen (there
            # are thousands together), only when a hub is made or a second
            # has passed.
            self._sweep_at = now + _HUB_SWEEP_EVERY
            for other, idle in list(self.hubs.items()):
                if other != key and idle.idle:
                    # Nobody listened there for a while and its thread has
                    # ended: let its descriptors go too.
                    idle.close()
                    del self.hubs[other]
        if hub is None or hub.closed:
            _core = native_core()
            hub = self.hubs[key] = _core.NoticeHub(_core.Target(key[0]), key[1])
        return hub

    def driver_notices(self) -> DriverNotices:
        """The process's ``DriverNotices`` (made on first use). Under ``lock``."""
        if self.driver is None:
            self.driver = DriverNotices()
        return self.driver

    def close(self) -> None:
        """At interpreter exit: stop and join every native reader thread."""
        with self.lock:
            hubs = list(self.hubs.values())
            self.hubs.clear()
        for hub in hubs:
            with contextlib.suppress(Exception):
                hub.close()

    def after_fork(self) -> None:
        # The native hubs are inert in a child (the core sees to it); they are
        # kept referenced so that none is torn down here. The driver's notices
        # go with the parent's driver.
        self._inherited.extend(self.hubs.values())
        self.lock = threading.Lock()
        self.hubs.clear()
        self.driver = None


def hub_key(endpoint: Endpoint, *, sharded: bool) -> HubKey:
    """The registry's key of ``endpoint``'s server: one hub per key.

    Pub/sub ignores the database, and the connection needs no name of its
    own. ``sharded``: the server is a cluster node (``endpoint`` its direct
    address).
    """
    return replace(endpoint, db=0, client_name=None), sharded


_core_module: Any = None


def native_core() -> Any:
    """The native core module (imported on first use: this module loads without it)."""
    global _core_module
    if _core_module is None:
        from .._native import _core

        _core_module = _core
    return _core_module


registry = Registry()


def _forget_after_fork() -> None:
    # A forked child has none of the parent's reader threads; its own
    # waiters get hubs of their own.
    registry.after_fork()
    _rehomer.after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(registry.close)
