"""The socket under the Python engine's connections: one deadline and one byte cap a round trip.

redis-py bounds each ``recv`` by the socket timeout, so a server that
trickles a reply a byte at a time renews the wait with every byte, and one
that never ends a line makes its parser buffer without end. Under every
connection of ``BoundedConnection`` lies a ``BoundedSocket`` instead: each
round trip ``begin``s with its deadline, every read waits at most until
then (a trickle or a stall ends in ``socket.timeout``, which redis-py
reports as its ``TimeoutError``), and the bytes read in one round trip
count against ``MAX_REPLY_BYTES`` (past it, ``ReplyTooLarge``, and the
connection is dropped). Every byte read also passes a ``Headers`` walker,
which refuses an array past ``MAX_REPLY_ELEMENTS`` or ``MAX_REPLY_DEPTH``
as its header arrives, before the parser (hiredis makes a list of the
length a header announces) sees it.

It is installed by the connection class (``bounded_class``), whatever the
user's connection class is (TCP, unix socket, TLS, a Sentinel's) and
whichever parser reads from it.
"""

from __future__ import annotations

import functools
import socket
import time
from typing import Any

from ..contract.interface import MAX_REPLY_BYTES, MAX_REPLY_DEPTH, MAX_REPLY_ELEMENTS, MIN_STEP
from ..rules.replies import ReplyTooLarge

_SHORTEST = 1e-6
"""The smallest timeout set on the socket: 0 would make it non-blocking."""


_AGGREGATES = {ord("*"): 1, ord("~"): 1, ord(">"): 1, ord("%"): 2, ord("|"): 2}
"""RESP types that hold elements, and how many elements each counted entry is."""

_LINES = frozenset(map(ord, ":+-"))
"""RESP types that are one line and nothing more."""

_LINE_KEPT = 64
"""How much of one line the walker keeps while waiting for its end."""

_BLOBS = frozenset(map(ord, "$=!"))
"""RESP types whose header is followed by a body of the length it gives."""


class Headers:
    """Walks the headers of a RESP stream as bytes arrive; refuses arrays past the limits.

    Only headers are looked at: a bulk string's body is skipped by its
    length, never scanned. The elements still owed by each open array are
    the stack, at most ``MAX_REPLY_DEPTH`` deep. A line it cannot read is
    left to the parser, which will refuse it; the walk stops there.
    """

    __slots__ = ("_broken", "_line", "_owed", "_skip")

    def __init__(self) -> None:
        self._line = b""
        self._skip = 0
        self._owed: list[int] = []
        self._broken = False

    def feed(self, data: bytes) -> None:
        """Walk ``data``; ``ReplyTooLarge`` at a header past the limits."""
        if (
            data
            and data[0] in _LINES
            and not (self._skip or self._owed or self._line)
            and data.find(b"\n") == len(data) - 1
        ):
            return  # one whole line (``:1``, ``+OK``, an error): the usual reply, no array
        pos, n = 0, len(data)
        while pos < n and not self._broken:
            if self._skip:
                taken = min(self._skip, n - pos)
                self._skip -= taken
                pos += taken
                continue
            end = data.find(b"\n", pos)
            if end < 0:
                # A line split across reads: only its start is kept (a header
                # is a type byte and at most 20 digits; a simple string's
                # text does not matter here).
                if len(self._line) < _LINE_KEPT:
                    self._line += data[pos : pos + _LINE_KEPT - len(self._line)]
                return
            line = (self._line + data[pos : min(end, pos + _LINE_KEPT)])[:_LINE_KEPT]
            self._line = b""
            pos = end + 1
            self._header(line)

    def _header(self, line: bytes) -> None:
        kind = line[0] if line else 0
        owed = self._owed
        if owed:
            owed[-1] -= 1  # this entry fills one place of the array it is in
        count = 0
        if kind in _AGGREGATES or kind in _BLOBS:
            try:
                count = int(line[1:].rstrip(b"\r"))
            except ValueError:
                self._broken = True
                return
        if kind in _BLOBS:
            if count >= 0:
                self._skip = count + 2
        elif kind in _AGGREGATES and count > 0:
            elements = count * _AGGREGATES[kind]
            if elements > MAX_REPLY_ELEMENTS or len(owed) >= MAX_REPLY_DEPTH:
                raise ReplyTooLarge.past_limits(
                    elements, len(owed) + 1, MAX_REPLY_ELEMENTS, MAX_REPLY_DEPTH
                )
            owed.append(elements)
            return
        while owed and owed[-1] == 0:
            owed.pop()


class BoundedSocket:
    """A socket whose reads share the round trip's deadline and byte budget."""

    __slots__ = ("_deadline", "_headers", "_left", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._deadline: float | None = None
        self._left = MAX_REPLY_BYTES
        self._headers = Headers()

    def begin(self, deadline: float) -> None:
        """A new round trip: reads end by ``deadline`` and share a fresh byte budget.

        One begun at or past its deadline (the connect and its handshake, or
        waiting for the GIL, took the time) still waits ``MIN_STEP`` for its
        reply, as every step of a round trip does, and no longer.
        """
        self._deadline = max(deadline, time.monotonic() + MIN_STEP)
        self._left = MAX_REPLY_BYTES

    def settimeout(self, timeout: float | None) -> None:
        # The parser sets its own timeout around each read: never past the deadline.
        if self._deadline is not None:
            left = max(self._deadline - time.monotonic(), _SHORTEST)
            timeout = left if timeout is None else min(timeout, left)
        self._sock.settimeout(timeout)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._before_read()
        data: bytes = self._sock.recv(bufsize, flags)
        if not flags & socket.MSG_PEEK:  # a peek (redis-py's can_read) reads nothing yet
            self._count(len(data))
            self._headers.feed(data)
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._before_read()
        got: int = self._sock.recv_into(buffer, nbytes, flags)
        if not flags & socket.MSG_PEEK:
            self._count(got)
            self._headers.feed(bytes(memoryview(buffer)[:got]))
        return got

    def _before_read(self) -> None:
        if self._deadline is None:
            return
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the round trip's deadline passed")  # socket.timeout
        current = self._sock.gettimeout()
        if current is None or current > left:
            self._sock.settimeout(left)

    def _count(self, got: int) -> None:
        self._left -= got
        if self._left < 0:
            raise ReplyTooLarge.past(MAX_REPLY_BYTES, MAX_REPLY_BYTES - self._left)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def begin_round_trip(conn: Any, deadline: float) -> None:
    """Start a round trip on redis-py connection ``conn``: its reads end by ``deadline``.

    A connection not made by ``bounded_class`` (or not connected) is left as it is.
    """
    sock = getattr(conn, "_sock", None)
    if isinstance(sock, BoundedSocket):
        sock.begin(deadline)


@functools.cache
def bounded_class(cls: type) -> type:
    """``cls`` (a redis-py connection class) whose socket is a ``BoundedSocket``."""

    class Bounded(cls):  # type: ignore[misc]
        def _connect(self) -> Any:
            return BoundedSocket(super()._connect())

    Bounded.__name__ = Bounded.__qualname__ = cls.__name__
    return Bounded
