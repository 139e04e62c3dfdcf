"""A lock's arguments, checked: the name, the TTL (with auto-renewal), the wait window.

Each rule broken is a ``ConfigError`` (or ``AutoRenewTTLTooShort``) naming
the rule and the value; nothing is sent.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

from .._config import to_seconds, whole_ms
from .._errors import AutoRenewTTLTooShort, ConfigError

DEFAULT_TTL = 30.0
"""Default lease of a lock, in seconds: how long a crashed holder can block others."""

DEFAULT_RETRY_INTERVAL = 0.1
"""Default polling cadence of a waiting ``acquire``, in seconds."""

DEFAULT_WAIT = 0.0
"""Default wait window of an acquisition: a single attempt."""

MIN_AUTO_RENEW_TTL = 0.03
"""The shortest TTL (seconds) auto-renewal accepts: the watchdog refreshes at TTL/3."""


def check_name(name: object) -> str:
    if not isinstance(name, str):
        raise ConfigError(f"lock name must be a str, got {type(name).__name__} {name!r}")
    if not name:
        raise ConfigError("lock name must not be empty")
    return name


def check_ttl(ttl: object, auto_renew: object) -> int:
    if not isinstance(auto_renew, bool):
        raise ConfigError(
            f"auto_renew must be a bool, got {type(auto_renew).__name__} {auto_renew!r}"
        )
    seconds = to_seconds(ttl, "ttl")
    ms = whole_ms(seconds)
    if ms < 1:
        raise ConfigError(
            f"ttl must be at least 1 ms (Redis expires keys in whole milliseconds), got {ttl!r} s"
        )
    if auto_renew and ms < round(MIN_AUTO_RENEW_TTL * 1000):
        raise AutoRenewTTLTooShort(
            f"auto_renew needs a ttl of at least MIN_AUTO_RENEW_TTL ({MIN_AUTO_RENEW_TTL} s) "
            f"so that a refresh every ttl/3 can land in time, got {ttl!r} s"
        )
    return ms


def check_wait(wait: object) -> float:
    """A wait window: zero (one attempt), positive, or ``math.inf`` (wait until acquired)."""
    if wait is None:
        return 0.0
    if isinstance(wait, bool) or not isinstance(wait, (int, float, timedelta)):
        raise ConfigError(
            f"wait must be a duration in seconds (int or float) or a timedelta, "
            f"got {type(wait).__name__} {wait!r}"
        )
    seconds = wait.total_seconds() if isinstance(wait, timedelta) else float(wait)
    if math.isnan(seconds):
        raise ConfigError("wait must be a number of seconds, got NaN")
    if seconds < 0:
        raise ConfigError(f"wait must not be negative (0 means a single attempt), got {wait!r}")
    return seconds


def check_flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be a bool, got {type(value).__name__} {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class AcquireOptions:
    """One acquisition's settings, checked: what every face of ``acquire`` hands the store."""

    ttl_ms: int
    window: float
    interval: float
    auto_renew: bool
    fair: bool


def acquire_options(
    *,
    ttl: object = DEFAULT_TTL,
    wait: object = DEFAULT_WAIT,
    retry_interval: object = DEFAULT_RETRY_INTERVAL,
    auto_renew: object = False,
    fair: object = False,
) -> AcquireOptions:
    """The one place an acquisition's arguments are checked (lock, semaphore, both shells)."""
    ttl_ms = check_ttl(ttl, auto_renew)
    window = check_wait(wait)
    interval = to_seconds(retry_interval, "retry_interval")
    return AcquireOptions(ttl_ms, window, interval, bool(auto_renew), check_flag(fair, "fair"))
