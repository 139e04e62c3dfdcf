"""One name's election: its settings, engine, keys, fence, observer, and each step's Redis.

``Election(client, name, ...)`` validates everything up front and is the core
the public shells (``Elector``, ``aio.Elector``) drive, through the internal
API below; the loop that steps it is ``runloop.RunLoop``:

* ``claim(stop)`` reserves the one run an election may have (a ``Run``);
* ``acquire()`` / ``acquired(reply)``, ``release()``, ``hold_reason()`` and
  ``leader()`` are what each step asks of Redis;
* ``Run.request_stop()`` ends a run from anywhere; ``token()``, ``resign()``,
  ``renew_lateness()``, ``renew_lateness_count()`` and ``fence`` (a
  ``fence.FencedWrites``) serve the rest;
* ``observe``, ``emit``, ``report`` and ``drain`` deliver to the observer and
  the events (logging, metrics).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from .. import _scripts
from .._config import Config
from .._engine import (
    CLUSTER,
    NO_NOTICES,
    ChannelRefusals,
    Engine,
    ForkSafeLock,
    Keeper,
    NoticeSubscription,
    ScriptRequest,
    call_timeout,
    due,
    execute_one,
    first_contact,
    is_cluster,
    released,
    rerouted,
    sharded_notices,
    shared_engine,
    slot_owner,
    threaded,
)
from .._errors import ConfigError
from .._keys import ElectionKeys, has_hash_tag
from .._log import Events
from .fence import FencedWrites
from .term import Leader, Observer, Once, Term, tell_on_error

_ACQUIRE = _scripts.load("acquire")
_RENEW = _scripts.load("renew")
_RELEASE = _scripts.load("release")
_LEADER = _scripts.load("leader")

LeaderFn = Callable[[Term, Any], object]
"""A leader function: ``fn(term, fencer)``, the fencer being the shell's (threaded or not)."""


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


NEVER = threading.Event()
"""The caller's stop event of every run started with ``start()``: never set."""


class _Threads:
    """A tiny set of threads (one to three at a time): a tuple, shared while empty."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: tuple[threading.Thread, ...] = ()

    def add(self, thread: threading.Thread) -> None:
        if thread not in self._items:
            self._items = (*self._items, thread)

    def discard(self, thread: threading.Thread) -> None:
        items = self._items
        if items and items[-1] is thread:
            self._items = items[:-1]  # the one added last, as a stop adds and discards its own
        elif thread in items:
            self._items = tuple(t for t in items if t is not thread)

    def __contains__(self, thread: object) -> bool:
        return thread in self._items


_NO_OBSERVER = Observer()


class Driven(Protocol):
    """A run's loop as the process's driver steps it (``runloop.RunLoop``)."""

    def poke(self) -> None:
        """Step the run soon (a stop, a resign, a notice)."""
        ...

    def stop(self, timeout: float | None) -> None:
        """End the run from the calling thread (see ``RunLoop.stop``)."""
        ...


_generation = 0
"""How many forks this process is away from the one its runs were made in (see ``Election.run``)."""


class Run:
    """What one run shares between its thread and the rest of the program."""

    __slots__ = (
        "acquired_at",
        "born",
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
        self.born = _generation
        # The instance id as given (a str shared with the config, not a copy
        # in bytes per run): a notice's payload is compared with it encoded.
        self.own_id = own_id
        self.user_stop = stop
        # A flag, not an Event: nobody waits on it (the keeper's notify() is
        # the wake-up), and thousands of runs should not cost a Condition each.
        self.stopping = _Flag()
        self.keeper = keeper
        self.term: Term | None = None
        # When the current term's acquire was sent (time.monotonic()).
        self.acquired_at = 0.0
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
        self.driven: Driven | None = None
        # The run's release notices (set as the run starts; see _runloop.run_here).
        self.notices: NoticeSubscription = NO_NOTICES

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
        if (released_by is None and self.resting) or (
            released_by is not None and released_by == self.own_id.encode()
        ):
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
        "_fence",
        "_refusals",
        "_run",
        "_started",
        "client",
        "cluster",
        "config",
        "engine",
        "events",
        "face",
        "family",
        "guard",
        "observer",
        "sharded_notice",
        "tenure_failover",
    )

    # One lock for every election's claim and end of a run: both are rare and
    # short, and 100,000 elections should not cost a lock each.
    mutex = ForkSafeLock()

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        observer: Observer | None = None,
        engine: str | None = "auto",
        face: FencerSource | None = None,
        **settings: Any,
    ) -> None:
        """``settings``: an elector's own keywords (``ElectorShell``), checked by ``Config``."""
        # The engines run on a threaded redis-py client (the user's own, or a twin of an
        # asyncio or valkey-py one); errors go out in the user's client family. Anything
        # that is no client of the face's kind is refused here, before the settings.
        client, self.family = threaded(client)
        self.config = Config.resolve(name, **settings)
        self.guard = self.config.guard
        check_cluster_name(client, self.config.name)
        if observer is not None and not isinstance(observer, Observer):
            raise ConfigError(
                f"observer must be a redlease.Observer, got {type(observer).__name__}"
            )
        # Shared with every other election on this client: one control pool,
        # one write pool and one renewer for all of them.
        self.engine: Engine = shared_engine(client, engine)
        self.client = client
        # Releases announce in the name's slot on a cluster (SPUBLISH).
        self.sharded_notice = "1" if sharded_notices(client) else "0"
        # Made when first needed (see ``refusals``).
        self._refusals: ChannelRefusals | None = None
        self.observer = observer or _NO_OBSERVER
        self.cluster = is_cluster(client)
        self.events = Events(
            "elector",
            self.config.name,
            self.config.instance_id,
            adopt=self.family.adopter,
            engine=self.engine.name,
            client=client,
        )
        # Made by the first fenced write (see ``fence``): most electors of a
        # token-driven process never write through their own.
        self._fence: FencedWrites | None = None
        # What makes the leader function's second argument, for a token (the
        # face itself, not a bound method of it: 64 bytes a lease fewer).
        self.face = face
        self._run: Run | None = None
        # The run a shell started in the background (``Elector.start()``),
        # kept until its end is collected by ``stop()``.
        self._started: Run | None = None
        # Told a failover reply to a fenced write when no run of this election holds the
        # token: a partition's lease is kept by its group member, not by a run.
        self.tenure_failover: Callable[[int, Exception], object] | None = None

    # A forked child has none of the parent's threads and must never act on
    # the parent's lease: there, a run made before the fork is no run at all.

    @property
    def run(self) -> Run | None:
        """The run going on (reserved by ``claim``), or None."""
        run = self._run
        if run is not None and run.born != _generation:
            self._run = self._started = None
            return None
        return run

    @run.setter
    def run(self, run: Run | None) -> None:
        self._run = run

    @property
    def started(self) -> Run | None:
        """The run a shell started in the background, until ``stop()`` collects its end."""
        started = self._started
        if started is not None and started.born != _generation:
            self._run = self._started = None
            return None
        return started

    @started.setter
    def started(self, run: Run | None) -> None:
        self._started = run

    @property
    def keys(self) -> ElectionKeys:
        """The name's keys (``_keys.ElectionKeys``), made when asked: each is built when read."""
        return ElectionKeys(self.config.name)

    @property
    def fence(self) -> FencedWrites:
        """The name's fenced writes (``fence.FencedWrites``), made on first use, once."""
        fence = self._fence
        if fence is None:
            with _REFUSALS:
                fence = self._fence
                if fence is None:
                    fence = self._fence = FencedWrites(
                        self.engine,
                        self.keys.applied,
                        self.config.name,
                        self.events,
                        cluster=self.cluster,
                        guard=self.guard,
                        failovers=self,
                    )
        return fence

    @property
    def refusals(self) -> ChannelRefusals:
        """Says that an ACL user lacks the name's notice channels, once per client connection
        pool and permission kind (made on first use)."""
        refusals = self._refusals
        if refusals is None:
            with _REFUSALS:
                refusals = self._refusals
                if refusals is None:
                    refusals = self._refusals = ChannelRefusals(
                        f"Elector {self.config.name!r} instance {self.config.instance_id!r}",
                        f"&{self.config.name}*",
                        self.client,
                    )
        return refusals

    @property
    def instance_id(self) -> str:
        return self.config.instance_id

    def make_fencer(self, token: int) -> Any:
        """What the leader function gets as its second argument, for ``token`` (or None)."""
        face = self.face
        return face._fencer_of(token) if face is not None else None

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

    def renew_lateness_count(self) -> int:
        run = self.run
        return run.keeper.lateness_count() if run is not None else 0

    def health(self) -> tuple[bool, int | None, float | None]:
        """What a health check asks: ``(a run is going, its term's token or None, seconds since
        the lease was last confirmed at Redis or None)``, read locally, no round trip.

        The lease was last confirmed by the term's acquire or its latest good
        renewal, whichever came later (their send times).
        """
        run = self.run
        if run is None:
            return False, None, None
        keeper = run.keeper
        token = keeper.token
        if not token:
            return True, None, None
        confirmed = max(keeper.renewed_at, run.acquired_at)
        return True, token, max(0.0, time.monotonic() - confirmed)

    def leader(self) -> Leader | None:
        """Who holds the lease now, as Redis says (one round trip); None when nobody does."""
        with self.family.errors():
            reply = self.lease_holder()
        if reply is None:
            return None
        return Leader(instance_text(reply[0]), int(reply[1]))

    def lease_holder(self) -> Any:
        """One read of the lease (a script that only reads): ``[holder, pttl_ms]``, or None."""
        reply, _ = execute_one(
            self.engine, (_LEADER, (self.keys.leader,), ()), timeout=self.config.renew_interval
        )
        return reply

    def batch_route(self) -> object | None:
        """What this election's acquire or release shares a round trip by; None: alone.

        Its engine; on a cluster, its engine and the master the client's slot
        map names for the name's slot (a batch goes to its first call's node).
        A call that met another node's keys there is answered MOVED or ASK,
        and goes again alone (``replies.rerouted``). None with the replication
        guard: each call waits for its own WAIT.
        """
        if self.guard.enabled:
            return None
        if not self.cluster:
            return self.engine
        owner = slot_owner(self.client, self.keys.leader)
        return None if owner is None else (self.engine, owner)

    def rerouted(self, reply: object) -> bool:
        """A batched acquire's or release's reply says: send it again alone (see above)."""
        return self.cluster and rerouted(reply, CLUSTER)

    def contact(self) -> None:
        """The client's first contact (``contact.first_contact``): raises, in the client's
        family, what retrying cannot mend; one bounded round trip per connection pool, the
        first time only (a read of who leads, bounded as an acquire and a control call).
        Nothing is built for a pool that had its contact: every start after the first."""
        if not due(self.client):
            return
        first_contact(
            self.engine,
            self.client,
            (_LEADER, (self.keys.leader,), ()),
            min(self.config.renew_interval, call_timeout(self.client)),
            self.family.adopter,
        )

    def contact_due(self) -> bool:
        """Whether ``contact()`` would make a round trip now (no contact made yet, or one
        the run's retries may mend, a while ago)."""
        return due(self.client)

    def claim(self, stop: threading.Event) -> Run | None:
        """Reserve this election's one run; None when ``stop`` is already set.

        Every run starts here (``Elector.run`` and ``start``, ``aio.Elector``'s),
        so the client's first contact is made here, before the run is reserved:
        what it raises leaves nothing to undo. RuntimeError when a run is
        already going: one run at a time.
        """
        if not stop.is_set():
            self.contact()
        with self.mutex:
            if self.run is not None:
                raise RuntimeError(
                    f"Elector {self.config.name!r} is already running; one run at a time per "
                    "Elector (use one Elector per concurrent run)"
                )
            if stop.is_set():
                return None
            keeper = self.engine.keeper(
                (_RENEW, (self.keys.leader,), (self.instance_id, self.config.ttl_ms)),
                interval=self.config.renew_interval,
                ttl=self.config.ttl,
            )
            self.events.keeper_opened(keeper)
            run = Run(stop, keeper, self.instance_id)
            self.run = run
        return run

    def observe(self, run: Run, holder: str) -> None:
        """``on_new_leader(holder)`` when ``holder`` is not who ``run`` observed last."""
        if holder != run.last_holder:
            run.last_holder = holder
            self.emit(self.observer.on_new_leader, holder)

    def acquire(self) -> tuple[int, int, str]:
        """``(token, pttl_ms, holder)``; token 0 when another instance (``holder``) leads."""
        # Answered READONLY / MASTERDOWN / NOREPLICAS, an acquire raises like
        # any error: no term starts (none runs while the loop contends).
        reply, acked = execute_one(
            self.engine,
            self.acquire_request(),
            timeout=self.config.renew_interval,
            wait=self.guard.wait,
        )
        return self.acquired(reply, acked)

    def acquire_request(self) -> tuple[Any, tuple[str, ...], tuple[Any, ...]]:
        """The acquire as a ``(script, keys, args)`` request (see ``Engine.execute``)."""
        return _ACQUIRE, tuple(self.keys.all()), (self.instance_id, self.config.ttl_ms)

    def acquired(self, reply: Any, acked: int = 0) -> tuple[int, int, str]:
        """An acquire's reply as ``(token, pttl_ms, holder)`` (the guard decides first).

        The engine checked the reply's shape: ``[token, pttl, holder]``.
        """
        token: int = reply[0]
        if token > 0:
            # Won on the master only: a failover now could hand the name to
            # another instance with an older fence. Unconfirmed, no term
            # starts and the lease goes back at once.
            self.guard.confirm_won(
                self.engine,
                acked,
                f"acquire of {self.config.name!r} was",
                "released, trying again",
                self.release,
                self.config.renew_interval,
            )
        holder = self.instance_id if token else instance_text(reply[2])
        return token, int(reply[1]), holder

    def failover_seen(self, token: int, exc: Exception) -> None:
        """A fenced write with ``token`` was answered READONLY / MASTERDOWN / NOREPLICAS.

        The server is no longer the master the running term was granted on:
        that term ends now (reason "lost"), not at its renewal deadline.
        """
        run = self.run
        if run is not None and token and run.keeper.token == token:
            run.keeper.lose(exc)
        elif self.tenure_failover is not None:
            self.tenure_failover(token, exc)

    def poll_delay(self, pttl_ms: int) -> float:
        delay = self.jittered(self.config.acquire_interval)
        if pttl_ms >= 0:
            # Wake when the holder's lease runs out rather than up to one
            # interval later: failover is as fast as the TTL allows.
            delay = min(delay, pttl_ms / 1000 + 0.001)
        return delay

    @staticmethod
    def jittered(interval: float) -> float:
        # Downward only, up to 10%: contenders that started together spread
        # out, and nobody polls less often than configured.
        return interval * (1 - 0.1 * random.random())

    def release(self) -> None:
        try:
            reply: Any = execute_one(
                self.engine, self.release_request(), timeout=self.config.renew_interval
            )[0]
        except Exception as exc:  # as an acquire's: reported, never fatal
            reply = exc
        self.after_release(reply)

    def release_request(self) -> ScriptRequest:
        """The call that gives this instance's lease back (ownership-checked)."""
        return _RELEASE, (self.keys.leader,), (self.instance_id, self.sharded_notice)

    def after_release(self, reply: Any) -> None:
        """A release's reply, or the exception in its place (reported, never raised)."""
        if isinstance(reply, Exception):
            self.report(reply)
            return
        if released(reply)[1]:
            self.refusals.publish_refused(self.keys.leader)

    # -- observer plumbing --------------------------------------------------------------

    def drain(self, keeper: Keeper) -> None:
        for exc in self.events.drain(keeper):
            self.report(exc)

    def report(self, exc: Exception) -> None:
        self.events.error(exc)
        tell_on_error(self.observer.on_error, exc)

    def emit(self, callback: Callable[..., object] | None, *args: Any) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception as exc:
            self.report(exc)


# Guards the first making of an election's refusals and of its fence: rare and
# short, so one lock serves every election.
_REFUSALS = ForkSafeLock()


class FencerSource(Protocol):
    """A face whose leader functions get a fencer for their term's token."""

    def _fencer_of(self, token: int) -> Any: ...


def generation() -> int:
    """How many forks this process is away from the first (a run made in another is no run)."""
    return _generation


def _forget_runs_after_fork() -> None:
    # Every run made so far is the parent's: ``Election.run`` now says None.
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forget_runs_after_fork)


def check_cluster_name(client: Any, name: str) -> None:
    """ConfigError when ``client`` is a cluster client and ``name`` has no hash tag."""
    if is_cluster(client) and not has_hash_tag(name):
        raise ConfigError(
            f"with a RedisCluster client the name needs a hash tag so its keys share one "
            f"slot, e.g. '{{{name}}}'; got {name!r}"
        )


def instance_text(value: object) -> str:
    """An instance id from a reply (bytes on the wire) as the str it was set from."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
