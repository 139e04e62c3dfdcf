"""The native encoder against a real redis-server: what it sends is what the server stores.

Hypothesis picks keys and values (bytes of any kind, text beyond ASCII,
integers of any size within 64 bits, floats), a fenced write on the native
engine sends them, and the server's own copy of each (read back by
redis-py) must be exactly the bytes redis-py would have sent for the same
value. A value the encoder got wrong in any byte, a length header off by
one, an argument dropped or doubled would each show up as a different
string at the server, or as a protocol error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import redlease
from helpers import require_native
from redlease._testing import RedisServer

require_native()

STORE = """
for i, key in ipairs(KEYS) do
    if i > 1 then redis.call('SET', key, ARGV[i]) end
end
"""
"""Stores each value under its key; the first key and arg are the fence's own."""

values = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
)
keys = st.one_of(st.binary(min_size=1, max_size=60), st.text(min_size=1, max_size=30))


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as running:
        yield running


def as_key(key: str | bytes) -> bytes:
    """The key the server sees: ``"0"`` and ``b"0"`` name one key, so a list holds only one."""
    return key.encode("utf-8") if isinstance(key, str) else key


def as_redis_py_sends(value: object) -> bytes:
    """The bytes redis-py's encoder makes of ``value`` (its own, not ours)."""
    encoded = redis.connection.Encoder("utf-8", "strict", False).encode(value)
    return encoded if isinstance(encoded, bytes) else bytes(encoded)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(st.tuples(keys, values), min_size=1, max_size=12, unique_by=lambda kv: as_key(kv[0]))
)
def test_what_the_native_encoder_sends_is_what_the_server_stores(
    server: RedisServer, pairs: list[tuple[str | bytes, object]]
) -> None:
    client = server.client()
    elector = redlease.Elector(client, "enc", engine="native")
    prefixed = [
        (b"enc:" + k if isinstance(k, bytes) else "enc:" + k, v) for k, v in pairs
    ]
    written = elector.fence_eval(
        1, STORE, keys=[k for k, _ in prefixed], args=[v for _, v in prefixed]  # type: ignore[misc]
    )
    assert written is True
    for key, value in prefixed:
        assert client.get(key) == as_redis_py_sends(value), (key, value)
    client.delete(*[k for k, _ in prefixed])
