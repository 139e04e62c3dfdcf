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
side agree on: the channel's name and whether it is sharded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
