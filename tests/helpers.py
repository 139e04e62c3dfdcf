"""Test helpers: polling with deadlines, fault endpoints, run threads, event recorders."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

import redlease

LOOPBACK = "127.0.0.1"


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(filename: str, module_name: str) -> ModuleType:
    """``benchmarks/<filename>`` loaded as the module ``module_name``, its functions to call.

    Registered in ``sys.modules`` (dataclasses look their module up by name),
    with ``benchmarks/`` on ``sys.path`` while it loads, for the benchmarks
    it imports.
    """
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / filename)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def require_native() -> ModuleType:
    """The native core module, for a test (or a whole test module) that needs it.

    Skips when the extension is not built, unless ``REDLEASE_REQUIRE_NATIVE=1``
    (as in CI), where a missing build fails instead: a test that needs the
    native engine must never pass by being skipped there.
    """
    try:
        from redlease._engine._native import _core
    except ImportError as exc:
        _missing(
            "REDLEASE_REQUIRE_NATIVE",
            f"the native extension redlease._engine._native._core is not built ({exc})",
        )
    return _core


def require_probe() -> ModuleType:
    """The native core's test hooks (``redlease._engine._native._probe``), as ``require_native``.

    Its RESP encoder and parser, its reading of a reply and a plain command
    on a ``Pool`` connection: what the core keeps to itself, built beside it.
    """
    require_native()
    try:
        from redlease._engine._native import _probe
    except ImportError as exc:
        _missing(
            "REDLEASE_REQUIRE_NATIVE",
            f"the native core's test hooks redlease._engine._native._probe are not built ({exc})",
        )
    return _probe


def _missing(required_by: str, reason: str) -> NoReturn:
    """Skip for ``reason``, or fail when the environment variable ``required_by`` is 1."""
    if os.environ.get(required_by) == "1":
        pytest.fail(f"{required_by}=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_valkey() -> ModuleType:
    """valkey-py, for a test that runs with a valkey client.

    Skips when it is not installed, unless ``REDLEASE_REQUIRE_VALKEY=1`` (as
    in CI), where a missing valkey-py fails the test instead.
    """
    try:
        import valkey
    except ImportError as exc:
        _missing("REDLEASE_REQUIRE_VALKEY", f"valkey-py is not installed ({exc})")
    return valkey


def family_errors(family: str) -> ModuleType:
    """The exceptions module of a client family: ``redis.exceptions`` or ``valkey.exceptions``.

    A valkey client's caller must be able to catch valkey-py's classes (the
    library's errors are instances of both families' classes of the name).
    """
    import importlib

    return importlib.import_module(f"{family}.exceptions")


def family_base_error(family: str) -> type[Exception]:
    """The base of every error of a client family: ``RedisError`` or ``ValkeyError``."""
    errors = family_errors(family)
    base: type[Exception] = errors.ValkeyError if family == "valkey" else errors.RedisError
    return base


def wait_until(
    predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.005, what: str = ""
) -> Any:
    """Poll ``predicate`` until truthy and return its value; AssertionError at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)


def stays(predicate: Callable[[], Any], duration: float, interval: float = 0.01) -> bool:
    """True when ``predicate`` stays truthy for the whole of ``duration`` seconds."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(interval)
    return bool(predicate())


@contextlib.contextmanager
def answering(reply: bytes) -> Iterator[int]:
    """A loopback port whose listener answers whatever it is sent with ``reply``, then
    hangs up: a peer that is not a Redis server (``HTTP_400``, say)."""
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                    conn.sendall(reply)

    thread = threading.Thread(target=serve, name="answering", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


HTTP_400 = b"HTTP/1.1 400 Bad Request\r\n\r\n"
"""What an HTTP server answers a request it cannot read."""


class BlackHole:
    """A loopback TCP server that accepts connections and never sends a byte."""

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.05)
        self.port: int = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="black-hole", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}"

    @property
    def accepted(self) -> int:
        """How many connections were accepted so far."""
        return len(self._conns)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._conns.append(conn)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(2)
        self._listener.close()
        for conn in self._conns:
            conn.close()


class ClosedPort:
    """A loopback port nothing listens on: connections are refused at once.

    The port is held by a bound, non-listening socket so no other process
    can start listening on it during the test.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((LOOPBACK, 0))
        self.port: int = self._sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}"

    def close(self) -> None:
        self._sock.close()


class RunThread:
    """``elector.run(fn, stop=...)`` on a helper thread, with its outcome kept for the test."""

    def __init__(self, elector: redlease.Elector, fn: Any = None) -> None:
        self.elector = elector
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.returned = False
        self._thread = threading.Thread(target=self._main, args=(fn,), daemon=True)
        self._thread.start()

    def _main(self, fn: Any) -> None:
        try:
            self.elector.run(fn, stop=self.stop_event)
            self.returned = True
        except BaseException as exc:
            self.error = exc

    def stop(self, timeout: float = 10.0) -> None:
        self.stop_event.set()
        self.join(timeout)

    def join(self, timeout: float = 10.0) -> bool:
        """Wait for run() to end; True when it did within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def ident(self) -> int | None:
        """The thread id that run() is called on."""
        return self._thread.ident


class Terms:
    """A leader function that records each term and holds it until it ends.

    ``returns_after`` makes the first N terms return at once instead.
    """

    def __init__(self, returns_after: int = 0) -> None:
        self.terms: list[redlease.Term] = []
        self.fencers: list[redlease.Fencer] = []
        self._returns_after = returns_after
        self._lock = threading.Lock()

    def __call__(self, term: redlease.Term, fencer: redlease.Fencer) -> None:
        with self._lock:
            self.terms.append(term)
            self.fencers.append(fencer)
            n = len(self.terms)
        if n <= self._returns_after:
            return
        term.wait()

    def wait_for(self, count: int, timeout: float = 5.0) -> redlease.Term:
        """The ``count``-th term (1-based), once it has started."""
        wait_until(lambda: len(self.terms) >= count, timeout, what=f"term #{count}")
        return self.terms[count - 1]


class Events:
    """An Observer that records every callback, in order, with timestamps."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any, float]] = []
        self._lock = threading.Lock()

    def record(self, kind: str, value: Any = None) -> None:
        with self._lock:
            self.events.append((kind, value, time.monotonic()))

    def observer(self, **overrides: Any) -> redlease.Observer:
        callbacks: dict[str, Any] = {
            "on_elected": lambda token: self.record("elected", token),
            "on_stepped_down": lambda: self.record("stepped_down"),
            "on_follower": lambda: self.record("follower"),
            "on_error": lambda exc: self.record("error", exc),
        }
        callbacks.update(overrides)
        return redlease.Observer(**callbacks)

    def kinds(self, *, errors: bool = False) -> list[str]:
        with self._lock:
            return [k for k, _, _ in self.events if errors or k != "error"]

    def values(self, kind: str) -> list[Any]:
        with self._lock:
            return [v for k, v, _ in self.events if k == kind]

    def times(self, kind: str) -> list[float]:
        with self._lock:
            return [t for k, _, t in self.events if k == kind]

    def count(self, kind: str) -> int:
        return len(self.values(kind))


NAME = "svc"
LEADER_KEY = f"{NAME}:leader"
FENCE_KEY = f"{NAME}:fence"
APPLIED_KEY = f"{NAME}:fence:applied"


def make_elector(client: Any, engine: str, **kwargs: Any) -> redlease.Elector:
    """An Elector named ``NAME`` on ``engine`` (short, test-friendly TTL unless given)."""
    kwargs.setdefault("ttl", 1.0)
    return redlease.Elector(client, kwargs.pop("name", NAME), engine=engine, **kwargs)


def elected_token(elector: redlease.Elector, timeout: float = 5.0) -> int:
    """Wait until ``elector`` leads and return its token."""
    token: int = wait_until(elector.token, timeout, what="election")
    return token


def gil_call_size(seconds: float) -> int:
    """An ``n`` for which ``sum(range(n))`` holds the GIL for about ``seconds``.

    ``sum`` over a range is one C call that never releases the GIL. The rate
    is the best of three samples: a sample slowed by preemption would make the
    call shorter than asked, and these tests need it at least that long.
    """
    n = 1_000_000
    while True:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            sum(range(n))
            best = min(best, time.perf_counter() - started)
        if best > 0.05:
            return int(n * seconds / best)
        n *= 4


def hold_gil(n: int) -> float:
    """Hold the GIL in one C call of size ``n``; return how long it took."""
    started = time.monotonic()
    sum(range(n))
    return time.monotonic() - started


def hold_gil_at_least(n: int, seconds: float, attempts: int = 3) -> float:
    """``hold_gil``, repeated with a larger call until one call lasted ``seconds``.

    ``gil_call_size`` calibrates on a loaded machine too: when its samples were
    all slowed, the real call ends early. Each retry is one call again, sized
    from what the last one took; the last call's duration is returned.
    """
    held = hold_gil(n)
    for _ in range(attempts - 1):
        if held >= seconds:
            break
        n = int(n * 1.5 * seconds / max(held, 0.01))
        held = hold_gil(n)
    return held


class ReportingProcess:
    """A Python script in another process that prints "ready", then one line per event.

    Its lines are collected as they come; closing its stdin tells it to stop.
    """

    def __init__(self, script: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        assert self.proc.stdout.readline().strip() == "ready"
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def elections(self) -> list[str]:
        return [line for line in self.lines if line.startswith("elected")]

    def close(self, wait: float = 10) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(5)


class ProcessContender(ReportingProcess):
    """An elector (Python engine) for ``name`` in another process, reporting each election.

    ``client_code`` is Python that binds ``client`` (redis, redis.sentinel and
    redis.cluster are imported).
    """

    def __init__(self, client_code: str, name: str, ttl: float) -> None:
        script = textwrap.dedent(
            """
            import sys, threading, redis, redis.sentinel, redis.cluster, redlease
            {client_code}
            def elected(token):
                print("elected", token, flush=True)
            e = redlease.Elector(client, {name!r}, ttl={ttl}, engine="python",
                                 observer=redlease.Observer(on_elected=elected))
            stop = threading.Event()
            threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
            print("ready", flush=True)
            e.run(None, stop=stop)
            """
        ).format(client_code=client_code, name=name, ttl=ttl)
        super().__init__(script)


def release_during_a_gil_hold(releaser: Any, seconds: float = 2.0) -> tuple[float, ...]:
    """Tell ``releaser`` ("go" on its stdin) to release, holding the GIL meanwhile.

    ``releaser`` is a process that answers with one line of floats (what it
    saw: when it released, when the doorbell rang...). Returns
    ``(hog_started, hog_ended, *its floats)``; no Python thread of this
    process runs between the two.
    """
    n = gil_call_size(seconds)
    releaser.stdin.write("go\n")
    releaser.stdin.flush()
    hog_started = time.monotonic()
    held = hold_gil(n)
    seen = tuple(map(float, releaser.stdout.readline().split()))
    return (hog_started, hog_started + held, *seen)


def lock_handover(locker: Any, name: str, waiting: Callable[[], Any]) -> float:
    """Seconds from releasing ``name`` to a waiting ``acquire`` getting it.

    The lock is held here, a thread waits for it (retrying only every 5 s,
    so a quick take-over is the release notice's doing), ``waiting()``
    returns once that waiter listens, then the lock is released.
    """
    held = locker.acquire(name, ttl=30)
    got: list[float] = []

    def waiter() -> None:
        second = locker.acquire(name, ttl=30, wait=20, retry_interval=5)
        got.append(time.monotonic())
        second.release()

    thread = threading.Thread(target=waiter)
    thread.start()
    waiting()
    released_at = time.monotonic()
    held.release()
    thread.join(10)
    assert got, "the waiter never got the lock"
    return got[0] - released_at


def fair_acquirer(locker: Any, kind: str) -> Callable[..., Any]:
    """``acquire`` of the lock "job", or of a permit of the 1-permit semaphore "job"."""
    if kind == "lock":
        return lambda **options: locker.acquire("job", **options)
    sem = locker.semaphore("job", 1)
    return lambda **options: sem.acquire(**options)


def commands_processed(client: Any) -> int:
    """How many commands the server ran, INFO (how this is asked) aside."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def script_calls(client: Any, command: str) -> int:
    """How many times the server ran ``command`` (``evalsha``, ``eval``...)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


def aio_client(server: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``server`` (a ``RedisServer``), bounded at 5 s."""
    import redis.asyncio

    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def watch_release_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the batched releases ``redlease.stop_all`` sends from now on, in order."""
    import redlease._election.runloop as runloop

    return watch_batches(monkeypatch, runloop)


def watch_acquire_batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the batched acquires the driver sends from now on, in order."""
    from redlease._engine.process import driver

    return watch_batches(monkeypatch, driver)


def watch_batches(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[int]:
    """The sizes of the batches ``module``'s ``execute_batch`` sends from now on, in order."""
    sizes: list[int] = []
    real = module.execute_batch

    def watched(engine: Any, requests: list[Any]) -> list[Any]:
        sizes.append(len(requests))
        return real(engine, requests)

    monkeypatch.setattr(module, "execute_batch", watched)
    return sizes


class HeldDriver:
    """A driver step that holds the driver thread until ``release()``.

    What is poked meanwhile is due together when the driver comes back, as
    followers whose polls fall due at one instant are. Without it, starting
    runs one after another races the driver: on a loaded host it may wake
    between two starts and send a lone acquire (never batched) each time.
    """

    def __init__(self) -> None:
        self.holding = threading.Event()
        self._released = threading.Event()

    def step(self) -> float | None:
        self.holding.set()
        self._released.wait(30.0)
        return None

    def release(self) -> None:
        self._released.set()
