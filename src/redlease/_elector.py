"""The Elector: contend, lead, hold, release — and the fenced writes of a term."""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from . import _scripts
from ._config import Config, Duration
from ._engine import ACTIVE, EncodableT, Engine, Keeper, is_cluster, make_engine
from ._errors import ConfigError, TooManyEvalBodies

MAX_EVAL_BODIES = 256
"""Distinct ``fence_eval`` bodies one Elector caches before TooManyEvalBodies."""

MAX_TOKEN = 2**53
"""Tokens at or above this cannot be compared exactly by Redis' Lua (doubles)."""

# How often a waiting run thread looks at a caller's stop event: a plain
# threading.Event cannot wake anybody, so it is polled at this period.
_STOP_POLL = 0.05

_ACQUIRE = _scripts.load("acquire")
_RENEW = _scripts.load("renew")
_RELEASE = _scripts.load("release")
_FENCE_SET = _scripts.fenced_file("fence_set")
_FENCE_HSET = _scripts.fenced_file("fence_hset")

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
      the redis-py exception it was. Already handled (retried, backed off or
      stepped down from): for logs and metrics, never requires action.

    Callbacks run on the run thread and must not block. An exception from a
    callback neither kills the elector nor ends the term: it is passed to
    ``on_error`` (or, from ``on_error`` itself, to ``sys.unraisablehook``).
    """

    on_elected: Callable[[int], object] | None = None
    on_stepped_down: Callable[[], object] | None = None
    on_follower: Callable[[], object] | None = None
    on_error: Callable[[Exception], object] | None = None


class Term:
    """One leadership term: its fencing token, and whether and why it ended.

    ``reason`` is None while the term is active, then one of ``"lost"``
    (the lease could not be kept), ``"returned"`` (the leader function
    returned or raised), ``"resigned"`` (``Elector.resign()``) or
    ``"stopped"`` (the run was stopped).
    """

    __slots__ = ("_callbacks", "_ended", "_guard", "_reason", "token")

    def __init__(self, token: int) -> None:
        self.token = token
        self._ended = threading.Event()
        self._reason: Reason | None = None
        self._guard = threading.Lock()
        self._callbacks: list[Callable[[], object]] = []

    @property
    def reason(self) -> Reason | None:
        """Why the term ended, or None while it is active."""
        return self._reason

    def ended(self) -> bool:
        """True once the term has ended: stop working for it."""
        return self._ended.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the term ends or ``timeout`` passes; True once it has ended."""
        return self._ended.wait(timeout)

    def _end(self, reason: Reason) -> None:
        with self._guard:
            if self._reason is None:
                self._reason = reason
            self._ended.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def _on_end(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once the term ends (at once if it already has)."""
        with self._guard:
            if not self._ended.is_set():
                self._callbacks.append(callback)
                return
        callback()

    def __repr__(self) -> str:
        state = self._reason or "active"
        return f"<redlease.Term token={self.token} {state}>"


def check_token(token: object) -> int:
    """A fencing token as an int: TypeError for non-ints (bools included),
    ValueError at or above 2**53, where Redis' comparison stops being exact."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, got {type(token).__name__} {token!r}")
    if token >= MAX_TOKEN:
        raise ValueError(
            f"fencing token must be below 2**53 (Redis compares tokens as doubles), got {token}"
        )
    return token


def _check_key(key: object, what: str = "key") -> str | bytes:
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"{what} must be str or bytes, got {type(key).__name__} {key!r}")
    return key


def _check_value(value: object, what: str = "value") -> EncodableT:
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
        raise TypeError(
            f"{what} must be str, bytes, int or float, got {type(value).__name__} {value!r}"
        )
    return value


class Fencer:
    """A term's fencing token bound to the Elector that minted it.

    Every write applies only when the token is at least the fence high-water
    mark, checked and written in one atomic script, and returns ``applied``:
    False means the token is stale (a newer term was elected or has written)
    and the caller should stop. All writes share one mark. A Fencer with token
    0 is inert: falsy, and every write is rejected.
    """

    __slots__ = ("_elector", "token")

    def __init__(self, elector: Elector, token: int) -> None:
        if not isinstance(elector, Elector):
            raise TypeError(f"elector must be a redlease.Elector, got {type(elector).__name__}")
        self._elector = elector
        self.token = check_token(token)

    def set(self, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``; see ``Elector.fence_set``."""
        return self._elector.fence_set(self.token, key, value)

    def hset(self, key: str | bytes, field: str | bytes, value: EncodableT) -> bool:
        """Fenced ``HSET key field value``; see ``Elector.fence_hset``."""
        return self._elector.fence_hset(self.token, key, field, value)

    def eval(
        self,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fenced Lua write; see ``Elector.fence_eval``."""
        return self._elector.fence_eval(self.token, body, keys, args)

    def __bool__(self) -> bool:
        return self.token > 0

    def __repr__(self) -> str:
        return f"<redlease.Fencer {self._elector.config.name!r} token={self.token}>"


def _check_leader_fn(fn: object) -> None:
    if fn is not None and not callable(fn):
        raise TypeError(
            f"the leader function must be callable as fn(term, fencer) or None, "
            f"got {type(fn).__name__} {fn!r}"
        )


def _has_hash_tag(name: str) -> bool:
    start = name.find("{")
    if start < 0:
        return False
    end = name.find("}", start + 1)
    return end > start + 1


class _RunState:
    """What one run shares between its thread and the Elector's other methods."""

    def __init__(self, stop: threading.Event, keeper: Keeper) -> None:
        self.user_stop = stop
        self.stopping = threading.Event()
        self.keeper = keeper
        self.term: Term | None = None
        self.resign_requested = False
        self.done = threading.Event()
        self.error: BaseException | None = None
        # The threads that must never wait for the run to end: the run thread
        # (observer callbacks) and the leader function's thread. Waiting there
        # would wait for themselves.
        self.own_threads: set[threading.Thread] = set()

    def should_stop(self) -> bool:
        return self.stopping.is_set() or self.user_stop.is_set()


class Elector:
    """Lease-based leader election on Redis, with a fencing token per term.

    One instance at a time holds ``<name>:leader`` with a TTL and runs the
    caller's work while it leads; if it cannot renew within the TTL it steps
    down so another instance takes over. Every term gets a strictly greater
    fencing token, and the ``fence_*`` writes reject any token below the
    newest elected term or applied write, so a paused or partitioned leader
    that still believes it leads cannot overwrite newer state.

    The lease is renewed by the engine's keeper: on the native engine a
    native thread that never waits for the GIL. ``is_leader()`` is advisory;
    carry the token through a fenced write for anything that must be safe.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        ttl: Duration | None = None,
        renew_interval: Duration | None = None,
        acquire_interval: Duration | None = None,
        instance_id: str | None = None,
        observer: Observer | None = None,
        engine: str | None = "auto",
    ) -> None:
        if client is None:
            raise ConfigError(
                "client must be a redis client (redis.Redis, RedisCluster, ...), got None"
            )
        self.config = Config.resolve(
            name,
            ttl=ttl,
            renew_interval=renew_interval,
            acquire_interval=acquire_interval,
            instance_id=instance_id,
        )
        if is_cluster(client) and not _has_hash_tag(self.config.name):
            raise ConfigError(
                f"with a RedisCluster client the name needs a hash tag so its keys share one "
                f"slot, e.g. '{{{self.config.name}}}'; got {self.config.name!r}"
            )
        if observer is not None and not isinstance(observer, Observer):
            raise ConfigError(
                f"observer must be a redlease.Observer, got {type(observer).__name__}"
            )
        self._engine: Engine = make_engine(client, engine)
        self._observer = observer or Observer()
        name = self.config.name
        self._lock_key = f"{name}:leader"
        self._fence_key = f"{name}:fence"
        self._applied_key = f"{name}:fence:applied"
        self._mutex = threading.Lock()
        self._run: _RunState | None = None
        self._thread: threading.Thread | None = None
        self._started: _RunState | None = None
        self._eval_scripts: dict[str, _scripts.Script] = {}
        _live_electors.add(self)

    # -- identity -----------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This elector's identity: the lock's value while it leads."""
        return self.config.instance_id

    @property
    def engine(self) -> str:
        """The engine that runs this elector: ``"native"`` or ``"python"``."""
        return self._engine.name

    def __repr__(self) -> str:
        return (
            f"<redlease.Elector {self.config.name!r} id={self.instance_id!r} "
            f"engine={self.engine} token={self.token()}>"
        )

    # -- leadership state -----------------------------------------------------

    def token(self) -> int | None:
        """The current term's fencing token while this instance leads, else None.

        A snapshot: leadership can change right after. Acting on it is safe
        because a stale token is rejected by the fenced writes.
        """
        run = self._run
        token = run.keeper.token if run is not None else 0
        return token or None

    def is_leader(self) -> bool:
        """Whether this instance leads right now. Advisory: never gate a write on it."""
        return self.token() is not None

    def fencer(self) -> Fencer:
        """A Fencer for the current term, or an inert one (token 0) when not leading."""
        return Fencer(self, self.token() or 0)

    def renew_lateness(self) -> list[float]:
        """How late each renewal of the current run was sent, in seconds, oldest first.

        Measured by the keeper itself: the time between a renewal's scheduled
        moment and its send. Read-only figures for benchmarks and monitoring;
        empty when the elector is not running. The keeper keeps the most
        recent samples only (tens of thousands).
        """
        run = self._run
        return run.keeper.lateness() if run is not None else []

    def resign(self) -> None:
        """End the current term (lock released); the run re-contends. No-op when not leading."""
        run = self._run
        if run is not None and run.term is not None and not run.term.ended():
            run.resign_requested = True
            run.keeper.notify()

    # -- running --------------------------------------------------------------

    def run(
        self,
        fn: Callable[[Term, Fencer], object] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        """Contend for leadership until ``stop`` is set.

        Each time this instance wins, ``fn(term, fencer)`` runs on its own
        thread; the term ends when leadership is lost, fn returns, ``resign()``
        is called or the run is stopped, and the run does not release or
        re-contend until fn has returned. With ``fn=None`` the run only keeps
        this instance elected (token-driven style). An exception from fn ends
        the term gracefully and the run: it is re-raised here, unchanged.
        """
        _check_leader_fn(fn)
        if stop is None:
            stop = threading.Event()
        elif not isinstance(stop, threading.Event):
            raise TypeError(f"stop must be a threading.Event, got {type(stop).__name__}")
        run = self._claim(stop)
        if run is None:
            return
        self._execute(run, fn)
        if run.error is not None:
            raise run.error

    def start(self, fn: Callable[[Term, Fencer], object] | None = None) -> Elector:
        """Run the same loop on a background thread; returns this elector."""
        _check_leader_fn(fn)
        run = self._claim(threading.Event())
        assert run is not None
        thread = threading.Thread(
            target=self._execute,
            args=(run, fn),
            name=f"redlease-run-{self.config.name}",
            daemon=True,
        )
        self._thread, self._started = thread, run
        thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """End the run: the term ends, the lock is released, the thread joined.

        Re-raises the leader function's exception when that is what ended a
        run started with ``start()``. No-op when nothing runs.
        """
        run = self._run
        if run is not None:
            run.stopping.set()
            run.keeper.notify()
            if threading.current_thread() in run.own_threads:
                # Called by the leader function or a callback: the run ends as
                # soon as that returns; waiting here would wait for ourselves.
                return
        thread, started = self._thread, self._started
        if thread is None or started is None:
            if run is not None:
                run.done.wait(timeout)
            return
        if thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            return
        self._thread = self._started = None
        if started.error is not None:
            error, started.error = started.error, None
            raise error

    def __enter__(self) -> Elector:
        if self._thread is None:
            self.start(None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _claim(self, stop: threading.Event) -> _RunState | None:
        with self._mutex:
            if self._run is not None:
                raise RuntimeError(
                    f"Elector {self.config.name!r} is already running; one run at a time per "
                    "Elector (use one Elector per concurrent run)"
                )
            if stop.is_set():
                return None
            keeper = self._engine.keeper(
                _RENEW,
                (self._lock_key,),
                (self.instance_id, self.config.ttl_ms),
                interval=self.config.renew_interval,
                ttl=self.config.ttl,
            )
            run = _RunState(stop, keeper)
            self._run = run
        return run

    def _execute(self, run: _RunState, fn: Callable[[Term, Fencer], object] | None) -> None:
        run.own_threads.add(threading.current_thread())
        try:
            self._contend(run, fn)
        except BaseException as exc:
            run.error = exc
        finally:
            run.keeper.close()
            with self._mutex:
                self._run = None
            run.done.set()

    # -- the loop: contend, lead, hold, release -----------------------------------

    def _contend(self, run: _RunState, fn: Callable[[Term, Fencer], object] | None) -> None:
        cfg = self.config
        errors_in_row = 0
        follower = False
        while not run.should_stop():
            sent = time.monotonic()
            try:
                token, pttl_ms = self._acquire()
            except Exception as exc:
                # Redis errors above all, but anything that fails an acquire
                # (a malformed reply, a broken connection class) is handled
                # the same way: reported, backed off, retried. The run thread
                # never dies of it silently.
                self._report(exc)
                errors_in_row += 1
                self._sleep(run, min(cfg.acquire_interval * 2**errors_in_row, cfg.ttl))
                continue
            errors_in_row = 0
            if token == 0:
                if not follower:
                    follower = True
                    self._emit(self._observer.on_follower)
                self._sleep(run, self._poll_delay(pttl_ms))
                continue
            follower = False
            self._lead(run, fn, token, sent)
            if run.error is not None:
                return
            self._sleep(run, self._jittered(cfg.acquire_interval))

    def _acquire(self) -> tuple[int, int]:
        reply = self._engine.call(
            _ACQUIRE,
            (self._lock_key, self._fence_key, self._applied_key),
            (self.instance_id, self.config.ttl_ms),
            self.config.renew_interval,
        )
        return int(reply[0]), int(reply[1])

    def _poll_delay(self, pttl_ms: int) -> float:
        delay = self._jittered(self.config.acquire_interval)
        if pttl_ms >= 0:
            # Wake when the holder's lease runs out rather than up to one
            # interval later: failover is as fast as the TTL allows.
            delay = min(delay, pttl_ms / 1000 + 0.001)
        return delay

    @staticmethod
    def _jittered(interval: float) -> float:
        # Downward only, up to 10%: contenders that started together spread
        # out, and nobody polls less often than configured.
        return interval * (1 - 0.1 * random.random())

    def _lead(
        self,
        run: _RunState,
        fn: Callable[[Term, Fencer], object] | None,
        token: int,
        acquired_at: float,
    ) -> None:
        keeper = run.keeper
        keeper.begin(token, acquired_at)
        term = Term(token)
        run.resign_requested = False
        run.term = term
        self._emit(self._observer.on_elected, token)
        worker = None
        if fn is not None:
            worker = _LeaderThread(fn, term, Fencer(self, token), keeper)
            run.own_threads.add(worker.thread)
            worker.thread.start()
        reason = self._hold(run, term, worker)
        keeper.end()
        term._end(reason)
        self._drain(keeper)
        if worker is not None:
            worker.join()
            run.own_threads.discard(worker.thread)
        if reason != "lost":
            self._release()
        run.term = None
        self._emit(self._observer.on_stepped_down)
        if worker is not None and worker.error is not None:
            run.error = worker.error

    def _hold(self, run: _RunState, term: Term, worker: _LeaderThread | None) -> Reason:
        keeper = run.keeper
        while True:
            self._drain(keeper)
            if keeper.state != ACTIVE:
                return "lost"
            if worker is not None and worker.finished:
                return "returned"
            if run.resign_requested:
                return "resigned"
            if run.should_stop():
                return "stopped"
            keeper.wait(_STOP_POLL)

    def _release(self) -> None:
        try:
            self._engine.call(
                _RELEASE, (self._lock_key,), (self.instance_id,), self.config.renew_interval
            )
        except Exception as exc:  # as in _contend: reported, never fatal
            self._report(exc)

    def _sleep(self, run: _RunState, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not run.should_stop():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            run.keeper.wait(min(remaining, _STOP_POLL))

    # -- observer plumbing --------------------------------------------------------------

    def _drain(self, keeper: Keeper) -> None:
        for exc in keeper.pop_errors():
            self._report(exc)

    def _report(self, exc: Exception) -> None:
        callback = self._observer.on_error
        if callback is None:
            return
        try:
            callback(exc)
        except Exception as hook_exc:
            sys.unraisablehook(
                _Unraisable(hook_exc, "Exception ignored in redlease Observer.on_error", callback)
            )

    def _emit(self, callback: Callable[..., object] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:
            self._report(exc)

    # -- fenced writes -----------------------------------------------------------------

    def fence_set(self, token: int, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``: applied only when ``token`` is current.

        Returns True when applied, False when the token is stale (below the
        newest elected term or applied write) or not positive. The check and
        the write are one atomic script; an applied write advances the fence
        high-water mark to ``token``. Works whether or not this elector runs.
        """
        return self._write(self._set_request(token, key, value))

    def fence_hset(
        self, token: int, key: str | bytes, field: str | bytes, value: EncodableT
    ) -> bool:
        """Fenced ``HSET key field value``; semantics as ``fence_set``."""
        return self._write(self._hset_request(token, key, field, value))

    def fence_eval(
        self,
        token: int,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fence an arbitrary Lua write (ZADD, XADD, multi-key, ...).

        The body runs atomically after the token check and before the mark
        advances; it must not ``return``. KEYS[1]/ARGV[1] are the fence's own:
        address your keys and args from index 2. Keep bodies constant (pass
        data through keys/args): at most 256 distinct bodies are cached per
        Elector, and the 257th raises TooManyEvalBodies. A body that errors
        raises ResponseError and does not move the mark.
        """
        return self._write(self._eval_request(token, body, keys, args))

    # Each fenced write is validated into a request first, so the threaded and
    # the asyncio front ends share every check and differ only in the I/O.

    def _set_request(self, token: object, key: object, value: object) -> FenceRequest | None:
        return self._request(_FENCE_SET, token, (_check_key(key),), (_check_value(value),))

    def _hset_request(
        self, token: object, key: object, field: object, value: object
    ) -> FenceRequest | None:
        return self._request(
            _FENCE_HSET,
            token,
            (_check_key(key),),
            (_check_value(field, "field"), _check_value(value)),
        )

    def _eval_request(
        self, token: object, body: object, keys: object, args: object
    ) -> FenceRequest | None:
        check_token(token)
        if not isinstance(body, str):
            raise TypeError(f"body must be a str of Lua, got {type(body).__name__}")
        if not isinstance(keys, Sequence) or isinstance(keys, (str, bytes)):
            raise TypeError(f"keys must be a sequence of str/bytes, got {type(keys).__name__}")
        if not isinstance(args, Sequence) or isinstance(args, (str, bytes)):
            raise TypeError(f"args must be a sequence of values, got {type(args).__name__}")
        checked_keys = tuple(_check_key(k, "each key") for k in keys)
        checked_args = tuple(_check_value(a, "each arg") for a in args)
        return self._request(self._eval_script(body), token, checked_keys, checked_args)

    def _eval_script(self, body: str) -> _scripts.Script:
        with self._mutex:
            script = self._eval_scripts.get(body)
            if script is None:
                if len(self._eval_scripts) >= MAX_EVAL_BODIES:
                    raise TooManyEvalBodies(
                        f"more than {MAX_EVAL_BODIES} distinct fence_eval bodies on Elector "
                        f"{self.config.name!r}; keep bodies constant and pass variable data "
                        "through keys and args"
                    )
                script = _scripts.fenced("fence_eval", body)
                self._eval_scripts[body] = script
        return script

    def _request(
        self,
        script: _scripts.Script,
        token: object,
        keys: tuple[str | bytes, ...],
        args: tuple[EncodableT, ...],
    ) -> FenceRequest | None:
        """The script, keys and args of a fenced write; None when the token can never write."""
        checked = check_token(token)
        if checked < 1:
            return None  # the inert and non-positive tokens never write
        return script, (self._applied_key, *keys), (str(checked), *args)

    def _write(self, request: FenceRequest | None) -> bool:
        if request is None:
            return False
        return bool(self._engine.write(*request) == 1)


FenceRequest = tuple[_scripts.Script, tuple["str | bytes", ...], tuple[EncodableT, ...]]


_live_electors: weakref.WeakSet[Elector] = weakref.WeakSet()


def _forget_runs_after_fork() -> None:
    # A forked child has none of the parent's threads and must never act on
    # the parent's lease: its electors are simply not running.
    for elector in list(_live_electors):
        elector._mutex = threading.Lock()
        elector._run = elector._started = None
        elector._thread = None


os.register_at_fork(after_in_child=_forget_runs_after_fork)


class _LeaderThread:
    """The leader function on a thread of its own; wakes the run when fn returns."""

    def __init__(
        self,
        fn: Callable[[Term, Fencer], object],
        term: Term,
        fencer: Fencer,
        keeper: Keeper,
    ) -> None:
        self.error: BaseException | None = None
        self.finished = False
        self._fn = fn
        self._term = term
        self._fencer = fencer
        self._keeper = keeper
        self.thread = threading.Thread(
            target=self._main, name=f"redlease-leader-{term.token}", daemon=True
        )

    def _main(self) -> None:
        try:
            self._fn(self._term, self._fencer)
        except BaseException as exc:
            self.error = exc
        finally:
            self.finished = True
            self._keeper.notify()

    def join(self) -> None:
        self.thread.join()


class _Unraisable:
    """The shape ``sys.unraisablehook`` expects."""

    def __init__(self, exc: BaseException, message: str, obj: object) -> None:
        self.exc_type: type[BaseException] = type(exc)
        self.exc_value: BaseException | None = exc
        self.exc_traceback: TracebackType | None = exc.__traceback__
        self.err_msg: str | None = message
        self.object: object = obj
