"""asyncio front end: the same Elector with coroutines.

``redlease.aio.Elector`` takes a ``redis.asyncio.Redis`` and runs the very same
contend/lead/hold/release loop as ``redlease.Elector``, on a thread of its own,
with the lease renewed by the engine's keeper (a native thread on the native
engine). A blocked event loop therefore cannot delay a renewal. When a term
ends — leadership lost, resigned, stopped — the leader task is cancelled,
the way ``asyncio.timeout`` cancels its block.

Observer callbacks run on the elector's run thread, not on the event loop;
like their threaded counterparts they must not block.

The asyncio lockers (``RedisLocker``, ``MemoryLocker``, ``Lock``, ``Semaphore``,
``with_lock``) have the threaded lockers' rules, and every call survives being
cancelled at any await; ``Partitions`` is the threaded partition group's twin.
The bodies live in ``redlease._election`` and ``redlease._locks``; this module
is the public face.
"""

from __future__ import annotations

from ._election.aioelector import Elector, Fencer
from ._election.aiopartitions import Partitions
from ._election.pipeline import AsyncFencedPipeline as FencedPipeline
from ._election.term import Observer, Term
from ._locks.aiolocks import Lock, MemoryLocker, RedisLocker, Semaphore, with_lock

__all__ = [
    "Elector",
    "FencedPipeline",
    "Fencer",
    "Lock",
    "MemoryLocker",
    "Observer",
    "Partitions",
    "RedisLocker",
    "Semaphore",
    "Term",
    "with_lock",
]
