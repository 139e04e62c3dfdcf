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
