"""A lock's arguments, checked: the name, the TTL (with auto-renewal), the wait window.

Each rule broken is a ``ConfigError`` (or ``AutoRenewTTLTooShort``) naming
the rule and the value; nothing is sent.

The parameter lists of taking a lock are written here once, as the three
functions that check them (``acquire_options``, ``attempt_options``,
``hold_options``). Every face (locker, semaphore, threaded, asyncio,
``with_lock``) takes its list from one of them (``takes``): its signature,
its defaults and its types, for people, ``help()`` and type checkers alike.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from .._config import Duration, check_max_ttl, non_negative_seconds, to_seconds, whole_ms
from .._errors import AutoRenewTTLTooShort, ConfigError

LOCK_DEFAULT_TTL = 30.0
"""Default lease of a lock (and of a semaphore's permit), in seconds: how long a crashed
holder can block others."""

DEFAULT_RETRY_INTERVAL = 0.1
"""Default polling cadence of a waiting ``acquire``, in seconds."""

DEFAULT_WAIT = 0.0
"""Default wait window of an acquisition: a single attempt."""

MIN_AUTO_RENEW_TTL = 0.03
"""The shortest TTL (seconds) auto-renewal accepts: the watchdog refreshes at TTL/3."""


def face_name(cls: type) -> str:
    """How a lock class names itself: its ``_face`` (``"aio.RedisLocker"``), else its own name."""
    face = getattr(cls, "_face", None)
    return face if isinstance(face, str) else cls.__name__


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
    ms = check_max_ttl(whole_ms(seconds), seconds)
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
    return non_negative_seconds(wait, "wait", "0 means a single attempt")


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
    ttl: Duration = LOCK_DEFAULT_TTL,
    wait: Duration = DEFAULT_WAIT,
    retry_interval: Duration = DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = False,
    fair: bool = False,
) -> AcquireOptions:
    """The one place an acquisition's arguments are checked (lock, semaphore, both shells)."""
    ttl_ms = check_ttl(ttl, auto_renew)
    window = check_wait(wait)
    interval = to_seconds(retry_interval, "retry_interval")
    return AcquireOptions(ttl_ms, window, interval, bool(auto_renew), check_flag(fair, "fair"))


def attempt_options(
    *, ttl: Duration = LOCK_DEFAULT_TTL, auto_renew: bool = False
) -> AcquireOptions:
    """``try_acquire``'s arguments: one attempt, no wait."""
    return acquire_options(ttl=ttl, auto_renew=auto_renew)


def hold_options(
    ttl: Duration = LOCK_DEFAULT_TTL,
    wait: Duration = DEFAULT_WAIT,
    retry_interval: Duration = DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = True,
) -> AcquireOptions:
    """``hold``'s and ``with_lock``'s arguments: auto-renewed unless told otherwise."""
    return acquire_options(
        ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
    )


Options = Callable[[], AcquireOptions]
"""An acquisition's arguments as given, checked when called (where the face checks them)."""

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def takes(
    spec: Callable[P, AcquireOptions],
) -> Callable[[Callable[[S, str, Options], R]], Callable[Concatenate[S, str, P], R]]:
    """A lock face's parameter list is ``spec``'s, after ``self`` and the lock's ``name``.

    The face is written ``face(self, name, options)``: ``options()`` checks
    the arguments given for ``spec``'s parameters and returns them as
    ``AcquireOptions``, so the face decides when they are checked (a
    ``hold`` on entry). Its public signature (``inspect.signature``,
    ``help()``, type checkers) is ``(self, name, <spec's parameters>)``.
    """

    def wrap(face: Callable[[S, str, Options], R]) -> Callable[Concatenate[S, str, P], R]:
        if inspect.iscoroutinefunction(face):

            async def call_async(self: S, name: str, *args: Any, **kwargs: Any) -> Any:
                return await face(self, name, _Given(spec, face, self, args, kwargs))

            return _signed(call_async, face, spec)

        def call(self: S, name: str, *args: Any, **kwargs: Any) -> R:
            return face(self, name, _Given(spec, face, self, args, kwargs))

        return _signed(call, face, spec)

    return wrap


def takes_unnamed(
    spec: Callable[P, AcquireOptions],
) -> Callable[[Callable[[S, Options], R]], Callable[Concatenate[S, P], R]]:
    """``takes`` for a face with no ``name`` parameter: a semaphore's, whose name is its own."""

    def wrap(face: Callable[[S, Options], R]) -> Callable[Concatenate[S, P], R]:
        if inspect.iscoroutinefunction(face):

            async def call_async(self: S, *args: Any, **kwargs: Any) -> Any:
                return await face(self, _Given(spec, face, self, args, kwargs))

            return _signed(call_async, face, spec)

        def call(self: S, *args: Any, **kwargs: Any) -> R:
            return face(self, _Given(spec, face, self, args, kwargs))

        return _signed(call, face, spec)

    return wrap


class _Given:
    """The arguments a face was given for ``spec``; calling it checks them (``Options``).

    A call that does not fit the parameter list is the ``TypeError`` Python
    gives, naming the method the caller called, on the public class of the
    object it was called on (``aio.RedisLocker.acquire()``), rather than ``spec``.
    """

    __slots__ = ("_args", "_face", "_kwargs", "_owner", "_spec")

    def __init__(
        self,
        spec: Callable[..., AcquireOptions],
        face: Callable[..., Any],
        owner: object,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self._spec, self._face, self._owner = spec, face, owner
        self._args, self._kwargs = args, kwargs

    def __call__(self) -> AcquireOptions:
        try:
            return self._spec(*self._args, **self._kwargs)
        except TypeError as exc:
            called = f"{face_name(type(self._owner))}.{self._face.__name__}()"
            said = str(exc).replace(f"{self._spec.__name__}()", called, 1)
            raise TypeError(said) from None


def _signed(
    call: Callable[..., Any], face: Callable[..., Any], spec: Callable[..., Any]
) -> Callable[..., Any]:
    """``call`` named and documented as ``face``, with the signature ``face``'s leading
    parameters (all but its last, ``options``) followed by ``spec``'s."""
    functools.update_wrapper(call, face)
    del call.__wrapped__  # type: ignore[attr-defined]  # the signature below is the record
    own = inspect.signature(face)
    call.__signature__ = own.replace(  # type: ignore[attr-defined]
        parameters=[
            *list(own.parameters.values())[:-1],
            *inspect.signature(spec).parameters.values(),
        ]
    )
    return call
