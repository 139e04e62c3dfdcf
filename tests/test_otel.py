"""redlease.otel: terms, lock waits and fenced writes as OpenTelemetry spans and metrics,
read back through the SDK's in-memory exporters against a real server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import redlease
import redlease.aio
from helpers import LEADER_KEY, NAME, aio_client, make_elector, wait_until
from redlease._log import PROCESS_SINKS
from redlease._testing import RedisServer

pytest.importorskip("opentelemetry.sdk")
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode

import redlease.otel


class Telemetry:
    """What the process reported while instrumented: finished spans, and metric points."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        spans = self.exporter.get_finished_spans()
        return [s for s in spans if name is None or s.name == name]

    def points(self, metric: str) -> list[Any]:
        """Every data point of ``metric`` at one collection."""
        data = self.reader.get_metrics_data()
        found = []
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for m in scope.metrics:
                    if m.name == metric:
                        found.extend(m.data.data_points)
        return found

    def value(self, metric: str, **attributes: Any) -> float:
        """The sum of ``metric``'s points whose attributes include ``attributes``."""
        total = 0.0
        for point in self.points(metric):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.value if hasattr(point, "value") else point.count
        return total


@pytest.fixture
def otel() -> Iterator[Telemetry]:
    telemetry = Telemetry()
    redlease.otel.instrument(
        tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
    )
    try:
        yield telemetry
    finally:
        redlease.otel.uninstrument()


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def test_a_term_span_holds_the_leaders_writes(
    otel: Telemetry, client: redis.Redis, engine: str
) -> None:
    done = threading.Event()

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        assert fencer.set("k", "v")
        with otel.tracer.start_as_current_span("caller's own"):
            fencer.pipeline().set("a", 1).hset("h", "f", 2).execute()
        done.set()
        term.wait()

    e = make_elector(client, engine)
    e.start(lead)
    try:
        assert done.wait(5.0)
        token = e.token()
    finally:
        e.stop()
    (term,) = otel.spans("redlease.term")
    assert attr(term, "redlease.term.token") == token
    assert attr(term, "redlease.term.end_reason") == "stopped"
    assert attr(term, "redlease.name") == NAME and attr(term, "redlease.engine") == engine
    assert term.parent is None
    (write,) = otel.spans("redlease.fence.set")
    assert parent_of(write) == term.context.span_id
    assert write.context.trace_id == term.context.trace_id
    assert attr(write, "redlease.fence.outcome") == "applied"
    assert attr(write, "db.system.name") == "redis"
    assert attr(write, "server.address") == "127.0.0.1"
    assert attr(write, "server.port") == client.connection_pool.connection_kwargs["port"]
    assert write.kind == trace.SpanKind.CLIENT
    (own,) = otel.spans("caller's own")
    (pipe,) = otel.spans("redlease.fence.pipeline")
    assert parent_of(own) == term.context.span_id
    assert parent_of(pipe) == own.context.span_id  # the current context wins
    assert attr(pipe, "db.operation.batch.size") == 2
    assert attr(pipe, "redlease.fence.applied") == 2
    assert otel.value("redlease.term.started", **{"redlease.name": NAME}) == 1
    assert otel.value("redlease.term.ended", **{"redlease.term.end_reason": "stopped"}) == 1
    assert otel.value("redlease.leader") == 0
    assert otel.value("redlease.fence.writes", **{"redlease.fence.outcome": "applied"}) == 3


def test_a_stale_write_and_a_failed_one_say_so(
    otel: Telemetry, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(10, "k", "new")
    assert not e.fence_set(9, "k", "old")
    assert not e.fencer().set("k", "inert")  # not leading: the inert token, never sent
    with pytest.raises(redis.exceptions.ResponseError):
        e.fence_eval(11, "redis.call('NOSUCHCOMMAND')")
    applied, stale, inert, failed = otel.spans("redlease.fence.set") + otel.spans(
        "redlease.fence.eval"
    )
    assert attr(applied, "redlease.fence.outcome") == "applied"
    assert attr(stale, "redlease.fence.outcome") == "stale"
    assert attr(stale, "redlease.term.token") == 9
    assert attr(inert, "redlease.fence.outcome") == "stale"
    assert attr(failed, "redlease.fence.outcome") == "unknown"
    assert failed.status.status_code == StatusCode.ERROR
    assert attr(failed, "error.type") == "ResponseError"
    assert [event.name for event in failed.events] == ["exception"]
    assert otel.value("redlease.fence.writes", **{"redlease.fence.outcome": "stale"}) == 2
    assert otel.value("redlease.fence.writes", **{"redlease.fence.outcome": "unknown"}) == 1
    # No attribute of a metric grows without bound.
    for point in otel.points("redlease.fence.writes"):
        assert set(point.attributes) == {
            "redlease.name",
            "redlease.engine",
            "redlease.fence.outcome",
        }


def test_a_lost_lease_ends_its_term_span_as_lost(
    otel: Telemetry, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=0.6)
    with e:
        wait_until(lambda: otel.value("redlease.leader") == 1, what="the term counted")
        # Taken away only once a renewal went through: on a busy host the lease
        # could otherwise be taken before the first renewal, which then finds it lost.
        wait_until(lambda: otel.value("redlease.renewals") >= 1, what="a renewal counted")
        client.set(LEADER_KEY, "someone-else", px=60_000)
        wait_until(lambda: otel.spans("redlease.term"), what="the term found lost")
        (term,) = otel.spans("redlease.term")
        assert attr(term, "redlease.term.end_reason") == "lost"
        assert otel.value("redlease.term.ended", **{"redlease.term.end_reason": "lost"}) == 1
        assert otel.value("redlease.leader") == 0
        # The keeper's renewals were counted, and how late each was sent.
        assert otel.value("redlease.renewals") >= 1
        assert otel.value("redlease.renew.lateness") >= 1
    client.delete(LEADER_KEY)


def test_lock_waits_and_holds(otel: Telemetry, client: redis.Redis, engine: str) -> None:
    locker = redlease.RedisLocker(client, prefix="o:", engine=engine)
    try:
        with otel.tracer.start_as_current_span("job"):
            held = locker.acquire("a", ttl=5)
            with pytest.raises(redlease.NotAcquired):
                locker.acquire("a", ttl=5, wait=0.2)
            held.release()
    finally:
        locker.close()
    (job,) = otel.spans("job")
    granted, timed_out = otel.spans("redlease.lock.wait")
    assert attr(granted, "redlease.lock.wait.outcome") == "granted"
    assert attr(timed_out, "redlease.lock.wait.outcome") == "timed_out"
    assert attr(timed_out, "redlease.lock.name") == "a"
    assert parent_of(timed_out) == job.context.span_id
    assert timed_out.end_time - timed_out.start_time >= 0.19e9
    (hold,) = otel.spans("redlease.lock.hold")
    assert attr(hold, "redlease.lock.end_reason") == "released"
    assert attr(hold, "redlease.lock.token") == held.fencing_token
    assert attr(hold, "redlease.name") == "o:"
    assert otel.value("redlease.lock.wait.duration") == 2
    assert otel.value(
        "redlease.lock.wait.duration", **{"redlease.lock.wait.outcome": "timed_out"}
    ) == 1
    released = {"redlease.lock.end_reason": "released"}
    assert otel.value("redlease.lock.hold.duration", **released) == 1
    assert otel.value("redlease.lock.held") == 0
    for point in otel.points("redlease.lock.wait.duration"):
        assert "redlease.lock.name" not in point.attributes


def test_asyncio_leader_tasks_write_inside_their_term(
    otel: Telemetry, redis_server: RedisServer, engine: str
) -> None:
    async def main() -> int:
        client = aio_client(redis_server)
        wrote = asyncio.Event()

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            assert await fencer.set("k", "v")
            assert await fencer.pipeline().set("a", 1).execute() == [True]
            wrote.set()
            await asyncio.sleep(3600)

        e = redlease.aio.Elector(client, NAME, ttl=1.0, engine=engine)
        e.start(lead)
        await asyncio.wait_for(wrote.wait(), 5.0)
        token = e.token()
        assert token is not None
        with otel.tracer.start_as_current_span("outside"):
            assert await e.fence_set(token, "k", "w")
        await e.stop()
        await client.aclose()
        return token

    token = asyncio.run(main())
    (term,) = otel.spans("redlease.term")
    assert attr(term, "redlease.term.token") == token
    inside, outside = otel.spans("redlease.fence.set")
    (pipe,) = otel.spans("redlease.fence.pipeline")
    (caller,) = otel.spans("outside")
    assert parent_of(inside) == parent_of(pipe) == term.context.span_id
    assert parent_of(outside) == caller.context.span_id


def test_uninstrumented_the_writes_are_the_librarys_own(client: redis.Redis) -> None:
    original = redlease.Fencer.set
    pipeline = redlease.FencedPipeline.execute
    telemetry = Telemetry()
    redlease.otel.instrument(telemetry.tracer_provider, telemetry.meter_provider)
    redlease.otel.instrument()  # again: nothing changes
    assert redlease.Fencer.set is not original and len(PROCESS_SINKS) == 1
    redlease.otel.uninstrument()
    redlease.otel.uninstrument()
    assert redlease.Fencer.set is original and redlease.FencedPipeline.execute is pipeline
    assert PROCESS_SINKS == []
    e = make_elector(client, "python")
    assert e.fence_set(1, "k", "v")
    assert telemetry.spans() == []


def test_a_missing_extra_names_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["opentelemetry"] = None
        try:
            import redlease.otel
        except ImportError as exc:
            print(exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "pip install 'redlease[otel]'" in out


def test_nothing_is_loaded_or_installed_until_asked() -> None:
    code = (
        "import sys, redlease, redlease.aio, redlease.lock, redlease._log as log; "
        "print('redlease.otel' in sys.modules, log.PROCESS_SINKS)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "False []"


def test_renewal_lateness_is_read_at_collection(otel: Telemetry, client: redis.Redis) -> None:
    e = make_elector(client, "python", ttl=0.3)
    with e:
        wait_until(e.token, what="the election")
        time.sleep(0.5)  # a few renewals
        first = otel.value("redlease.renew.lateness")
        assert first >= 1
        time.sleep(0.3)
        assert otel.value("redlease.renew.lateness") > first  # cumulative, and growing


def test_partitions_owned_follow_the_members_tenures(
    otel: Telemetry, client: redis.Redis, engine: str
) -> None:
    member = redlease.Partitions(client, "parts", 4, ttl=0.5, member_id="m1", engine=engine)
    member.start()
    try:
        assert len(member.wait_owned(10.0)) == 4
        assert otel.value("redlease.partitions.owned", **{"redlease.name": "parts"}) == 4
        assert otel.value("redlease.partitions.assigned") == 4
    finally:
        member.stop(10)
    assert otel.value("redlease.partitions.owned") == 0
    stopped = {"redlease.partitions.revoke_reason": "stopped"}
    assert otel.value("redlease.partitions.revoked", **stopped) == 4


def test_asyncio_lock_waits_are_children_of_the_callers_span(
    otel: Telemetry, redis_server: RedisServer, engine: str
) -> None:
    async def main() -> None:
        client = aio_client(redis_server)
        locker = redlease.aio.RedisLocker(client, prefix="oa:", engine=engine)
        with otel.tracer.start_as_current_span("task"):
            async with locker.hold("a", ttl=5):
                pass
        await locker.close()
        await client.aclose()

    asyncio.run(main())
    (task,) = otel.spans("task")
    (wait,) = otel.spans("redlease.lock.wait")
    (hold,) = otel.spans("redlease.lock.hold")
    assert parent_of(wait) == parent_of(hold) == task.context.span_id
    assert attr(hold, "redlease.lock.end_reason") == "released"
