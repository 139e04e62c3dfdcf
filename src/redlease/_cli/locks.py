"""``redlease locks``: every lock and every semaphore held under a prefix, who holds each,
its token and TTL; a semaphore with its permits held out of its limit.

A ``RedisLocker`` keeps a lock in the hash ``<prefix>key:<name>`` and a
semaphore's live permits in the sorted set ``<prefix>sem:<name>`` (with
their tokens, labels and the limit in ``<prefix>sem-info:<name>``). Both are
walked with SCAN (on a Cluster, on every master; never KEYS) and each lease
is read with the library's own script (``lua/lock_holder.lua``,
``lua/sem_holders.lua``), so a row's holder, token and TTL belong to one
lease. The rows are as ``locker.held()`` reports them, each marked as a
lock's or a semaphore's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from .. import _scripts
from .._keys import LockKeys, has_hash_tag
from . import schema
from .redisurl import CliError, on_redis, redact, reply_text

SCAN_COUNT = 500
"""Keys asked for per SCAN step, and leases read per round trip."""


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a cluster client (redis-py's or valkey-py's)."""
    return type(client).__name__ in ("RedisCluster", "ValkeyCluster")


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def _scan(client: Any, prefix: str, kind: str) -> list[str]:
    """The names of every ``<prefix><kind>:<name>`` key of a lease (each once), sorted."""
    start = f"{prefix}{kind}:"
    options: dict[str, Any] = {
        "match": _glob_escape(start) + "*",
        "count": SCAN_COUNT,
        "_type": "hash" if kind == "key" else "zset",
    }
    if is_cluster(client):
        options["target_nodes"] = client.PRIMARIES
    names = {str(reply_text(key))[len(start):] for key in client.scan_iter(**options)}
    return sorted(names)


def _chunks(names: list[str]) -> Iterator[list[str]]:
    for first in range(0, len(names), SCAN_COUNT):
        yield names[first : first + SCAN_COUNT]


def _batch(client: Any, calls: list[Callable[[Any], Any]]) -> list[Any]:
    """Each call on ``client`` in one round trip; one by one on a cluster.

    A cluster client's pipeline does not take EVAL, while its own EVAL goes
    to the node of the keys; each lease read stays one atomic script.
    """
    if is_cluster(client):
        return [call(client) for call in calls]
    pipe = client.pipeline(transaction=False)
    for call in calls:
        call(pipe)
    return list(pipe.execute())


def _holder(reply: Any) -> tuple[str, int, int]:
    """A ``{label, token, pttl}`` script reply as ``(holder, token, ttl_ms)``."""
    return str(reply_text(reply[0])), int(reply[1]), int(reply[2])


def _by_token(permit: tuple[str, int, int]) -> int:
    return permit[1]


def collect(client: Any, prefix: str) -> list[dict[str, Any]]:
    """Every held lock, then every live permit, under ``prefix``: JSON-able dicts, by name."""
    if is_cluster(client) and not has_hash_tag(prefix):
        raise CliError(
            f"on a Redis Cluster the lockers' prefix carries a {{hash tag}} (e.g. '{{locks}}:'); "
            f"{prefix!r} has none, so no locker can use it there: pass --prefix"
        )
    keys = LockKeys(prefix)
    rows: list[dict[str, Any]] = []
    lock_script = _scripts.load("lock_holder").source
    for chunk in _chunks(_scan(client, prefix, "key")):
        calls = [_eval(lock_script, keys.lock(name)) for name in chunk]
        for name, reply in zip(chunk, _batch(client, calls), strict=True):
            if reply is not None:
                holder, token, ttl_ms = _holder(reply)
                rows.append(
                    schema.record(
                        schema.LOCKS, name=name, kind=schema.KIND_LOCK, holder=holder,
                        token=token, ttl_ms=ttl_ms, permits=None,
                    )
                )
    for chunk in _chunks(_scan(client, prefix, "sem")):
        replies = _batch(client, [call for name in chunk for call in _permit_reads(keys, name)])
        for i, name in enumerate(chunk):
            rows += _permit_rows(name, replies[2 * i], replies[2 * i + 1])
    return rows


def _eval(source: str, *keys: str) -> Callable[[Any], Any]:
    return lambda target: target.eval(source, len(keys), *keys)


def _permit_reads(keys: LockKeys, name: str) -> list[Callable[[Any], Any]]:
    """The reads of a semaphore's live permits (one script) and of its limit.

    The limit cannot change while a permit is live (an acquire with another
    count is refused), so it is read beside the permits, not in their script.
    """
    info = keys.permit_info(name)
    return [
        _eval(_scripts.load("sem_holders").source, keys.permits(name), info),
        lambda target: target.hget(info, "permits"),
    ]


def semaphore_holders(client: Any, prefix: str, name: str) -> list[dict[str, Any]]:
    """The live permits of the semaphore ``name``, as ``collect``'s rows."""
    return _permit_rows(name, *_batch(client, _permit_reads(LockKeys(prefix), name)))


def _permit_rows(name: str, permits: Any, limit: Any) -> list[dict[str, Any]]:
    """``collect``'s rows of the semaphore ``name`` from its two reads (``_permit_reads``)."""
    text = reply_text(limit)
    count = int(text) if text is not None and text.isdigit() else None
    return [
        schema.record(
            schema.LOCKS, name=name, kind=schema.KIND_SEMAPHORE, holder=holder, token=token,
            ttl_ms=ttl_ms, permits=count,
        )
        for holder, token, ttl_ms in sorted(map(_holder, permits or ()), key=_by_token)
    ]


def run(url: str, prefix: str, as_json: bool) -> str:
    """The text ``redlease locks`` prints (CliError when Redis cannot be read)."""
    if not prefix:
        raise CliError("the prefix must not be empty (the default is redlease:lock:)")
    rows = on_redis(url, "the locks", lambda client: collect(client, prefix))
    if as_json:
        return json.dumps(rows)
    return render(rows, prefix, redact(url))


def _ttl(ttl_ms: int) -> str:
    return f"{ttl_ms / 1000:.3f} s"


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]], right: int) -> list[str]:
    """Columns padded to their widest cell; column ``right`` aligned right, the last left free."""
    table = [header, *rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    return [
        "  ".join(
            [
                *(
                    f"{cell:>{widths[i]}}" if i == right else f"{cell:<{widths[i]}}"
                    for i, cell in enumerate(row[:-1])
                ),
                row[-1],
            ]
        )
        for row in table
    ]


def render(rows: list[dict[str, Any]], prefix: str, where: str) -> str:
    """The locks, then the semaphores, as tables a person reads at a glance."""
    if not rows:
        return f"no lock or semaphore is held under {prefix!r} at {where}"
    locks = [r for r in rows if r[schema.KIND] == schema.KIND_LOCK]
    permits = [r for r in rows if r[schema.KIND] == schema.KIND_SEMAPHORE]
    lines: list[str] = []
    if locks:
        lines += _table(
            ("LOCK", "HOLDER", "TOKEN", "TTL"),
            [(r["name"], r["holder"] or "-", str(r["token"]), _ttl(r["ttl_ms"])) for r in locks],
            right=2,
        )
    held: dict[str, int] = {}
    for r in permits:
        held[r["name"]] = held.get(r["name"], 0) + 1
    if permits:
        if lines:
            lines.append("")
        lines += _table(
            ("SEMAPHORE", "PERMITS", "HOLDER", "TOKEN", "TTL"),
            [
                (
                    r["name"],
                    f"{held[r['name']]}/{'?' if r['permits'] is None else r['permits']}",
                    r["holder"] or "-",
                    str(r["token"]),
                    _ttl(r["ttl_ms"]),
                )
                for r in permits
            ],
            right=3,
        )
    counted = [_count(len(locks), "lock")] if locks else []
    if permits:
        counted.append(
            f"{_count(len(held), 'semaphore')} ({_count(len(permits), 'permit')})"
        )
    lines.append(f"{' and '.join(counted)} held under {prefix!r} at {where}")
    return "\n".join(lines)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"
