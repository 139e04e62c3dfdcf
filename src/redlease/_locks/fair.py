"""Fair waiting's one rule, which every locker's queue follows (``acquire(..., fair=True)``).

A fair waiter holds a place in its name's queue at the store: dated from when
its ``acquire`` began (``since``), and alive for ``place_ms`` after each
attempt and each renewal by the renewer's thread (``PlaceKeeping``), so it does
not lapse while the waiter's own thread waits for the GIL or the CPU; when
the waiter's process dies the renewals stop with it, and its place ends
within ``place_ms``. The queue itself lives in ``lua/queue.lua`` (Redis) and
``MemoryStore`` (memory).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

from .._engine import ACTIVE, Engine, Keeper, renew_interval
from .._scripts import load

PLACE_INTERVALS = 3
"""A place lives this many of its waiter's retry intervals after each attempt or renewal."""

PLACE_MIN = 0.1
"""The shortest life of a place, in seconds (for short retry intervals)."""


def place_ms(interval: float) -> int:
    """How long a fair waiter's place lives, in ms: max(3 x ``interval``, 100 ms)."""
    # rounded first, so 3 x 0.05 s is 150 ms, not 151
    return max(math.ceil(PLACE_MIN * 1000), math.ceil(round(PLACE_INTERVALS * interval * 1000, 6)))


def since(began: float | None) -> int:
    """Whole microseconds since ``began`` (``time.monotonic()``; None: 0): how long a fair
    attempt's waiter has waited, which the store dates its new place back by."""
    return 0 if began is None else max(0, int((time.monotonic() - began) * 1e6))


class PlaceKeeping:
    """While one fair waiter waits (a ``with`` block): its place renewed by its locker's
    renewer every third of the place's life, besides its own attempts."""

    def __init__(self, make: Callable[[], Keeper | None]) -> None:
        self._make = make  # the locker's keeper for this place; None: attempts only
        self._keeper: Keeper | None = None

    def kept(self, sent: float) -> None:
        """After an attempt sent at ``sent``, which took or renewed the place: renewals
        run from then on (again, when the renewer had found the place gone)."""
        if self._keeper is None:
            self._keeper = self._make()
        if self._keeper is not None and self._keeper.state != ACTIVE:
            self._keeper.begin(1, sent)

    def __enter__(self) -> PlaceKeeping:
        return self

    def __exit__(self, *exc: object) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            with contextlib.suppress(Exception):
                keeper.close()


def redis_place_keeper(
    engine: Engine, queue: tuple[str, str], owner: str, life_ms: int
) -> Keeper:
    """The engine's renewer holding ``owner``'s place in ``queue`` (natively without the GIL)."""
    life = life_ms / 1000
    script = load("queue_keep")
    return engine.keeper((script, queue, (owner, life_ms)), interval=renew_interval(life), ttl=life)
