"""Fixtures for the engine tests: a private server, a native pool, keepers of both kinds.

Every test runs against a private redis-server started here (loopback TCP
and a unix socket), so it may pause or kill it. Timing bounds are generous:
the machines running this are small and shared.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from engine_helpers import KEEPER_KINDS, RENEW, Keepers, Server, native_ref
from helpers import require_native
from tls_helpers import require_native_tls


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def rc(server: Server) -> Iterator[redis.Redis]:
    """A redis-py client for ``server``, to set up and inspect what the code under test did."""
    c = server.client()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def pool(server: Server) -> Iterator[Any]:
    """A native ``Pool`` of two connections to ``server``."""
    p = require_native().Pool(server.target(), 2)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(params=KEEPER_KINDS, ids=KEEPER_KINDS)
def keepers(request: pytest.FixtureRequest, server: Server, rc: redis.Redis) -> Iterator[Keepers]:
    """Keepers of each kind in turn: every test taking this runs on both.

    The native keeper is skipped when the extension is not built, unless
    ``REDLEASE_REQUIRE_NATIVE=1``, which fails the test instead.
    """
    kind: str = request.param
    if kind == "native":
        require_native()
    made = Keepers(kind, server, rc)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def native_keepers() -> Iterator[Callable[..., Any]]:
    """Native leases made directly, each on a renewer of its own, for tests of the native thread."""
    native = require_native()
    made: list[Any] = []

    def make(
        server: Server,
        key: str = "lease",
        owner: str = "me",
        *,
        ttl: float = 0.3,
        interval: float = 0.1,
        unix: bool = False,
    ) -> Any:
        target = server.unix_target() if unix else server.target()
        renewer = native.Renewer(target)
        k = native.Lease(renewer, native_ref(RENEW), [key], [owner, int(ttl * 1000)], interval, ttl)
        made.append((k, renewer))
        return k

    try:
        yield make
    finally:
        for k, renewer in made:
            k.close()
            renewer.close()


@pytest.fixture
def tls_engine(engine: str) -> str:
    """``engine``, with the native one built with TLS."""
    if engine == "native":
        require_native_tls()
    return engine
