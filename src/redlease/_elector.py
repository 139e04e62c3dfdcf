"""The election loop: contend, lead, hold, release; and the threaded Elector over it.

``Election`` is the core one name's run needs — settings, engine, keys, fence,
observer — and what each step of the loop asks of Redis (``_acquire``,
``_release``, ``_hold_reason``). ``RunLoop`` is the loop itself, as steps:
contend, lead, drain, done. The process's driver steps every started run;
``Elector.run()`` steps its own on the calling thread. It is the internal API
the public shells drive:

* ``Election(client, name, ...)`` validates everything up front;
* ``claim(stop)`` reserves the one run an election may have (a ``Run``);
* ``execute(run, fn)`` runs the loop on the calling thread until the run ends;
* ``Run.request_stop()`` ends it from anywhere; ``token()``, ``resign()``,
  ``renew_lateness()`` and ``fence`` (a ``_fence.Fence``) serve the rest.

``Elector`` (threaded) and ``aio.Elector`` (asyncio) are thin shells over it.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from . import _scripts
from ._config import Config, Duration
from ._driver import driver
from ._engine import ACTIVE, EncodableT, Engine, Keeper, is_cluster, sharded_notices, shared_engine
from ._engine.base import NoticeSubscription
from ._errors import ConfigError, NotReplicated
from ._fence import Fence, FencedPipeline, Fencer
from ._keys import ElectionKeys, has_hash_tag
from ._log import Events
from ._term import Leader, Observer, Once, Reason, Term, end_term

# How often a waiting run thread looks at a caller's stop event: a plain
# threading.Event cannot wake anybody, so it is polled at this period.
_STOP_POLL = 0.05

_ACQUIRE = _scripts.load("acquire")
_RENEW = _scripts.load("renew")
_RELEASE = _scripts.load("release")
_LEADER = _scripts.load("leader")

LeaderFn = Callable[[Term, Fencer], object]


def check_leader_fn(fn: object) -> None:
    """TypeError unless ``fn`` is callable or None: caught before Redis is touched."""
    if fn is not None and not callable(fn):
        raise TypeError(
            f"the leader function must be callable as fn(term, fencer) or None, "
            f"got {type(fn).__name__} {fn!r}"
        )


class _Flag:
    """A set-once flag with ``threading.Event``'s ``set``/``is_set`` and nothing to wait on."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


_NEVER = threading.Event()
"""The caller's stop event of every run started with ``start()``: never set."""


class _Threads:
    """A tiny set of threads (one to three at a time): a list, a quarter of a set's memory."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[threading.Thread] = []

    def add(self, thread: threading.Thread) -> None:
        if thread not in self._items:
            self._items.append(thread)

    def discard(self, thread: threading.Thread) -> None:
        if thread in self._items:
            self._items.remove(thread)

    def __contains__(self, thread: object) -> bool:
        return thread in self._items


_NO_OBSERVER = Observer()


class _NoNotices:
    """No subscription (yet): nothing is ever delivered."""

    def wait(self, timeout: float) -> bool:
        time.sleep(timeout)
        return False

    def deliver(self) -> None:
        pass

    def cancel(self) -> None:
        pass


_NO_NOTICES = _NoNotices()


class Run:
    """What one run shares between its thread and the rest of the program."""

    __slots__ = (
        "done",
        "driven",
        "error",
        "keeper",
        "last_holder",
        "noticed",
        "notices",
        "own_id",
        "own_threads",
        "released_by",
        "resign_requested",
        "resting",
        "stopping",
        "term",
        "user_stop",
    )

    def __init__(self, stop: threading.Event, keeper: Keeper, own_id: str) -> None:
        self.own_id = own_id.encode()
        self.user_stop = stop
        # A flag, not an Event: nobody waits on it (the keeper's notify() is
        # the wake-up), and thousands of runs should not cost a Condition each.
        self.stopping = _Flag()
        self.keeper = keeper
        self.term: Term | None = None
        self.resign_requested = False
        self.done = Once()
        self.error: BaseException | None = None
        # Set by a release notice (on the notice listener's thread), cleared
        # before each acquire: a notice that lands between an acquire and the
        # wait after it still cuts that wait short.
        self.noticed = False
        # The holder this run last observed (on_new_leader fires on a change).
        self.last_holder: str | None = None
        # Who released, by the latest notice (the lease's holder until then).
        self.released_by: bytes | None = None
        # True while the run rests after a term of its own (see notice()).
        self.resting = False
        # The threads that must never wait for the run to end: the run thread
        # (observer callbacks) and the leader function's thread. Waiting there
        # would wait for themselves.
        self.own_threads = _Threads()
        # Set when the process's driver runs this run instead of a thread.
        self.driven: RunLoop | None = None
        # The run's release notices (set as the run starts; see Election.execute).
        self.notices: NoticeSubscription = _NO_NOTICES

    def should_stop(self) -> bool:
        return self.stopping.is_set() or self.user_stop.is_set()

    def request_stop(self) -> None:
        """Ask the run to end: the term steps down, the lease is released. Returns at once."""
        self.stopping.set()
        self.keeper.notify()
        if self.driven is not None:
            self.driven.poke()

    def notice(self, released_by: bytes | None) -> None:
        """The lease was released (a notice arrived): wake the waiting contender.

        A notice of this instance's own release is not news: the instance
        that just stepped down leaves the lease to the others for a while,
        and only another holder's release (not a reconnected listener's
        "look again", ``None``) ends that rest.
        """
        if released_by == self.own_id or (released_by is None and self.resting):
            return
        if released_by is not None:
            self.released_by = released_by
        self.noticed = True
        self.keeper.notify()
        if self.driven is not None:
            self.driven.poke()


class Election:
    """One name's election on one engine: the loop and what it needs (see the module doc)."""

    # Thousands of elections in one process: no instance dict.
    __slots__ = (
        "__weakref__",
        "_client",
        "_fencer",
        "_mutex",
        "_observer",
        "_sharded_notice",
        "batchable",
        "config",
        "engine",
        "events",
        "fence",
        "guard",
        "keys",
        "run",
        "started",
    )

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
        fencer: Callable[[int], Any] | None = None,
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
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
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
        )
        self.guard = self.config.guard
        if is_cluster(client) and not has_hash_tag(self.config.name):
            raise ConfigError(
                f"with a RedisCluster client the name needs a hash tag so its keys share one "
                f"slot, e.g. '{{{self.config.name}}}'; got {self.config.name!r}"
            )
        if observer is not None and not isinstance(observer, Observer):
            raise ConfigError(
                f"observer must be a redlease.Observer, got {type(observer).__name__}"
            )
        # Shared with every other election on this client: one control pool,
        # one write pool and one renewer for all of them.
        self.engine: Engine = shared_engine(client, engine)
        self._client = client
        # Releases announce in the name's slot on a cluster (SPUBLISH).
        self._sharded_notice = "1" if sharded_notices(client) else "0"
        self._observer = observer or _NO_OBSERVER
        self.keys = ElectionKeys(self.config.name)
        # Acquires of many started runs on this engine may share a round trip:
        # not on a cluster (one connection, one node) nor with the guard (each
        # acquire waits for its own WAIT).
        self.batchable = not is_cluster(client) and not self.config.guard.enabled
        self.events = Events("elector", self.config.name, self.config.instance_id)
        self.fence = Fence(
            self.engine,
            self.keys.applied,
            self.config.name,
            self.events,
            cluster=is_cluster(client),
            guard=self.guard,
            on_failover=self._failover_seen,
        )
        # What the leader function gets as its second argument, for a token.
        self._fencer: Callable[[int], Any] = fencer or (lambda _token: None)
        self._mutex = threading.Lock()
        self.run: Run | None = None
        # The run a shell started in the background (``Elector.start()``),
        # kept until its end is collected by ``stop()``.
        self.started: Run | None = None
        _live_elections.add(self)

    @property
    def instance_id(self) -> str:
        return self.config.instance_id

    def token(self) -> int | None:
        """The running term's token, or None (a snapshot)."""
        run = self.run
        token = run.keeper.token if run is not None else 0
        return token or None

    def resign(self) -> None:
        """End the current term (lock released); the run re-contends. No-op when not leading."""
        run = self.run
        # The keeper's token, not run.term: token() shows a term a moment
        # before the loop has its Term, and a resign in between must count.
        if run is not None and run.keeper.token:
            run.resign_requested = True
            run.keeper.notify()
            if run.driven is not None:
                run.driven.poke()

    def renew_lateness(self) -> list[float]:
        run = self.run
        return run.keeper.lateness() if run is not None else []

    def leader(self) -> Leader | None:
        """Who holds the lease now, as Redis says (one round trip); None when nobody does."""
        reply = self.engine.call(_LEADER, (self.keys.leader,), (), self.config.renew_interval)
        if reply is None:
            return None
        return Leader(_instance_text(reply[0]), int(reply[1]))

    def claim(self, stop: threading.Event) -> Run | None:
        """Reserve this election's one run; None when ``stop`` is already set.

        RuntimeError when a run is already going: one run at a time.
        """
        with self._mutex:
            if self.run is not None:
                raise RuntimeError(
                    f"Elector {self.config.name!r} is already running; one run at a time per "
                    "Elector (use one Elector per concurrent run)"
                )
            if stop.is_set():
                return None
            keeper = self.engine.keeper(
                _RENEW,
                (self.keys.leader,),
                (self.instance_id, self.config.ttl_ms),
                interval=self.config.renew_interval,
                ttl=self.config.ttl,
            )
            self.events.keeper_opened(keeper)
            run = Run(stop, keeper, self.instance_id)
            self.run = run
        return run

    def execute(self, run: Run, fn: LeaderFn | None) -> None:
        """Run the loop on this thread until ``run`` ends; its error lands in ``run.error``."""
        # The engine's listener: on the native engine a native thread wakes
        # the keeper's eventfd, which the follower sleeps on without the GIL,
        # and the notice itself is delivered here, on the run thread.
        notices = self.engine.notices(self._client).listen(
            self.keys.leader, run.notice, signal=run.keeper
        )
        run.notices = notices
        loop = RunLoop(self, run, fn, driven=False)
        loop.notices = notices
        loop.run_here()

    def _observe(self, run: Run, holder: str) -> None:
        """``on_new_leader(holder)`` when ``holder`` is not who ``run`` observed last."""
        if holder != run.last_holder:
            run.last_holder = holder
            self._emit(self._observer.on_new_leader, holder)

    def _acquire(self) -> tuple[int, int, str]:
        """``(token, pttl_ms, holder)``; token 0 when another instance (``holder``) leads."""
        guard = self.guard
        args = (self.instance_id, self.config.ttl_ms)
        # Answered READONLY / MASTERDOWN / NOREPLICAS, an acquire raises like
        # any error: no term starts (none runs while the loop contends).
        acked = 0
        if not guard.enabled:
            reply = self.engine.call(_ACQUIRE, self.keys.all(), args, self.config.renew_interval)
        else:
            reply, acked = self.engine.call_replicated(
                _ACQUIRE,
                self.keys.all(),
                args,
                self.config.renew_interval,
                guard.min_replicas,
                guard.timeout_ms,
            )
        return self._acquired(reply, acked)

    def _acquire_request(self) -> tuple[Any, tuple[str, ...], tuple[Any, ...]]:
        """The acquire as a ``(script, keys, args)`` request (see ``Engine.call_many``)."""
        return _ACQUIRE, tuple(self.keys.all()), (self.instance_id, self.config.ttl_ms)

    def _acquired(self, reply: Any, acked: int = 0) -> tuple[int, int, str]:
        """An acquire's reply as ``(token, pttl_ms, holder)`` (the guard decides first)."""
        guard = self.guard
        token = int(reply[0])
        if token > 0 and guard.enabled and acked < guard.min_replicas:
            # Won on the master only: a failover now could hand the name to
            # another instance with an older fence. No term starts; the lease
            # goes back at once so nobody waits a TTL for it.
            self._release()
            raise NotReplicated(
                f"acquire of {self.config.name!r} was confirmed by {acked} of the "
                f"{guard.min_replicas} replicas required within {guard.timeout_ms} ms; "
                "released, trying again",
                applied=True,
                replicas=acked,
            )
        if token > 0:
            # Behind Sentinel: won on a node the sentinels still name as the
            # master, and not one being failed over, or no term (released).
            self.engine.confirm_master(self.config.renew_interval, self._release)
        holder = self.instance_id if token else _instance_text(reply[2])
        return token, int(reply[1]), holder

    def _failover_seen(self, token: int, exc: Exception) -> None:
        """A fenced write with ``token`` was answered READONLY / MASTERDOWN / NOREPLICAS.

        The server is no longer the master the running term was granted on:
        that term ends now (reason "lost"), not at its renewal deadline.
        """
        run = self.run
        if run is not None and token and run.keeper.token == token:
            run.keeper.lose(exc)

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

    def _hold_reason(self, run: Run, worker: _LeaderThread | None) -> Reason | None:
        """Why the running term ends now, or None while it holds."""
        self._drain(run.keeper)
        if run.keeper.state != ACTIVE:
            return "lost"
        if worker is not None and worker.finished:
            return "returned"
        if run.resign_requested:
            return "resigned"
        if run.should_stop():
            return "stopped"
        return None

    def _release(self) -> None:
        try:
            self.engine.call(
                _RELEASE,
                (self.keys.leader,),
                (self.instance_id, self._sharded_notice),
                self.config.renew_interval,
            )
        except Exception as exc:  # as an acquire's: reported, never fatal
            self._report(exc)

    # -- observer plumbing --------------------------------------------------------------

    def _drain(self, keeper: Keeper) -> None:
        for exc in self.events.drain(keeper):
            self._report(exc)

    def _report(self, exc: Exception) -> None:
        self.events.error(exc)
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

    Replication guard: with ``min_replicas=N`` (default 0, off) every acquire
    and fenced write is followed, on the same connection, by ``WAIT N
    replica_timeout`` (default 0.1 s). An acquire fewer than N replicas
    confirmed starts no term: the lease is released, ``NotReplicated`` goes
    to ``Observer.on_error`` and the run tries again. A fenced write applied
    but confirmed by fewer raises ``NotReplicated`` (``applied=True``). WAIT
    is not consensus: see the README's correctness boundary. A renewal,
    acquire or fenced write answered READONLY, MASTERDOWN or NOREPLICAS ends
    the term at once (reason ``"lost"``).
    """

    __slots__ = ("__weakref__", "_election", "_fence", "config")

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
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
    ) -> None:
        self._election = Election(
            client,
            name,
            ttl=ttl,
            renew_interval=renew_interval,
            acquire_interval=acquire_interval,
            instance_id=instance_id,
            observer=observer,
            engine=engine,
            fencer=lambda token: Fencer(self, token),
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
        )
        self.config: Config = self._election.config
        self._fence = self._election.fence

    # -- identity -----------------------------------------------------------

    @property
    def instance_id(self) -> str:
        """This elector's identity: the lock's value while it leads."""
        return self.config.instance_id

    @property
    def engine(self) -> str:
        """The engine that runs this elector: ``"native"`` or ``"python"``."""
        return self._election.engine.name

    @property
    def engine_reason(self) -> str:
        """Why the native engine does not run this elector, in one sentence ("" when it does).

        Set when ``engine="auto"`` fell back to the Python engine for this
        client (a build without OpenSSL and a TLS client, a
        ``credential_provider``, ...); empty on the native engine and when the
        Python engine was asked for.
        """
        return self._election.engine.reason

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
        return self._election.token()

    def is_leader(self) -> bool:
        """Whether this instance leads right now. Advisory: never gate a write on it."""
        return self.token() is not None

    def fencer(self) -> Fencer:
        """A Fencer for the current term, or an inert one (token 0) when not leading."""
        return Fencer(self, self.token() or 0)

    def resign(self) -> None:
        """End the current term (lock released); the run re-contends. No-op when not leading."""
        self._election.resign()

    def leader(self) -> Leader | None:
        """Who holds the lease now, as Redis says: a ``Leader``, or None when nobody does.

        One round trip (bounded like an acquire), whether or not this elector
        runs; for dashboards and for forwarding requests to the leader. A
        snapshot: the holder may change right after.
        """
        return self._election.leader()

    def renew_lateness(self) -> list[float]:
        """How late each renewal of the current run was sent, in seconds, oldest first.

        Measured by the keeper itself: the time between a renewal's scheduled
        moment and its send. Read-only figures for benchmarks and monitoring;
        empty when the elector is not running. The keeper keeps the most
        recent samples only (tens of thousands).
        """
        return self._election.renew_lateness()

    # -- running --------------------------------------------------------------

    def run(
        self,
        fn: LeaderFn | None = None,
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
        check_leader_fn(fn)
        if stop is None:
            stop = threading.Event()
        elif not isinstance(stop, threading.Event):
            raise TypeError(f"stop must be a threading.Event, got {type(stop).__name__}")
        run = self._election.claim(stop)
        if run is None:
            return
        self._election.execute(run, fn)
        if run.error is not None:
            raise run.error

    def start(self, fn: LeaderFn | None = None) -> Elector:
        """Run the same loop in the background; returns this elector.

        The loop runs on the process's one driver thread, with every other
        started elector's: only the leader function, when given, gets a
        thread of its own while it runs.
        """
        check_leader_fn(fn)
        run = self._election.claim(_NEVER)
        assert run is not None
        self._election.started = run
        RunLoop(self._election, run, fn).start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """End the run: the term ends, the lock is released, the run is over.

        Re-raises the leader function's exception when that is what ended a
        run started with ``start()``. No-op when nothing runs.
        """
        run = self._election.run
        if run is not None:
            if threading.current_thread() in run.own_threads:
                # Called by the leader function or a callback: the run ends as
                # soon as that returns; waiting here would wait for ourselves.
                run.request_stop()
                return
            if run.driven is not None:
                run.driven.stop(timeout)
            else:
                run.request_stop()
        election = self._election
        started = election.started
        if started is None:
            if run is not None:
                run.done.wait(timeout)
            return
        if not started.done.wait(timeout):
            return
        election.started = None
        if started.error is not None:
            error, started.error = started.error, None
            raise error

    def __enter__(self) -> Elector:
        if self._election.started is None:
            self.start(None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- fenced writes -----------------------------------------------------------------

    def fence_set(self, token: int, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``: applied only when ``token`` is current.

        Returns True when applied, False when the token is stale (below the
        newest elected term or applied write) or not positive. The check and
        the write are one atomic script; an applied write advances the fence
        high-water mark to ``token``. Works whether or not this elector runs.
        The write is sent at most once: when its outcome is unknown (the
        connection broke, the deadline passed) it raises redis-py's
        ConnectionError or TimeoutError, and it may or may not have landed.
        """
        return self._fence.write(self._fence.set_request(token, key, value))

    def fence_hset(
        self, token: int, key: str | bytes, field: str | bytes, value: EncodableT
    ) -> bool:
        """Fenced ``HSET key field value``; semantics as ``fence_set``."""
        return self._fence.write(self._fence.hset_request(token, key, field, value))

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
        return self._fence.write(self._fence.eval_request(token, body, keys, args))

    def fence_pipeline(self, token: int) -> FencedPipeline:
        """A pipeline of fenced writes with ``token``, sent in one round trip.

        ``pipe.set(...).hset(...).eval(...)`` queue writes (validated at
        once); ``pipe.execute()`` returns one ``applied`` per write, in
        order. Each write is fenced on its own, so a write after a rejected
        one is rejected too. See ``redlease.FencedPipeline``.
        """
        return FencedPipeline(self._fence, token)


_live_elections: weakref.WeakSet[Election] = weakref.WeakSet()


def _forget_runs_after_fork() -> None:
    # A forked child has none of the parent's threads and must never act on
    # the parent's lease: its elections are simply not running.
    for election in list(_live_elections):
        election._mutex = threading.Lock()
        election.run = election.started = None


os.register_at_fork(after_in_child=_forget_runs_after_fork)


class RunLoop:
    """One run's loop, as steps: contend (one acquire per step), lead, drain, done.

    Driven (``start()``): the process's driver steps it — contending is a
    timer, leading a watch on the keeper — and ``stop()`` from another
    thread ends the run right there, on that thread, once any step in
    progress is done; with a leader function it asks the driver and waits,
    as the function must return first. Not driven (``Elector.run()``):
    ``run_here()`` steps it on the calling thread, which waits between steps
    on the keeper (woken by a renewal's news, a notice, a stop, the leader
    function's return).
    """

    CONTEND, LEAD, DRAIN, DONE = range(4)

    __slots__ = (
        "busy",
        "driven",
        "election",
        "errors_in_row",
        "fn",
        "follower",
        "keeper",
        "not_before",
        "notices",
        "on_done",
        "phase",
        "prefetched",
        "reason",
        "run",
        "token",
        "worker",
    )

    def __init__(
        self,
        election: Election,
        run: Run,
        fn: LeaderFn | None,
        on_done: Callable[[], object] | None = None,
        *,
        driven: bool = True,
    ) -> None:
        self.election = election
        self.run = run
        self.fn = fn
        self.driven = driven
        # Called (on whichever thread ends the run) once the run is over.
        self.on_done = on_done
        self.keeper = run.keeper
        self.busy = threading.Lock()
        self.phase = self.CONTEND
        self.errors_in_row = 0
        self.follower = False
        self.token = 0
        self.reason: Reason = "stopped"
        self.worker: _LeaderThread | None = None
        # The next acquire's time (a poll, a backoff, the rest after a term):
        # an early step (a poke, a sweep) waits for it unless a release
        # notice arrived meanwhile.
        self.not_before = 0.0
        # An acquire the driver sent for this run with others' (reply, send
        # time), for the next contend step to use instead of a round trip.
        self.prefetched: tuple[Any, float] | None = None
        self.notices: NoticeSubscription | None = None
        if driven:
            run.driven = self

    def start(self) -> None:
        election = self.election
        # The engine's listener, on the connection the process's other
        # waiters share: each notice pokes this run on the driver thread
        # (native: the reader rings the driver's doorbell without the GIL).
        self.notices = election.engine.notices(election._client).listen(
            election.keys.leader, self.run.notice, driven=True
        )
        driver().poke(self)

    def poke(self) -> None:
        if self.driven:
            driver().poke(self)
        else:
            self.keeper.notify()  # the run's own thread waits on the keeper

    def run_here(self) -> None:
        """Step the run on the calling thread until it ends (``Elector.run()``)."""
        run, keeper = self.run, self.keeper
        try:
            while self.phase != self.DONE:
                run.notices.deliver()
                when = self.step()  # keeps this thread among the run's own (not driven)
                if self.phase == self.DONE:
                    break
                if when is None:
                    # Leading, or waiting for the leader function to return.
                    keeper.wait(_STOP_POLL)
                    continue
                # A poll, a backoff or the rest after a term, cut short by a
                # release notice or a stop.
                while True:
                    run.notices.deliver()
                    left = when - time.monotonic()
                    if run.should_stop() or run.noticed or left <= 0:
                        break
                    keeper.wait(min(left, _STOP_POLL))
        except BaseException as exc:
            # An interrupt between steps: the run ends here, as a stop would.
            run.error = exc
            with self.busy:
                self._finish()

    # -- steps (on the driver thread) ---------------------------------------------------

    def step(self) -> float | None:
        if not self.busy.acquire(blocking=False):
            return None  # stop() is ending the run on another thread
        try:
            thread = threading.current_thread()
            self.run.own_threads.add(thread)
            try:
                return self._step()
            except BaseException as exc:
                self.run.error = exc
                self._finish()
                return None
            finally:
                if self.driven:
                    self.run.own_threads.discard(thread)
        finally:
            self.busy.release()

    def check(self) -> bool:
        """The watch: the keeper reported something while leading (True: watch no more)."""
        when = self.step()
        if when is not None:
            driver().schedule(self, when)
        return self.phase in (self.CONTEND, self.DONE)

    def _step(self) -> float | None:
        if self.phase == self.DONE:
            return None
        if self.phase == self.CONTEND:
            return self._contend_step()
        if self.phase == self.LEAD:
            reason = self._hold_reason()
            if reason is None:
                return None
            self._end_term(reason)
        if self.phase == self.DRAIN:
            worker = self.worker
            if worker is not None and not worker.finished:
                return None
            self._after_term()
            if self.run.error is not None or self.run.should_stop():
                self._finish()
                return None
            self.not_before = time.monotonic() + self.election._jittered(
                self.election.config.acquire_interval
            )
            return self.not_before
        return None

    def _contend_step(self) -> float | None:
        election, run, cfg = self.election, self.run, self.election.config
        if run.should_stop():
            self._finish()
            return None
        if not run.noticed and time.monotonic() < self.not_before:
            return self.not_before
        run.noticed, run.resting = False, False
        released_by, run.released_by = run.released_by, None
        if released_by is not None:
            # A holder seen only through its release notice still led meanwhile.
            election._observe(run, _instance_text(released_by))
        sent = time.monotonic()
        prefetched, self.prefetched = self.prefetched, None
        try:
            if prefetched is None:
                token, pttl_ms, holder = election._acquire()
            else:
                reply, sent = prefetched
                if isinstance(reply, Exception):
                    raise reply
                token, pttl_ms, holder = election._acquired(reply)
        except Exception as exc:
            election._report(exc)
            self.errors_in_row += 1
            backoff: float = min(cfg.acquire_interval * 2**self.errors_in_row, cfg.ttl)
            self.not_before = sent + backoff
            return self.not_before
        self.errors_in_row = 0
        election.events.ok()
        election._observe(run, holder)
        if token == 0:
            if not self.follower:
                self.follower = True
                election._emit(election._observer.on_follower)
            self.not_before = time.monotonic() + election._poll_delay(pttl_ms)
            return self.not_before
        self.follower = False
        self._begin(token, sent)
        return None

    def acquire_request(self) -> tuple[Engine, Any] | None:
        """The acquire this run's next step would send now, for the driver to batch; or None."""
        run, election = self.run, self.election
        if (
            self.phase != self.CONTEND
            or self.prefetched is not None
            or not election.batchable
            or run.should_stop()
            or (not run.noticed and time.monotonic() < self.not_before)
        ):
            return None
        return election.engine, election._acquire_request()

    def _begin(self, token: int, acquired_at: float) -> None:
        election, run, keeper = self.election, self.run, self.keeper
        run.resign_requested = False
        keeper.begin(token, acquired_at)
        term = Term(token)
        run.term = term
        self.token = token
        self.phase = self.LEAD
        election.events.elected(token)
        election._emit(election._observer.on_elected, token)
        if self.fn is not None:
            worker = _LeaderThread(self.fn, term, election._fencer(token), keeper, self.poke)
            self.worker = worker
            run.own_threads.add(worker.thread)
            worker.thread.start()
        if self.phase == self.LEAD and self.driven:
            driver().watch(self)

    def _hold_reason(self) -> Reason | None:
        return self.election._hold_reason(self.run, self.worker)

    def _end_term(self, reason: Reason) -> None:
        # Rest from here, before the release: a successor that takes the
        # lease and gives it back at once must still find this run listening.
        run = self.run
        run.noticed, run.released_by, run.resting = False, None, True
        self.keeper.end()
        self.reason = reason
        self.phase = self.DRAIN
        term = self.run.term
        if term is not None:
            end_term(term, reason)

    def _after_term(self) -> None:
        election, run, worker = self.election, self.run, self.worker
        election._drain(self.keeper)
        if worker is not None:
            worker.join()
            run.own_threads.discard(worker.thread)
            self.worker = None
        if self.reason != "lost":
            election._release()
        run.term = None
        election.events.stepped_down(self.token, self.reason)
        election._emit(election._observer.on_stepped_down)
        self.token = 0
        self.phase = self.CONTEND
        if worker is not None and worker.error is not None:
            run.error = worker.error

    def _finish(self) -> None:
        if self.phase == self.DONE:
            return
        election, run = self.election, self.run
        # Unsubscribed before the release: the run's own notice is no news,
        # and thousands of runs stopping together should not flood the listener.
        if self.notices is not None:
            self.notices.cancel()
            self.notices = None
        prefetched, self.prefetched = self.prefetched, None
        if (
            prefetched is not None
            and self.phase == self.CONTEND
            and not isinstance(prefetched[0], Exception)
        ):
            # A batched acquire this run had not read yet: a term it won is
            # begun and ended like any other, so every token is a term.
            token = 0
            with contextlib.suppress(Exception):
                token = election._acquired(prefetched[0])[0]
            if token > 0:
                self._begin(token, prefetched[1])
        if self.phase == self.LEAD:
            self._end_term("stopped")
        if self.phase == self.DRAIN:
            self._after_term()
        self.phase = self.DONE
        if self.driven:
            driver().unwatch(self)
        run.keeper.close()
        election.events.keeper_closed(run.keeper)
        with election._mutex:
            if election.run is run:
                election.run = None
        self._done()

    def _done(self) -> None:
        self.run.done.set()
        on_done = self.on_done
        if on_done is not None:
            self.on_done = None
            on_done()

    # -- stop (on the caller's thread) ---------------------------------------------------

    def stop(self, timeout: float | None) -> None:
        run = self.run
        run.stopping.set()
        if self.fn is None:
            # Nothing to wait for but a step in progress: end the run here,
            # without a hand-over to the driver thread and back.
            acquired = self.busy.acquire(timeout=-1 if timeout is None else max(timeout, 0))
            if acquired:
                thread = threading.current_thread()
                run.own_threads.add(thread)
                try:
                    self._finish()
                except BaseException as exc:
                    run.error = exc
                    self.phase = self.DONE
                    self._done()
                finally:
                    run.own_threads.discard(thread)
                    self.busy.release()
                return
        run.keeper.notify()
        self.poke()


class _LeaderThread:
    """The leader function on a thread of its own; wakes the run when fn returns."""

    def __init__(
        self,
        fn: Callable[[Term, Fencer], object],
        term: Term,
        fencer: Fencer,
        keeper: Keeper,
        on_finish: Callable[[], None] | None = None,
    ) -> None:
        self.error: BaseException | None = None
        self._on_finish = on_finish
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
            if self._on_finish is not None:
                self._on_finish()

    def join(self) -> None:
        self.thread.join()


def _instance_text(value: object) -> str:
    """An instance id from a reply (bytes on the wire) as the str it was set from."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class _Unraisable:
    """The shape ``sys.unraisablehook`` expects."""

    def __init__(self, exc: BaseException, message: str, obj: object) -> None:
        self.exc_type: type[BaseException] = type(exc)
        self.exc_value: BaseException | None = exc
        self.exc_traceback: TracebackType | None = exc.__traceback__
        self.err_msg: str | None = message
        self.object: object = obj
