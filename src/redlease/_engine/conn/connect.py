"""Standalone redis-py connections like the user's client's, for the engines' own use.

The Python engine's control calls, fenced writes and renewals, the Python
notice listener, and the slot-map refresh of both engines, each open
connections of their own with the client's settings (address, credentials,
TLS, database) but none of its retry policy: every call carries its own
deadline instead. Whether the client is a cluster's (``is_cluster``) says
where they go, so it is answered here.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def is_cluster(client: object) -> bool:
    """True for a ``redis.RedisCluster`` client."""
    cluster_cls = getattr(redis, "RedisCluster", None)
    return cluster_cls is not None and isinstance(client, cluster_cls)


def connection_factory(
    client: Any,
    key: str | bytes | None,
    node_addr: tuple[str, int] | None = None,
    *,
    wrap: Callable[[type], type] | None = None,
    **overrides: Any,
) -> Callable[[], Any]:
    """A factory of standalone redis-py connections like ``client``'s, with no retries.

    The user's client keeps its own settings for its own commands; ours get a
    per-call deadline instead of whatever retry policy the client carries.
    On a cluster the connection goes to the owner of ``key``'s slot, or to
    ``node_addr`` when given (an ASK redirection). ``overrides`` replace
    connection settings (the notice listener's RESP protocol, for one);
    ``wrap`` makes the connection class (a bounded socket under it, say).
    """
    if is_cluster(client):
        node = client.get_default_node() if key is None else client.get_node_from_key(key)
        pool = node.redis_connection.connection_pool
    else:
        pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    if node_addr is not None:
        kwargs["host"], kwargs["port"] = node_addr
    for private in ("maint_notifications_pool_handler", "maint_notifications_config"):
        kwargs.pop(private, None)
    if pool.__class__.__name__ == "SentinelConnectionPool":
        kwargs["connection_pool"] = pool
    kwargs.update(
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        retry_on_error=[],
        health_check_interval=0,
        decode_responses=False,
    )
    kwargs.update(overrides)
    cls = pool.connection_class if wrap is None else wrap(pool.connection_class)

    def make() -> Any:
        return cls(**kwargs)

    return make


def pooled_connection(pool: Any) -> Any:
    """A connection from redis-py ``pool``, asked for as that version wants.

    redis-py before 5.3 requires a command name (which it ignores); 5.3 and
    later deprecate passing one.
    """
    pool_cls: Any = type(pool)
    if _wants_command_name(pool_cls):
        return pool.get_connection("_")
    return pool.get_connection()


@functools.cache
def _wants_command_name(pool_cls: Any) -> bool:
    try:
        params = inspect.signature(pool_cls.get_connection).parameters
    except (TypeError, ValueError):
        return False
    name = params.get("command_name")
    return name is not None and name.default is inspect.Parameter.empty
