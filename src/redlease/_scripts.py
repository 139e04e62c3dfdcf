"""Lua scripts, loaded once from ``lua/*.lua`` with their SHA1 computed once.

The files in ``lua/`` are the single source of truth for server-side logic.
An installed package carries copies in ``redlease/lua/``; an editable install
reads the repository's ``lua/`` directly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_SEARCH = (_HERE / "lua", _HERE.parent.parent / "lua")


def _lua_dir() -> Path:
    for candidate in _SEARCH:
        if (candidate / "acquire.lua").is_file():
            return candidate
    raise FileNotFoundError(
        "redlease Lua scripts not found; looked in " + ", ".join(str(p) for p in _SEARCH)
    )


def names() -> list[str]:
    """The name of every script (``lua/<name>.lua``), sorted."""
    return sorted(path.stem for path in _lua_dir().glob("*.lua"))


@cache
def source(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (_lua_dir() / f"{name}.lua").read_text(encoding="utf-8")


# What each script answers, where it is not 0 or 1 (every fenced write, renew
# and refresh answers 0 or 1; a release 0, 1 or 2, ``_engine.replies.released``).
# The shapes themselves are checked in ``_engine.replies``.
_REPLIES = {
    "acquire": "acquire",
    "release": "release",
    "renew_many": "renew_many",
    "lock_release": "release",
    "sem_release": "release",
    "lock_acquire": "lock_acquire",
    "leader": "leader",
    "lock_holder": "lock_holder",
    "sem_acquire": "sem_acquire",
    "sem_holders": "sem_holders",
    "evict": "evict",
    "lock_force_release": "evict",
    "sem_force_release": "evict",
    # A partition group's replies depend on the group (how many partitions a
    # view reads): redlease._election.member and .tenures check them.
    "partition_join": "any",
    "partition_view": "any",
    "partition_release": "any",
    "partition_leave": "any",
}


@dataclass(frozen=True)
class Script:
    """One Lua script: its source, the SHA1 that EVALSHA names it by, its reply shape.

    ``reply`` names what the script can answer (``"flag"``: 0 or 1; see
    ``_engine.replies``); any other reply is an error, never a result. Every
    script of ours has one; ``"any"`` (a script made elsewhere) checks nothing.
    """

    name: str
    source: str
    reply: str = "any"
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode("utf-8")).hexdigest())


# Scripts that begin with other files' functions (fair waiting's queue, release notices).
_PRELUDES: dict[str, tuple[str, ...]] = {
    "lock_acquire": ("queue",),
    "sem_acquire": ("queue",),
    "queue_keep": ("queue",),
    "queue_leave": ("queue",),
    "release": ("notify",),
    "lock_release": ("notify",),
    "sem_release": ("notify",),
    "evict": ("notify",),
    "lock_force_release": ("notify",),
    "sem_force_release": ("notify",),
    "partition_join": ("notify",),
    "partition_release": ("notify",),
    "partition_leave": ("notify",),
}


@cache
def load(name: str) -> Script:
    """The script in ``lua/<name>.lua`` (after its prelude, if any), loaded and hashed once."""
    text = "\n".join([*map(source, _PRELUDES.get(name, ())), source(name)])
    return Script(name, text, _REPLIES.get(name, "flag"))


def fenced(name: str, body: str) -> Script:
    """Wrap a write body as guard + body + epilogue: one atomic fenced write.

    KEYS[1]/ARGV[1] are the high-water mark key and the token; the body's own
    keys and arguments start at index 2.
    """
    return Script(
        name, source("fence_guard") + "\n" + body + "\n" + source("fence_epilogue"), "flag"
    )


@cache
def fenced_file(name: str) -> Script:
    """A fenced write whose body lives in ``lua/<name>.lua``."""
    return fenced(name, source(name))


# The renewals lua/renew_many.lua does for many leases in one call, by the kind
# its arguments name: renew.lua's string lease, lock_refresh.lua's lock hash.
_TOGETHER = {"renew": "s", "lock_refresh": "h"}


def renewed_together(script: Script) -> str | None:
    """The kind (``"s"`` or ``"h"``) renew_many renews ``script``'s leases as, or None.

    None for any script but renew.lua and lock_refresh.lua (itself, not a
    script of the same name), whose leases are renewed each in its own call.
    """
    kind = _TOGETHER.get(script.name)
    if kind is None or load(script.name).sha != script.sha:
        return None
    return kind
