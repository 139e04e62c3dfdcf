"""``redlease locks``: every lock and semaphore permit held under a prefix, who holds it,
its token and TTL."""

from __future__ import annotations

import json
from typing import Any

from .. import RedisLocker
from .redisurl import CliError, on_redis, redact


def collect(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Every held lock under ``prefix``, as JSON-able dicts sorted by name."""
    locker = RedisLocker(client, prefix=prefix)
    try:
        return [
            {
                "name": name,
                "holder": who.holder,
                "fencing_token": who.fencing_token,
                "ttl_ms": who.ttl_ms,
            }
            for name, who in locker.held()
        ]
    finally:
        locker.close()


def run(url: str, prefix: str, as_json: bool) -> str:
    """The text ``redlease locks`` prints (CliError when Redis cannot be read)."""
    if not prefix:
        raise CliError("the prefix must not be empty (the default is redlease:lock:)")
    rows = on_redis(url, "the locks", lambda client: collect(client, prefix))
    if as_json:
        return json.dumps(rows)
    return render(rows, prefix, redact(url))


def render(rows: list[dict[str, Any]], prefix: str, where: str) -> str:
    """The locks as a table a person reads at a glance."""
    if not rows:
        return f"no lock is held under {prefix!r} at {where}"
    table = [("LOCK", "HOLDER", "TOKEN", "TTL")] + [
        (
            r["name"],
            r["holder"] or "-",
            str(r["fencing_token"]),
            f"{r['ttl_ms'] / 1000:.3f} s",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}"
        for row in table
    ]
    count = len(rows)
    leases = f"{count} lock{'s' if count != 1 else ''} and permit{'s' if count != 1 else ''}"
    lines.append(f"{leases} held under {prefix!r} at {where}")
    return "\n".join(lines)
