"""Engines: what an Elector or a locker needs from Redis, and the two that provide it.

``base`` holds the Engine and Keeper protocols and the keeper states;
``replies`` says what a reply means;
``select`` picks an engine for a client; ``renewer`` is the Python renewer
(shared by the Python engine and ``MemoryLocker``); ``python`` and
``native`` are the engines; ``_native`` is the Cython core. ``notices``
says what a release notice is; ``pynotices`` and ``nativenotices`` are the
engines' listeners, reached only through ``Engine.notices(client)``.
"""

from .base import (
    ACTIVE,
    ENDED,
    IDLE,
    LATENESS_BUCKETS,
    LATENESS_SAMPLES,
    LOST,
    BatchItem,
    EncodableT,
    Engine,
    Keeper,
    ScriptRequest,
    ScriptRun,
    batch_size,
    flatten,
    run_one,
)
from .client import call_timeout, is_cluster, socket_timeout, write_timeout
from .notices import sharded_notices
from .replies import FAILOVER_REPLIES, UnexpectedReply, is_failover_reply
from .select import make_engine, native_available, shared_engine

__all__ = [
    "ACTIVE",
    "ENDED",
    "FAILOVER_REPLIES",
    "IDLE",
    "LATENESS_BUCKETS",
    "LATENESS_SAMPLES",
    "LOST",
    "BatchItem",
    "EncodableT",
    "Engine",
    "Keeper",
    "ScriptRequest",
    "ScriptRun",
    "UnexpectedReply",
    "batch_size",
    "call_timeout",
    "flatten",
    "is_cluster",
    "is_failover_reply",
    "make_engine",
    "native_available",
    "run_one",
    "sharded_notices",
    "shared_engine",
    "socket_timeout",
    "write_timeout",
]
