"""Elector settings: validated up front, with messages that name the rule broken."""

from __future__ import annotations

import math
import os
import socket
import types
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from ._engine import DEFAULT_REPLICA_TIMEOUT, MAX_TTL, ReplicationGuard
from ._engine import renew_interval as renew_interval_of
from ._errors import ConfigError

Duration = int | float | timedelta

F = TypeVar("F", bound=Callable[..., Any])

ELECTOR_DEFAULT_TTL = 5.0
"""Default lease TTL of an Elector (and of a partition member), in seconds."""

MIN_TTL = 0.1
MIN_INTERVAL = 0.001

MAX_TTL_MS = round(MAX_TTL * 1000)
"""``MAX_TTL`` (``_engine.timing``: the longest lease the engines time) in whole milliseconds."""


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


def non_negative_seconds(value: object, what: str, zero: str) -> float:
    """A wait (seconds or ``timedelta``) as float seconds, zero and infinity allowed, or
    ConfigError; ``zero`` says in the message what a zero (or None) means for it."""
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise ConfigError(
            f"{what} must be a duration in seconds (int or float) or a timedelta, "
            f"got {type(value).__name__} {value!r}"
        )
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if math.isnan(seconds):
        raise ConfigError(f"{what} must be a number of seconds, got NaN")
    if seconds < 0:
        raise ConfigError(f"{what} must not be negative ({zero}), got {value!r}")
    return seconds


def whole_ms(seconds: float) -> int:
    """Seconds as the whole milliseconds Redis applies (``PX``), truncated.

    The small epsilon keeps values like 0.3 (0.29999... in binary) at 300 ms.
    """
    return math.floor(seconds * 1000 + 1e-9)


def check_max_ttl(ttl_ms: int, seconds: float, what: str = "ttl") -> int:
    """``ttl_ms`` when the lease is at most ``MAX_TTL``; else a ConfigError saying why.

    ``seconds`` is the TTL as given, for the message. Every lease TTL (an
    elector's, a partition group's, a lock's or a semaphore's) is checked
    here, after truncation to the whole milliseconds Redis would apply.
    """
    if ttl_ms > MAX_TTL_MS:
        raise ConfigError(
            f"{what} must be at most {MAX_TTL:.0f} s (about {MAX_TTL / 86400:.1f} days, the "
            f"longest lease both engines can keep: a lease's waits, each up to its ttl, are "
            f"timed in 32-bit milliseconds), got {seconds!r} s"
        )
    return ttl_ms


def named_for(function: F, qualname: str) -> F:
    """A copy of ``function`` (same code, defaults, signature) under the ``__qualname__`` given.

    Python names a function's qualified name in the ``TypeError`` of a call
    that does not fit its parameters (an unknown keyword, a missing
    argument). A parameter list written once on a shared base would then
    name the base (``ElectorShell.__init__()``); each public class gets a
    copy named for itself (``aio.Elector.__init__()``).
    """
    copy = types.FunctionType(
        function.__code__,
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__annotations__ = function.__annotations__
    copy.__doc__ = function.__doc__
    copy.__module__ = function.__module__
    copy.__dict__.update(function.__dict__)
    copy.__qualname__ = qualname
    return copy  # type: ignore[return-value]


def default_instance_id() -> str:
    """hostname + "-" + 16 random hex digits: unique per live process."""
    return f"{socket.gethostname()}-{os.urandom(8).hex()}"


def whole_number(value: object, what: str, least: int, meaning: str) -> int:
    """``value`` as an int of at least ``least``: a ConfigError naming the rule and the value.

    ``meaning`` says what the number counts, for the message. A bool is not a
    number here (``True`` is an int to Python, never to a person).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{what} must be a whole number (int) of at least {least} ({meaning}), "
            f"got {type(value).__name__} {value!r}"
        )
    if value < least:
        raise ConfigError(f"{what} must be at least {least} ({meaning}), got {value!r}")
    return value


def replication_guard(min_replicas: object = 0, replica_timeout: object = None) -> ReplicationGuard:
    """Validate the replication guard's settings: ConfigError naming the rule and the value."""
    replicas = whole_number(
        min_replicas, "min_replicas", 0, "replicas that must confirm each acquire and fenced write"
    )
    timeout = (
        DEFAULT_REPLICA_TIMEOUT
        if replica_timeout is None
        else to_seconds(replica_timeout, "replica_timeout")
    )
    return ReplicationGuard(replicas, timeout)


_NO_GUARD = ReplicationGuard()


_SHARED_SECONDS: dict[float, float] = {}
_SHARED_SECONDS_MAX = 256


def shared_seconds(value: float) -> float:
    """``value``, as the one float object of that value every ``Config`` holds.

    A process with a million electors of the same settings holds three
    durations once, not three floats per elector. Only floats, and only the
    first few hundred values seen: past those, each keeps its own.
    """
    if type(value) is not float:
        return value
    shared = _SHARED_SECONDS.get(value)
    if shared is None:
        if len(_SHARED_SECONDS) >= _SHARED_SECONDS_MAX:
            return value
        shared = _SHARED_SECONDS.setdefault(value, value)
    return shared


@dataclass(frozen=True, slots=True)
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
        if self.min_replicas == 0 and self.replica_timeout == _NO_GUARD.replica_timeout:
            return _NO_GUARD  # the common case, shared
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

        raw_ttl = ELECTOR_DEFAULT_TTL if ttl is None else to_seconds(ttl, "ttl")
        ttl_ms = check_max_ttl(whole_ms(raw_ttl), raw_ttl)
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

        guard = replication_guard(min_replicas, replica_timeout)
        if guard.enabled and guard.replica_timeout >= ttl_s:
            raise ConfigError(
                f"replica_timeout must be less than ttl ({ttl_s!r} s) so a confirmed acquire "
                f"still has a lease to lead on, got {guard.replica_timeout!r} s"
            )
        return cls(
            name,
            shared_seconds(ttl_s),
            shared_seconds(renew),
            shared_seconds(acquire),
            ident,
            guard.min_replicas,
            guard.replica_timeout,
        )
