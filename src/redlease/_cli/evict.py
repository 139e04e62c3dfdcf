"""``redlease evict NAME`` and ``redlease locks --release NAME``: take a lease away from its
holder and fence it out at once, and say who was evicted and the new mark.

Each runs the library's own script (``lua/evict.lua``, ``lua/lock_force_release.lua``: what
``redlease.evict`` and ``Locker.force_release`` run) in one call, so who was evicted and the
mark come from the same atomic step.
"""

from __future__ import annotations

import json
from typing import Any

from .. import _scripts
from .._keys import ElectionKeys, LockKeys
from .redisurl import CliError, on_redis, redact


def _is_cluster(client: Any) -> bool:
    return type(client).__name__ in ("RedisCluster", "ValkeyCluster")


def _run_script(url: str, name: str, script: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """Run ``script`` on ``keys`` at ``url``: ``{"name", "evicted", "mark"}``."""
    source = _scripts.load(script).source

    def run(client: Any) -> Any:
        return client.eval(source, len(keys), *keys, "1" if _is_cluster(client) else "0")

    reply = on_redis(url, repr(name), run)
    if not (
        isinstance(reply, list)
        and len(reply) == 2
        and isinstance(reply[0], int)
        and isinstance(reply[1], (bytes, str))
    ):
        raise CliError(f"Redis at {redact(url)} answered {reply!r}, not a mark and a holder")
    holder = reply[1].decode("utf-8", "replace") if isinstance(reply[1], bytes) else reply[1]
    return {"name": name, "evicted": holder or None, "mark": int(reply[0])}


def render(result: dict[str, Any], what: str, mark: str) -> str:
    if result["evicted"] is None:
        return f"nobody held {what} {result['name']!r}: nothing changed ({mark} {result['mark']})"
    who, name, now = result["evicted"], result["name"], result["mark"]
    return f"evicted {who!r} from {what} {name!r}: {mark} now {now}"


def run_evict(url: str, name: str, as_json: bool) -> str:
    """``redlease evict NAME``: end the elector's term at Redis."""
    if not name:
        raise CliError("the elector name must not be empty")
    result = _run_script(url, name, "evict", ElectionKeys(name).all())
    return json.dumps(result) if as_json else render(result, "elector", "fence mark")


def run_release(url: str, prefix: str, name: str, as_json: bool) -> str:
    """``redlease locks --release NAME``: take the lock from its holder."""
    if not prefix:
        raise CliError("the prefix must not be empty (the default is redlease:lock:)")
    if not name:
        raise CliError("the lock name must not be empty")
    keys = LockKeys(prefix)
    result = _run_script(
        url, name, "lock_force_release", (keys.lock(name), keys.fencing, keys.queue("key", name)[0])
    )
    return json.dumps(result) if as_json else render(result, "lock", "fencing counter")
