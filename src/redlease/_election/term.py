"""Observer and Term: what a run tells its caller, and one term of leadership."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from .._engine import ForkSafeLock

Reason = Literal["lost", "returned", "resigned", "stopped"]


@dataclass(frozen=True)
class Observer:
    """Optional callbacks on leadership transitions; a None field is not called.

    - ``on_elected(token)``: this instance won a term; fires before the leader
      function starts.
    - ``on_stepped_down()``: the term ended; fires after the leader function
      returned and the release was tried.
    - ``on_follower()``: an acquire found the lock held by another instance;
      once per transition into the follower role, not on every retry.
    - ``on_error(exc)``: a Redis error during acquire, renewal or release, as
      the redis-py exception it was, or ``redlease.NotReplicated`` for an
      acquire too few replicas confirmed (``min_replicas``). Already handled (retried, backed off or
      stepped down from): for logs and metrics, never requires action.
    - ``on_new_leader(instance_id)``: the run observed a different holder of
      the lease than it last observed (this instance included), in the order
      observed; the first observation of a run counts as a change.

    Callbacks run on the run thread and must not block. An exception from a
    callback neither kills the elector nor ends the term: it is passed to
    ``on_error`` (or, from ``on_error`` itself, to ``sys.unraisablehook``).
    """

    on_elected: Callable[[int], object] | None = None
    on_stepped_down: Callable[[], object] | None = None
    on_follower: Callable[[], object] | None = None
    on_error: Callable[[Exception], object] | None = None
    on_new_leader: Callable[[str], object] | None = None


@dataclass(frozen=True)
class Leader:
    """Who holds an election's lease, as Redis said at the moment of asking.

    ``instance_id`` is the holder's identity (the lease's value) and
    ``ttl_ms`` the lease's remaining time in milliseconds. A snapshot: the
    holder may resign or lose the lease right after.
    """

    instance_id: str
    ttl_ms: int


class Once:
    """``threading.Event``'s ``set``/``is_set``/``wait`` for something that happens once.

    A held lock released once, and made only when somebody waits before it
    happened (a run stopped from the thread that ends it never needs one):
    a fraction of an Event's memory, which counts with thousands of runs.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock: threading.Lock | None = None
        self._set = False

    def set(self) -> None:
        with _ONCE:
            if self._set:
                return
            self._set = True
            lock = self._lock
        if lock is not None:
            lock.release()  # once: every waiter releases it again after taking it

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True  # set once, never unset: no lock to ask
        with _ONCE:
            if self._set:
                return True
            lock = self._lock
            if lock is None:
                lock = self._lock = threading.Lock()
                lock.acquire()  # held until set()
        if lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
            lock.release()
            return True
        return self._set


class Term:
    """One leadership term: its fencing token, and whether and why it ended.

    ``reason`` is None while the term is active, then one of ``"lost"``
    (the lease could not be kept), ``"returned"`` (the leader function
    returned or raised), ``"resigned"`` (``Elector.resign()``) or
    ``"stopped"`` (the run was stopped).
    """

    # What a waiter waits on and the callbacks are made only when somebody
    # waits or watches (a token-driven term has neither), under one lock for
    # every term: a term ends once, and 100,000 terms should not cost a lock each.
    __slots__ = ("_callbacks", "_ended", "_reason", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self._ended: Once | None = None
        self._reason: Reason | None = None
        self._callbacks: list[Callable[[], object]] | None = None

    @property
    def reason(self) -> Reason | None:
        """Why the term ended, or None while it is active."""
        return self._reason

    def ended(self) -> bool:
        """True once the term has ended: stop working for it."""
        return self._reason is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the term ends or ``timeout`` passes; True once it has ended."""
        with _TERMS:
            if self._reason is not None:
                return True
            ended = self._ended
            if ended is None:
                ended = self._ended = Once()
        return ended.wait(timeout)

    def _end(self, reason: Reason) -> None:
        with _TERMS:
            if self._reason is None:
                self._reason = reason
            ended = self._ended
            callbacks, self._callbacks = self._callbacks, None
        if ended is not None:
            ended.set()
        for callback in callbacks or ():
            callback()

    def _on_end(self, callback: Callable[[], object]) -> None:
        with _TERMS:
            if self._reason is None:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    def __repr__(self) -> str:
        state = self._reason or "active"
        return f"<redlease.Term token={self.token} {state}>"


_TERMS = ForkSafeLock()
_ONCE = ForkSafeLock()  # every Once's: held for a moment, never across a wait

# The run loop and the shells end terms and watch them through these two
# functions: the internal API of a Term, kept off its public surface.


def end_term(term: Term, reason: Reason) -> None:
    """End ``term`` with ``reason`` (the first reason given sticks) and run its callbacks."""
    term._end(reason)


def when_ended(term: Term, callback: Callable[[], object]) -> None:
    """Call ``callback`` once ``term`` ends (at once, here, if it already has)."""
    term._on_end(callback)


def tell_on_error(callback: Callable[[Exception], object] | None, exc: Exception) -> None:
    """Hand ``exc`` to an ``Observer.on_error`` callback; what that raises goes to
    ``sys.unraisablehook`` (an error handler's error has nowhere else to go)."""
    if callback is None:
        return
    try:
        callback(exc)
    except Exception as hook_exc:
        sys.unraisablehook(
            _Unraisable(hook_exc, "Exception ignored in redlease Observer.on_error", callback)
        )


class _Unraisable:
    """The shape ``sys.unraisablehook`` expects."""

    def __init__(self, exc: BaseException, message: str, obj: object) -> None:
        self.exc_type: type[BaseException] = type(exc)
        self.exc_value: BaseException | None = exc
        self.exc_traceback: TracebackType | None = exc.__traceback__
        self.err_msg: str | None = message
        self.object: object = obj
