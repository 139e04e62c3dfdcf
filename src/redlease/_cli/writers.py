"""``redlease bench --writers``: fenced writers of each engine against redis-py, in one run.

Every contender runs the same fenced SET script on the same server, one
after the other, each for the measurement's length:

- sync, one thread: ``Elector.fence_set`` against ``redis.Redis.evalsha``;
  the same loop's ``time.process_time()`` gives the CPU per write;
- asyncio, many tasks on one loop and one task: ``aio.Fencer.set`` against
  ``redis.asyncio.Redis.evalsha`` (its pool: a connection per busy task);
- pipelines: ``Elector.fence_pipeline(token)`` of ``BATCH`` SETs against
  redis-py's pipeline (``transaction=False``) of the same EVALSHAs.

With valkey-py installed, each engine runs once more on a valkey-py client
of the same server, beside valkey-py's own EVALSHAs: the two client
families side by side in one run, each against its own library.

Each engine writes under a name of its own that nobody has elected, with
token 1, so every write applies (a rejected write would be measured as a
cheaper one: the run counts them and fails if any was rejected).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redlease
import redlease.aio

from .. import _scripts
from .._keys import ElectionKeys
from .redisurl import CliError, errors

TASKS = 64
"""Concurrent asyncio tasks of the many-task case."""

BATCH = 100
"""Fenced writes per pipeline."""

TOKEN = 1
BASELINE = "redis-py"

BASELINES = {"redis": BASELINE, "valkey": "valkey-py"}
"""Each client family's own library, the contender its engines' rows are compared with."""

CASES = (
    ("sync", "sync, 1 thread"),
    ("tasks", f"asyncio, {TASKS} tasks"),
    ("task", "asyncio, 1 task"),
    ("pipeline", f"pipelines of {BATCH}, 1 thread"),
)


@dataclass
class WriterResults:
    """Fenced writes per second per case and contender, and CPU per sync write."""

    contenders: list[str]
    baseline_of: dict[str, str] = field(default_factory=dict)
    """The contender each contender's ratio is taken against (its family's library)."""
    rates: dict[str, dict[str, float]] = field(default_factory=dict)
    cpu_us: dict[str, float] = field(default_factory=dict)

    def add(self, case: str, contender: str, rate: float) -> None:
        self.rates.setdefault(case, {})[contender] = rate


def loop_rate(op: Callable[[int], object], seconds: float) -> tuple[float, float]:
    """``(calls/s, CPU µs per call)`` of ``op`` called back to back for ``seconds``."""
    calls = 0
    cpu = time.process_time()
    start = time.perf_counter()
    stop = start + seconds
    while time.perf_counter() < stop:
        for _ in range(50):
            op(calls)
            calls += 1
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    return calls / elapsed, cpu / calls * 1e6


async def async_rate(op: Callable[[int], Awaitable[object]], tasks: int, seconds: float) -> float:
    """Calls/s of ``tasks`` tasks each awaiting ``op`` back to back for ``seconds``."""
    counts = [0] * tasks
    stop = time.perf_counter() + seconds

    async def worker(i: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            await op(n)
            n += 1
        counts[i] = n

    start = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(tasks)))
    return sum(counts) / (time.perf_counter() - start)


class _Applied:
    """Counts fenced writes that were rejected; any is a broken measurement."""

    def __init__(self) -> None:
        self.rejected = 0

    def check(self, applied: object) -> None:
        if applied is not True and applied != 1:
            self.rejected += 1


def measure_writers(
    make_client: Callable[..., Any],
    make_async_client: Callable[..., Any],
    name_for: Callable[[str], str],
    engines: Sequence[str],
    seconds: float,
    phase: Callable[[str, float], Callable[[float], None]],
    families: Sequence[str] = ("redis",),
) -> WriterResults:
    """Every case for every engine in ``engines`` and for the client library, one after the other.

    Once per client family in ``families`` (``"redis"``, ``"valkey"``):
    the engines on a client of that family, then the library itself.
    ``make_client`` / ``make_async_client`` take ``family=`` for any but
    redis-py. ``name_for`` turns a base name into one that works on the
    deployment; ``phase`` announces a measurement (the CLI's progress lines).
    """
    results = WriterResults(contenders=[])
    script = _scripts.fenced_file("fence_set")
    run = secrets.token_hex(3)
    client = make_client()
    applied = _Applied()
    names: list[str] = []
    opened: list[Any] = []
    try:
        client.script_load(script.source)
        for family in families:
            chosen: dict[str, Any] = {} if family == "redis" else {"family": family}
            family_client = client if family == "redis" else make_client(**chosen)
            if family_client is not client:
                opened.append(family_client)

            def make_async(chosen: dict[str, Any] = chosen) -> Any:
                return make_async_client(**chosen)

            baseline = BASELINES[family]
            for engine in [*engines, None]:
                contender = baseline if engine is None else _label(engine, family)
                results.contenders.append(contender)
                results.baseline_of[contender] = baseline
                name = name_for(f"redlease-writers-{run}-{contender.replace(' ', '')}")
                names.append(name)
                ops = (
                    _client_ops(family_client, make_async, name, script)
                    if engine is None
                    else _engine_ops(family_client, make_async, name, engine)
                )
                _measure(contender, ops, seconds, phase, results, applied)
    finally:
        for other in opened:
            other.close()
        with contextlib.suppress(*errors("RedisError")):
            for name in names:
                keys = [*ElectionKeys(name).all(), *_value_keys(name)]
                client.delete(*keys)
        client.close()
    if applied.rejected:
        raise CliError(
            f"{applied.rejected} fenced writes of the benchmark were rejected; another writer "
            "is using its names, the numbers would be wrong"
        )
    return results


def families() -> tuple[str, ...]:
    """The client families to measure: redis-py, and valkey-py when it is installed."""
    try:
        import valkey  # noqa: F401
    except ImportError:
        return ("redis",)
    return ("redis", "valkey")


def _label(engine: str, family: str) -> str:
    """An engine's column: ``native``, or ``native (valkey-py)`` on a valkey-py client."""
    return engine if family == "redis" else f"{engine} ({BASELINES[family]})"


def _value_keys(name: str) -> list[str]:
    return [f"{name}:value", *(f"{name}:value:{i}" for i in range(BATCH))]


AsyncWrite = Callable[[int], Awaitable[object]]


@dataclass
class _Ops:
    """One contender's writes: one, a pipeline of ``BATCH``, and asyncio's (opened in a loop)."""

    one: Callable[[int], object]
    batch: Callable[[int], Sequence[object]]
    open_async: Callable[[], contextlib.AbstractAsyncContextManager[AsyncWrite]]


def _engine_ops(
    client: Any, make_async_client: Callable[[], Any], name: str, engine: str
) -> _Ops:
    elector = redlease.Elector(client, name, engine=engine)
    key, keys = f"{name}:value", _value_keys(name)[1:]

    def batch(n: int) -> Sequence[object]:
        pipe = elector.fence_pipeline(TOKEN)
        for k in keys:
            pipe.set(k, n)
        return pipe.execute()

    @contextlib.asynccontextmanager
    async def open_async() -> AsyncIterator[AsyncWrite]:
        aclient = make_async_client()
        fencer = redlease.aio.Fencer(redlease.aio.Elector(aclient, name, engine=engine), TOKEN)
        try:
            yield lambda n: fencer.set(key, n)
        finally:
            await aclient.aclose()

    return _Ops(lambda n: elector.fence_set(TOKEN, key, n), batch, open_async)


def _client_ops(
    client: Any, make_async_client: Callable[[], Any], name: str, script: _scripts.Script
) -> _Ops:
    """The client library's own EVALSHAs of the fenced SET script (redis-py's or valkey-py's)."""
    mark = ElectionKeys(name).applied
    key, keys = f"{name}:value", _value_keys(name)[1:]

    def batch(n: int) -> Sequence[object]:
        pipe = client.pipeline(transaction=False)
        for k in keys:
            pipe.evalsha(script.sha, 2, mark, k, TOKEN, n)
        return pipe.execute()  # type: ignore[no-any-return]

    @contextlib.asynccontextmanager
    async def open_async() -> AsyncIterator[AsyncWrite]:
        aclient = make_async_client()
        try:
            yield lambda n: aclient.evalsha(script.sha, 2, mark, key, TOKEN, n)
        finally:
            await aclient.aclose()

    return _Ops(lambda n: client.evalsha(script.sha, 2, mark, key, TOKEN, n), batch, open_async)


def _measure(
    contender: str,
    ops: _Ops,
    seconds: float,
    phase: Callable[[str, float], Callable[[float], None]],
    results: WriterResults,
    applied: _Applied,
) -> None:
    """Every case of ``CASES`` for one contender, in turn; each write's reply is checked."""

    def one(n: int) -> None:
        applied.check(ops.one(n))

    def batch(n: int) -> None:
        for reply in ops.batch(n):
            applied.check(reply)

    phase(f"{contender}: fenced writes, one thread", seconds)
    one(0)  # connect
    rate, cpu = loop_rate(one, seconds)
    results.add("sync", contender, rate)
    results.cpu_us[contender] = cpu

    phase(f"{contender}: pipelines of {BATCH} fenced writes", seconds)
    batch(0)
    rate, _cpu = loop_rate(batch, seconds)
    results.add("pipeline", contender, rate * BATCH)

    async def in_loop() -> None:
        async with ops.open_async() as write:

            async def op(n: int) -> None:
                applied.check(await write(n))

            for case, tasks in (("tasks", TASKS), ("task", 1)):
                phase(f"{contender}: asyncio fenced writes, {tasks} task(s)", seconds)
                await async_rate(op, tasks, min(0.05, seconds))  # connect, warm up
                results.add(case, contender, await async_rate(op, tasks, seconds))

    asyncio.run(in_loop())


def render_writers(results: WriterResults, seconds: float, description: str) -> str:
    """The writers table: writes/s with the ratio to redis-py, then CPU per sync write."""
    width = 20
    lines = [
        f"fenced writers: {seconds:g} s per measurement, the same fenced SET script for "
        "every contender",
        f"server: {description}",
        "(in brackets: the ratio to the client library's own EVALSHA in this run: "
        "redis-py / redis.asyncio, or valkey-py's for the valkey-py columns)",
        "",
        f"{'fenced writes/s by':<28}" + "".join(f"{c:>{width}}" for c in results.contenders),
    ]
    for case, label in CASES:
        rates = results.rates.get(case, {})
        cells = []
        for contender in results.contenders:
            base = rates.get(results.baseline_of.get(contender, BASELINE))
            rate = rates.get(contender)
            if rate is None:
                cells.append("-")
            elif base:
                cells.append(f"{rate:,.0f} ({rate / base:.2f}x)")
            else:
                cells.append(f"{rate:,.0f}")
        lines.append(f"{label:<28}" + "".join(f"{c:>{width}}" for c in cells))
    lines.append(
        f"{'CPU per sync write':<28}"
        + "".join(
            f"{(f'{results.cpu_us[c]:.1f} us' if c in results.cpu_us else '-'):>{width}}"
            for c in results.contenders
        )
    )
    lines.append("")
    lines.append(
        "CPU per sync write: this process's time.process_time() (user and kernel, every "
        "thread) over the one-thread loop, divided by its writes; the server's work is "
        "not in it."
    )
    return "\n".join(line.rstrip() for line in lines)
