"""What OpenTelemetry costs per fenced write: plain, and with ``redlease.otel`` on.

    python benchmarks/otel_overhead.py [--rounds N] [--seconds S] [--redis URL]

For each engine, one thread does fenced SETs of an Elector in alternating
windows: uninstrumented, then instrumented with ``redlease.otel.instrument``
on the OpenTelemetry SDK (a tracer provider whose batch processor exports to
nowhere, a meter provider with an in-memory reader), a span and a counter
add per write. The windows alternate for ``--rounds`` rounds so that
machine noise falls on both alike. Prints writes/s and microseconds per
write, median of the windows, and what instrumenting added to each write;
asserts nothing.
"""

from __future__ import annotations

import argparse
import secrets
import time
from collections.abc import Sequence

import redis
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import redlease
import redlease.otel
from redlease._cli.bench import native_engine_available
from redlease._testing import RedisServer


class Nowhere(SpanExporter):
    """Takes every span and keeps none: the cost measured is redlease's and the SDK's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def window(client: redis.Redis, engine: str, seconds: float) -> float:
    """Fenced SETs per second of one elector for ``seconds``."""
    name = f"bench-otel-{secrets.token_hex(3)}"
    elector = redlease.Elector(client, name, engine=engine)
    writes = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        for _ in range(100):
            elector.fence_set(1, f"{name}:v", writes)
            writes += 1
    rate = writes / (time.monotonic() - start)
    client.delete(f"{name}:v", f"{name}:fence:applied")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--redis", default=None, help="a server URL (default: a private one)")
    args = parser.parse_args()

    engines = ["native", "python"] if native_engine_available()[0] else ["python"]
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Nowhere()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    server = None
    url = args.redis
    if url is None:
        server = RedisServer()
        server.start()
        url = server.url
    client = redis.Redis.from_url(url)
    rates: dict[tuple[str, bool], list[float]] = {}
    try:
        for round_no in range(args.rounds):
            for engine in engines:
                for on in (False, True) if round_no % 2 == 0 else (True, False):
                    if on:
                        redlease.otel.instrument(tracer_provider, meter_provider)
                    try:
                        rate = window(client, engine, args.seconds)
                    finally:
                        redlease.otel.uninstrument()
                    rates.setdefault((engine, on), []).append(rate)
    finally:
        client.close()
        tracer_provider.shutdown()
        if server is not None:
            server.stop()

    print(
        f"otel overhead: fenced SETs from one thread, {args.rounds} windows of "
        f"{args.seconds:g} s each way, medians"
    )
    print(f"{'engine':<10}{'otel':<6}{'writes/s':>11}{'us/write':>10}{'added us':>10}")
    for engine in engines:
        plain_us = 0.0
        for on in (False, True):
            values = sorted(rates[(engine, on)])
            median = values[len(values) // 2]
            us = 1e6 / median
            added = f"{us - plain_us:>10.1f}" if on else f"{'':>10}"
            if not on:
                plain_us = us
            print(f"{engine:<10}{'on' if on else 'off':<6}{median:>11,.0f}{us:>10.1f}{added}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
