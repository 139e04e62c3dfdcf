"""Liveness and readiness over HTTP for electors: ``/livez`` and ``/readyz`` (stdlib only).

```python
from redlease.health import HealthServer

with HealthServer([elector], host="0.0.0.0", port=8080):   # ready="always" | "leader"
    ...   # GET /livez, GET /readyz
```

``/livez`` answers 200 while every elector's run is alive and, when it
leads, its lease was renewed within its ttl; 503 otherwise (a run that
ended, or a leader whose renewals stalled past its ttl without stepping
down). A follower is live, and so is a leader that stepped down because
Redis is out of reach: restarting either would not help. ``/readyz`` is
``/livez`` for ``ready="always"``; for ``ready="leader"`` it answers 200
only while every elector leads (see ``docs/integrations.md`` for what that
does to a rolling update). Both answer JSON ``{"ok": bool, "electors":
[...]}``, one object per elector as ``status()`` gives it. Any other path is
a 404.

Everything is read locally, without a round trip: each elector's core (the
shells' one internal attribute, ``_core``, which ``redlease.metrics`` reads
too) says whether its run is going, its term's token, and when its lease
was last confirmed at Redis (the term's acquire or its latest good renewal).
"""

from __future__ import annotations

import errno
import json
import logging
import threading
import urllib.parse
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redlease
import redlease.aio
from redlease import ConfigError

from ._on_exit import StopsOnExit

__all__ = ["READY", "HealthServer", "status"]

logger = logging.getLogger(__name__)

READY = ("always", "leader")
"""The readiness rules: ``"always"`` (as ``/livez``) or ``"leader"`` (only while leading)."""

AnyElector = redlease.Elector | redlease.aio.Elector

def status(elector: AnyElector) -> dict[str, Any]:
    """What ``/livez`` reports for one elector, as a JSON-ready dict.

    Keys: ``name``, ``leader`` (bool), ``token`` (int, None when not
    leading), ``engine``, ``last_renewal_ms_ago`` (int: how long ago the
    lease was last confirmed at Redis, by the term's acquire or its latest
    good renewal; None when not leading) and, only when this elector is not
    live, ``reason`` (str). Read locally: no round trip.
    """
    _check_elector(elector)
    alive, token, ago = elector._core.health()
    answer: dict[str, Any] = {
        "name": elector.config.name,
        "leader": token is not None,
        "token": token,
        "engine": elector.engine,
        "last_renewal_ms_ago": None if ago is None else int(ago * 1000),
    }
    ttl = elector.config.ttl
    if not alive:
        answer["reason"] = "its run has ended (or was never started)"
    elif ago is not None and ago > ttl:
        answer["reason"] = (
            f"leads with token {token} but its lease was last confirmed {ago:.3f} s ago, past "
            f"its ttl ({ttl} s): its renewals stalled and it has not stepped down"
        )
    return answer


def _check_elector(elector: object) -> None:
    if not isinstance(elector, (redlease.Elector, redlease.aio.Elector)):
        raise ConfigError(
            "health checks take a redlease.Elector or redlease.aio.Elector, got "
            f"{type(elector).__name__}"
        )


class HealthServer(StopsOnExit):
    """``/livez`` and ``/readyz`` for ``electors`` on ``host``:``port`` (0: a free port).

    ``electors`` is a non-empty sequence of ``redlease.Elector`` and
    ``redlease.aio.Elector``; ``ready`` is ``"always"`` or ``"leader"`` (see
    the module doc). ``start()`` serves from a thread of its own (one thread
    per request, stdlib ``http.server``); ``port`` is the bound port once
    started; ``stop()`` closes it. Also a context manager. The server never
    starts or stops the electors.

    A ``start()`` that cannot bind raises the ``OSError`` the bind raised, of
    the same class and ``errno`` (so existing ``except OSError`` handlers and
    ``errno`` checks still work), with a message that names the host and port
    and what to do: a port in use says to pick another one or ``port=0``.
    The original error is its ``__cause__``.
    """

    def __init__(
        self,
        electors: Sequence[AnyElector],
        host: str = "127.0.0.1",
        port: int = 0,
        ready: str = "always",
    ) -> None:
        if isinstance(electors, (str, bytes)) or not isinstance(electors, Sequence):
            raise ConfigError(
                f"electors must be a sequence (a list) of electors, got {type(electors).__name__}"
            )
        if not electors:
            raise ConfigError("electors must name at least one elector, got an empty sequence")
        for elector in electors:
            _check_elector(elector)
        if not isinstance(host, str) or not host:
            raise ConfigError(f"host must be a non-empty str, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(
                f"port must be an int from 0 to 65535 (0: any free port), got {port!r}"
            )
        if ready not in READY:
            raise ConfigError(f"ready must be one of {', '.join(READY)}, got {ready!r}")
        self.electors: tuple[AnyElector, ...] = tuple(electors)
        self.host = host
        self.ready = ready
        self._requested_port = port
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def port(self) -> int:
        """The TCP port the server listens on; RuntimeError before ``start()``."""
        server = self._server
        if server is None:
            raise RuntimeError("the HealthServer is not started: no port is bound")
        return int(server.server_address[1])

    def start(self) -> HealthServer:
        """Bind and serve from a background thread; returns the server."""
        with self._mutex:
            if self._server is not None:
                raise RuntimeError("the HealthServer is already started")
            server = self._bind()
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever, name="redlease-health", daemon=True
            )
            self._thread.start()
        return self

    def _bind(self) -> _Server:
        host, port = self.host, self._requested_port
        try:
            return _Server((host, port), self)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                said = (
                    f"port {port} on {host} is in use: pick another port, "
                    "or port=0 for a free one"
                )
            elif exc.errno == errno.EACCES:
                said = (
                    f"port {port} on {host} needs privileges this process lacks: "
                    "pick a port of 1024 or above, or port=0 for a free one"
                )
            else:
                said = f"cannot listen on {host} port {port}: {exc.strerror or exc}"
            raise type(exc)(exc.errno, said) from exc

    def stop(self) -> None:
        """Stop serving and close the socket. No-op when not started."""
        with self._mutex:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> HealthServer:
        return self.start()


    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        """The status code and JSON body this server gives ``GET path``."""
        if path not in ("/livez", "/readyz"):
            return 404, {"ok": False, "error": f"no such path {path!r}: /livez, /readyz"}
        leader_only = path == "/readyz" and self.ready == "leader"
        electors = []
        for elector in self.electors:
            answer = status(elector)
            if leader_only and "reason" not in answer and not answer["leader"]:
                answer["reason"] = 'not the leader (readiness is ready="leader")'
            electors.append(answer)
        ok = not any("reason" in answer for answer in electors)
        return (200 if ok else 503), {"ok": ok, "electors": electors}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], health: HealthServer) -> None:
        super().__init__(address, _Handler)
        self.health = health


class _Handler(BaseHTTPRequestHandler):
    server_version = "redlease-health"

    def do_GET(self) -> None:
        assert isinstance(self.server, _Server)
        health = self.server.health
        path = urllib.parse.urlsplit(self.path).path
        try:
            code, body = health.answer(path)
        except Exception as exc:
            logger.warning("health: %s failed: %r", path, exc)
            code, body = 500, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("health: " + format, *args)
