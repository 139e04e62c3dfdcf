"""Helpers for the engine tests: a server on TCP and a unix socket, keepers of either kind.

Nothing here imports the native extension at import time: the Python
keeper's half of the contract suite runs where the extension is not built.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any

import redis

from helpers import require_native, require_probe
from redlease._engine.conn.client import Endpoint
from redlease._engine.contract.interface import Keeper
from redlease._scripts import Script, load
from redlease._testing import RedisServer

RENEW = load("renew")

COUNTED_RENEW = Script(
    "renew-counted",
    "local function renew()\n"
    + RENEW.source
    + "\nend\n"
    + "local renewed = renew()\n"
    + "if renewed == 1 then redis.call('INCR', KEYS[1] .. ':renewals') end\n"
    + "return renewed\n",
)
"""The real renewal script, counting each renewal it grants in ``<key>:renewals``.

The keeper contract suite counts renewals at the server with it: the Keeper
protocol has no counter of its own (the native keeper's ``renewals`` is an
extra).
"""

KEEPER_KINDS = ("native", "python")


def endpoint_at(port: int = 6379, *, path: str | None = None, **kwargs: Any) -> Endpoint:
    """An ``Endpoint`` for a loopback port, or for a unix socket ``path``."""
    fields: dict[str, Any] = {
        "host": None if path else "127.0.0.1",
        "port": port,
        "path": path,
        "db": 0,
        "username": None,
        "password": None,
        "client_name": None,
    }
    fields.update(kwargs)
    return Endpoint(**fields)


class Server:
    """One private redis-server listening on a loopback port and a unix socket at once.

    The harness's ``RedisServer`` with a second listener, so each test can
    reach the same server over TCP and over a unix socket.
    """

    def __init__(self, *extra: str) -> None:
        self._sock_dir = tempfile.mkdtemp(prefix="rlnative")
        self.sock = os.path.join(self._sock_dir, "redis.sock")
        self._server = RedisServer(
            args=["--unixsocket", self.sock, "--unixsocketperm", "700", *extra]
        )
        try:
            self._server.start()
        except BaseException:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            raise
        port = self._server.port
        assert port is not None
        self.port: int = port

    @property
    def paused(self) -> bool:
        return self._server.paused

    def client(self, *, unix: bool = False, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        if unix:
            return redis.Redis(unix_socket_path=self.sock, **kwargs)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def endpoint(self, *, unix: bool = False, **kwargs: Any) -> Endpoint:
        """This server's endpoint, as ``native_endpoint()`` takes it from a client."""
        if unix:
            return endpoint_at(path=self.sock, **kwargs)
        return endpoint_at(self.port, **kwargs)

    def target(self, **kwargs: Any) -> Any:
        """A native ``Target`` for this server over TCP (fields as ``endpoint()`` takes them)."""
        return require_native().Target(self.endpoint(**kwargs))

    def unix_target(self, **kwargs: Any) -> Any:
        return require_native().Target(self.endpoint(unix=True, **kwargs))

    def pause(self) -> None:
        self._server.pause()

    def resume(self) -> None:
        self._server.resume()

    def kill(self) -> None:
        self._server.kill()

    def stop(self) -> None:
        self._server.stop()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


class Keepers:
    """Makes keepers of one kind for a test, the way the engines do, and closes them after.

    ``kind`` is ``"native"`` (``NativeEngine(endpoint).keeper(...)``) or
    ``"python"`` (``PythonEngine(client).keeper(...)``): the same call, so
    one test runs on both. Keepers renew with ``COUNTED_RENEW`` unless given
    another script.
    """

    def __init__(self, kind: str, server: Server, rc: redis.Redis) -> None:
        self.kind = kind
        self._server = server
        self._rc = rc
        self._engines: dict[bool, Any] = {}
        self._clients: list[redis.Redis] = []
        self._made: list[Keeper] = []
        self._leases: dict[int, tuple[str, float]] = {}

    def _engine(self, unix: bool) -> Any:
        engine = self._engines.get(unix)
        if engine is None:
            if self.kind == "native":
                require_native()
                from redlease._engine.engines.native import NativeEngine

                engine = NativeEngine(self._server.endpoint(unix=unix), write_timeout=None)
            else:
                from redlease._engine.engines.python import PythonEngine

                client = self._server.client(unix=unix)
                self._clients.append(client)
                engine = PythonEngine(client)
            self._engines[unix] = engine
        return engine

    def __call__(
        self,
        key: str = "lease",
        owner: str = "me",
        *,
        ttl: float = 0.3,
        interval: float = 0.1,
        unix: bool = False,
        script: Script | None = None,
        keys: list[Any] | None = None,
        args: list[Any] | None = None,
    ) -> Keeper:
        renew = (
            COUNTED_RENEW if script is None else script,
            [key] if keys is None else keys,
            [owner, int(ttl * 1000)] if args is None else args,
        )
        keeper: Keeper = self._engine(unix).keeper(
            renew,
            interval=interval,
            ttl=ttl,
        )
        self._made.append(keeper)
        self._leases[id(keeper)] = (key, ttl)
        return keeper

    def start(self, keeper: Keeper, token: int = 7, owner: str = "me") -> None:
        """Take the keeper's lease the way acquire would, then hand it to ``keeper``."""
        key, ttl = self._leases[id(keeper)]
        t0 = time.monotonic()
        assert self._rc.set(key, owner, px=int(ttl * 1000))
        keeper.begin(token, t0)

    def renewals(self, key: str = "lease") -> int:
        """How many renewals of ``key`` the server granted (``COUNTED_RENEW`` only)."""
        return int(self._rc.get(f"{key}:renewals") or 0)

    def close(self) -> None:
        for keeper in self._made:
            keeper.close()
        for engine in self._engines.values():
            engine.close()
        for client in self._clients:
            client.close()


def command(pool: Any, args: list[Any], timeout: float) -> Any:
    """One plain command (``["PING"]``) on one of a native ``Pool``'s connections; its reply.

    Through the core's test hooks (``_native._probe``): the engine itself
    only ever runs scripts on a Pool.
    """
    return require_probe().command(pool, args, timeout)


def native_ref(script: Script) -> Any:
    """The native ``ScriptRef`` of ``script``."""
    return require_native().ScriptRef(script.sha, script.source)


def lua(body: str) -> Any:
    """A native ``ScriptRef`` for a Lua body."""
    return native_ref(Script("test", body))


def run_batch(
    pool: Any,
    batch: list[tuple[Script, list[Any], list[Any]]],
    timeout: float,
    replicas: int = 0,
    wait_ms: int = 0,
) -> Any:
    """The native core's ``execute_scripts`` of ``batch`` on ``pool``, with refs made on
    first use: the replies, or ``(replies, acknowledged)`` with ``replicas``."""
    replies, acked, _flags = require_native().execute_scripts(
        pool, batch, {}, native_ref, timeout, replicas, wait_ms
    )
    return (replies, acked) if replicas > 0 else replies


def wait_state(keeper: Any, state: int, timeout: float) -> float | None:
    """The monotonic time ``keeper`` was seen in ``state``, or None on timeout."""
    deadline = time.monotonic() + timeout
    while keeper.state != state:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        keeper.wait(min(left, 0.05))
    return time.monotonic()


def in_child(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: a crash there fails the test, not the whole run."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_ids() -> set[str]:
    """The kernel's ids of this process's threads now."""
    return set(os.listdir("/proc/self/task"))
