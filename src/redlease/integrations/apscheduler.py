"""APScheduler 3.x: a scheduler that runs its jobs only while its process leads.

```python
from apscheduler.schedulers.background import BackgroundScheduler
from redlease.integrations.apscheduler import LeaderGate

scheduler = BackgroundScheduler()
scheduler.add_job(send_reports, "interval", minutes=5)
gate = LeaderGate(scheduler, client, "reports-scheduler", ttl=10.0)
gate.start()        # paused; resumed while this process leads, paused again on loss
...
gate.stop()         # shuts the scheduler down, then releases the lease
```

Every replica of a service runs the same scheduler with the same jobs, each
with its own job store; one of them processes jobs at a time. A job that
writes shared state fences its writes with ``gate.fencer()``. APScheduler is
imported by this module only (``pip install 'redlease[apscheduler]'``).
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import Any

try:
    from apscheduler.events import EVENT_SCHEDULER_SHUTDOWN  # type: ignore[import-untyped]
    from apscheduler.schedulers import SchedulerNotRunningError  # type: ignore[import-untyped]
    from apscheduler.schedulers.base import (  # type: ignore[import-untyped]
        STATE_STOPPED,
        BaseScheduler,
    )
except ImportError:  # pragma: no cover - exercised in a process without the extra
    raise ImportError(
        "redlease.integrations.apscheduler needs APScheduler 3: pip install 'redlease[apscheduler]'"
    ) from None

import redlease
from redlease import ConfigError

__all__ = ["LeaderGate"]

logger = logging.getLogger(__name__)


class LeaderGate:
    """Runs an APScheduler 3.x scheduler's jobs only while a ``redlease.Elector`` leads.

    ``scheduler`` is any ``BaseScheduler`` (background, asyncio, gevent,
    ...), not started yet; ``client`` a threaded Redis client as for
    ``redlease.Elector`` (``name`` and ``ttl`` too; bad ones raise
    ``ConfigError`` here). ``start()`` starts the scheduler paused and the
    Elector; while it leads the scheduler is resumed, and it is paused the
    moment the term ends. Pausing stops new job runs; a job already running
    goes on to its end, so a job that writes shared state fences its writes
    with ``fencer()``: once a successor leads, its writes are rejected.

    Each replica keeps its own job store: APScheduler 3 does not support one
    store shared by several schedulers, and a paused scheduler still writes
    to its store. A job whose run time passed while its scheduler was
    paused follows the job's ``misfire_grace_time`` and ``coalesce`` when it
    is resumed. A scheduler shut down behind the gate's back ends its run
    (the lease is released; ``stop()`` then raises ``SchedulerNotRunningError``).
    """

    def __init__(self, scheduler: Any, client: Any, name: str, ttl: float = 10.0) -> None:
        if not isinstance(scheduler, BaseScheduler):
            raise ConfigError(
                "scheduler must be an APScheduler 3 scheduler (a BaseScheduler), got "
                f"{type(scheduler).__name__}"
            )
        self._scheduler = scheduler
        self._elector = redlease.Elector(client, name, ttl=ttl)
        self._mutex = threading.Lock()
        self._fencer: redlease.Fencer | None = None
        self._term: redlease.Term | None = None
        self._started = False
        self._wait = True
        self._shut_down = False
        scheduler.add_listener(self._scheduler_shut_down, EVENT_SCHEDULER_SHUTDOWN)

    @property
    def scheduler(self) -> Any:
        """The gated scheduler."""
        return self._scheduler

    @property
    def elector(self) -> redlease.Elector:
        """The Elector that decides (for ``token()``, ``leader()``, a ``HealthServer``)."""
        return self._elector

    def is_leader(self) -> bool:
        """Whether this process leads now, so its scheduler runs jobs. Advisory."""
        return self._elector.is_leader()

    def fencer(self) -> redlease.Fencer:
        """The current term's ``redlease.Fencer``, for fenced writes from jobs.

        Inert when this process does not lead now (a job that outlived its
        term, or one run by hand on a follower), as ``Elector.fencer()`` is:
        token 0, falsy, and every write through it is rejected (``set``
        returns False). Take it once per job run and write through it: if
        the term ends while the job runs, that fencer's writes are rejected
        once a successor leads.
        """
        with self._mutex:
            term, fencer = self._term, self._fencer
        if term is None or fencer is None or term.ended():
            return redlease.Fencer(self._elector, 0)
        return fencer

    def start(self) -> LeaderGate:
        """Start the scheduler paused, and contend for leadership; returns the gate."""
        with self._mutex:
            if self._started:
                raise RuntimeError(f"LeaderGate {self._elector.config.name!r} already started")
            if self._scheduler.running:
                raise RuntimeError(
                    "the scheduler is already running: let LeaderGate.start() start it (paused), "
                    "or every replica would run its jobs until the first election"
                )
            self._started = True
            self._shut_down = False
        self._scheduler.start(paused=True)
        self._elector.start(self._lead)
        return self

    def stop(self, wait: bool = True) -> None:
        """Shut the scheduler down (``wait``: for running jobs), then release the lease.

        A waiting replica takes over at once. Re-raises what the gate's
        leader function raised, if anything did. No-op when not started.
        """
        with self._mutex:
            if not self._started:
                return
            self._started = False
            self._wait = wait
        try:
            # A leading gate shuts the scheduler down before the lease goes (see _lead).
            self._elector.stop()
        finally:
            if not self._shut_down and self._scheduler.state != STATE_STOPPED:
                self._shut_down = True
                self._scheduler.shutdown(wait=wait)

    def __enter__(self) -> LeaderGate:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _scheduler_shut_down(self, event: object) -> None:
        if not self._shut_down:  # not by the gate: the term has nothing left to run
            self._elector.resign()

    def _lead(self, term: redlease.Term, fencer: redlease.Fencer) -> None:
        name = self._elector.config.name
        with self._mutex:
            self._term, self._fencer = term, fencer
        try:
            self._scheduler.resume()
            logger.info("LeaderGate %r leads (token %d): jobs run here", name, term.token)
            term.wait()
            if self._scheduler.state == STATE_STOPPED and not self._shut_down:
                raise SchedulerNotRunningError
        except SchedulerNotRunningError:
            # Nothing left to run here: the run ends (the lease goes to another replica) and
            # stop() raises this, rather than winning and giving up terms in a loop.
            logger.warning("LeaderGate %r: its scheduler was shut down outside the gate", name)
            raise
        finally:
            with self._mutex:
                self._term = self._fencer = None
                stopping = not self._started and term.reason == "stopped"
            if self._scheduler.state != STATE_STOPPED:
                self._scheduler.pause()  # at once, on every scheduler (shutdown may be deferred)
                if stopping:
                    # Running jobs end before the lease is released (on a scheduler that runs
                    # on an event loop, the shutdown is the loop's to do, later).
                    self._shut_down = True
                    self._scheduler.shutdown(wait=self._wait)
            logger.info("LeaderGate %r paused its scheduler (%s)", name, term.reason)
