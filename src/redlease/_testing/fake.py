"""A fake Redis on a loopback port that answers each script with the raw reply a test chose.

A real redis-server cannot be made to answer a script with a reply the script
cannot give (an array where it returns 0/1, a bulk whose length lies...). This
one speaks enough RESP2/RESP3 for both engines' handshakes (redis-py's HELLO 3
and CLIENT SETINFO; AUTH / SELECT / CLIENT SETNAME when configured) and release
notices (SUBSCRIBE), answers what it does not know with ``+OK``, knows every
script in ``lua/`` by its SHA1, and records every command it received.
"""

from __future__ import annotations

import hashlib
import itertools
import socket
import socketserver
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from io import BufferedIOBase

import redis

from redlease import _scripts
from redlease._testing._common import client_module


class Stream:
    """A reply sent in pieces: each of ``pieces`` in turn, ``every`` seconds apart.

    ``pieces`` may be endless (``itertools.repeat``): the fake sends until the
    client hangs up or the fake closes.
    """

    def __init__(self, pieces: Iterable[bytes], every: float) -> None:
        self.pieces = pieces
        self.every = every


class Hangup:
    """A reply cut off: ``data`` is sent, then the connection closed (``reset``: with an RST)."""

    def __init__(self, data: bytes = b"", *, reset: bool = False) -> None:
        self.data = data
        self.reset = reset


Reply = bytes | Stream | Hangup | Callable[[list[bytes], list[bytes]], bytes]
"""Raw reply bytes, a ``Stream`` of them, or a function of the script's (keys, args) giving them."""


def bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


def array(*items: bytes, kind: bytes = b"*") -> bytes:
    """A RESP array (or, by ``kind``, a push) of already encoded ``items``."""
    return kind + b"%d\r\n" % len(items) + b"".join(items)


def won(token: int) -> Reply:
    """An acquire reply starting a term with ``token`` for the instance that asked."""
    return lambda keys, args: array(b":%d\r\n" % token, b":" + args[1] + b"\r\n", bulk(args[0]))


def lock_won(token: int) -> Reply:
    """A lock_acquire reply granting the lock with fencing ``token``."""
    return lambda keys, args: array(b":%d\r\n" % token, b":" + args[1] + b"\r\n")


DEFAULTS: dict[str, Reply] = {
    "acquire": array(b":0\r\n", b":1000\r\n", bulk(b"someone-else")),  # held elsewhere
    "leader": b"$-1\r\n",
    "lock_acquire": array(b":0\r\n", b":1000\r\n"),
}
"""Replies to scripts the test did not queue any for; every other script answers ``:1``."""


def _script_names() -> dict[str, str]:
    """SHA1 -> name of every script file, as sent plain and wrapped as a fenced write."""
    stems = _scripts.names()
    plain = {_scripts.load(stem).sha: stem for stem in stems}
    return {**{_scripts.fenced_file(stem).sha: stem for stem in stems}, **plain}


HOSTILE: dict[str, Callable[[], Reply]] = {
    "garbage": lambda: b"\x00\xffgarbage\r\n",
    "a bad type byte": lambda: b"?1\r\n",
    "a negative bulk length": lambda: b"$-5\r\n",
    "an overflowing integer": lambda: b":99999999999999999999\r\n",
    "`$9223372036854775807`, then silence": lambda: Stream(
        [b"$9223372036854775807\r\n", b""], every=5.0
    ),
    "`*2147483647`, then silence": lambda: Stream([b"*2147483647\r\n", b""], every=5.0),
    "arrays nested 9 deep, then silence": lambda: Stream([b"*1\r\n" * 9, b""], every=5.0),
    "no line end, 16 bytes every 20 ms": lambda: Stream(
        itertools.chain([b"+"], itertools.repeat(b"x" * 16)), every=0.02
    ),
    "no line end, as fast as read": lambda: Stream(
        itertools.chain([b"+"], itertools.repeat(b"x" * 65536)), every=0.0
    ),
    "a valid `:1`, one byte every 400 ms": lambda: Stream(
        [b":", b"1", b"\r", b"\n"], every=0.4
    ),
    "`*3 :1 :2 :3`": lambda: b"*3\r\n:1\r\n:2\r\n:3\r\n",
    "a 64 MiB bulk": lambda: b"$%d\r\n" % (64 << 20) + b"x" * (64 << 20) + b"\r\n",
    "a bulk whose length lies": lambda: b"$2\r\nabcd\r\n",
    "an error reply": lambda: b"-ERR no\r\n",
    "closed mid-reply": lambda: Hangup(b"*3\r\n:1\r\n"),
    "reset (RST)": lambda: Hangup(reset=True),
}
"""Every way of answering a call badly that the tests and ``benchmarks/hostile.py`` try.

Each makes a fresh reply (a ``Stream`` is consumed as it is sent). None is a
result: a call answered so must raise, within its bound, and be sent once.
"""


class FakeRedis:
    """The fake server: ``with FakeRedis() as fake: fake.script("renew", b":1\\r\\n")``."""

    def __init__(self) -> None:
        self.commands: list[list[bytes]] = []
        self._queues: dict[str, deque[Reply]] = {}
        self._names = _script_names()
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._closing = False
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with fake._lock:
                    fake._conns.append(self.connection)
                fake._serve(self.rfile, self.connection)

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,))
        self._thread.start()

    def script(self, name: str, *replies: Reply) -> FakeRedis:
        """Answer the next runs of script ``name`` with ``replies``, in order."""
        with self._lock:
            self._queues.setdefault(name, deque()).extend(replies)
        return self

    def command(self, verb: str, *replies: bytes | Stream | Hangup) -> FakeRedis:
        """Answer the next ``verb`` commands (SUBSCRIBE, PING...) with ``replies``, in order."""
        with self._lock:
            self._queues.setdefault(verb.upper(), deque()).extend(replies)
        return self

    def runs(self, name: str) -> int:
        """How many EVALSHA/EVAL of script ``name`` were answered (not NOSCRIPT)."""
        with self._lock:
            return sum(1 for cmd in self.commands if self._script_of(cmd) == name)

    def pending(self, name: str) -> int:
        """How many queued replies for ``name`` are still unused."""
        with self._lock:
            return len(self._queues.get(name, ()))

    def close(self) -> None:
        self._closing = True
        self._server.shutdown()
        self._thread.join(5)
        for conn in list(self._conns):
            with suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()

    def __enter__(self) -> FakeRedis:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _serve(self, rfile: BufferedIOBase, conn: socket.socket) -> None:
        session = _Session()
        while True:
            try:
                cmd = _read_command(rfile)
                if cmd is None:
                    return
                with self._lock:
                    self.commands.append(cmd)
                    reply = self._answer(cmd, session)
                if isinstance(reply, Hangup):
                    conn.sendall(reply.data)
                    if reply.reset:  # SO_LINGER 0: the close sends an RST
                        conn.setsockopt(
                            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                        )
                    conn.close()
                    return
                if isinstance(reply, Stream):
                    for piece in reply.pieces:
                        if self._closing:
                            return
                        conn.sendall(piece)
                        time.sleep(reply.every)
                else:
                    conn.sendall(reply)
            except (OSError, ValueError):
                return

    def _script_of(self, cmd: list[bytes]) -> str | None:
        """The script an answered EVALSHA/EVAL ran (under ``_lock``), else None."""
        verb = cmd[0].upper()
        if verb == b"EVALSHA" and len(cmd) > 1:
            return self._names.get(cmd[1].decode().lower())
        if verb == b"EVAL" and len(cmd) > 1:
            return self._names.get(hashlib.sha1(cmd[1]).hexdigest(), "<eval>")
        return None

    def _answer(self, cmd: list[bytes], session: _Session) -> bytes | Stream | Hangup:
        verb = cmd[0].upper()
        queued = self._queues.get(verb.decode("ascii", "replace"))
        if queued:
            chosen = queued.popleft()
            assert not callable(chosen)
            return chosen
        if verb in (b"EVALSHA", b"EVAL"):
            name = self._script_of(cmd)
            if name is None:
                return b"-NOSCRIPT No matching script. Please use EVAL.\r\n"
            numkeys = int(cmd[2])
            keys, args = cmd[3 : 3 + numkeys], cmd[3 + numkeys :]
            queue = self._queues.get(name)
            reply = queue.popleft() if queue else DEFAULTS.get(name, b":1\r\n")
            return reply(keys, args) if callable(reply) else reply
        if verb == b"SCRIPT" and len(cmd) > 2 and cmd[1].upper() == b"LOAD":
            return bulk(hashlib.sha1(cmd[2]).hexdigest().encode())
        if verb == b"HELLO":
            # As redis-server 7 answers it: a map in RESP3, a flat array in RESP2.
            session.proto = int(cmd[1]) if len(cmd) > 1 else session.proto
            info = [b"server", b"redis", b"version", b"7.2.4", b"mode", b"standalone"]
            fields = [bulk(field) for field in info]
            fields += [bulk(b"proto"), b":%d\r\n" % session.proto, bulk(b"modules"), b"*0\r\n"]
            if session.proto == 3:
                return b"%%%d\r\n" % (len(fields) // 2) + b"".join(fields)
            return array(*fields)
        if verb in (b"SUBSCRIBE", b"UNSUBSCRIBE"):
            return session.subscription(verb, cmd[1:])
        if verb == b"PING":
            if session.channels and session.proto == 2:
                return array(bulk(b"pong"), bulk(b""))
            return b"+PONG\r\n"
        if verb in (b"PUBLISH", b"WAIT"):
            return b":0\r\n"
        return b"+OK\r\n"


class _Session:
    """What one connection has asked for: its protocol and its subscriptions."""

    def __init__(self) -> None:
        self.proto = 2
        self.channels: set[bytes] = set()

    def subscription(self, verb: bytes, channels: list[bytes]) -> bytes:
        """What (UN)SUBSCRIBE confirms: one reply per channel, a push in RESP3."""
        kind, out = (b">" if self.proto == 3 else b"*"), b""
        for channel in channels or sorted(self.channels):
            (self.channels.add if verb == b"SUBSCRIBE" else self.channels.discard)(channel)
            out += array(
                bulk(verb.lower()), bulk(channel), b":%d\r\n" % len(self.channels), kind=kind
            )
        return out or array(bulk(verb.lower()), b"$-1\r\n", b":0\r\n", kind=kind)


def _read_command(rfile: BufferedIOBase) -> list[bytes] | None:
    """One RESP array of bulk strings from the client; None at end of stream."""
    header = rfile.readline()
    if not header:
        return None
    if not header.startswith(b"*"):
        return header.split()  # an inline command
    parts = []
    for _ in range(int(header[1:])):
        size = int(rfile.readline()[1:])
        parts.append(rfile.read(size + 2)[:size])
    return parts


@contextmanager
def client_of(fake: FakeRedis, timeout: float, family: str = "redis") -> Iterator[redis.Redis]:
    """A ``redis.Redis`` (or ``valkey.Valkey``) for ``fake``, its socket timeouts ``timeout``."""
    client = client_module(family).Redis(
        host="127.0.0.1", port=fake.port, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        yield client
    finally:
        client.close()
