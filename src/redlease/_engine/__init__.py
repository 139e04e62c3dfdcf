"""Engines: what an Elector or a locker needs from Redis, and the two that provide it.

This module is the engine's face: the rest of the library imports the engine
only from here. Inside, the modules live in wings, each importing only its own
wing and those below it (bottom first):

* ``rules``: what a reply means, the timing, the WAIT rule, what an argument may be;
* ``process``: the process's driver thread and fork-safe locks;
* ``contract``: the interface both engines implement, and the asyncio loop writer;
* ``_native``: the Cython core, its units in folders named as these wings;
* ``conn``: endpoints, client families, the engines' own connections, Sentinel,
  Cluster slot maps, first contact;
* ``renewal``: the Python renewer (shared by the Python engine and ``MemoryLocker``);
* ``notices``: release notices and each engine's listener;
* ``engines``: the Python and native engines, and which one a client gets.
"""

from .conn.client import call_timeout, is_cluster, slot_owner, socket_timeout, write_timeout
from .conn.clientfamily import threaded
from .conn.contact import due, first_contact, named
from .contract.aiowriter import LoopWriter
from .contract.interface import (
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
    NoticeSubscription,
    ScriptRequest,
    ScriptSeries,
    batch_size,
    execute_one,
    flatten,
)
from .engines.select import EngineInfo, engine_info, make_engine, native_available, shared_engine
from .notices.notice import NO_NOTICES, ChannelRefusals, sharded_notices
from .process.driver import BATCH, driver, execute_batch
from .process.forksafe import ForkSafeLock
from .renewal.renewer import Lease, Renewer
from .rules.encodable import split_pairs
from .rules.replication import ReplicationGuard
from .rules.replies import (
    FAILOVER_REPLIES,
    MAX_TOKEN,
    UnexpectedReply,
    is_failover_reply,
    released,
    rerouted,
    unexpected_reply,
)
from .rules.replytable import CLUSTER
from .rules.timing import DEFAULT_REPLICA_TIMEOUT, MAX_TTL, NOTICE_CATCH_UP, renew_interval

__all__ = [
    "ACTIVE",
    "BATCH",
    "CLUSTER",
    "DEFAULT_REPLICA_TIMEOUT",
    "ENDED",
    "FAILOVER_REPLIES",
    "IDLE",
    "LATENESS_BUCKETS",
    "LATENESS_SAMPLES",
    "LOST",
    "MAX_TOKEN",
    "MAX_TTL",
    "NOTICE_CATCH_UP",
    "NO_NOTICES",
    "BatchItem",
    "ChannelRefusals",
    "EncodableT",
    "Engine",
    "EngineInfo",
    "ForkSafeLock",
    "Keeper",
    "Lease",
    "LoopWriter",
    "NoticeSubscription",
    "Renewer",
    "ReplicationGuard",
    "ScriptRequest",
    "ScriptSeries",
    "UnexpectedReply",
    "batch_size",
    "call_timeout",
    "driver",
    "due",
    "engine_info",
    "execute_batch",
    "execute_one",
    "first_contact",
    "flatten",
    "is_cluster",
    "is_failover_reply",
    "make_engine",
    "named",
    "native_available",
    "released",
    "renew_interval",
    "rerouted",
    "sharded_notices",
    "shared_engine",
    "slot_owner",
    "socket_timeout",
    "split_pairs",
    "threaded",
    "unexpected_reply",
    "write_timeout",
]
