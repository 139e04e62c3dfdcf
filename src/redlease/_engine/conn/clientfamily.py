"""The user's client family (redis-py or valkey-py) and the threaded redis-py twin the engines use.

Two questions about a client the user passes, each answered here only:

* **Which family is it?** ``redis`` for redis-py's classes, ``valkey`` for
  valkey-py's (a fork with its own module and exception classes). The
  ``valkey`` package is imported only when the user's client is one of its
  classes: it is never a dependency of ours.
* **What do the engines run on?** Always a threaded redis-py client that
  reaches what the user's client reaches: the same address (TCP, unix
  socket, TLS, a Sentinel-managed master or a Cluster), database,
  credentials and timeouts. For a threaded redis-py client that is the
  client itself; for an asyncio client or a valkey-py one it is a *twin*
  made once per client (``threaded``), so every elector and locker on one
  client shares one twin and with it one engine. The engines never send
  anything through the user's own client.

Errors the library raises or reports then come back in the user's family:
``Family.adopt`` gives a redis-py exception the class of the same name in
valkey-py (as well as its own), in place, so a valkey client's caller
catches ``valkey.exceptions.ConnectionError`` and the library itself still
sees what it raised. The front ends (the fences, the lockers, the errors
reported to ``on_error``, the logs and metrics) adopt every error they let
out; nothing inside the engines needs to know.
"""

from __future__ import annotations

import contextlib
import importlib
import weakref
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, NamedTuple, TypeVar

import redis
import redis.cluster
import redis.sentinel
from redis.exceptions import RedisError

from ..._errors import ConfigError
from ..process.forksafe import ForkSafeLock

E = TypeVar("E", bound=BaseException)

# redis-py names whose valkey-py counterpart is spelled otherwise.
_RENAMED = {"RedisError": "ValkeyError", "RedisClusterException": "ValkeyClusterException"}


class Family:
    """A client library speaking the Redis protocol: redis-py or valkey-py."""

    def __init__(self, name: str, module: ModuleType) -> None:
        self.name = name
        self.module = module
        self._adopted: dict[type, type] = {}
        # ``adopt`` bound once, for every elector and lock to keep: a bound
        # method each would cost 64 bytes a lease.
        self.adopter: Callable[[BaseException], BaseException] = self.adopt

    def __repr__(self) -> str:
        return f"<client family {self.name}>"

    def adopt(self, exc: E) -> E:
        """``exc``, made an instance of this family's class of the same name too (in place).

        A redis-py error becomes, for valkey-py, an instance of a class
        derived from both its own class and valkey-py's counterpart (found
        along its class's bases: our own ``UnexpectedReply`` is a
        ``ResponseError``), so both ``except`` clauses catch it. Identity,
        arguments, attributes and traceback are kept. Anything else, and
        every error for redis-py, is returned untouched.
        """
        if self.name == "redis" or not isinstance(exc, RedisError):
            return exc
        cls = type(exc)
        twin = self._adopted.get(cls)
        if twin is None:
            twin = self._adopted.setdefault(cls, self._twin_class(cls))
        if twin is not cls:
            exc.__class__ = twin
        return exc

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Whatever the block raises leaves it as this family's error (``adopt``, in place)."""
        try:
            yield
        except BaseException as exc:
            self.adopt(exc)
            raise

    def _twin_class(self, cls: type) -> type:
        ours = self._counterpart(cls)
        if ours is None or issubclass(cls, ours):
            return cls

        def reduce(err: BaseException) -> tuple[Any, ...]:
            # Pickled as the family's own class: the twin is not importable.
            return (ours, err.args, err.__dict__ or None)

        namespace = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "__reduce__": reduce,
        }
        return type(cls.__name__, (cls, ours), namespace)

    def _counterpart(self, cls: type) -> type | None:
        """The class of this family that stands for redis-py's ``cls`` (the nearest base's)."""
        base = self.module.exceptions.ValkeyError
        for klass in cls.__mro__:
            module = klass.__module__
            if module != "redis" and not module.startswith("redis."):
                continue  # one of ours, say: its redis-py base decides
            try:
                mirror = importlib.import_module(self.name + module[len("redis") :])
            except ImportError:
                mirror = self.module.exceptions
            found = getattr(mirror, _RENAMED.get(klass.__name__, klass.__name__), None)
            if found is None:
                found = getattr(self.module.exceptions, klass.__name__, None)
            if isinstance(found, type) and issubclass(found, base):
                return found
        return None


REDIS = Family("redis", redis)

_families: dict[str, Family] = {"redis": REDIS}


def family_of(client: object) -> Family:
    """The family of ``client``'s class: valkey-py's classes, else redis-py (the default)."""
    root = type(client).__module__.partition(".")[0]
    if root != "valkey":
        return REDIS
    family = _families.get(root)
    if family is None:
        module = importlib.import_module("valkey")
        for sub in ("exceptions", "sentinel", "cluster"):
            importlib.import_module(f"valkey.{sub}")
        family = _families.setdefault(root, Family(root, module))
    return family


class Threaded(NamedTuple):
    """What a front end works with: the threaded redis-py client, and the user's family."""

    client: Any
    family: Family


_twins: weakref.WeakKeyDictionary[Any, Threaded] = weakref.WeakKeyDictionary()
_twins_lock = ForkSafeLock()


def threaded(client: object, *, asyncio: bool | None = False) -> Threaded:
    """The threaded redis-py client the engines use for ``client``, and ``client``'s family.

    ``asyncio`` says which front end asks: ``redlease.aio`` takes asyncio
    clients only, the threaded front ends threaded ones (either refuses the
    other kind with a ``ConfigError`` naming the right one; None takes
    either, for a one-off call such as ``redlease.evict``). A threaded
    redis-py client is used as it is; any other gets one twin for as long as
    it lives. Anything that is no client of either family is refused here,
    the one check every face makes (``check_client``).
    """
    if isinstance(client, Threaded):
        return client
    family, kind = check_client(client, asyncio=asyncio)
    if family is REDIS and kind != "asyncio":
        return Threaded(client, family)
    try:
        with _twins_lock:
            found = _twins.get(client)
    except TypeError:  # not weakly referenceable: a twin of its own
        return Threaded(_make_twin(client, family, kind), family)
    if found is None:
        found = Threaded(_make_twin(client, family, kind), family)
        with _twins_lock:
            found = _twins.setdefault(client, found)
    return found


def check_client(client: object, *, asyncio: bool | None = False) -> tuple[Family, str]:
    """``client``'s family and kind (``"threaded"`` or ``"asyncio"``), or a ConfigError.

    The one check of the client every face makes (electors, lockers,
    partition groups, ``evict``), before anything is built on it: None, a
    URL, a dict of settings or any other object that is not a redis-py or
    valkey-py client is refused naming its type (for a URL, with the line
    that makes a client of it), and so is a client of the wrong kind for the
    face (``asyncio`` as for ``threaded``).
    """
    if isinstance(client, Threaded):
        return client.family, "threaded"
    family = family_of(client)
    kind = _kind(client, family)
    if kind == "other":
        raise ConfigError(_not_a_client(client, asyncio))
    if asyncio is True and kind != "asyncio":
        raise ConfigError(
            "redlease.aio needs an asyncio client (a redis.asyncio.Redis or RedisCluster, or "
            f"valkey.asyncio's); got the threaded {type(client).__name__} (the threaded faces, "
            "redlease.Elector, RedisLocker and Partitions, take threaded clients)"
        )
    if asyncio is False and kind == "asyncio":
        raise ConfigError(
            f"the client is an asyncio {type(client).__name__}; use redlease.aio "
            "(redlease.aio.Elector, aio.RedisLocker, aio.Partitions) for asyncio clients"
        )
    return family, kind


def _kind(client: object, family: Family) -> str:
    """``"asyncio"``, ``"threaded"`` or ``"other"`` (neither family's client class)."""
    if isinstance(client, (family.module.Redis, family.module.RedisCluster)):
        return "threaded"
    if client is None or isinstance(client, (str, bytes, int, float, dict, list, tuple)):
        return "other"  # common mistakes: no need to import the asyncio package to say so
    # Imported only for a client that is no threaded one: a threaded user never pays.
    module = _asyncio(family)
    if isinstance(client, (module.Redis, module.RedisCluster)):
        return "asyncio"
    return "other"


def _not_a_client(client: object, asyncio: bool | None) -> str:
    """Why ``client`` is refused, and for a URL or a dict of settings the line that makes one."""
    module = "redis.asyncio" if asyncio else "redis"
    wanted = (
        "an asyncio redis client (redis-py's or valkey-py's: redis.asyncio.Redis, RedisCluster "
        "or a Sentinel master_for(...) client)"
        if asyncio
        else "a redis client (redis-py's or valkey-py's: redis.Redis, RedisCluster "
        "or a Sentinel master_for(...) client)"
    )
    got = type(client).__name__
    if client is None:
        return f"client must be {wanted}, got None"
    if isinstance(client, str):
        url = client if "://" in client else f"redis://{client}"
        if url.startswith(("valkey://", "valkeys://")):
            module = "valkey.asyncio" if asyncio else "valkey"
            maker = f"{module}.Valkey.from_url({_shown_url(url)!r})"
        else:
            maker = f"{module}.Redis.from_url({_shown_url(url)!r})"
        return (
            f"client must be {wanted}, got the str {_shown_url(client)!r}; "
            f"make a client of it first: {maker}"
        )
    if isinstance(client, dict):
        return (
            f"client must be {wanted}, got a dict (of connection settings?); "
            f"make a client of it first: {module}.Redis(**settings)"
        )
    if isinstance(client, (int, float, bytes)):
        return f"client must be {wanted}, got {got} {client!r}"
    return f"client must be {wanted}, got {got}"


def _shown_url(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``: an error never shows one."""
    head, sep, rest = url.partition("://")
    auth, at, host = rest.rpartition("@")
    user, colon, _password = auth.partition(":")
    if not sep or not at or not colon:
        return url
    return f"{head}://{user}:***@{host}"


def _asyncio(family: Family) -> ModuleType:
    """The family's asyncio package, imported on first need (a threaded user never pays)."""
    for sub in ("asyncio", "asyncio.sentinel", "asyncio.cluster"):
        importlib.import_module(f"{family.name}.{sub}")
    return family.module.asyncio  # type: ignore[no-any-return]


def _make_twin(client: Any, family: Family, kind: str) -> Any:
    module = _asyncio(family) if kind == "asyncio" else family.module
    if isinstance(client, module.RedisCluster):
        return _cluster(client, module, kind)
    pool = client.connection_pool
    if isinstance(pool, module.sentinel.SentinelConnectionPool):
        if not pool.is_master:
            raise ConfigError(
                "the client is a Sentinel replica client; leases need the master "
                "(use sentinel.master_for)"
            )
        return _sentinel_master(pool, module)
    if type(pool) is not module.ConnectionPool and type(pool) is not module.BlockingConnectionPool:
        raise ConfigError(
            f"redlease supports plain, Sentinel and Cluster clients; this one uses a "
            f"{type(pool).__name__}"
        )
    kw: dict[str, Any] = pool.connection_kwargs
    common = _common(kw)
    if kw.get("credential_provider") is not None:
        common["credential_provider"] = kw["credential_provider"]
    cls = pool.connection_class
    if issubclass(cls, module.UnixDomainSocketConnection):
        return redis.Redis(unix_socket_path=kw["path"], **common)
    host = kw.get("host", "localhost")
    return redis.Redis(host=host, port=kw.get("port", 6379), **common, **_ssl(kw, cls, module))


_COMMON = (
    "db",
    "username",
    "password",
    "client_name",
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
)


def _common(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: kwargs[key] for key in _COMMON if kwargs.get(key) is not None}


def _ssl(kwargs: dict[str, Any], cls: type | None, module: ModuleType) -> dict[str, Any]:
    """``ssl=True`` and every ``ssl_*`` option set when ``cls`` is the family's SSLConnection.

    A cluster client may say TLS by ``ssl=True`` instead of a class.
    """
    is_tls = cls is not None and issubclass(cls, module.SSLConnection)
    if not is_tls and not (cls is None and kwargs.get("ssl")):
        return {}
    # The classes of both families take the same ssl_* options (None: not set,
    # but for ssl_cert_reqs, where None means no verification).
    options = {
        k: v
        for k, v in kwargs.items()
        if k.startswith("ssl_") and (v is not None or k == "ssl_cert_reqs")
    }
    return {"ssl": True, **options}


def _sentinel_master(pool: Any, module: ModuleType) -> redis.Redis:
    """The same Sentinel-managed master, through a threaded redis-py Sentinel client."""
    manager = pool.sentinel_manager
    sentinels = []
    for sentinel in manager.sentinels:
        kw = sentinel.connection_pool.connection_kwargs
        sentinels.append((kw.get("host", "localhost"), kw.get("port", 26379)))
    # redis-py leaves Sentinel and ClusterNode untyped.
    sentinel_cls: Any = redis.sentinel.Sentinel
    twin = sentinel_cls(sentinels, sentinel_kwargs=_plain(manager.sentinel_kwargs or {}))
    # The master's TLS settings ride on the pool's class, not on an ``ssl`` flag.
    master: redis.Redis = twin.master_for(
        pool.service_name,
        **_common(pool.connection_kwargs),
        **_ssl(pool.connection_kwargs, pool.connection_class, module),
    )
    return master


def _plain(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The settings of ``kwargs`` a threaded redis-py client can take: no objects of the
    user's client library (an asyncio ``Retry``, say, which redis-py 8.2 puts into an
    asyncio Sentinel's defaults: a threaded connection would call it and never await it)."""
    return {
        key: value
        for key, value in kwargs.items()
        if key != "retry" and not type(value).__module__.startswith(("redis.", "valkey."))
    }


def _cluster(client: Any, module: ModuleType, kind: str) -> Any:
    """A threaded redis-py RedisCluster over the same nodes, credentials and timeouts."""
    nodes = client.get_nodes() or list(client.nodes_manager.startup_nodes.values())
    node_cls: Any = redis.cluster.ClusterNode
    # The asyncio cluster keeps its connection settings itself, the threaded one in its
    # nodes manager.
    owner = client if kind == "asyncio" else client.nodes_manager
    kwargs = owner.connection_kwargs
    tls = _ssl(kwargs, kwargs.get("connection_class"), module)
    return redis.cluster.RedisCluster(
        startup_nodes=[node_cls(n.host, n.port) for n in nodes],
        **{k: v for k, v in _common(kwargs).items() if k != "db"},
        **tls,
    )
