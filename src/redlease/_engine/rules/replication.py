"""The replication guard: how many replicas must confirm an acquire or a fenced write (WAIT).

The engines send the ``WAIT`` it asks for after each confirmed call; the
electors and lockers hold one (``redlease._config.replication_guard`` checks
its settings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..._errors import NotReplicated
from .timing import DEFAULT_REPLICA_TIMEOUT, wait_ms


@dataclass(frozen=True, slots=True)
class ReplicationGuard:
    """How many replicas must confirm an acquire or fenced write, and for how long to wait.

    ``min_replicas`` 0 turns the guard off: nothing waits for replicas.
    """

    min_replicas: int = 0
    replica_timeout: float = DEFAULT_REPLICA_TIMEOUT

    @property
    def enabled(self) -> bool:
        return self.min_replicas > 0

    @property
    def wait(self) -> ReplicationGuard | None:
        """What an engine's ``run`` takes as ``wait``: this guard when on, else None."""
        return self if self.min_replicas > 0 else None

    def require(
        self, acked: int, what: str, then: str, give_back: Callable[[], object] | None = None
    ) -> None:
        """The replication guard, the one place that raises ``NotReplicated``.

        Call it for something applied on the master that ``acked`` replicas
        confirmed: with fewer than ``min_replicas``, ``give_back`` runs (an
        acquire releases what it won) and ``NotReplicated`` is raised, saying
        ``what`` was confirmed by how many and ``then`` what follows.
        """
        if acked >= self.min_replicas:
            return
        if give_back is not None:
            give_back()
        raise NotReplicated(
            f"{what} confirmed by {acked} of the {self.min_replicas} replicas required "
            f"within {self.timeout_ms} ms; {then}",
            applied=True,
            replicas=acked,
        )

    def confirm_won(
        self,
        engine: Any,
        acked: int,
        what: str,
        then: str,
        give_back: Callable[[], object],
        within: float,
    ) -> None:
        """Confirm an acquire that won on the master (an elector's or a lock's, the one rule).

        With the guard on, ``acked`` replicas must have confirmed it
        (``require``); behind Sentinel, the sentinels must still name its
        server the master, asked within ``within`` seconds
        (``engine.confirm_master``). Unconfirmed, ``give_back`` runs (nobody
        waits a TTL for the lease) and this raises.
        """
        if self.enabled:
            self.require(acked, what, then, give_back)
        engine.confirm_master(within, give_back)

    @property
    def timeout_ms(self) -> int:
        """``replica_timeout`` as the whole milliseconds ``WAIT`` takes, rounded up.

        Never 0: ``WAIT n 0`` would block until the replicas answer, forever
        if they never do.
        """
        return wait_ms(self.replica_timeout)
