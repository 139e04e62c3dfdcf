"""The threaded public shell: ``Elector`` and its ``Fencer``.

Thin over the core (``election.Election``, the shell's ``_core``) and the
loop (``runloop``); ``aio.Elector`` is its asyncio twin.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

from .._config import to_seconds
from .._engine import EncodableT
from .._errors import ConfigError
from .._on_exit import StopsOnExit
from .election import NEVER, LeaderFn, check_leader_fn
from .pipeline import FencedPipeline
from .runloop import RunLoop, end_together, run_here
from .shell import ElectorShell, FencerShell
from .term import Leader


class Elector(ElectorShell, StopsOnExit):
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

    __slots__ = ()

    def _fencer_face(self) -> Elector:
        return self

    def _fencer_of(self, token: int) -> Fencer:
        return Fencer(self, token)

    def __repr__(self) -> str:
        return (
            f"<redlease.Elector {self.config.name!r} id={self.instance_id!r} "
            f"engine={self.engine} token={self.token()}>"
        )

    # -- leadership state -----------------------------------------------------

    def fencer(self) -> Fencer:
        """A Fencer for the current term, or an inert one (token 0) when not leading."""
        return Fencer(self, self.token() or 0)

    def resign(self) -> None:
        """End the current term (lock released); the run re-contends. No-op when not leading."""
        self._core.resign()

    def leader(self) -> Leader | None:
        """Who holds the lease now, as Redis says: a ``Leader``, or None when nobody does.

        One round trip (bounded like an acquire), whether or not this elector
        runs; for dashboards and for forwarding requests to the leader. A
        snapshot: the holder may change right after.
        """
        return self._core.leader()

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
        What retrying cannot mend at the client's first contact is raised
        before the run begins (see ``start``).
        """
        check_leader_fn(fn)
        if stop is None:
            stop = threading.Event()
        elif not isinstance(stop, threading.Event):
            raise TypeError(f"stop must be a threading.Event, got {type(stop).__name__}")
        run = self._core.claim(stop)
        if run is None:
            return
        run_here(self._core, run, fn)
        if run.error is not None:
            raise run.error

    def start(self, fn: LeaderFn | None = None) -> Elector:
        """Run the same loop in the background; returns this elector.

        The loop runs on the process's one driver thread, with every other
        started elector's: only the leader function, when given, gets a
        thread of its own while it runs.

        The first start (or run) on a client's connection pool makes one
        bounded round trip, its first contact, and raises what retrying
        cannot mend, as the client family's own exception naming the
        endpoint: a wrong or missing password (``AuthenticationError``), an
        ACL user without the scripts or the name's keys
        (``NoPermissionError``), a db index out of range (``ResponseError``),
        a peer that does not speak the Redis protocol (``InvalidResponse``).
        A refused or reset connection, a timeout, LOADING or a failover is
        not raised: the run retries it, as it retries every failure once a
        first contact succeeded. Later starts on that pool make no contact.
        """
        check_leader_fn(fn)
        run = self._core.claim(NEVER)
        assert run is not None
        self._core.started = run
        RunLoop(self._core, run, fn).start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """End the run: the term ends, the lock is released, the run is over.

        Re-raises the leader function's exception when that is what ended a
        run started with ``start()``. No-op when nothing runs.
        """
        run = self._core.run
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
        election = self._core
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
        if self._core.started is None:
            self.start(None)
        return self

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
        fence = self._fence
        return fence.write(fence.set_request(token, key, value))

    def fence_hset(
        self, token: int, key: str | bytes, field: str | bytes, value: EncodableT
    ) -> bool:
        """Fenced ``HSET key field value``; semantics as ``fence_set``."""
        fence = self._fence
        return fence.write(fence.hset_request(token, key, field, value))

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
        fence = self._fence
        return fence.write(fence.eval_request(token, body, keys, args))

    def fence_pipeline(self, token: int) -> FencedPipeline:
        """A pipeline of fenced writes with ``token``, sent in one round trip.

        ``pipe.set(...).hset(...).eval(...)`` queue writes (validated at
        once); ``pipe.execute()`` returns one ``applied`` per write, in
        order. Each write is fenced on its own, so a write after a rejected
        one is rejected too. See ``redlease.FencedPipeline``.
        """
        return FencedPipeline(self._fence, token)


class Fencer(FencerShell):
    """A term's fencing token bound to its Elector's fence.

    Every write applies only when the token is at least the fence high-water
    mark, checked and written in one atomic script, and returns ``applied``:
    False means the token is stale (a newer term was elected or has written)
    and the caller should stop. All writes share one mark. A Fencer with token
    0 is inert: falsy, and every write is rejected.
    """

    __slots__ = ()
    _elector = Elector

    def set(self, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``; see ``Elector.fence_set``."""
        fence = self._fence
        return fence.write(fence.set_request(self.token, key, value))

    def hset(self, key: str | bytes, field: str | bytes, value: EncodableT) -> bool:
        """Fenced ``HSET key field value``; see ``Elector.fence_hset``."""
        fence = self._fence
        return fence.write(fence.hset_request(self.token, key, field, value))

    def eval(
        self,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fenced Lua write; see ``Elector.fence_eval``."""
        fence = self._fence
        return fence.write(fence.eval_request(self.token, body, keys, args))

    def pipeline(self) -> FencedPipeline:
        """A pipeline of fenced writes with this token; see ``Elector.fence_pipeline``."""
        return FencedPipeline(self._fence, self.token)


def stop_all(electors: Iterable[Elector], timeout: float | None = None) -> None:
    """``stop()`` every elector of ``electors``, their releases sharing round trips.

    The same as calling ``e.stop(timeout)`` for each, one after another,
    except that the leases of runs started without a leader function are
    given back in batches (one round trip per few hundred, per master on a
    Cluster) rather than one round trip each, and every run is asked to end
    before any is waited for. ``timeout`` bounds the whole call; what
    has not ended by then ends on its own.

    Raises the first leader function exception (in the order given) once
    every run has ended; each later one is logged on the ``redlease`` logger.
    """
    group = list(electors)
    for e in group:
        if not isinstance(e, Elector):
            raise ConfigError(
                f"stop_all takes redlease.Elector instances, got {type(e).__name__} {e!r}"
            )
    if timeout is not None and not (type(timeout) in (int, float) and timeout == 0):
        timeout = to_seconds(timeout, "stop_all timeout")
    deadline = None if timeout is None else time.monotonic() + timeout
    here = threading.current_thread()
    loops: list[RunLoop] = []
    for e in group:
        run = e._core.run
        if run is None:
            continue
        driven = run.driven
        if isinstance(driven, RunLoop) and here not in run.own_threads:
            loops.append(driven)
        else:
            run.request_stop()
    end_together(loops, deadline)
    errors: list[BaseException] = []
    for e in group:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            e.stop(left)
        except BaseException as exc:  # the leader function's, raised once all have ended
            errors.append(exc)
    for later in errors[1:]:
        logging.getLogger("redlease").error(
            "stop_all: a leader function also raised", exc_info=later
        )
    if errors:
        raise errors[0]
