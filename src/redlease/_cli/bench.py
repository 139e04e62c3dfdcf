"""``redlease bench``: how late renewals go out under load, and fenced writes per second.

For each engine an Elector leads with a short renew interval while the main
thread runs the chosen load; the keeper records how late each renewal was
sent after its scheduled time. A Python keeper thread needs the GIL to send,
so a load that holds the GIL delays it; the native keeper never takes it.
Then one thread does fenced SETs in a loop for the same time.

The run's settings and results are in ``benchrun``, the table and the plot
in ``benchreport``.
"""

from __future__ import annotations

import contextlib
import itertools
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

import redlease

from .. import _scripts
from .._keys import ElectionKeys
from . import writers as _writers
from .benchreport import draw_plot, render
from .benchreport import percentile as percentile  # the benchmarks import it from here
from .benchrun import GIL_CALL_SECONDS, RENEW_INTERVAL, TTL, Result
from .redisurl import CliError, errors, one_line
from .topology import BenchServer, bench_server

RENEW_SHA = _scripts.load("renew").sha
"""What marks a renewal among the commands MONITOR shows: its script's SHA1."""


class Progress:
    """Phase lines on stderr, and a heartbeat for long phases.

    On a terminal the heartbeat is one line rewritten in place with the
    seconds left in the phase and in the whole run; elsewhere (a log, a
    pipe) a plain line every few seconds.
    """

    def __init__(self, total_phases: int, seconds_per_phase: float = 0.0) -> None:
        self.total = total_phases
        self.done = 0
        self.seconds_per_phase = seconds_per_phase
        self.live = sys.stderr.isatty()

    def phase(self, text: str, seconds: float) -> Callable[[float], None]:
        self.done += 1
        prefix = f"bench [{self.done}/{self.total}]"
        if self.live:
            sys.stderr.write("\r\033[K")
        sys.stderr.write(f"{prefix} {text} ({seconds:g} s)\n")
        sys.stderr.flush()
        start = time.monotonic()
        last = [start]
        later = (self.total - self.done) * self.seconds_per_phase

        def tick(now: float) -> None:
            if self.live:
                if now - last[0] >= 0.5:
                    last[0] = now
                    left = max(0.0, seconds - (now - start))
                    sys.stderr.write(
                        f"\r\033[K{prefix}   {text}: {left:.0f} s left "
                        f"(about {left + later:.0f} s in all)"
                    )
                    sys.stderr.flush()
            elif now - last[0] >= 5.0:
                last[0] = now
                sys.stderr.write(f"{prefix}   ... {now - start:.0f} s\n")
                sys.stderr.flush()

        return tick

    def finish(self) -> None:
        """Clear the live line before the results are printed."""
        if self.live:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def native_engine_available() -> tuple[bool, str]:
    """Whether the native engine can run here, and the library's reason when it cannot.

    Asked the way a user would: an Elector on ``engine="native"`` raises
    ConfigError when the extension is not built. The probe's client is a plain
    ``redis.Redis()``, which the native engine can always serve, so the only
    refusal left is the build; nothing connects, nothing runs.
    """
    try:
        redlease.Elector(redis.Redis(), "redlease-native-probe", engine="native")
    except redlease.ConfigError as exc:
        message = str(exc)
        # 'engine="native" is unavailable: <reason>': the reason is what a person acts on
        _, found, reason = message.partition(" is unavailable: ")
        return False, reason if found else message
    return True, ""


def gil_call_size() -> int:
    """An n for which ``sum(range(n))`` holds the GIL for about GIL_CALL_SECONDS."""
    n = 1_000_000
    while True:
        start = time.perf_counter()
        sum(range(n))
        spent = time.perf_counter() - start
        if spent >= 0.02:
            return max(1, int(n * GIL_CALL_SECONDS / spent))
        n *= 4


def run_load(load: str, seconds: float, tick: Callable[[float], None], gil_n: int) -> None:
    """Keep the main thread busy the chosen way for ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        now = time.monotonic()
        if now >= deadline:
            return
        tick(now)
        if load == "idle":
            time.sleep(min(0.5, deadline - now))
        elif load == "python":
            x = 0
            for i in range(20_000):
                x += i * i
        else:
            sum(range(gil_n))


def gaps_beyond(arrivals: list[float], interval: float) -> list[float]:
    """How much later than ``interval`` after the previous one each arrival came.

    Gaps between renewals as the server received them are what the lease
    feels, whatever the renewer's own clock says.
    """
    return [max(0.0, (b - a) - interval) for a, b in itertools.pairwise(arrivals)]


class ArrivalRecorder:
    """Server-side arrival times (MONITOR timestamps) of the commands naming ``marker``.

    Runs on a connection and a thread of its own; if the server refuses
    MONITOR (an ACL, a managed service) it records nothing and says why.
    """

    def __init__(self, client: redis.Redis, marker: str) -> None:
        self._client = client
        self._marker = marker
        self._stop = threading.Event()
        self.arrivals: list[float] = []
        self.latest = 0.0  # server time of the newest command read, of any kind
        self.error: str | None = None
        self._thread = threading.Thread(
            target=self._run, name="redlease-bench-monitor", daemon=True
        )

    def __enter__(self) -> ArrivalRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def catch_up(self, until: float, timeout: float = 2.0) -> None:
        """Wait until the reader has read past server time ``until``.

        The reader is a Python thread: under a GIL-holding load it falls
        behind, and what it has not read yet would be missing from the window.
        """
        deadline = time.monotonic() + timeout
        while self.latest <= until and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)

    def between(self, start: float, end: float) -> list[float]:
        """Arrivals (server wall-clock seconds) within ``[start, end]``."""
        return [t for t in list(self.arrivals) if start <= t <= end]

    def _run(self) -> None:
        try:
            client: Any = self._client  # redis-py leaves monitor() untyped
            with client.monitor() as monitor:
                connection = monitor.connection
                assert connection is not None
                while not self._stop.is_set():
                    if not connection.can_read(timeout=0.1):
                        continue
                    command = monitor.next_command()
                    at = float(command["time"])
                    if self._marker in command["command"]:
                        self.arrivals.append(at)
                    self.latest = at
        except errors("RedisError", "ConnectionError") as exc:
            self.error = one_line(exc)


@dataclass
class Lateness:
    """How late renewals were over one window of load, by both clocks."""

    own: list[float]
    """Send time minus scheduled time of each renewal, by the keeper's own clock."""
    server: list[float] | None
    """How much more than one renew interval passed between renewals as Redis received
    them; None when the server refused MONITOR."""
    kept: bool
    """Whether the term that led when the window opened still led when it closed."""


def newest_since(samples: list[float], mark: int, count: int) -> list[float]:
    """The lateness samples recorded after a keeper's count was ``mark``.

    ``samples`` is what it holds (its newest only, oldest first) read while
    its count was ``count``: the newest ``count - mark`` of them, or all it
    holds when more were recorded since (the older ones are gone).
    """
    new = min(count - mark, len(samples))
    return samples[len(samples) - new :] if new > 0 else []


class LatenessWindow:
    """Every renew-lateness sample a keeper records from now on, gathered by ``take()``.

    ``samples`` and ``count`` are the keeper's readers (an elector's
    ``renew_lateness`` and ``renew_lateness_count``, or a keeper's
    ``lateness`` and ``lateness_count``). A keeper holds its newest
    ``LATENESS_SAMPLES`` (128) only: taking at least once every that many
    renewals keeps every one.
    """

    def __init__(self, samples: Callable[[], list[float]], count: Callable[[], int]) -> None:
        self._samples = samples
        self._count = count
        self._mark = count()
        self.samples: list[float] = []

    def take(self) -> list[float]:
        """Add the samples recorded since the last take (or the start); return them all."""
        while True:
            count = self._count()
            held = self._samples()
            if self._count() == count:  # no renewal in between: ``held`` goes with ``count``
                break
        self.samples += newest_since(held, self._mark, count)
        self._mark = count
        return self.samples


def lateness_under_load(
    elector: redlease.Elector,
    token: int,
    monitor: redis.Redis,
    load: str,
    seconds: float,
    gil_n: int,
    tick: Callable[[float], None] = lambda now: None,
) -> Lateness:
    """Run ``load`` on this thread for ``seconds`` while ``elector`` leads with ``token``.

    ``monitor`` is a client of its own for the MONITOR reader (closed after);
    ``tick`` is called with the time now and then during the load (progress).
    """
    interval = elector.config.renew_interval
    own = LatenessWindow(elector.renew_lateness, elector.renew_lateness_count)
    taken = time.monotonic()

    def tick_and_take(now: float) -> None:
        # About once a second, between the load's steps: the keeper holds
        # its newest 128 samples only, and a long window has more renewals.
        nonlocal taken
        if now - taken >= 1.0:
            own.take()
            taken = now
        tick(now)

    with ArrivalRecorder(monitor, RENEW_SHA) as recorder:
        time.sleep(interval * 3)  # let MONITOR attach before the window opens
        window_start = time.time()
        run_load(load, seconds, tick_and_take, gil_n)
        window_end = time.time()
        recorder.catch_up(window_end)
    server = None
    if recorder.error is None:
        server = gaps_beyond(recorder.between(window_start, window_end), interval)
    return Lateness(own=own.take(), server=server, kept=elector.token() == token)


def measure(
    target: BenchServer, engine: str, load: str, seconds: float, progress: Progress, gil_n: int
) -> Result:
    """Renew lateness under ``load``, then fenced-write throughput, for one engine."""
    name = target.name(f"redlease-bench-{secrets.token_hex(3)}")
    client = target.client()
    elector = redlease.Elector(client, name, ttl=TTL, renew_interval=RENEW_INTERVAL, engine=engine)
    result = Result(engine=elector.engine)
    key = f"{name}:value"
    try:
        elector.start(None)
        token = wait_for_token(elector)
        tick = progress.phase(f"{engine}: renew lateness, {load} load", seconds)
        lateness = lateness_under_load(
            elector, token, target.monitor_client(name), load, seconds, gil_n, tick
        )
        result.lateness = lateness.own
        result.server_lateness = lateness.server
        result.kept_lease = lateness.kept

        tick = progress.phase(f"{engine}: fenced writes, one thread", seconds)
        token = wait_for_token(elector)  # re-elected if the load cost the lease
        writes = 0
        start = time.monotonic()
        deadline = start + seconds
        while True:
            now = time.monotonic()
            if now >= deadline:
                break
            tick(now)
            for _ in range(100):
                elector.fence_set(token, key, writes)
                writes += 1
        result.writes_per_second = writes / (time.monotonic() - start)
    finally:
        try:
            elector.stop()
        finally:
            with contextlib.suppress(*errors("RedisError")):
                client.delete(*ElectionKeys(name).all(), key)
            client.close()
    return result


def wait_for_token(elector: redlease.Elector, timeout: float = TTL + 5.0) -> int:
    """The token of the term ``elector`` (started) is elected to; CliError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        token = elector.token()
        if token is not None:
            return token
        time.sleep(0.005)
    raise CliError(f"the {elector.engine} elector was not elected within {timeout:g} s")


WRITER_TOPOLOGIES = ("plain", "tls")
"""Where ``--writers`` runs: one server, which a ``redis.asyncio`` client reaches as well."""

LOADS = ("idle", "python", "gil")
"""Every load, in the order ``--load all`` runs them."""


def main(
    url: str | None,
    *,
    engine: str,
    load: str,
    seconds: float,
    topology: str = "plain",
    plot: str | None = None,
    writers: bool = False,
) -> int:
    """Run the benchmark and print a table per load (and draw ``plot``); the exit status.

    With ``writers`` the fenced writers' table follows (``_cli.writers``).
    """
    if plot is not None:
        from . import plot as _plot

        _plot.require_matplotlib()  # before minutes of measuring, not after
    loads = list(LOADS) if load == "all" else [load]
    wanted = ["native", "python"] if engine == "both" else [engine]
    ok, why = native_engine_available()
    if engine == "native" and not ok:
        raise CliError(f"the native engine is unavailable: {why}; try --engine python")
    runnable = [e for e in wanted if e == "python" or ok]
    phases = 2 * len(runnable) * len(loads)
    if writers:
        phases += len(_writers.CASES) * (len(runnable) + 1)
    progress = Progress(total_phases=phases, seconds_per_phase=seconds)
    gil_n = gil_call_size() if "gil" in loads and runnable else 0
    by_load: dict[str, list[Result]] = {}
    if writers and topology not in WRITER_TOPOLOGIES:
        raise CliError(
            f"--writers compares with redis-py on one server: use --topology plain or tls, "
            f"not {topology}"
        )
    with bench_server(topology, url) as target:
        for this_load in loads:
            results = by_load.setdefault(this_load, [])
            for name in wanted:
                if name == "native" and not ok:
                    results.append(Result(engine="native", unavailable=why))
                    continue
                try:
                    results.append(measure(target, name, this_load, seconds, progress, gil_n))
                except redlease.ConfigError as exc:
                    # This engine cannot serve this deployment's client: say why.
                    results.append(Result(engine=name, unavailable=str(exc)))
                except errors("RedisError") as exc:
                    raise CliError(
                        f"Redis failed during the {name} benchmark: {one_line(exc)}"
                    ) from None
        writer_results = None
        if writers:
            assert target.make_async_client is not None  # every WRITER_TOPOLOGIES has one
            try:
                writer_results = _writers.measure_writers(
                    target.client,
                    target.make_async_client,
                    target.name,
                    runnable,
                    seconds,
                    progress.phase,
                    families=_writers.families(),
                )
            except errors("RedisError") as exc:
                raise CliError(
                    f"Redis failed during the fenced writers' benchmark: {one_line(exc)}"
                ) from None
        progress.finish()
        tables = [render(by_load[this_load], this_load, seconds, target) for this_load in loads]
        if writer_results is not None:
            tables.append(_writers.render_writers(writer_results, seconds, target.description))
        sys.stdout.write("\n\n".join(tables) + "\n")
        if plot is not None:
            draw_plot(plot, by_load, seconds, target)
            sys.stdout.write(f"\nplot written to {plot}\n")
    return 0
