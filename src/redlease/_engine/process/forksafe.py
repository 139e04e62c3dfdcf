"""A lock for module-wide state that a forked child gets back unlocked.

``os.fork()`` copies a lock as it was: held, if another thread of the
parent held it at that moment, and in the child no thread will ever let it
go. Module-wide registries (shared engines, asyncio twins, the driver, the
notice listeners, metric collectors) are used again in a child, so each
guards its state with a ``ForkSafeLock``, which the child gets back as a new,
unlocked lock before any of its own code runs. What the lock guarded is the
owner's to reset (its own fork handler), as a parent's thread may have been
half-way through a change.
"""

from __future__ import annotations

import os
import threading
import weakref


class ForkSafeLock:
    """A ``threading.Lock`` (as a context manager) that is new and unlocked in a forked child."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _live.add(self)

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        # Released on every way out; the exception, if any, is not the lock's to judge.
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()


_live: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


def _renew_after_fork() -> None:
    for lock in list(_live):
        lock._lock = threading.Lock()


# Registered when this module is first imported, which is before any module
# that makes a ForkSafeLock registers its own handler: the locks are new by
# the time those handlers run.
os.register_at_fork(after_in_child=_renew_after_fork)
