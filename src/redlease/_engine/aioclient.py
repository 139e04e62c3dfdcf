"""The threaded twin of a user's asyncio client.

The election loop and the engines run off the event loop, so ``redlease.aio``
needs a blocking client that reaches what the async client reaches: the same
address (plain, unix socket, TLS, Sentinel-managed master or Cluster),
database, credentials and timeouts.
"""

from __future__ import annotations

import weakref
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from .._errors import ConfigError
from .._forksafe import ForkSafeLock

_twins: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_twins_lock = ForkSafeLock()


def sync_twin(client: object) -> Any:
    """A threaded client (``redis.Redis`` or ``RedisCluster``) that reaches what ``client`` does.

    The election loop and the native engine run off the event loop, so they
    need a blocking client with the async client's address, database,
    credentials, timeouts and TLS settings. One twin per async client, for as
    long as that client lives: electors and lockers on one client share it,
    and with it their engine (one renewer, one set of connections).
    """
    try:
        with _twins_lock:
            twin = _twins.get(client)
    except TypeError:  # not weakly referenceable: a twin of its own
        return _make_twin(client)
    if twin is None:
        twin = _make_twin(client)
        with _twins_lock:
            twin = _twins.setdefault(client, twin)
    return twin


def _make_twin(client: object) -> Any:
    if client is None:
        raise ConfigError("client must be a redis.asyncio.Redis, got None")
    cluster_cls = getattr(redis.asyncio, "RedisCluster", None)
    if cluster_cls is not None and isinstance(client, cluster_cls):
        return _sync_cluster(client)
    if not isinstance(client, redis.asyncio.Redis):
        raise ConfigError(
            "redlease.aio needs a redis.asyncio.Redis or RedisCluster client; got "
            f"{type(client).__name__} (use redlease.Elector for threaded clients)"
        )
    pool = client.connection_pool
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        return _sync_sentinel_master(pool)
    if type(pool) is not redis.asyncio.ConnectionPool and type(pool) is not (
        redis.asyncio.BlockingConnectionPool
    ):
        raise ConfigError(
            f"redlease.aio supports plain, Sentinel and Cluster clients; this one uses a "
            f"{type(pool).__name__} (use the threaded redlease.Elector with a matching client)"
        )
    kw: dict[str, Any] = pool.connection_kwargs
    common: dict[str, Any] = {
        "db": kw.get("db", 0),
        "username": kw.get("username"),
        "password": kw.get("password"),
        "client_name": kw.get("client_name"),
        "socket_timeout": kw.get("socket_timeout"),
        "credential_provider": kw.get("credential_provider"),
    }
    cls = pool.connection_class
    if issubclass(cls, redis.asyncio.UnixDomainSocketConnection):
        return redis.Redis(unix_socket_path=kw["path"], **common)
    common.update(
        host=kw.get("host", "localhost"),
        port=kw.get("port", 6379),
        socket_connect_timeout=kw.get("socket_connect_timeout"),
    )
    if issubclass(cls, redis.asyncio.SSLConnection):
        ssl_kwargs = {key: value for key, value in kw.items() if key.startswith("ssl_")}
        return redis.Redis(ssl=True, **ssl_kwargs, **common)
    return redis.Redis(**common)


_COMMON = ("db", "username", "password", "client_name", "socket_timeout", "socket_connect_timeout")


def _common(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: kwargs[key] for key in _COMMON if kwargs.get(key) is not None}


def _ssl(kwargs: dict[str, Any], cls: type | None) -> dict[str, Any]:
    """``ssl=True`` and every ``ssl_*`` option when ``cls`` is an asyncio SSLConnection."""
    if cls is None or not issubclass(cls, redis.asyncio.SSLConnection):
        return {}
    # The threaded classes take the same ssl_* options (None: not set).
    options = {k: v for k, v in kwargs.items() if k.startswith("ssl_") and v is not None}
    return {"ssl": True, **options}


def _sync_sentinel_master(pool: Any) -> redis.Redis:
    """The same Sentinel-managed master, through a threaded Sentinel client."""
    manager = pool.sentinel_manager
    sentinels = []
    for sentinel in manager.sentinels:
        kw = sentinel.connection_pool.connection_kwargs
        sentinels.append((kw.get("host", "localhost"), kw.get("port", 26379)))
    # redis-py leaves Sentinel and ClusterNode untyped.
    sentinel_cls: Any = redis.sentinel.Sentinel
    threaded = sentinel_cls(sentinels, sentinel_kwargs=dict(manager.sentinel_kwargs or {}))
    # The master's TLS settings ride on the pool's class, not on an ``ssl`` flag.
    master: redis.Redis = threaded.master_for(
        pool.service_name,
        **_common(pool.connection_kwargs),
        **_ssl(pool.connection_kwargs, pool.connection_class),
    )
    return master


def _sync_cluster(client: Any) -> Any:
    """A threaded RedisCluster over the same nodes, credentials and timeouts."""
    nodes = client.get_nodes() or list(client.nodes_manager.startup_nodes.values())
    node_cls: Any = redis.cluster.ClusterNode
    kwargs = client.connection_kwargs
    return redis.cluster.RedisCluster(
        startup_nodes=[node_cls(n.host, n.port) for n in nodes],
        **{k: v for k, v in _common(kwargs).items() if k != "db"},
        **_ssl(kwargs, kwargs.get("connection_class")),
    )
