"""redlease: lease-based leader election on Redis with fencing tokens.

``Elector`` elects one leader among instances and keeps it elected, minting a
strictly increasing fencing token per term; ``Fencer`` and the ``fence_*``
writes reject a stale leader's writes at Redis. The lease is renewed by a
native thread that never waits for the GIL when the extension is built
(``engine="native"``), or by a Python thread (``engine="python"``).

``RedisLocker`` / ``MemoryLocker`` are lease locks for an operation rather
than a role, with the same fencing tokens; ``redlease.aio`` has both for
asyncio.
"""

from . import aio
from ._config import ELECTOR_DEFAULT_TTL, Config
from ._election.elector import Elector, Fencer, stop_all
from ._election.evict import evict
from ._election.partitions import Partitions
from ._election.pipeline import FencedPipeline
from ._election.term import Leader, Observer, Term
from ._engine import EngineInfo, engine_info
from ._errors import (
    AutoRenewTTLTooShort,
    ConfigError,
    NotAcquired,
    NotHeld,
    NotReplicated,
    RedleaseError,
    TooManyEvalBodies,
)
from ._version import __version__
from .lock import (
    DEFAULT_RETRY_INTERVAL,
    LOCK_DEFAULT_TTL,
    MIN_AUTO_RENEW_TTL,
    Lock,
    Locker,
    LockHolder,
    MemoryLocker,
    RedisLocker,
    Semaphore,
    default_locker,
    with_lock,
)

DEFAULT_TTL = ELECTOR_DEFAULT_TTL
"""``ELECTOR_DEFAULT_TTL`` (5.0 s) by its first name, kept working. It is an elector's
default, not a lock's: that one is ``LOCK_DEFAULT_TTL`` (30.0 s)."""

__all__ = [
    "DEFAULT_RETRY_INTERVAL",
    "DEFAULT_TTL",
    "ELECTOR_DEFAULT_TTL",
    "LOCK_DEFAULT_TTL",
    "MIN_AUTO_RENEW_TTL",
    "AutoRenewTTLTooShort",
    "Config",
    "ConfigError",
    "Elector",
    "EngineInfo",
    "FencedPipeline",
    "Fencer",
    "Leader",
    "Lock",
    "LockHolder",
    "Locker",
    "MemoryLocker",
    "NotAcquired",
    "NotHeld",
    "NotReplicated",
    "Observer",
    "Partitions",
    "RedisLocker",
    "RedleaseError",
    "Semaphore",
    "Term",
    "TooManyEvalBodies",
    "__version__",
    "aio",
    "default_locker",
    "engine_info",
    "evict",
    "stop_all",
    "with_lock",
]
