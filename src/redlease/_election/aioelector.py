"""The asyncio Elector and Fencer, published as ``redlease.aio`` (whose docstring says how
they behave): the threaded election on a thread of its own, its terms bridged to tasks on
the caller's event loop (``_LeaderBridge``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._engine import EncodableT, threaded
from .._offload import off_loop, outlast
from .._on_exit import AwaitsStopOnExit
from .election import Run, check_leader_fn
from .pipeline import AsyncFencedPipeline as FencedPipeline
from .runloop import RunLoop
from .shell import ElectorShell, FencerShell
from .term import Leader, Term, when_ended

LeaderCoroutine = Callable[[Term, "Fencer"], Awaitable[object]]


class Fencer(FencerShell):
    """A term's fencing token bound to its ``aio.Elector``; writes are coroutines.

    Same guarantees as ``redlease.Fencer``: each write applies only when the
    token is at least the fence high-water mark, atomically, and returns
    ``applied``. Token 0 is inert: falsy, every write rejected.

    A write (or pipeline) cancelled while in flight raises ``CancelledError``
    and its outcome is unknown: it may have been applied, it is never sent
    again, and the connection stays in step (every later write gets its own
    reply).
    """

    __slots__ = ()
    _face = "aio.Fencer"

    # Each write awaits the fence's future itself: one coroutine a write, this one.

    async def set(self, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET``; see ``Elector.fence_set``."""
        fence = self._fence
        return await fence.write_async(fence.set_request(self.token, key, value))

    async def hset(self, key: str | bytes, field: str | bytes, value: EncodableT) -> bool:
        """Fenced ``HSET``; see ``Elector.fence_hset``."""
        fence = self._fence
        return await fence.write_async(fence.hset_request(self.token, key, field, value))

    async def eval(
        self,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fenced Lua write; see ``Elector.fence_eval``."""
        fence = self._fence
        return await fence.write_async(fence.eval_request(self.token, body, keys, args))

    def pipeline(self) -> FencedPipeline:
        """A pipeline of fenced writes with this token; ``await pipe.execute()`` sends it."""
        return FencedPipeline(self._fence, self.token)



class Elector(ElectorShell, AwaitsStopOnExit):
    """Lease-based leader election with fencing tokens, for asyncio.

    Arguments, validation, defaults and semantics are those of
    ``redlease.Elector``; ``client`` is a ``redis.asyncio.Redis``. ``run`` and
    the fenced writes are coroutines; ``token()``, ``is_leader()``,
    ``fencer()`` and ``resign()`` are plain calls, safe from any thread.
    """

    _face = "aio.Elector"
    _client: Any
    _stop_event: asyncio.Event | None
    _task: asyncio.Task[None] | None
    _leader_tasks: set[asyncio.Task[None]]

    def _engine_client(self, client: Any) -> Any:
        return threaded(client, asyncio=True)

    def _shell_init(self, client: Any) -> None:
        self._client = client
        self._stop_event = None
        self._task = None
        self._leader_tasks = set()

    def fencer(self) -> Fencer:
        """A Fencer for the current term, or an inert one (token 0) when not leading."""
        return Fencer(self, self._core.token() or 0)

    def resign(self) -> None:
        """End the current term (its task is cancelled, the lock released); re-contend."""
        self._core.resign()

    async def leader(self) -> Leader | None:
        """Who holds the lease now (one round trip, off the event loop); None when nobody does."""
        return await off_loop(self._core.leader)

    def __repr__(self) -> str:
        return f"<redlease.aio.Elector {self.config.name!r} engine={self.engine}>"

    # -- running --------------------------------------------------------------

    async def run(
        self, fn: LeaderCoroutine | None = None, stop: asyncio.Event | None = None
    ) -> None:
        """Contend for leadership until ``stop`` is set (or this coroutine is cancelled).

        Each time this instance wins, ``fn(term, fencer)`` runs as a task on
        this event loop; the task is cancelled when the term ends (leadership
        lost, ``resign()``, the run stopped). The run does not release or
        re-contend until the task has finished. An exception from fn ends the
        term gracefully and the run, and is re-raised here. What retrying
        cannot mend at the client's first contact is raised before the run
        begins (see ``redlease.Elector.start``).

        Cancelled (at any point, any number of times), the run ends as if
        stopped: the leader task is cancelled and has finished, and the
        lease is released, before ``CancelledError`` propagates.
        """
        check_leader_fn(fn)
        if stop is not None and stop.is_set():
            return
        # The client's first contact off the loop (claim() then finds it made); a client
        # contacted before costs no await.
        if self._core.contact_due():
            await off_loop(self._core.contact)
        run = self._core.claim(threading.Event())
        assert run is not None
        await self._drive(run, fn, stop)

    async def _drive(
        self,
        run: Run,
        fn: LeaderCoroutine | None,
        stop: asyncio.Event | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        core = self._core
        bridge = None if fn is None else _LeaderBridge(self, fn, loop)
        finished: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, finished)

        # The process's driver runs the loop (no thread per run); a leader
        # coroutine's term holds one thread while it leads, as the bridge
        # waits there for the task to finish.
        RunLoop(core, run, bridge, on_done=done).start()
        stop_waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            waiting: set[asyncio.Future[Any]] = {finished}
            if stop_waiter is not None:
                waiting.add(stop_waiter)
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Stopped, cancelled or finished: the run ends, the term steps down
            # and the lock is released before this coroutine returns, however
            # many cancellations arrive meanwhile.
            run.request_stop()
            if stop_waiter is not None:
                stop_waiter.cancel()
            cancelled = await outlast(finished)
        if cancelled:
            raise asyncio.CancelledError
        if run.error is not None:
            raise run.error

    def start(self, fn: LeaderCoroutine | None = None) -> Elector:
        """Run the loop as a task on the running event loop; returns this elector.

        The first start on a client makes one bounded round trip, on this
        thread, and raises what retrying cannot mend (see
        ``redlease.Elector.start``); later starts on that client make none.
        """
        if self._task is not None and not self._task.done():
            raise RuntimeError(f"aio.Elector {self.config.name!r} is already running")
        check_leader_fn(fn)
        # Claim the run now, not when the task first runs, so a concurrent
        # run() or start() right after this one raises as it should.
        self._stop_event = asyncio.Event()
        run = self._core.claim(threading.Event())
        assert run is not None
        self._task = asyncio.ensure_future(self._drive(run, fn, self._stop_event))
        return self

    async def stop(self) -> None:
        """End the run started by ``start()``: the term ends, the lock is released.

        Re-raises the leader coroutine's exception when that ended the run.
        Cancelled, it still waits for the run to end (the lease released)
        before ``CancelledError`` propagates.
        """
        task = self._task
        if task is None:
            return
        if self._stop_event is not None:
            self._stop_event.set()
        if asyncio.current_task() in self._leader_tasks:
            # Called by the leader coroutine: the run ends once it returns;
            # awaiting the run here would await ourselves.
            return
        self._task = None
        if await outlast(task):
            if not task.cancelled():
                task.exception()  # retrieved: the cancellation is what the caller gets
            raise asyncio.CancelledError
        await task

    async def __aenter__(self) -> Elector:
        """Start contending (``start()``); ``__aexit__`` stops, releasing the lease, even
        when cancelled (see ``stop``)."""
        if self._task is None:
            self.start(None)
        return self


    # -- fenced writes ----------------------------------------------------------

    async def fence_set(self, token: int, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``: applied only when ``token`` is current (True).

        Cancelled, its outcome is unknown (see ``Fencer``): never resent, and
        the next write gets its own reply.
        """
        fence = self._fence
        return await fence.write_async(fence.set_request(token, key, value))

    async def fence_hset(
        self, token: int, key: str | bytes, field: str | bytes, value: EncodableT
    ) -> bool:
        """Fenced ``HSET key field value``; semantics as ``fence_set``."""
        fence = self._fence
        return await fence.write_async(fence.hset_request(token, key, field, value))

    async def fence_eval(
        self,
        token: int,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fence an arbitrary Lua write; semantics as ``redlease.Elector.fence_eval``."""
        fence = self._fence
        return await fence.write_async(fence.eval_request(token, body, keys, args))


    def fence_pipeline(self, token: int) -> FencedPipeline:
        """A pipeline of fenced writes with ``token``; ``await pipe.execute()`` -> ``list[bool]``.

        Semantics as ``redlease.Elector.fence_pipeline``; the whole batch is
        one round trip.
        """
        return FencedPipeline(self._fence, token)


Fencer._elector = Elector  # a Fencer binds to this face's electors only


class _LeaderBridge:
    """Runs the leader coroutine on the event loop for the run thread.

    Called on the elector's leader thread with each term: it starts the
    coroutine as a task on the loop, cancels the task when the term ends, and
    returns only once the task has really finished, so the run releases the
    lock after the leader's work is done, never while it still runs.
    """

    def __init__(self, elector: Elector, fn: LeaderCoroutine, loop: asyncio.AbstractEventLoop):
        self._elector = elector
        self._fn = fn
        self._loop = loop

    def __call__(self, term: Term, _fencer: object) -> None:
        finished = threading.Event()
        outcome: list[BaseException] = []
        tasks: list[asyncio.Task[None]] = []

        async def drive() -> None:
            try:
                with self._elector._core.events.leading():  # e.g. the term's span current
                    await self._fn(term, Fencer(self._elector, term.token))
            except asyncio.CancelledError as exc:
                if not term.ended():
                    outcome.append(exc)  # cancelled by someone else: not a term end
            except BaseException as exc:
                outcome.append(exc)

        def ended(task: asyncio.Task[None]) -> None:
            # A task cancelled before its first step never runs drive(): the
            # term is told here, on every way out, so it never waits forever.
            if task.cancelled() and not outcome and not term.ended():
                outcome.append(asyncio.CancelledError())
            finished.set()

        def begin() -> None:
            task = self._loop.create_task(drive())
            tasks.append(task)
            self._elector._leader_tasks.add(task)
            task.add_done_callback(self._elector._leader_tasks.discard)
            task.add_done_callback(ended)

        def cancel() -> None:
            for task in tasks:
                task.cancel()

        self._loop.call_soon_threadsafe(begin)
        when_ended(term, lambda: self._loop.call_soon_threadsafe(cancel))
        finished.wait()
        if outcome:
            raise outcome[0]


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
