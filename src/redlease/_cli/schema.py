"""The keys of the JSON the commands print (``--json``), each named once for every command.

One concept has one key wherever it appears: a fencing token is ``token``
(never ``fencing_token``), a lease's time left ``ttl_ms``, a lock's or a
permit's label ``holder``, whoever an eviction took a lease from
``evicted``. Each command builds its objects with ``record``, which insists
on exactly its command's keys, so a key cannot drift in one command alone;
``docs/cli.md`` has a table per command and ``tests/cli/test_json_keys.py``
holds the two to each other.
"""

from __future__ import annotations

from typing import Any

NAME = "name"
TOKEN = "token"
TTL_MS = "ttl_ms"
HOLDER = "holder"
KIND = "kind"
EVICTED = "evicted"
MARK = "mark"

KIND_LOCK = "lock"
KIND_SEMAPHORE = "semaphore"

STATUS = (NAME, "leader", TTL_MS, "fence", "applied", "server", "engine")
"""``redlease status NAME --json``: one object."""

LOCKS = (NAME, KIND, HOLDER, TOKEN, TTL_MS, "permits")
"""``redlease locks --json``: a list, one object per held lock and per live semaphore permit."""

RELEASE = (NAME, KIND, EVICTED, MARK)
"""``redlease locks --release NAME [--permit TOKEN] --json``: one object."""

EVICT = (NAME, EVICTED, MARK)
"""``redlease evict NAME --json``: one object."""

PARTITIONS = ("partition", "member", TOKEN, TTL_MS)
"""``redlease partitions NAME --json``: a list, one object per partition."""

COMMANDS: dict[str, tuple[str, ...]] = {
    "status": STATUS,
    "locks": LOCKS,
    "locks --release": RELEASE,
    "evict": EVICT,
    "partitions": PARTITIONS,
}
"""Each command's keys, in the order it prints them."""


def record(keys: tuple[str, ...], **values: Any) -> dict[str, Any]:
    """One JSON object with exactly ``keys``, in that order; a missing or extra key is a bug."""
    if set(values) != set(keys):
        missing = sorted(set(keys) - set(values))
        extra = sorted(set(values) - set(keys))
        raise AssertionError(f"JSON keys {keys}: missing {missing}, unexpected {extra}")
    return {key: values[key] for key in keys}
