"""The pure-Python engine's loop connection: redis-py's connect, then a bare socket.

``PyLoopConn`` is the ``Conn`` a ``LoopWriter`` drives on the Python
engine: redis-py opens the connection (handshake, TLS, the sentinels'
master), then the writer's event loop works the non-blocking socket
directly, encoding the scripts' RESP itself and parsing replies with
hiredis.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.exceptions import ConnectionError, InvalidResponse

from ..._scripts import Script
from ..contract.interface import MAX_REPLY_BYTES
from ..rules.encodable import EncodableT
from ..rules.replies import ReplyTooLarge
from .boundedsocket import Headers

try:
    from redis._parsers import BaseParser as _BaseParser
except ImportError:  # redis-py < 5
    from redis.connection import BaseParser as _BaseParser  # type: ignore[attr-defined]


def _encode(parts: Sequence[Any]) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if type(part) is bytes:
            data = part
        elif type(part) is str:
            data = part.encode()
        elif type(part) is int:
            data = b"%d" % part
        elif type(part) is float:
            data = repr(part).encode()
        elif isinstance(part, (bytes, bytearray, memoryview)):
            data = bytes(part)
        else:
            raise TypeError(
                f"Invalid input of type: '{type(part).__name__}'. "
                "Convert to a bytes, string, int or float first."
            )
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class PyLoopConn:
    """A ``Conn`` on redis-py: its connect and handshake, then the bare socket, hiredis replies.

    ``make`` returns a new, unconnected redis-py connection configured like
    the user's client (no retries): a Sentinel-managed one asks the
    sentinels for the master as it connects, a TLS one wraps its socket.
    ``generation`` changes whenever the master may have changed; a
    connection made before the change is ``outdated``.
    """

    def __init__(
        self, make: Callable[[], Any], generation: Callable[[], int] | None = None
    ) -> None:
        self._make = make
        self._generation = generation
        self._connected_in = 0
        self._redis_conn: Any = None
        self._sock: socket.socket | None = None
        self._tls = False
        self._out = bytearray()
        self._reader = hiredis.Reader(replyError=_BaseParser.parse_error)
        self._headers = Headers()
        self._unreplied = 0  # bytes read since the last whole reply

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self, timeout: float) -> None:
        if self._sock is not None:
            return
        generation = self._generation() if self._generation is not None else 0
        conn = self._make()
        conn.socket_timeout = timeout
        conn.socket_connect_timeout = timeout
        conn.connect()
        sock = conn._sock
        sock.setblocking(False)
        self._redis_conn = conn
        self._reader = hiredis.Reader(replyError=_BaseParser.parse_error)
        self._headers = Headers()
        self._unreplied = 0
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._connected_in = generation
        self._sock = sock

    def fileno(self) -> int:
        return -1 if self._sock is None else self._sock.fileno()

    @property
    def outdated(self) -> bool:
        return (
            self._sock is not None
            and self._generation is not None
            and self._generation() != self._connected_in
        )

    def put(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        load: bool = False,
        slot: int | None = None,  # one server: no slot to route by
    ) -> None:
        head = ("EVAL", script.source) if load else ("EVALSHA", script.sha)
        self._out += _encode((*head, len(keys), *keys, *args))

    def flush(self) -> bool:
        sock, out = self._sock, self._out
        if sock is None:
            return not out
        while out:
            try:
                n = sock.send(out)
            except _WOULD_BLOCK:
                return False
            except OSError as exc:
                self.drop()
                raise ConnectionError(f"Error while writing to the server: {exc}") from exc
            del out[:n]
        return True

    def read(self) -> list[Any]:
        """Every whole reply that has arrived; never more than the cap without one."""
        sock = self._sock
        if sock is None:
            return []
        reader = self._reader
        replies: list[Any] = []
        while True:
            try:
                data = sock.recv(65536)
            except _WOULD_BLOCK:
                break
            except OSError as exc:
                self.drop()
                raise ConnectionError(f"Error while reading from the server: {exc}") from exc
            if not data:
                self.drop()
                raise ConnectionError("Connection closed by server.")
            try:
                # An array past the limits is refused before the reader sizes a list by it.
                self._headers.feed(data)
            except ReplyTooLarge:
                self.drop()
                raise
            reader.feed(data)
            self._unreplied += len(data)
            try:
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
                    self._unreplied = 0
            except hiredis.ProtocolError as exc:
                # Past a malformed reply nothing on this stream can be trusted.
                self.drop()
                raise InvalidResponse(
                    f"Protocol error: the server sent a malformed reply ({exc})"
                ) from exc
            if self._unreplied > MAX_REPLY_BYTES:
                # A server flooding the socket would otherwise keep this loop
                # (and the event loop) reading, and the reader buffering.
                read = self._unreplied
                self.drop()
                raise ReplyTooLarge.past(MAX_REPLY_BYTES, read)
            # TLS: read on until OpenSSL wants the socket, so no decrypted
            # byte stays inside it where the loop cannot see it.
            if len(data) < 65536 and not self._tls:
                break
        return replies

    def clear(self) -> None:
        self._out.clear()

    def drop(self) -> None:
        self.clear()
        conn, self._redis_conn, self._sock = self._redis_conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()
