"""``redlease partitions NAME``: who owns each partition of a group, its token and its TTL."""

from __future__ import annotations

import json
from typing import Any

from .._keys import ElectionKeys, PartitionKeys
from . import schema
from .redisurl import CliError, on_redis, redact


def _natural(name: str) -> tuple[int, int, str]:
    # As the group sorts them: decimal names by their number, then the rest.
    if name.isdecimal() and str(int(name)) == name:
        return 0, int(name), ""
    return 1, 0, name


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def collect(client: Any, name: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Each partition's row (sorted as the group sorts them) and the live members."""
    keys = PartitionKeys(name)
    stored = client.get(keys.partitions)
    if stored is None:
        return [], []
    try:
        names = json.loads(_text(stored))
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CliError(f"{keys.partitions} holds {stored[:80]!r}, not a partition set")
    names.sort(key=_natural)
    # One round trip: every key of a group shares its name's slot.
    pipe = client.pipeline(transaction=False)
    pipe.zrange(keys.members, 0, -1)
    for partition in names:
        lease = ElectionKeys(keys.lease(partition))
        pipe.get(lease.leader)
        pipe.pttl(lease.leader)
        pipe.get(lease.fence)
    replies = pipe.execute()
    members = [_text(m) for m in replies[0]]
    rows = []
    for i, partition in enumerate(names):
        holder, pttl, token = replies[1 + 3 * i : 4 + 3 * i]
        owned = holder is not None
        rows.append(
            schema.record(
                schema.PARTITIONS,
                partition=partition,
                member=_text(holder) if owned else None,
                token=int(token) if owned and token is not None else None,
                ttl_ms=int(pttl) if owned and pttl is not None and pttl >= 0 else None,
            )
        )
    return rows, members


def run(url: str, name: str, as_json: bool) -> str:
    """The text ``redlease partitions`` prints (CliError when Redis cannot be read)."""
    if not name:
        raise CliError("the group name must not be empty")
    rows, members = on_redis(url, f"group {name!r}", lambda client: collect(client, name))
    if as_json:
        return json.dumps(rows)
    return render(rows, members, name, redact(url))


def render(rows: list[dict[str, Any]], members: list[str], name: str, where: str) -> str:
    """The partitions as a table a person reads at a glance."""
    if not rows:
        return f"no partition group {name!r} at {where} (no member is live)"
    table = [("PARTITION", "MEMBER", "TOKEN", "TTL")] + [
        (
            r["partition"],
            r["member"] or "-",
            "-" if r["token"] is None else str(r["token"]),
            "-" if r["ttl_ms"] is None else f"{r['ttl_ms'] / 1000:.3f} s",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    lines = [
        f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}"
        for row in table
    ]
    owned = sum(1 for r in rows if r["member"] is not None)
    lines.append(
        f"{owned} of {len(rows)} partitions owned, {len(members)} member"
        f"{'s' if len(members) != 1 else ''} in group {name!r} at {where}"
    )
    return "\n".join(lines)
