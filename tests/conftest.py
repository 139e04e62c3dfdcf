"""Shared fixtures: a private redis-server per test, a client for it, both engines.

Every test that needs Redis gets its own real redis-server (cheap: a few
milliseconds to start), so it may pause, kill or restart it freely. Fault
tests also get a loopback "black hole" (accepts, never answers) and a port
that refuses connections.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from helpers import BlackHole, ClosedPort, require_native
from redlease._testing import RedisServer

ENGINES = ("python", "native")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh private redis-server on a free loopback port, stopped after the test."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private redis-server whose data survives ``kill()`` + ``restart()`` (AOF, fsync always)."""
    server = RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` for ``redis_server``, as a user would configure one."""
    c = redis_server.client(socket_timeout=5, socket_connect_timeout=5)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(params=ENGINES, ids=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """``"python"`` and ``"native"``: every test taking it runs once per engine.

    ``native`` is skipped when the extension is not built, unless
    ``REDLEASE_REQUIRE_NATIVE=1``, in which case the missing build fails the test.
    """
    name: str = request.param
    if name == "native":
        require_native()
    return name


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    """A loopback TCP server that accepts connections and never answers."""
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture
def closed_port() -> Iterator[ClosedPort]:
    """A loopback port that refuses every connection (reserved for the test's duration)."""
    port = ClosedPort()
    try:
        yield port
    finally:
        port.close()
