"""Fenced writes from asyncio tasks, pipelined on one connection the event loop drives.

A ``LoopWriter`` belongs to one event loop. Each write is encoded onto the
connection's output buffer and answered by a future; the loop itself watches
the socket (``add_reader`` / ``add_writer``), so a write costs no thread hop
and many tasks' writes share one round trip. Replies come back in the order
the calls were sent and are matched to the futures first in, first out.

* A cancelled task's write may already be on the wire: its reply is still
  read, and dropped, so every later reply still reaches its own future. Its
  outcome is unknown to the task, and it is never sent again.
* NOSCRIPT (the server lost its scripts) means the call did not run: it is
  sent again as EVAL, once, and its future waits for that reply (unless its
  task was cancelled meanwhile: then it is dropped, not resent).
* Every write has a deadline (the engine's write timeout, counted from the
  call). When the oldest call in flight passes it, every call in flight
  fails with ``TimeoutError`` and the connection is dropped: their outcome
  is unknown, and none of them is ever sent again. The next write opens a
  new connection.
* Any I/O error fails every call in flight with ``ConnectionError`` the
  same way.
* A reply saying the call did not run on this server, where the reply
  table resends it (``replytable.resends``: through sentinels a failover or
  a loading server; never on a client at a fixed address) sends that call
  again, once, the blocking way (``fallback``, the engine's ``write``, on the
  loop's executor), which asks the sentinels or follows the redirection as
  a threaded write does; once nothing is in flight the connection is
  dropped and the next write connects to the right server. Likewise, once
  the sentinels announce a new master the connection is ``outdated``, and
  the next write made with nothing in flight reconnects first.

Only the connect (with its handshake) blocks, once per connection, on the
loop's default executor; writes made meanwhile are queued and sent once it
is open.

The connection is a ``Conn``: the native ``LoopConn`` (C encoding and
parsing) or ``PyLoopConn`` (redis-py's connect and handshake, hiredis
parsing, in ``pyloopconn``) for the pure-Python engine.

Where the native extension is built, this module is compiled too, as it is,
with ``aiowriter.pxd`` declaring ``LoopWriter``'s fields (an extension type:
a write's and a reply's attribute reads are C fields, not dictionary
lookups); both engines then use the compiled writer. This source stays its
one definition, runs unchanged where nothing is compiled, and the asyncio
writer tests run against both forms. Keep it to what both run alike: every
attribute set on a ``LoopWriter`` is declared there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from redis.exceptions import (
    ConnectionError,
    RedisError,
    TimeoutError,
)

from ..._scripts import Script
from ..rules.encodable import EncodableT
from ..rules.replies import UnexpectedReply, check, classify, resent
from ..rules.replytable import DONE, NOSCRIPT, PLAIN


class Conn(Protocol):
    """What a ``LoopWriter`` drives: one non-blocking connection with an output buffer."""

    @property
    def connected(self) -> bool: ...

    def connect(self, timeout: float) -> None:
        """Open and handshake, bounded by ``timeout`` (blocking; runs on an executor)."""
        ...

    def fileno(self) -> int: ...

    @property
    def outdated(self) -> bool:
        """True when the server this connection reaches is no longer known to be the master."""
        ...

    def flush(self) -> bool:
        """Send what the socket takes now; True when nothing is left to send."""
        ...

    def read(self) -> list[Any]:
        """Every whole reply that arrived (error replies as exception instances)."""
        ...

    def clear(self) -> None:
        """Forget every queued call."""
        ...

    def drop(self) -> None:
        """Close the socket; forget queued calls and unread bytes."""
        ...


Put = Callable[[Script, Sequence["str | bytes"], Sequence[EncodableT], bool, "int | None"], None]
"""Queue one script call on the connection (EVAL instead of EVALSHA when the flag is set),
its first key's cluster slot given when known (None: the connection hashes the key)."""

Fallback = Callable[
    [Script, Sequence["str | bytes"], Sequence[EncodableT], "float | None", "int | None"], Any
]
"""Send one script call the blocking way: the engine's ``call_one`` (timeout None, slot)."""


class Settler(Protocol):
    """Who says what a call's future gets: ``settled(reply)`` for its reply, and is told
    ``raised(args, exc)`` of its error before the future gets it (a fenced write's fence:
    the future's awaiter then has nothing left to do)."""

    def settled(self, reply: Any) -> Any: ...

    def raised(self, args: Sequence[EncodableT], exc: BaseException) -> None: ...


_Future = asyncio.Future
_monotonic = time.monotonic
_get_ident = threading.get_ident

# One call in flight: its future, what to resend on NOSCRIPT, its deadline, its settler,
# its slot (as given to ``write``).
_Entry = tuple[
    "asyncio.Future[Any]",
    Script,
    Sequence["str | bytes"],
    Sequence[EncodableT],
    float,
    "Settler | None",
    "int | None",
]


def _settle(fut: asyncio.Future[Any], settler: Settler | None, reply: Any) -> None:
    """``fut`` (not done) gets ``reply``, or what its settler makes of it."""
    if settler is None:
        fut.set_result(reply)
        return
    try:
        result = settler.settled(reply)
    except Exception as exc:  # the settler's own failure is the awaiter's, not the loop's
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _reject(
    fut: asyncio.Future[Any],
    settler: Settler | None,
    args: Sequence[EncodableT],
    error: BaseException,
) -> None:
    """``fut`` (not done) gets ``error``, its settler told first."""
    if settler is not None:
        try:
            settler.raised(args, error)
        except Exception as exc:
            error = exc
    fut.set_exception(error)


class LoopWriter:
    """Pipelined script calls on one connection, driven by the event loop ``loop``.

    Use only from ``loop``'s thread, except ``close()``, which may be called
    from anywhere.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: Conn,
        put: Put,
        timeout: float,
        fallback: Fallback,
        topology: int = PLAIN,
    ) -> None:
        self._loop_ref = weakref.ref(loop)
        self._topology = topology  # how the client finds its server (``replytable``)
        # asyncio's own loop: its futures and clock are made without a
        # Python-level call (the same Future class, the same monotonic time).
        self._plain_loop = (
            type(loop).create_future is asyncio.BaseEventLoop.create_future
            and type(loop).time is asyncio.BaseEventLoop.time
        )
        self._fallback = fallback
        self._reroute = False  # a call ran elsewhere: reconnect once nothing is in flight
        self._thread = threading.get_ident()
        self._conn = conn
        self._put = put
        self._timeout = timeout
        self._pending: deque[_Entry] = deque()
        self._fd = -1
        self._connecting: asyncio.Future[None] | None = None
        self._writing = False
        self._flush_soon = False
        # Whether the deadline timer is scheduled. Its handle is not kept: a
        # handle holds its loop, and the loop must stay collectable while
        # this writer lives on in the engine's table of writers per loop.
        self._timer = False
        self._closed = False

    def running_here(self) -> bool:
        """True when this writer's loop is the one running on the calling thread.

        For asyncio's own loops, without ``asyncio.get_running_loop()``
        (which on Python 3.11 asks the kernel for the process id on every
        call): a thread runs one loop at a time, and a running loop knows
        its thread.
        """
        loop = self._loop_ref()
        if loop is None:
            return False
        if self._plain_loop:
            return getattr(loop, "_thread_id", None) == _get_ident()
        try:
            return loop is asyncio.get_running_loop()
        except RuntimeError:  # no loop runs on this thread
            return False

    @property
    def in_flight(self) -> int:
        """Calls sent or queued whose reply has not been read yet."""
        return len(self._pending)

    def write(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        settler: Settler | None = None,
        slot: int | None = None,
    ) -> asyncio.Future[Any]:
        """Queue one call of ``script``; the future gets its reply (or its error).

        With a ``settler``, the future gets what ``settler.settled`` makes of
        the reply, and an error only once ``settler.raised`` was told of it;
        a future already done (its task cancelled) is neither. ``slot``: on
        a cluster, the slot of the first key when the caller knows it (as
        for ``Engine.execute``), kept for the call's resends.
        """
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop of this writer is gone")
        if self._closed:
            raise ConnectionError("redlease: the engine was closed")
        pending = self._pending
        if not pending and self._fd >= 0 and (self._reroute or self._conn.outdated):
            self._disconnect()  # nothing in flight: reconnect to the server named now
        self._put(script, keys, args, False, slot)  # bad input raises here, before anything is sent
        fut: asyncio.Future[Any]
        if self._plain_loop:
            fut = _Future(loop=loop)
            deadline = _monotonic() + self._timeout
        else:
            fut = loop.create_future()
            deadline = loop.time() + self._timeout
        pending.append((fut, script, keys, args, deadline, settler, slot))
        if not self._timer:
            self._timer = True
            loop.call_at(pending[0][4], self._on_timer)
        if self._fd < 0:
            if self._connecting is None:
                self._connect(loop)
        elif len(pending) == 1:
            self._flush()  # nothing else in flight: send at once
        elif not self._flush_soon and not self._writing:
            # Others are in flight: gather this iteration's writes into one send.
            self._flush_soon = True
            loop.call_soon(self._flush)
        return fut

    # -- the loop's callbacks ------------------------------------------------

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the event loop of this writer is gone")
        return loop

    def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        fut = loop.run_in_executor(None, self._conn.connect, self._timeout)
        self._connecting = fut
        fut.add_done_callback(self._on_connected)

    def _on_connected(self, fut: asyncio.Future[None]) -> None:
        self._connecting = None
        error = fut.exception() if not fut.cancelled() else ConnectionError("connect cancelled")
        if self._closed:
            self._conn.drop()
            return
        if error is not None:
            self._fail(error)
            return
        if not self._pending:
            return  # every waiting call failed meanwhile; keep the fresh connection
        self._fd = self._conn.fileno()
        self._loop().add_reader(self._fd, self._on_readable)
        self._flush()

    def _flush(self) -> None:
        self._flush_soon = False
        if self._fd < 0:
            return
        try:
            done = self._conn.flush()
        except (RedisError, OSError) as exc:
            self._fail(exc)
            return
        if done:
            if self._writing:
                self._writing = False
                self._loop().remove_writer(self._fd)
        elif not self._writing:
            self._writing = True
            self._loop().add_writer(self._fd, self._flush)

    def _on_readable(self) -> None:
        try:
            replies = self._conn.read()
        except (RedisError, OSError) as exc:
            self._fail(exc)
            return
        pending = self._pending
        resend = False
        for reply in replies:
            if not pending:
                self._fail(ConnectionError("redlease: a reply nobody asked for; connection reset"))
                return
            fut, script, keys, args, _deadline, settler, slot = pending.popleft()
            kind = DONE if not isinstance(reply, Exception) else classify(reply)
            if kind == DONE:
                if type(reply) is not int or reply > 1 or reply < 0 or script.reply != "flag":
                    reply = check(script, reply)  # all but the common case of ``check``
                if type(reply) is UnexpectedReply:
                    # Not a result. The stream is still in step (a malformed
                    # one fails in read()), but this server is not to be
                    # trusted: reconnect once nothing is in flight.
                    self._reroute = True
                    if not fut.done():
                        _reject(fut, settler, args, reply)
                elif not fut.done():  # else the task was cancelled: the reply is dropped
                    _settle(fut, settler, reply)
            elif kind == NOSCRIPT:
                if fut.done():
                    continue  # not run, and its task is gone: never sent again
                # Not run: load the script with EVAL and wait for that reply instead.
                self._put(script, keys, args, True, slot)
                deadline = self._loop().time() + self._timeout
                pending.append((fut, script, keys, args, deadline, settler, slot))
                resend = True
            elif resent(reply, self._topology):
                self._reroute = True
                if not fut.done():
                    self._send_blocking(fut, script, keys, args, settler, slot)
            elif not fut.done():
                _reject(fut, settler, args, reply)
        if self._reroute and not pending:
            self._reroute = False
            self._disconnect()
        elif resend:
            self._flush()

    def _send_blocking(
        self,
        fut: asyncio.Future[Any],
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        settler: Settler | None,
        slot: int | None,
    ) -> None:
        """Send a call that did not run through ``fallback`` on the executor; ``fut`` gets it."""
        attempt = self._loop().run_in_executor(None, self._fallback, script, keys, args, None, slot)

        def settle(done: asyncio.Future[Any]) -> None:
            if fut.done():
                return
            if done.cancelled():
                _reject(fut, settler, args, ConnectionError("redlease: the write was cancelled"))
            elif (error := done.exception()) is not None:
                _reject(fut, settler, args, error)
            else:
                _settle(fut, settler, done.result())

        attempt.add_done_callback(settle)

    def _on_timer(self) -> None:
        self._timer = False
        pending = self._pending
        if not pending:
            return
        loop = self._loop()
        deadline = pending[0][4]
        if deadline <= loop.time():
            self._fail(TimeoutError(f"Timeout reading from the server after {self._timeout:g} s"))
        else:
            self._timer = True
            loop.call_at(deadline, self._on_timer)

    def _disconnect(self) -> None:
        """Stop watching the socket and drop the connection (queued calls included)."""
        if self._fd >= 0:
            loop = self._loop_ref()
            if loop is not None and not loop.is_closed():
                loop.remove_reader(self._fd)
                if self._writing:
                    loop.remove_writer(self._fd)
            self._fd = -1
        self._writing = False
        if self._connecting is None:
            self._conn.drop()
        else:
            self._conn.clear()  # the connect thread owns the socket until it returns

    def _fail(self, error: BaseException) -> None:
        """Every call in flight fails with ``error``'s kind; the connection is dropped."""
        self._disconnect()
        pending, self._pending = self._pending, deque()
        if not isinstance(error, RedisError):
            error = ConnectionError(str(error) or type(error).__name__)
        for fut, _script, _keys, args, _deadline, settler, _slot in pending:
            if not fut.done():
                _reject(fut, settler, args, type(error)(*error.args))

    def close(self) -> None:
        """Fail every call in flight and close the connection. Idempotent; any thread."""
        if self._closed:
            return
        loop = self._loop_ref()
        if loop is not None and not loop.is_closed() and threading.get_ident() != self._thread:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self.close)
                return
        self._closed = True
        self._fail(ConnectionError("redlease: the engine was closed"))


__all__ = ["Conn", "LoopWriter", "Settler"]
