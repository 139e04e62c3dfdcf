"""Fenced writes as spans: the public write methods wrapped while instrumented.

As the OpenTelemetry instrumentations do, ``wrap`` replaces each public
fenced write (``Elector.fence_*``, ``Fencer.*``, a pipeline's ``execute``,
threaded and asyncio) with one that opens a client span around it, and
``unwrap`` puts the originals back: uninstrumented, a write runs the
library's own code with nothing in between. A span starts in the caller's
current context, so a write inside the caller's span (or inside a leader
function, where the term's span is current) is its child.

Each write's outcome goes on its span (``redlease.fence.outcome``:
``applied``, ``stale``, or ``unknown`` when it raised, the error then
recorded with status ERROR) and on the ``redlease.fence.writes`` counter,
one per write of a pipeline.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import Span, SpanKind

from .._election.aioelector import Elector as AioElector
from .._election.aioelector import Fencer as AioFencer
from .._election.elector import Elector, Fencer
from .._election.pipeline import AsyncFencedPipeline, FencedPipeline
from .._log import Events
from ._sink import TOKEN, Sink, record_error, target_attributes

OUTCOME = "redlease.fence.outcome"

_sink: Sink | None = None


def _argument_token(shell: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An elector's write: the token is its first argument."""
    return args[0] if args else kwargs.get("token")


def _own_token(shell: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A fencer's or a pipeline's write: the token is its own."""
    return shell.token


_WRITES: tuple[tuple[type, str, str, Callable[..., Any]], ...] = (
    *(
        (cls, f"fence_{op}", op, _argument_token)
        for cls in (Elector, AioElector)
        for op in ("set", "hset", "eval")
    ),
    *((cls, op, op, _own_token) for cls in (Fencer, AioFencer) for op in ("set", "hset", "eval")),
    (FencedPipeline, "execute", "pipeline", _own_token),
    (AsyncFencedPipeline, "execute", "pipeline", _own_token),
)

_originals: list[tuple[type, str, Any]] = []

_servers: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def server_attributes(client: Any) -> dict[str, Any]:
    """The database-client attributes of ``client``'s server, as far as its settings say."""
    try:
        known = _servers.get(client)
    except TypeError:  # not weakly referable: worked out each time
        known = None
    if known is not None:
        return known
    attributes: dict[str, Any] = {"db.system.name": "redis"}
    pool = getattr(client, "connection_pool", None)
    settings = getattr(pool, "connection_kwargs", None)
    if isinstance(settings, dict):
        if settings.get("path"):
            attributes["server.address"] = str(settings["path"])
            attributes["network.transport"] = "unix"
        elif settings.get("host"):
            attributes["server.address"] = str(settings["host"])
            attributes["server.port"] = int(settings.get("port", 6379))
        if "db" in settings:
            attributes["db.namespace"] = str(settings["db"])
    with contextlib.suppress(TypeError):
        _servers[client] = attributes
    return attributes


def _events(shell: Any) -> Events:
    """The elector's ``Events`` a write of ``shell`` reports to (its fence's)."""
    events: Events = shell._fence._events
    return events


def _start(sink: Sink, op: str, shell: Any, token: Any, writes: int) -> Span:
    events = _events(shell)
    attributes = {
        **target_attributes(events),
        **server_attributes(events.client),
        "db.operation.name": "EVALSHA" if writes == 1 else "BATCH EVALSHA",
    }
    if writes != 1:
        attributes["db.operation.batch.size"] = writes
    if isinstance(token, int):
        attributes[TOKEN] = token
    return sink.tracer.start_span(
        f"redlease.fence.{op}", kind=SpanKind.CLIENT, attributes=attributes
    )


def _finish(sink: Sink, span: Span, shell: Any, result: object, writes: int) -> None:
    counted = target_attributes(_events(shell))
    if isinstance(result, list):
        applied = sum(1 for done in result if done)
        stale = len(result) - applied
        span.set_attribute("redlease.fence.applied", applied)
    else:
        applied, stale = (1, 0) if result else (0, 1)
    span.set_attribute(OUTCOME, "stale" if stale else "applied")
    if applied:
        sink.fenced.add(applied, {**counted, OUTCOME: "applied"})
    if stale:
        sink.fenced.add(stale, {**counted, OUTCOME: "stale"})
    span.end()


def _failed(sink: Sink, span: Span, shell: Any, exc: BaseException, writes: int) -> None:
    span.set_attribute(OUTCOME, "unknown")
    record_error(span, exc)
    sink.fenced.add(writes, {**target_attributes(_events(shell)), OUTCOME: "unknown"})
    span.end()


def _traced(original: Any, op: str, token_of: Callable[..., Any]) -> Any:
    """``original`` with a span around each call (a coroutine function stays one)."""
    pipeline = op == "pipeline"

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def traced_async(shell: Any, *args: Any, **kwargs: Any) -> Any:
            sink = _sink
            writes = len(shell) if pipeline else 1
            if sink is None or not writes:
                return await original(shell, *args, **kwargs)
            span = _start(sink, op, shell, token_of(shell, args, kwargs), writes)
            try:
                result = await original(shell, *args, **kwargs)
            except BaseException as exc:
                _failed(sink, span, shell, exc, writes)
                raise
            _finish(sink, span, shell, result, writes)
            return result

        return traced_async

    @functools.wraps(original)
    def traced(shell: Any, *args: Any, **kwargs: Any) -> Any:
        sink = _sink
        writes = len(shell) if pipeline else 1
        if sink is None or not writes:
            return original(shell, *args, **kwargs)
        span = _start(sink, op, shell, token_of(shell, args, kwargs), writes)
        try:
            result = original(shell, *args, **kwargs)
        except BaseException as exc:
            _failed(sink, span, shell, exc, writes)
            raise
        _finish(sink, span, shell, result, writes)
        return result

    return traced


def wrap(sink: Sink) -> None:
    """Trace every fenced write of the process with ``sink`` from now on."""
    global _sink
    _sink = sink
    if _originals:
        return
    for cls, method, op, token_of in _WRITES:
        original = cls.__dict__[method]
        _originals.append((cls, method, original))
        setattr(cls, method, _traced(original, op, token_of))


def unwrap() -> None:
    """Put the library's own write methods back."""
    global _sink
    _sink = None
    while _originals:
        cls, method, original = _originals.pop()
        setattr(cls, method, original)
