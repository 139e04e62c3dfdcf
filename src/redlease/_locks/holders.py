"""Who holds a lock, for people: the label a lease carries, and reading it back.

Ownership of a lock is its random token, which means nothing to an
operator looking at a stuck job. Each lease therefore also carries a label
(by default ``<hostname>-<pid>``) that is stored with it and never used to
decide anything. ``LockHolder`` is what a locker's ``holder(name)`` and
``held()`` report. ``RedisLocker.held()`` walks the prefix with SCAN on
every master (never KEYS, which blocks the server), then reads each lease
with one script, so a label, token and TTL always belong to the same lease.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._errors import ConfigError

MAX_LABEL = 256
"""The longest holder label, in characters: a label is for a person to read."""

SCAN_COUNT = 500
"""Keys asked for per SCAN step, and lock reads per round trip."""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock now, as the store said at the moment of asking.

    ``holder`` is the label of the locker that took it (its ``holder=``
    argument, by default ``<hostname>-<pid>``; empty for a lease written
    without one), ``fencing_token`` the acquisition's fencing token and
    ``ttl_ms`` the milliseconds left on its lease.
    """

    holder: str
    fencing_token: int
    ttl_ms: int


def check_label(value: object) -> str | None:
    """A locker's ``holder=`` argument, checked: None (the default label) or the label itself."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"holder must be a str or None, got {type(value).__name__} {value!r}")
    if not value:
        raise ConfigError("holder must not be empty (None gives <hostname>-<pid>)")
    if len(value) > MAX_LABEL:
        raise ConfigError(
            f"holder must be at most {MAX_LABEL} characters (a label for people), "
            f"got {len(value)}"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ConfigError(f"holder must not contain control characters, got {value!r}")
    return value


def label(value: str | None) -> str:
    """The label a lease is stored with: ``value``, else ``<hostname>-<pid>`` of this process.

    Made at each acquisition, so a forked child labels its locks with its own pid.
    """
    return value if value is not None else f"{socket.gethostname()}-{os.getpid()}"


def from_reply(reply: Any) -> LockHolder | None:
    """The ``LockHolder`` of a ``lock_holder`` script reply (its shape already checked)."""
    if reply is None:
        return None
    return LockHolder(reply[0].decode("utf-8", "replace"), int(reply[1]), int(reply[2]))


def glob_escape(text: str) -> str:
    """``text`` as a SCAN MATCH pattern that matches itself only."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def lease_keys(client: Any, prefix: str, cluster: bool, kind: str = "key") -> Iterator[str]:
    """Every key ``<prefix><kind>:*`` of a lease: a lock's hash (``key``) or a semaphore's
    sorted set of permits (``sem``), by SCAN (on every master of a cluster).

    A key may come twice (SCAN's own rule); the caller reads each lease and
    keeps one per name.
    """
    pattern = glob_escape(f"{prefix}{kind}:") + "*"
    options: dict[str, Any] = {
        "match": pattern,
        "count": SCAN_COUNT,
        "_type": "hash" if kind == "key" else "zset",
    }
    if cluster:
        options["target_nodes"] = client.PRIMARIES
    for key in client.scan_iter(**options):
        yield key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
