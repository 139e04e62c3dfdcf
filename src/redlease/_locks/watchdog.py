"""The watchdog of an auto-renewed lock: it notices a lost lease and says so.

``Watchdog`` turns the keeper's reports into the lock's ``done`` event and
its log records; ``stop_renewing`` is what a lock dropped without
``release()`` runs when it is garbage-collected.
"""

from __future__ import annotations

import os
import threading
import time

from .._engine import ENDED, LOST, Keeper, driver
from .._log import Events


class Watchdog:
    """Sets ``done`` the moment the keeper reports the lease LOST; logs the renewal errors.

    Watched by the process's driver (no thread of its own): looked at when
    the keeper reports a change, and once a second during an outage, to see
    it end.
    """

    def __init__(
        self, keeper: Keeper, done: threading.Event, stopping: threading.Event, events: Events
    ) -> None:
        self.keeper = keeper
        self._done = done
        self._stopping = stopping
        self._events = events
        self._finished = False
        self._look_pending = False

    def check(self) -> bool:
        """True once there is nothing more to watch."""
        if self._finished:
            return True
        events = self._events
        for exc in events.drain(self.keeper):
            events.error(exc)
        state = self.keeper.state
        if state == LOST:
            self._finished = True
            # Recorded before ``done`` is set: whoever waits on ``done`` sees
            # the loss in the metrics and the log already.
            events.released("lost")
            self._done.set()
            return True
        if state == ENDED or self._stopping.is_set():
            self._finished = True
            return True
        if events.failing() and not self._look_pending:
            self._look_pending = True
            driver().schedule(self, time.monotonic() + 1.0)
        return False

    def step(self) -> float | None:
        self._look_pending = False
        if self.check():
            driver().unwatch(self)
        return None


def stop_renewing(keeper: Keeper, stopping: threading.Event, pid: int) -> None:
    """Stop the watchdog of a lock dropped without release: the lease then expires on its own."""
    if os.getpid() != pid:
        return  # a forked child's copy: the keeper is the parent's business
    stopping.set()
    keeper.end()
    keeper.notify()
    keeper.close()
