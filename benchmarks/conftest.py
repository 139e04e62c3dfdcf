"""Fixtures of the pytest-benchmark suites: one private redis-server per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from redlease._testing import RedisServer


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as redis_server:
        yield redis_server


@pytest.fixture(scope="module")
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = server.client()
    yield c
    c.close()
