"""``redlease evict NAME`` and ``redlease locks --release NAME [--permit TOKEN]``: take a lease
away from its holder and fence it out at once, and say who was evicted and the new mark.

Each runs the library's own script (``lua/evict.lua``, ``lua/lock_force_release.lua``: what
``redlease.evict`` and ``Locker.force_release`` run; ``lua/sem_force_release.lua`` for one
permit of a semaphore) in one call, so who was evicted and the mark come from the same
atomic step.

A semaphore is many holders under one name, so ``--release NAME`` never takes
them all: for a name that is a semaphore (and no lock), it refuses, lists the
permits and prints the command that takes one (``--permit TOKEN``, a token the
listing shows). It never says "nobody held" a name whose permits are live.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from .. import _scripts
from .._keys import ElectionKeys, LockKeys
from ..lock import DEFAULT_PREFIX
from . import schema
from .locks import is_cluster, semaphore_holders
from .redisurl import CliError, on_redis, redact, reply_text

SHOWN_PERMITS = 5
"""How many of a semaphore's permits a refused ``--release`` names."""


def _script(
    client: Any, url: str, script: str, keys: tuple[str, ...], *args: Any
) -> tuple[int, str | None]:
    """``script`` on ``keys``: ``(mark, evicted)``, evicted None when nothing was held."""
    reply = client.eval(
        _scripts.load(script).source, len(keys), *keys, *args, "1" if is_cluster(client) else "0"
    )
    if not (
        isinstance(reply, list)
        and len(reply) == 2
        and isinstance(reply[0], int)
        and isinstance(reply[1], (bytes, str))
    ):
        raise CliError(f"Redis at {redact(url)} answered {reply!r}, not a mark and a holder")
    return int(reply[0]), reply_text(reply[1]) or None


def render(result: dict[str, Any], what: str, mark: str) -> str:
    """One line: who was evicted from ``what`` and the new ``mark``, or that nothing was held."""
    if result[schema.EVICTED] is None:
        return f"nobody held {what}: nothing changed ({mark} {result[schema.MARK]})"
    return f"evicted {result[schema.EVICTED]!r} from {what}: {mark} now {result[schema.MARK]}"


def run_evict(url: str, name: str, as_json: bool) -> str:
    """``redlease evict NAME``: end the elector's term at Redis."""
    if not name:
        raise CliError("the elector name must not be empty")
    mark, evicted = on_redis(
        url, repr(name), lambda client: _script(client, url, "evict", ElectionKeys(name).all())
    )
    result = schema.record(schema.EVICT, name=name, evicted=evicted, mark=mark)
    return json.dumps(result) if as_json else render(result, f"elector {name!r}", "fence mark")


def release_command(prefix: str, name: str, token: int) -> str:
    """The command line that takes the permit ``token`` of the semaphore ``name``."""
    words = ["redlease", "locks", "--release", name, "--permit", str(token)]
    if prefix != DEFAULT_PREFIX:
        words += ["--prefix", prefix]
    return shlex.join(words)


def _refusal(prefix: str, name: str, permits: list[dict[str, Any]]) -> CliError:
    limit = permits[0]["permits"]
    shown = ", ".join(
        f"{p[schema.HOLDER] or '-'!r} (token {p[schema.TOKEN]})" for p in permits[:SHOWN_PERMITS]
    )
    if len(permits) > SHOWN_PERMITS:
        shown += f" and {len(permits) - SHOWN_PERMITS} more"
    return CliError(
        f"{name!r} under {prefix!r} is a semaphore, not a lock: {len(permits)} of "
        f"{'?' if limit is None else limit} permits held by {shown}; --release takes one "
        "holder's lease, so name the permit by its token: "
        f"{release_command(prefix, name, permits[0][schema.TOKEN])}"
    )


def run_release(url: str, prefix: str, name: str, permit: int | None, as_json: bool) -> str:
    """``redlease locks --release NAME [--permit TOKEN]``: take a lock, or one permit."""
    if not prefix:
        raise CliError("the prefix must not be empty (the default is redlease:lock:)")
    if not name:
        raise CliError("the lock name must not be empty")
    keys = LockKeys(prefix)

    def release(client: Any) -> dict[str, Any]:
        if permit is not None:
            sem_keys = (
                keys.permits(name), keys.permit_info(name), keys.fencing,
                keys.queue("sem", name)[0],
            )
            mark, evicted = _script(client, url, "sem_force_release", sem_keys, str(permit))
            return schema.record(
                schema.RELEASE, name=name, kind=schema.KIND_SEMAPHORE, evicted=evicted, mark=mark
            )
        lock_keys = (keys.lock(name), keys.fencing, keys.queue("key", name)[0])
        mark, evicted = _script(client, url, "lock_force_release", lock_keys)
        if evicted is None:
            permits = semaphore_holders(client, prefix, name)
            if permits:
                raise _refusal(prefix, name, permits)
        return schema.record(
            schema.RELEASE, name=name, kind=schema.KIND_LOCK, evicted=evicted, mark=mark
        )

    result = on_redis(url, repr(name), release)
    if as_json:
        return json.dumps(result)
    if permit is not None:
        if result[schema.EVICTED] is None:
            return (
                f"no live permit of semaphore {name!r} under {prefix!r} has token {permit}: "
                f"nothing changed (fencing counter {result[schema.MARK]})"
            )
        return render(result, f"permit {permit} of semaphore {name!r}", "fencing counter")
    if result[schema.EVICTED] is None:
        return render(result, f"lock or semaphore {name!r} under {prefix!r}", "fencing counter")
    return render(result, f"lock {name!r}", "fencing counter")
