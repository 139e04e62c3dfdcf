"""How a waiting ``acquire`` learns that its caller gave it up (an asyncio task cancelled).

The asyncio lockers run the threaded locker's ``acquire`` on a worker thread;
when the awaiting task is cancelled they set a flag, and the acquire loop
(``_lock.Locker._acquire``) checks it after each pause: it stops without
another attempt, and a fair waiter leaves its queue.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class AcquireAbandoned(Exception):
    """A waiting ``acquire`` stopped before its next attempt: its caller gave up on it."""


_abandoned = threading.local()


@contextlib.contextmanager
def abandonable(flag: threading.Event) -> Iterator[None]:
    """Inside the block, a waiting ``acquire`` on this thread ends once ``flag`` is set.

    It raises ``AcquireAbandoned`` after the pause in which ``flag`` was set,
    without another attempt, and a fair waiter leaves its queue. The asyncio
    lockers use this so that a cancelled acquire stops within one retry
    interval instead of waiting out its window.
    """
    _abandoned.flag = flag
    try:
        yield
    finally:
        _abandoned.flag = None


def check_abandoned() -> None:
    """Raise ``AcquireAbandoned`` when this thread's caller gave the acquire up."""
    flag = getattr(_abandoned, "flag", None)
    if flag is not None and flag.is_set():
        raise AcquireAbandoned("the caller gave this acquire up")
