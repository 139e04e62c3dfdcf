"""Elector settings: validated up front, with messages that name the rule broken."""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ._errors import ConfigError, NotReplicated
from ._timing import DEFAULT_REPLICA_TIMEOUT, wait_ms
from ._timing import renew_interval as renew_interval_of

Duration = int | float | timedelta

DEFAULT_TTL = 5.0
"""Default lease TTL of an Elector, in seconds."""

MIN_TTL = 0.1
MIN_INTERVAL = 0.001


def to_seconds(value: object, what: str) -> float:
    """A duration (seconds or ``timedelta``) as float seconds, or ConfigError.

    Rejects bools, NaN, infinities, zero and negative values: each is a
    mistake, never a meaningful duration.
    """
    if isinstance(value, bool):
        raise ConfigError(
            f"{what} must be a duration in seconds or a timedelta, not a bool ({value!r})"
        )
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        raise ConfigError(
            f"{what} must be a duration in seconds (int or float) or a timedelta, "
            f"got {type(value).__name__} {value!r}"
        )
    if math.isnan(seconds):
        raise ConfigError(f"{what} must be a number of seconds, got NaN")
    if math.isinf(seconds):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    if seconds <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}")
    return seconds


def whole_ms(seconds: float) -> int:
    """Seconds as the whole milliseconds Redis applies (``PX``), truncated.

    The small epsilon keeps values like 0.3 (0.29999... in binary) at 300 ms.
    """
    return math.floor(seconds * 1000 + 1e-9)


def default_instance_id() -> str:
    """hostname + "-" + 16 random hex digits: unique per live process."""
    return f"{socket.gethostname()}-{os.urandom(8).hex()}"


@dataclass(frozen=True)
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

    @classmethod
    def resolve(cls, min_replicas: object = 0, replica_timeout: object = None) -> ReplicationGuard:
        """Validate the guard's settings: ConfigError naming the rule and the value."""
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
            raise ConfigError(
                f"min_replicas must be an int (replicas that must confirm each acquire and "
                f"fenced write), got {type(min_replicas).__name__} {min_replicas!r}"
            )
        if min_replicas < 0:
            raise ConfigError(f"min_replicas must be 0 or more, got {min_replicas!r}")
        timeout = (
            DEFAULT_REPLICA_TIMEOUT
            if replica_timeout is None
            else to_seconds(replica_timeout, "replica_timeout")
        )
        return cls(min_replicas, timeout)


@dataclass(frozen=True)
class Config:
    """The validated, resolved settings of an Elector (durations in float seconds).

    ``ttl`` is the value after truncation to whole milliseconds, which is what
    Redis applies (``PX``).
    """

    name: str
    ttl: float
    renew_interval: float
    acquire_interval: float
    instance_id: str
    min_replicas: int = 0
    replica_timeout: float = DEFAULT_REPLICA_TIMEOUT

    @property
    def guard(self) -> ReplicationGuard:
        """The replication guard these settings ask for."""
        return ReplicationGuard(self.min_replicas, self.replica_timeout)

    @property
    def ttl_ms(self) -> int:
        """The lease TTL in whole milliseconds, as sent to Redis."""
        return round(self.ttl * 1000)

    @classmethod
    def resolve(
        cls,
        name: object,
        *,
        ttl: Duration | None = None,
        renew_interval: Duration | None = None,
        acquire_interval: Duration | None = None,
        instance_id: object = None,
        min_replicas: object = 0,
        replica_timeout: object = None,
    ) -> Config:
        """Validate the user's settings and fill in the defaults."""
        if not isinstance(name, str):
            raise ConfigError(f"name must be a str, got {type(name).__name__} {name!r}")
        if not name:
            raise ConfigError("name must not be empty")

        raw_ttl = DEFAULT_TTL if ttl is None else to_seconds(ttl, "ttl")
        ttl_ms = whole_ms(raw_ttl)
        ttl_s = ttl_ms / 1000
        if ttl_s < MIN_TTL:
            raise ConfigError(
                f"ttl must be at least {MIN_TTL} s after truncation to whole milliseconds "
                f"(so a renewal can complete before expiry), got {raw_ttl!r} s"
            )

        renew = (
            renew_interval_of(ttl_s)
            if renew_interval is None
            else to_seconds(renew_interval, "renew_interval")
        )
        if renew < MIN_INTERVAL:
            raise ConfigError(f"renew_interval must be at least 1 ms, got {renew!r} s")
        if renew > ttl_s / 2:
            raise ConfigError(
                f"renew_interval must be at most ttl/2 ({ttl_s / 2!r} s) so two renewals fit "
                f"in one lease, got {renew!r} s"
            )

        acquire = (
            ttl_s / 2
            if acquire_interval is None
            else to_seconds(acquire_interval, "acquire_interval")
        )
        if acquire < MIN_INTERVAL:
            raise ConfigError(f"acquire_interval must be at least 1 ms, got {acquire!r} s")
        if acquire >= ttl_s:
            raise ConfigError(
                f"acquire_interval must be less than ttl ({ttl_s!r} s) so a follower polls at "
                f"least once per lease, got {acquire!r} s"
            )

        if instance_id is None:
            ident = default_instance_id()
        elif not isinstance(instance_id, str):
            raise ConfigError(
                f"instance_id must be a str, got {type(instance_id).__name__} {instance_id!r}"
            )
        elif not instance_id:
            raise ConfigError("instance_id must not be empty (pass None to generate one)")
        else:
            ident = instance_id

        guard = ReplicationGuard.resolve(min_replicas, replica_timeout)
        if guard.enabled and guard.replica_timeout >= ttl_s:
            raise ConfigError(
                f"replica_timeout must be less than ttl ({ttl_s!r} s) so a confirmed acquire "
                f"still has a lease to lead on, got {guard.replica_timeout!r} s"
            )
        return cls(
            name, ttl_s, renew, acquire, ident, guard.min_replicas, guard.replica_timeout
        )
