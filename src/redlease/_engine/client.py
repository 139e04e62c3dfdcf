"""What the engines need to know about the user's redis-py client."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis
from redis.connection import Connection, UnixDomainSocketConnection


@dataclass(frozen=True)
class Endpoint:
    """Where and how to open a connection like the user's client does.

    Everything a native connection needs, taken from a plain ``redis.Redis``
    over TCP or a unix socket: the server, the database, the credentials and
    the client name. The password is left out of the repr.
    """

    host: str | None
    port: int
    path: str | None
    db: int
    username: str | None
    password: str | None = field(repr=False)
    client_name: str | None

    @property
    def address(self) -> str:
        return self.path if self.path else f"{self.host}:{self.port}"


def is_cluster(client: object) -> bool:
    """True for a ``redis.RedisCluster`` client."""
    cluster_cls = getattr(redis, "RedisCluster", None)
    return cluster_cls is not None and isinstance(client, cluster_cls)


def native_endpoint(client: object) -> tuple[Endpoint | None, str]:
    """The endpoint of a client the native engine can serve, or None and why not."""
    if is_cluster(client):
        return None, "a RedisCluster client needs slot routing, which the native engine does not do"
    if not isinstance(client, redis.Redis):
        return None, f"the client is a {type(client).__name__}, not a redis.Redis"
    pool = client.connection_pool
    cls = pool.connection_class
    kwargs: dict[str, Any] = pool.connection_kwargs
    if type(pool) is not redis.ConnectionPool and type(pool) is not redis.BlockingConnectionPool:
        return None, (
            f"the client's pool is a {type(pool).__name__} (e.g. Sentinel), which resolves its "
            "server itself; the native engine needs a fixed TCP or unix-socket address"
        )
    if cls not in (Connection, UnixDomainSocketConnection):
        return None, (
            f"the client connects with {cls.__name__} (TLS or a custom class); the native engine "
            "speaks plain TCP and unix sockets only"
        )
    if kwargs.get("credential_provider") is not None:
        return (
            None,
            "the client uses a credential_provider; the native engine needs a fixed password",
        )
    # The client's protocol (RESP2 or RESP3) does not matter: the native
    # engine talks RESP2 on connections of its own, and every script it runs
    # answers with integers, which both protocols encode alike.
    path = kwargs.get("path") if cls is UnixDomainSocketConnection else None
    endpoint = Endpoint(
        host=None if path else str(kwargs.get("host", "localhost")),
        port=int(kwargs.get("port", 6379)),
        path=path,
        db=int(kwargs.get("db", 0) or 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        client_name=kwargs.get("client_name"),
    )
    return endpoint, ""


def socket_timeout(client: object) -> float | None:
    """The client's ``socket_timeout`` in seconds, or None when it has none."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    value = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None
