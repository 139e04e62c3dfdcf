"""Lease-based distributed locks with fencing tokens.

For "only one of us does this" work across replicas: singleton cron jobs,
one-off migrations, resource-exclusive maintenance. Take a lock for a while
(its TTL), do the work, release it::

    locker = redlease.RedisLocker(client)
    with locker.hold("cleanup:orders") as held:
        cleanup_expired_orders(fencing_token=held.fencing_token)

Two implementations share the same semantics (TTL expiry, ownership tokens,
fencing tokens, waiting), so behaviour does not change between development
and production: ``RedisLocker`` gives mutual exclusion to every process that
shares the Redis server; ``MemoryLocker`` only to the threads of one process.

Locks are cooperative leases, not absolute guarantees. A process pause that
outlives the TTL (GC, VM freeze, network partition) can let a second holder
in. Guard state that must never be corrupted with the lock's fencing token
(pass it to the resource and reject writes carrying an older one), with
idempotent operations, or with database constraints. ``RedisLocker`` targets
one Redis server (or one cluster shard); it is not a Redlock implementation.

The bodies live in ``redlease._locks``; this module is the public face.
"""

from __future__ import annotations

from ._errors import AutoRenewTTLTooShort, NotAcquired, NotHeld
from ._locks.args import MIN_AUTO_RENEW_TTL
from ._locks.holders import LockHolder
from ._locks.lock import DEFAULT_RETRY_INTERVAL, LOCK_DEFAULT_TTL, Lock, Locker
from ._locks.memory import MemoryLocker
from ._locks.redislocker import DEFAULT_PREFIX, RedisLocker, default_locker, with_lock
from ._locks.semaphore import Semaphore

DEFAULT_TTL = LOCK_DEFAULT_TTL
"""``LOCK_DEFAULT_TTL`` (30.0 s) by its first name, kept working. It is a lock's default,
not an elector's: ``redlease.DEFAULT_TTL`` is that one (5.0 s, ``ELECTOR_DEFAULT_TTL``)."""

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_RETRY_INTERVAL",
    "DEFAULT_TTL",
    "LOCK_DEFAULT_TTL",
    "MIN_AUTO_RENEW_TTL",
    "AutoRenewTTLTooShort",
    "Lock",
    "LockHolder",
    "Locker",
    "MemoryLocker",
    "NotAcquired",
    "NotHeld",
    "RedisLocker",
    "Semaphore",
    "default_locker",
    "with_lock",
]
