"""A partitioned group's names: its partition set, how it is written, the member's identity.

``partition_names`` checks what ``Partitions(..., partitions, ...)`` was given
and names the partitions; ``describe_set`` says a set in a few words (errors,
logs); ``canonical`` is the set as the group's key holds it, which every
member must match, and ``stored_set`` reads it back. The other arguments of a
member checked here are its callbacks and its ``member_id``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from .._config import default_instance_id
from .._errors import ConfigError

MAX_PARTITIONS = 65536
"""The most partitions one group may have: one reply's element cap (``MAX_REPLY_ELEMENTS``)."""

_SHOWN_NAMES = 8
"""How many names of a partition set an error message shows."""

Callback = Callable[..., object]
"""A user callback of a member (``on_assigned``, ``on_revoked``, ``on_error``)."""


def partition_names(partitions: object) -> tuple[str, ...]:
    """The partition names ``partitions`` stands for, in its order; ConfigError otherwise.

    An int N >= 1 names "0" .. "N-1"; a sequence names itself (distinct,
    non-empty str names). A bare str is not a sequence of names.
    """
    if isinstance(partitions, bool):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of partition names, "
            f"not a bool ({partitions!r})"
        )
    if isinstance(partitions, int):
        if partitions < 1:
            raise ConfigError(
                f"partitions must be at least 1 (an int N names the partitions '0' .. 'N-1'), "
                f"got {partitions!r}"
            )
        if partitions > MAX_PARTITIONS:
            raise ConfigError(
                f"partitions must be at most {MAX_PARTITIONS} (one reply reads them all), "
                f"got {partitions!r}"
            )
        return tuple(str(index) for index in range(partitions))
    if isinstance(partitions, (str, bytes)):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of partition names; a bare "
            f"{type(partitions).__name__} is not a sequence of names, got {partitions!r} "
            f"(pass [{partitions!r}] for one partition of that name)"
        )
    if not isinstance(partitions, Sequence):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of distinct non-empty str names, "
            f"got {type(partitions).__name__} {_short(partitions)}"
        )
    names = tuple(partitions)
    if not names:
        raise ConfigError("partitions must name at least one partition, got an empty sequence")
    if len(names) > MAX_PARTITIONS:
        raise ConfigError(
            f"partitions must name at most {MAX_PARTITIONS} partitions (one reply reads them "
            f"all), got {len(names)}"
        )
    for index, each in enumerate(names):
        if not isinstance(each, str):
            raise ConfigError(
                f"each partition name must be a str, got {type(each).__name__} {each!r} "
                f"at index {index}"
            )
        if not each:
            raise ConfigError(f"partition names must not be empty, got '' at index {index}")
    if len(set(names)) != len(names):
        counted = Counter(names)
        twice = sorted((each for each, n in counted.items() if n > 1), key=natural)
        raise ConfigError(f"partition names must be distinct, got {_short(twice)} more than once")
    return names


def natural(name: str) -> tuple[int, int, str]:
    """Sort key: decimal names by their number first ("2" before "10"), then the rest."""
    if name.isdecimal() and str(int(name)) == name:
        return 0, int(name), ""
    return 1, 0, name


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...]"


def describe_set(names: Iterable[str]) -> str:
    """A partition set in a few words: ``12 partitions '0' .. '11'`` or ``{'a', 'b'}``."""
    ordered = sorted(names, key=natural)
    if ordered == [str(index) for index in range(len(ordered))]:
        if len(ordered) == 1:
            return "1 partition '0'"
        return f"{len(ordered)} partitions '0' .. '{len(ordered) - 1}'"
    shown = ", ".join(repr(name) for name in ordered[:_SHOWN_NAMES])
    more = f", ... ({len(ordered)} names)" if len(ordered) > _SHOWN_NAMES else ""
    return "{" + shown + more + "}"


def canonical(names: Iterable[str]) -> str:
    """A partition set as the group's key holds it: the sorted names as one JSON list."""
    return json.dumps(sorted(names), ensure_ascii=False, separators=(",", ":"))


def stored_set(value: bytes) -> str:
    """The set a group's key holds, described (or as it is, when it is not a set of ours)."""
    try:
        names = json.loads(value.decode("utf-8"))
    except ValueError:
        return repr(value[:80])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return repr(value[:80])
    return describe_set(names)


def check_callback(value: object, what: str, signature: str) -> None:
    if value is not None and not callable(value):
        raise ConfigError(
            f"{what} must be callable as {signature} or None, got {type(value).__name__} {value!r}"
        )


def check_member_id(member_id: object) -> str:
    if member_id is None:
        return default_instance_id()
    if not isinstance(member_id, str):
        raise ConfigError(f"member_id must be a str, got {type(member_id).__name__} {member_id!r}")
    if not member_id:
        raise ConfigError("member_id must not be empty (pass None to generate one)")
    return member_id
