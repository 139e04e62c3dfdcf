"""The library's own exception types.

Redis failures are never wrapped: they surface as redis-py's own exceptions
(``ResponseError``, ``ConnectionError``, ``TimeoutError``) on every engine.
"""

from __future__ import annotations


class RedleaseError(Exception):
    """Base class of every error this library raises itself."""


class ConfigError(RedleaseError, ValueError):
    """A setting broke a validation rule; the message names the rule and the value."""


class TooManyEvalBodies(RedleaseError):
    """More distinct ``fence_eval`` bodies than one Elector caches (256).

    A caller bug, not a transient error: keep bodies constant and pass variable
    data through ``keys`` and ``args``. Bodies already cached keep working.
    """


class NotAcquired(RedleaseError):
    """The lock is held by someone else (and the wait window, if any, ran out)."""


class NotHeld(RedleaseError):
    """The lease expired, was already released, or was taken over by another holder."""


class AutoRenewTTLTooShort(RedleaseError, ValueError):
    """Auto-renewal was requested with a TTL below ``MIN_AUTO_RENEW_TTL``."""


class NotReplicated(RedleaseError):
    """Fewer replicas than ``min_replicas`` confirmed an acquire or a fenced write in time.

    ``WAIT`` answered with ``replicas`` acknowledgements after
    ``replica_timeout``. ``applied`` says whether the server took the command
    itself: a fenced write with ``applied=True`` *is* on the master (and on
    ``replicas`` replicas); it is not undone, and a failover now could lose
    it. An acquire that was not confirmed is released again before this is
    reported, so no term starts and no lock is returned.
    """

    def __init__(self, message: str, *, applied: bool, replicas: int) -> None:
        super().__init__(message)
        self.applied = applied
        self.replicas = replicas

    def __reduce__(self) -> tuple[object, ...]:
        return _not_replicated, (str(self), self.applied, self.replicas)


def _not_replicated(message: str, applied: bool, replicas: int) -> NotReplicated:
    return NotReplicated(message, applied=applied, replicas=replicas)
