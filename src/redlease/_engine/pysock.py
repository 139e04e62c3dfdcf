"""The socket under the Python engine's connections: one deadline and one byte cap a round trip.

redis-py bounds each ``recv`` by the socket timeout, so a server that
trickles a reply a byte at a time renews the wait with every byte, and one
that never ends a line makes its parser buffer without end. Under every
connection of ``BoundedConnection`` lies a ``BoundedSocket`` instead: each
round trip ``begin``s with its deadline, every read waits at most until
then (a trickle or a stall ends in ``socket.timeout``, which redis-py
reports as its ``TimeoutError``), and the bytes read in one round trip
count against ``MAX_REPLY_BYTES`` (past it, ``ReplyTooLarge``, and the
connection is dropped).

It is installed by the connection class (``bounded_class``), whatever the
user's connection class is (TCP, unix socket, TLS, a Sentinel's) and
whichever parser reads from it.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from .base import MAX_REPLY_BYTES, MIN_STEP
from .replies import ReplyTooLarge

_SHORTEST = 1e-6
"""The smallest timeout set on the socket: 0 would make it non-blocking."""


class BoundedSocket:
    """A socket whose reads share the round trip's deadline and byte budget."""

    __slots__ = ("_deadline", "_left", "_sock")

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._deadline: float | None = None
        self._left = MAX_REPLY_BYTES

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
        self._count(len(data))
        return data

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._before_read()
        got: int = self._sock.recv_into(buffer, nbytes, flags)
        self._count(got)
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
