"""The deployments ``redlease bench`` can measure on: plain, TLS, Sentinel, Cluster.

Plain uses ``--redis URL`` or an embedded server; the others start their own
private servers on loopback through the test-server manager (a TLS server
with certificates minted for the run, a master with a replica and three
sentinels, a three-master cluster with replicas; ``tls-sentinel`` and
``tls-cluster`` are those two with every process TLS-only) and stop them
afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from .redisurl import TIMEOUTS, CliError, async_connect, one_line, redis_target

TOPOLOGIES = ("plain", "tls", "sentinel", "cluster", "tls-sentinel", "tls-cluster")


@dataclass(frozen=True)
class BenchServer:
    """Where a benchmark runs: a client like a user's, and a way to watch the serving node."""

    description: str
    make_client: Callable[..., Any]
    make_monitor: Callable[[str], redis.Redis]
    tagged: bool = False
    """Names need a hash tag (Cluster)."""
    make_async_client: Callable[..., Any] | None = None
    """An asyncio client of the same server (one-server deployments only); ``family=`` as
    for ``make_client`` picks redis-py's or valkey-py's."""

    def client(self, **kwargs: Any) -> Any:
        """A new client of the kind this deployment's users have."""
        return self.make_client(**kwargs)

    def monitor_client(self, name: str) -> redis.Redis:
        """A plain client of the node that serves ``name``'s keys (for MONITOR)."""
        return self.make_monitor(name)

    def name(self, base: str) -> str:
        """``base`` as an elector name that works here (hash-tagged on a cluster)."""
        return f"{{{base}}}" if self.tagged else base


@contextmanager
def bench_server(topology: str, url: str | None) -> Iterator[BenchServer]:
    """The deployment ``topology`` names, started (or reached) for the block's duration."""
    if topology == "plain":
        with redis_target(url) as target:
            yield BenchServer(
                description=target.description,
                make_client=target.client,
                make_monitor=lambda _name: target.client(),
                make_async_client=lambda family=None: async_connect(target.url, family=family),
            )
        return
    if url is not None:
        raise CliError(f"--topology {topology} starts its own servers; --redis is for plain")
    from .. import _testing

    try:
        if topology == "tls":
            tls = _testing.TLSRedisServer()
            with tls:
                yield BenchServer(
                    description="a private redis-server over TLS on loopback",
                    make_client=tls.client,
                    make_monitor=lambda _name: tls.client(),
                    make_async_client=lambda family="redis": tls.client(
                        family=family, asyncio=True, **TIMEOUTS
                    ),
                )
        elif topology == "sentinel":
            with _testing.SentinelSet() as sentinels:
                yield BenchServer(
                    description="a Sentinel-managed master (1 replica, 3 sentinels) on loopback",
                    make_client=sentinels.master_for,
                    make_monitor=lambda _name: sentinels.master().client(),
                )
        elif topology == "cluster":
            with _testing.ClusterSet() as cluster:
                yield BenchServer(
                    description="a Redis Cluster (3 masters, 1 replica each) on loopback",
                    make_client=cluster.client,
                    make_monitor=lambda name: cluster.node_for_key(name).client(),
                    tagged=True,
                )
        elif topology == "tls-sentinel":
            with _testing.TLSMaterials() as m, _testing.SentinelSet(tls=m) as sentinels:
                yield BenchServer(
                    description=(
                        "a Sentinel-managed master (1 replica, 3 sentinels), all over TLS, "
                        "on loopback"
                    ),
                    make_client=sentinels.master_for,
                    make_monitor=lambda _name: sentinels.master().client(),
                )
        elif topology == "tls-cluster":
            with _testing.TLSMaterials() as m, _testing.ClusterSet(tls=m) as cluster:
                yield BenchServer(
                    description="a Redis Cluster (3 masters, 1 replica each) over TLS on loopback",
                    make_client=cluster.client,
                    make_monitor=lambda name: cluster.node_for_key(name).client(),
                    tagged=True,
                )
        else:
            raise CliError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    except (_testing.RedisServerError, OSError) as exc:
        raise CliError(f"could not start the {topology} servers: {one_line(exc)}") from None
