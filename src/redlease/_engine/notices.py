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
is refused and it polls; the owner logs one WARNING naming the channel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .._log import logger
from .client import is_cluster

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


class ChannelRefusals:
    """One WARNING per owner (a locker, an elector) whose notice channel the server refused.

    ``grant`` is the ACL rule that would allow them (``&<prefix>*``). A
    refused notice costs waiters up to one poll interval, never a result:
    it is said once, as a state, never once per release or per wait.
    """

    __slots__ = ("_lock", "_said", "grant", "owner")

    def __init__(self, owner: str, grant: str) -> None:
        self.owner = owner
        self.grant = grant
        self._lock = threading.Lock()
        self._said = False

    @property
    def said(self) -> bool:
        """True once the WARNING was logged."""
        return self._said

    def publish_refused(self, lease_key: str) -> None:
        """A release of ``lease_key`` went through, but the server refused its notice."""
        self._say(
            "may not publish to channel %r: releases are not announced, waiters poll",
            channel_of(lease_key),
        )

    def subscribe_refused(self, lease_key: str) -> None:
        """A waiter's subscription to ``lease_key``'s notices was refused: it polls."""
        self._say(
            "may not subscribe to channel %r: waiters poll instead of being woken by releases",
            channel_of(lease_key),
        )

    def _say(self, what: str, channel: str) -> None:
        if self._said:
            return
        with self._lock:
            if self._said:
                return
            self._said = True
        logger.warning(
            "%s: the Redis ACL user " + what + "; grant the user %s for release notices",
            self.owner,
            channel,
            self.grant,
        )
