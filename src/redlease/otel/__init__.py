"""OpenTelemetry traces and metrics for the whole process (the ``otel`` extra).

```python
import redlease.otel

redlease.otel.instrument()    # the global tracer and meter providers
```

One call turns it on for every elector, locker and lock of the process,
made before or after, threaded and asyncio, on both engines;
``uninstrument()`` turns it off again. ``tracer_provider`` and
``meter_provider`` default to OpenTelemetry's global ones, as the
OpenTelemetry instrumentations' do.

Spans:

- ``redlease.term``: one per term, from its acquire to its end; attributes
  ``redlease.name``, ``redlease.engine``, ``redlease.term.token``,
  ``redlease.instance.id`` and, once ended, ``redlease.term.end_reason``
  (``lost``, ``returned``, ``resigned``, ``stopped``). It is the current
  span while the leader function runs (its thread, or its asyncio task), so
  what the leader does is part of the term's trace.
- ``redlease.fence.set`` / ``.hset`` / ``.eval`` / ``.pipeline`` (kind
  CLIENT): one per fenced write or pipeline, a child of the caller's current
  span, with ``redlease.fence.outcome`` (``applied``, ``stale``, or
  ``unknown`` when it raised: the error recorded, status ERROR), the token,
  and the database-client attributes ``db.system.name``, ``server.address``,
  ``server.port``, ``db.namespace``, ``db.operation.name`` (and
  ``db.operation.batch.size`` for a pipeline).
- ``redlease.lock.wait``: one per acquire, from its call to its grant or its
  timeout (``redlease.lock.wait.outcome``: ``granted``, ``timed_out``);
  ``redlease.lock.hold``: from the grant to the release or the loss
  (``redlease.lock.end_reason``: ``released``, ``lost``), with the lock's
  name and fencing token.

Renewals are counted, never traced one by one.

Instruments (attributes ``redlease.name`` and ``redlease.engine``, and a
bounded reason or outcome; never a token, an instance id or a lock's name):
``redlease.term.started``, ``redlease.term.ended`` (by
``redlease.term.end_reason``), ``redlease.leader`` (up-down: terms led now),
``redlease.errors`` (by ``error.type``), ``redlease.fence.writes`` (by
``redlease.fence.outcome``), ``redlease.renewals`` and
``redlease.renew.lateness`` (s; the keepers' own counts, read at each
collection), ``redlease.lock.acquired``, ``redlease.lock.released`` (by
``redlease.lock.end_reason``), ``redlease.lock.held`` (up-down),
``redlease.lock.wait.duration`` (s, by ``redlease.lock.wait.outcome``),
``redlease.lock.hold.duration`` (s), and for ``Partitions`` members
``redlease.partitions.owned`` (up-down), ``redlease.partitions.assigned`` and
``redlease.partitions.revoked`` (by ``redlease.partitions.revoke_reason``).

A term, lock or partition already held when ``instrument()`` is called gets
no span and is not counted as held; its end and everything later are.

Cost: uninstrumented, nothing (the fenced writes are the library's own
methods, and the events find no process sink); instrumented, a span per
write (``benchmarks/otel_overhead.py`` measures it).
"""

from __future__ import annotations

from typing import Any

try:
    from opentelemetry import metrics, trace
except ImportError:  # pragma: no cover - exercised in a subprocess without the extra
    # One line that says what to do, rather than Python's own.
    raise ImportError(
        "redlease.otel needs opentelemetry-api: pip install 'redlease[otel]'"
    ) from None

from .._engine import ForkSafeLock
from .._log import PROCESS_SINKS
from .._version import __version__
from ._sink import Sink
from ._writes import unwrap, wrap

__all__ = ["instrument", "uninstrument"]

_mutex = ForkSafeLock()
_installed: list[Sink] = []


def instrument(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Report every redlease target of the process to OpenTelemetry from now on.

    ``tracer_provider`` / ``meter_provider``: an OpenTelemetry ``TracerProvider``
    and ``MeterProvider``; None takes the global ones. Called again while
    instrumented, it does nothing (``uninstrument()`` first to change providers).
    """
    with _mutex:
        if _installed:
            return
        tracer = trace.get_tracer("redlease", __version__, tracer_provider)
        meter = metrics.get_meter("redlease", __version__, meter_provider)
        sink = Sink(tracer, meter)
        _installed.append(sink)
        wrap(sink)
        PROCESS_SINKS.append(sink)


def uninstrument() -> None:
    """Stop reporting: the write methods are the library's own again. No-op when off."""
    with _mutex:
        while _installed:
            sink = _installed.pop()
            PROCESS_SINKS.remove(sink)
            unwrap()
            sink.end()

