"""Release notices: wake waiting contenders and lock waiters the moment a lease is released.

Releasing a lease (an elector's ``release.lua``, a lock's ``lock_release.lua``)
publishes on ``<lease key>:released`` — ``SPUBLISH`` on a Redis Cluster 7+,
so the notice travels in the name's slot, else ``PUBLISH``. Waiters listen
there: one subscription connection per server per process, shared by every
elector and lock waiter of the process, opened by the first listener and
closed a while after the last one leaves.

A notice only wakes a waiter early; it never decides anything. The waiter
still acquires by its script, and keeps polling at its own interval, so a
notice lost to a dropped connection (reconnected with backoff, every waiter
woken once when it comes back), to a server that does not publish (another
language's contender) or to a failover costs one poll interval, not safety.

Each engine picks its listener (``Engine.notices``), and nothing else
reaches the listeners:

* ``pynotices`` — the Python engine's: a Python thread per server
  (``PythonNotices``).
* ``nativenotices`` — the native engine's: a connection per server, all
  read by one native thread of the process that never takes the GIL
  (``NativeNotices``, the core's ``NoticeHub`` and ``NoticeReader``). It wakes
  a waiter through an eventfd the waiter sleeps on with the GIL released, so
  a notice reaches a follower while another thread holds the GIL. On a Redis
  Cluster that is one hub per node that owns a listened-to name's slot
  (SSUBSCRIBE there); when the node stops carrying the channel (the slot
  moved, the node is gone) the hub tells the channel's waiters to look
  again, and each re-homes its subscription, in Python, to the slot's owner
  in a refreshed slot map. A run the process's driver steps
  (``Elector.start()``, the asyncio elector) has no thread to sleep on: its
  subscription rings the driver's doorbell instead (``DriverNotices``), and
  the driver wakes just the runs whose notices arrived.

Either way every waiter of a process shares the one connection per server,
and sees the same subscription interface (``base.NoticeSubscription``):
``wait`` for a notice, ``deliver`` queued ones to its wake-up on its own
thread, ``cancel``. This module holds what both listeners and the releasing
side agree on: the channel's name and whether it is sharded, and what an
ACL user without the channel gets (``ChannelRefusals``).

Least privilege: an ACL user needs the channels under its keys' prefix
(``&<prefix>*``, next to ``~<prefix>*``) for notices. Without them (Redis 7's
default for a new user) the server refuses both sides: a release still
releases (its script skips the notice and says so), a waiter's subscription
is refused and it polls; one WARNING names the channel and the permission
(subscribe, publish), once per client connection pool and permission kind.
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..._log import logger
from ..conn.client import is_cluster
from ..process.forksafe import ForkSafeLock

RELEASED_SUFFIX = ":released"
"""A lease key's notice channel is the key plus this suffix (see ``lua/release.lua``)."""

Wake = Callable[[bytes | None], object]
"""A waiter's wake-up: called with the notice's payload (the releasing
elector's instance id; ``b"1"`` for a lock), or None when notices may have
been lost (the connection came back) and every waiter should look."""


def channel_of(lease_key: str) -> str:
    """The channel a release of ``lease_key`` is announced on."""
    return lease_key + RELEASED_SUFFIX


def sharded_notices(client: Any) -> bool:
    """Whether releases through ``client`` announce in the key's slot (a cluster)."""
    return is_cluster(client)


class _NoNotices:
    """No subscription (yet): nothing is ever delivered."""

    refused = False

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False

    def deliver(self) -> None:
        pass

    def cancel(self) -> None:
        pass


NO_NOTICES = _NoNotices()
"""A run's notices before it listens: every wait runs to its timeout."""


def pool_of(client: Any) -> Any:
    """What one WARNING about refused channels is said per: ``client``'s connection pool.

    A cluster client has a pool per node and none of its own: the client
    itself stands for them.
    """
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


_said_lock = ForkSafeLock()
_said: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
"""The permission kinds ("subscribe", "publish") already said, by connection pool."""


def _forget_said_after_fork() -> None:
    # A forked child logs to its own output: it says so once itself.
    _said.clear()


os.register_at_fork(after_in_child=_forget_said_after_fork)


class ChannelRefusals:
    """Says that the server refused an owner's notice channel: one WARNING per client
    connection pool and permission kind.

    ``owner`` (a locker, an elector, a group member) and ``grant``, the ACL
    rule that would allow its channels (``&<prefix>*``), are what the
    WARNING names. A refused notice costs waiters up to one poll interval,
    never a result: it is said once, as a state, for all the electors, locks
    and partitions that share the client's connection pool, never once per
    owner, release or wait. A client with a pool of its own says it again.
    """

    __slots__ = ("_kinds", "grant", "owner", "pool")

    def __init__(self, owner: str, grant: str, client: Any) -> None:
        self.owner = owner
        self.grant = grant
        self.pool = pool_of(client)
        # A pool that cannot be weakly referenced (a client of neither family):
        # said once per owner instead.
        self._kinds: set[str] = set()

    def publish_refused(self, lease_key: str) -> None:
        """A release of ``lease_key`` went through, but the server refused its notice."""
        self._say(
            "publish",
            "may not publish to channel %r: releases are not announced, waiters poll",
            channel_of(lease_key),
        )

    def subscribe_refused(self, lease_key: str) -> None:
        """A waiter's subscription to ``lease_key``'s notices was refused: it polls."""
        self._say(
            "subscribe",
            "may not subscribe to channel %r: waiters poll instead of being woken by releases",
            channel_of(lease_key),
        )

    def _say(self, kind: str, what: str, channel: str) -> None:
        with _said_lock:
            try:
                kinds = _said.setdefault(self.pool, set())
            except TypeError:
                kinds = self._kinds
            if kind in kinds:
                return
            kinds.add(kind)
        logger.warning(
            "%s: the Redis ACL user " + what + "; grant the user %s for release notices "
            "(said once for every lease on this client's connection pool)",
            self.owner,
            channel,
            self.grant,
        )
