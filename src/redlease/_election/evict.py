"""Evicting a leader: an operator ends the current term at Redis (``redlease.evict``).

The lease is deleted and the fence's high-water mark raised above every token
granted so far, in one script (``lua/evict.lua``): from that moment the
evicted leader's fenced writes are rejected, its next renewal finds the lease
gone and ends its term, and the next term's token is greater still. The
contenders are told at once, as on a release.
"""

from __future__ import annotations

from typing import Any

from .. import _scripts
from .._config import Config
from .._engine import call_timeout, execute_one, sharded_notices, shared_engine, threaded
from .._keys import ElectionKeys
from .election import check_cluster_name, instance_text

_EVICT = _scripts.load("evict")


def evicted(client: Any, name: str) -> tuple[int, str | None]:
    """Evict ``name``'s leader: ``(the mark now, the evicted instance id or None)``.

    One script call, never resent once it may have run (its outcome unknown,
    the client family's error is raised).
    """
    twin, family = threaded(client, asyncio=None)
    name = Config.resolve(name).name
    check_cluster_name(twin, name)
    engine = shared_engine(twin, "auto")
    sharded = "1" if sharded_notices(twin) else "0"
    with family.errors():
        reply, _ = execute_one(
            engine, (_EVICT, ElectionKeys(name).all(), (sharded,)), timeout=call_timeout(twin)
        )
    mark, holder = reply
    return int(mark), (instance_text(holder) if holder else None)


def evict(client: Any, name: str) -> int:
    """End ``name``'s current term at Redis; the fence mark it leaves (see the module).

    The evicted leader's fenced writes are rejected from this moment and its
    next renewal steps it down. Evicting a name nobody holds changes nothing
    and returns the current mark (0 when there is none). ``client`` is any
    client an ``Elector`` takes (an asyncio one too: the call is made on its
    threaded twin, so it blocks; run it off the event loop).
    """
    return evicted(client, name)[0]
