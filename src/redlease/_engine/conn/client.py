"""What the engines need to know about the user's redis-py client."""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.sentinel import (
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from ..contract.interface import DEFAULT_CALL_TIMEOUT, DEFAULT_WRITE_TIMEOUT
from ..process.forksafe import ForkSafeLock
from .connect import is_cluster as is_cluster
from .slotmap import refresh

_REDACTED = "<REDACTED>"
_NEEDS_PASSWORD = "the client uses a credential_provider; the native engine needs a fixed password"

CertReqs = str
"""How a TLS peer certificate is checked: ``"none"``, ``"optional"`` or ``"required"``.

As in Python's ``ssl`` module, a client treats ``"optional"`` like
``"required"``: a certificate the server sends must verify.
"""


@dataclass(frozen=True)
class TLS:
    """The client's TLS settings, as redis-py's ``ssl_*`` options give them.

    ``server_hostname`` is the name sent for SNI and matched against the
    certificate; None means the host connected to. Nothing here is secret
    except ``key_password``, which ``repr`` never shows.
    """

    ca_certs: str | None = None
    ca_path: str | None = None
    ca_data: str | bytes | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: str | None = None
    cert_reqs: CertReqs = "required"
    check_hostname: bool = True

    def __repr__(self) -> str:
        shown = {
            "ca_certs": self.ca_certs,
            "ca_path": self.ca_path,
            "ca_data": None if self.ca_data is None else f"<{len(self.ca_data)} bytes>",
            "certfile": self.certfile,
            "keyfile": self.keyfile,
            "key_password": None if self.key_password is None else _REDACTED,
        }
        parts = [
            f"{k}={v}" if k in ("key_password", "ca_data") else f"{k}={v!r}"
            for k, v in shown.items()
            if v is not None
        ]
        parts += [f"cert_reqs={self.cert_reqs!r}", f"check_hostname={self.check_hostname}"]
        return f"TLS({', '.join(parts)})"


@dataclass(frozen=True)
class Sentinels:
    """How to find a Sentinel-managed master: the sentinels, the service, their own credentials."""

    addresses: tuple[tuple[str, int], ...]
    service: str
    username: str | None = None
    password: str | None = None
    tls: TLS | None = None

    def __repr__(self) -> str:
        secret = "" if self.password is None else f", password={_REDACTED}"
        return (
            f"Sentinels({list(self.addresses)!r}, service={self.service!r}, "
            f"username={self.username!r}{secret}, tls={self.tls!r})"
        )


@dataclass(frozen=True)
class Endpoint:
    """Where and how to open a connection like the user's client does.

    Everything a native connection needs, taken from the user's client: the
    server (a fixed TCP address or unix socket; or the sentinels that name
    the master; or a cluster's known nodes, of which the owner of the name's
    slot serves), the database, the credentials, the client name and the TLS
    settings. ``repr`` never shows a password.
    """

    host: str | None
    port: int
    path: str | None
    db: int
    username: str | None
    password: str | None
    client_name: str | None
    tls: TLS | None = None
    sentinels: Sentinels | None = None
    cluster_nodes: tuple[tuple[str, int], ...] = ()

    @property
    def kind(self) -> str:
        """``"direct"``, ``"sentinel"`` or ``"cluster"``: how the server is found."""
        if self.sentinels is not None:
            return "sentinel"
        if self.cluster_nodes:
            return "cluster"
        return "direct"

    @property
    def address(self) -> str:
        """A readable name of the server (or of how it is found)."""
        if self.sentinels is not None:
            return f"sentinel:{self.sentinels.service}"
        if self.cluster_nodes:
            host, port = self.cluster_nodes[0]
            return f"cluster:{host}:{port}"
        return self.path if self.path else f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        secret = "" if self.password is None else f" password={_REDACTED}"
        extra = "" if self.tls is None else f" tls={self.tls!r}"
        if self.sentinels is not None:
            extra += f" sentinels={self.sentinels!r}"
        if self.cluster_nodes:
            extra += f" nodes={list(self.cluster_nodes)!r}"
        return (
            f"<Endpoint {self.address} db={self.db} username={self.username!r}{secret}"
            f" client_name={self.client_name!r}{extra}>"
        )


# TLS options of redis-py that the native connection does not implement: a
# client that sets any of them is served by the Python engine.
_UNSUPPORTED_TLS = (
    "ssl_include_verify_flags",
    "ssl_exclude_verify_flags",
    "ssl_validate_ocsp",
    "ssl_validate_ocsp_stapled",
    "ssl_ocsp_context",
    "ssl_ocsp_expected_cert",
    "ssl_min_version",
    "ssl_ciphers",
)


_KNOWN_CONNECTIONS = (
    Connection,
    UnixDomainSocketConnection,
    SSLConnection,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)


def _cert_reqs(value: object) -> CertReqs:
    if value is None:
        return "none"
    if isinstance(value, str):
        return value.lower()
    name = getattr(value, "name", str(value))  # ssl.VerifyMode
    return {"CERT_NONE": "none", "CERT_OPTIONAL": "optional"}.get(name, "required")


def _tls(kwargs: dict[str, Any], cls: type) -> tuple[TLS | None, str]:
    """The TLS settings of a connection class and its kwargs, or why they cannot be served."""
    if not issubclass(cls, SSLConnection):
        return None, ""
    for option in _UNSUPPORTED_TLS:
        if kwargs.get(option) not in (None, False, [], ()):
            return None, f"the client sets {option}, which the native TLS connection does not do"
    return TLS(
        ca_certs=kwargs.get("ssl_ca_certs"),
        ca_path=kwargs.get("ssl_ca_path"),
        ca_data=kwargs.get("ssl_ca_data"),
        certfile=kwargs.get("ssl_certfile"),
        keyfile=kwargs.get("ssl_keyfile"),
        key_password=kwargs.get("ssl_password"),
        cert_reqs=_cert_reqs(kwargs.get("ssl_cert_reqs", "required")),
        check_hostname=bool(kwargs.get("ssl_check_hostname", True)),
    ), ""


def _host_port(kwargs: dict[str, Any], default_port: int) -> tuple[str, int]:
    return str(kwargs.get("host", "localhost")), int(kwargs.get("port", default_port))


def native_endpoint(client: object) -> tuple[Endpoint | None, str]:
    """The endpoint of a client, or None and why the native engine cannot serve it.

    Whether this build of the extension has what the endpoint needs (TLS,
    Sentinel, Cluster) is for engine selection to decide.
    """
    if is_cluster(client):
        return _cluster_endpoint(client)
    if not isinstance(client, redis.Redis):
        return None, f"the client is a {type(client).__name__}, not a redis.Redis"
    pool = client.connection_pool
    cls = pool.connection_class
    kwargs: dict[str, Any] = pool.connection_kwargs
    if kwargs.get("credential_provider") is not None:
        return None, _NEEDS_PASSWORD
    sentinels: Sentinels | None = None
    if isinstance(pool, SentinelConnectionPool):
        if not pool.is_master:
            return None, "the client is a Sentinel replica client; leases need the master"
        sentinels, why = _sentinels(pool)
        if sentinels is None:
            return None, why
    elif type(pool) is not redis.ConnectionPool and type(pool) is not redis.BlockingConnectionPool:
        return None, f"the client's pool is a {type(pool).__name__}, unknown to the native engine"
    if cls not in _KNOWN_CONNECTIONS:
        return None, f"the client connects with {cls.__name__}, unknown to the native engine"
    tls, why = _tls(kwargs, cls)
    if why:
        return None, why
    # The client's protocol (RESP2 or RESP3) does not matter: the native
    # engine talks RESP2 on connections of its own, and every script it runs
    # answers with integers, which both protocols encode alike.
    path = kwargs.get("path") if issubclass(cls, UnixDomainSocketConnection) else None
    host, port = _host_port(kwargs, 6379)
    endpoint = Endpoint(
        host=None if path else host,
        port=port,
        path=path,
        db=int(kwargs.get("db", 0) or 0),
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        client_name=kwargs.get("client_name"),
        tls=tls,
        sentinels=sentinels,
    )
    return endpoint, ""


def _sentinels(pool: Any) -> tuple[Sentinels | None, str]:
    addresses: list[tuple[str, int]] = []
    first: dict[str, Any] = {}
    tls: TLS | None = None
    for sentinel in pool.sentinel_manager.sentinels:
        spool = sentinel.connection_pool
        kw: dict[str, Any] = spool.connection_kwargs
        if kw.get("credential_provider") is not None:
            return None, "the sentinels: " + _NEEDS_PASSWORD
        tls, why = _tls(kw, spool.connection_class)
        if why:
            return None, why
        addresses.append(_host_port(kw, 26379))
        first = first or kw
    if not addresses:
        return None, "the Sentinel client knows no sentinels"
    return Sentinels(
        addresses=tuple(addresses),
        service=str(pool.service_name),
        username=first.get("username"),
        password=first.get("password"),
        tls=tls,
    ), ""


def sentinels_of(client: object) -> Sentinels | None:
    """The sentinels behind a Sentinel ``master_for`` client, or None for any other client."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool) or not pool.is_master:
        return None
    return _sentinels(pool)[0]


def _cluster_endpoint(client: Any) -> tuple[Endpoint | None, str]:
    manager = client.nodes_manager
    kwargs: dict[str, Any] = dict(manager.connection_kwargs)
    if kwargs.get("credential_provider") is not None:
        return None, _NEEDS_PASSWORD
    # RedisCluster hands ``ssl=True`` on to the Redis of each node, which
    # picks SSLConnection from it; a ``rediss://`` URL names the class itself.
    cls = kwargs.get("connection_class") or (SSLConnection if kwargs.get("ssl") else Connection)
    tls, why = _tls(kwargs, cls)
    if why:
        return None, why
    nodes = [(str(n.host), int(n.port)) for n in client.get_nodes()]
    nodes += [(str(n.host), int(n.port)) for n in manager.startup_nodes.values()]
    seen = tuple(dict.fromkeys(nodes))
    if not seen:
        return None, "the cluster client knows no nodes"
    host, port = seen[0]
    return Endpoint(
        host=host,
        port=port,
        path=None,
        db=0,
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        client_name=kwargs.get("client_name"),
        tls=tls,
        cluster_nodes=seen,
    ), ""


class _Refreshes:
    """One cluster client's slot-map refreshes: one at a time, and when the last began."""

    __slots__ = ("began", "lock")

    def __init__(self) -> None:
        self.lock = ForkSafeLock()
        self.began = 0.0


_refreshes_lock = ForkSafeLock()  # guards _refreshes only, never held across a round trip
_refreshes: weakref.WeakKeyDictionary[Any, _Refreshes] = weakref.WeakKeyDictionary()


def slot_owner(client: Any, key: str | bytes) -> str | None:
    """``"host:port"`` of the master a cluster ``client``'s slot map names for ``key``.

    None when the map names none (the slot is not covered, or no map yet).
    A hint for grouping calls by node, never a route by itself: each engine
    routes a call, and follows a redirection, on its own.
    """
    try:
        node = master_node(client, key)
    except Exception:  # SlotNotCoveredError and its like: no owner to group by
        return None
    name = getattr(node, "name", None)
    return name if isinstance(name, str) else None


def master_node(client: Any, key: str | bytes, slot: int | None = None) -> Any:
    """The node a cluster ``client``'s slot map names the master of ``key``'s slot.

    ``slot`` is that slot when the caller knows it (a fence computes its
    name's once): read from the map without hashing ``key`` again, as
    ``get_node_from_key`` reads it (the first node of the slot's entry).
    None, or a slot the map does not cover: ``get_node_from_key``, which
    hashes ``key`` and raises ``SlotNotCoveredError`` for an uncovered slot.
    """
    if slot is not None:
        entry = client.nodes_manager.slots_cache.get(slot)
        if entry:
            return entry[0]
    return client.get_node_from_key(key)


def refresh_slot_map(client: Any, asked: float | None = None) -> None:
    """Refresh a cluster client's slot map, unless a refresh began after ``asked``.

    The one place either engine asks for a fresh slot map (after a MOVED, a
    dropped connection, or a notice channel that left its node): many
    callers that saw the same move cause one refresh. ``asked`` is when the
    caller saw the need (default: now). The map is read and checked by
    ``slotmap``, each node within the client's call bound (``call_timeout``)
    and all within twice it. Callers wait only for a refresh of the same client: one
    cluster that answers slowly or badly holds no other client's. Never
    raises: a cluster that does not answer, or answers with something that
    is not a map, leaves the old map, and the caller tries again later.
    """
    asked = time.monotonic() if asked is None else asked
    with _refreshes_lock:
        try:
            state = _refreshes.get(client) or _refreshes.setdefault(client, _Refreshes())
        except TypeError:  # not weakly referenceable or hashable: no coalescing for it
            state = _Refreshes()
    with state.lock:
        if state.began >= asked:
            return
        state.began = time.monotonic()
        try:
            refresh(client, call_timeout(client))
        except Exception as exc:
            logging.getLogger("redlease").debug("the slot map could not be refreshed: %r", exc)


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def socket_timeout(client: object) -> float | None:
    """The client's ``socket_timeout`` in seconds, or None when it has none.

    A ``RedisCluster`` keeps it in its nodes manager (every node's
    connections get it), not in a pool of its own.
    """
    holder = getattr(client, "nodes_manager", None) or getattr(client, "connection_pool", None)
    kwargs = getattr(holder, "connection_kwargs", None)
    value = kwargs.get("socket_timeout") if isinstance(kwargs, dict) else None
    return _seconds(value)


def call_timeout(client: object) -> float:
    """The bound on one control round trip for ``client``: its socket_timeout, else 5 s."""
    return socket_timeout(client) or DEFAULT_CALL_TIMEOUT


def write_timeout(client: object) -> float:
    """The bound on one fenced write for ``client``: its socket_timeout, else 30 s."""
    return socket_timeout(client) or DEFAULT_WRITE_TIMEOUT
