"""Real redis-server processes for tests, demos and benchmarks, and the faults they suffer.

- ``RedisServer`` (``server``): one private server on a free loopback port or
  a unix socket; pause (SIGSTOP), kill (SIGKILL), restart, stop.
  ``TLSRedisServer`` (``server`` too): a TLS-only one.
- ``TLSMaterials``, ``ServerTLS`` (``tls``): certificates minted in the test,
  and how a server speaks TLS with them.
- ``SentinelSet`` (``sentinel``): a master, replicas and three sentinels;
  failover, master crash, frozen nodes. ``tls=TLSMaterials()`` makes it
  TLS-only (``tls_sentinels=False``: the sentinels stay plain).
- ``ClusterSet`` (``cluster``): three masters with a replica each; failover,
  master crash, live slot migration, frozen nodes. ``tls=TLSMaterials()``
  makes every node TLS-only, its bus and replication included.
- ``notices`` (imported on its own): what this process's release-notice
  listeners hold (hubs per server, the driver's routing).
- ``fake`` (imported on its own): a fake server answering each script with
  the raw bytes chosen, at the pace chosen (``FakeRedis``, ``Stream``), for
  the tests and the benchmark of broken and hostile servers.

Everything started here and still running at interpreter exit is stopped by
an ``atexit`` hook, and its temporary files removed.
"""

from __future__ import annotations

from ._cluster_nodes import NodeInfo
from ._common import (
    RedisServerError,
    RedisServerNotFound,
    TopologyError,
    find_redis_server,
    free_cluster_port,
    free_port,
)
from ._sentinel_events import SwitchWatcher
from .cluster import ClusterSet, SlotMigration, key_slot
from .sentinel import SentinelSet
from .server import RedisServer, TLSRedisServer, client_for
from .tls import (
    ServerTLS,
    TLSMaterials,
    TLSNotSupported,
    find_tls_redis_server,
    tls_unsupported_reason,
)

__all__ = [
    "ClusterSet",
    "NodeInfo",
    "RedisServer",
    "RedisServerError",
    "RedisServerNotFound",
    "SentinelSet",
    "ServerTLS",
    "SlotMigration",
    "SwitchWatcher",
    "TLSMaterials",
    "TLSNotSupported",
    "TLSRedisServer",
    "TopologyError",
    "client_for",
    "find_redis_server",
    "find_tls_redis_server",
    "free_cluster_port",
    "free_port",
    "key_slot",
    "tls_unsupported_reason",
]
