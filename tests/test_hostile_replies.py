"""A server that answers slowly, endlessly or too much: every round trip keeps its bound.

The fake server (``redlease._testing.fake``) answers a fenced write with a reply sent
in pieces over time. The client's ``socket_timeout`` (1 s) is the write's
bound: a reply trickled a byte at a time, or one that never ends its line,
ends in a ``TimeoutError`` by then, however often bytes arrive, and a flood
of bytes is cut off at the reply cap instead of being buffered. Each time
the write was sent once, and the next write on the same elector works.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions

import redlease
import redlease.aio
from helpers import (
    Events,
    RunThread,
    Terms,
    family_base_error,
    family_errors,
    make_elector,
    wait_until,
)
from redlease._engine.contract.interface import MAX_REPLY_BYTES
from redlease._engine.notices import pynotices
from redlease._engine.rules.replies import ReplyTooLarge
from redlease._testing._common import client_module
from redlease._testing.fake import (
    HOSTILE,
    FakeRedis,
    Reply,
    Stream,
    client_of,
    lock_won,
    won,
)
from redlease._testing.notices import python_hubs

pytestmark = pytest.mark.timeout(60)

BOUND = 1.0
"""The client's socket_timeout: the bound of one fenced write."""

SLACK = 1.5
"""What a loaded machine may add to a bound before the test calls it broken (seconds)."""


@pytest.fixture
def client(fake: FakeRedis, family: str) -> Iterator[redis.Redis]:
    with client_of(fake, BOUND, family) as c:
        yield c


def timed_failure(call: object) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        returned = call()  # type: ignore[operator]
    except Exception as exc:
        return exc, time.monotonic() - started
    pytest.fail(f"returned {returned!r} instead of raising")


SLOW_ANSWERS = (
    "a valid `:1`, one byte every 400 ms",
    "no line end, 16 bytes every 20 ms",
    "`$9223372036854775807`, then silence",
)
"""Answers that keep the reader waiting: they end in a TimeoutError at the bound."""

SLOW_REPLIES: dict[str, Callable[[], Reply]] = {
    # Each byte well within the socket timeout, the whole reply not.
    "trickled": HOSTILE["a valid `:1`, one byte every 400 ms"],
    # Bytes keep coming, and the line never ends.
    "endless line": HOSTILE["no line end, 16 bytes every 20 ms"],
}


def failed_once(
    fake: FakeRedis, client: redis.Redis, engine: str, reply: Reply
) -> tuple[BaseException, float]:
    """A fenced write answered with ``reply``: its error and how long it took to fail.

    Checked here: it was sent once, and the next write on the same elector (a
    new connection, the next reply) is applied.
    """
    fake.script("fence_set", reply, b":1\r\n")
    e = make_elector(client, engine)
    exc, took = timed_failure(lambda: e.fence_set(1, "k", "v"))
    assert fake.runs("fence_set") == 1
    assert e.fence_set(1, "k", "v") is True
    return exc, took


@pytest.mark.parametrize("answer", list(HOSTILE))
def test_a_fenced_write_answered_badly_raises_within_its_bound_and_is_sent_once(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, answer: str
) -> None:
    # Every row of benchmarks/hostile.py: never a result, never past the bound.
    exc, took = failed_once(fake, client, engine, HOSTILE[answer]())
    assert isinstance(exc, family_base_error(family)), repr(exc)
    assert took < BOUND + SLACK, f"the write took {took:.2f} s, its bound is {BOUND} s"


@pytest.mark.parametrize("slow", list(SLOW_REPLIES))
def test_a_slow_reply_ends_at_the_writes_bound(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, slow: str
) -> None:
    exc, took = failed_once(fake, client, engine, SLOW_REPLIES[slow]())
    assert isinstance(exc, family_errors(family).TimeoutError), repr(exc)
    assert took < BOUND + SLACK, f"the write took {took:.2f} s, its bound is {BOUND} s"


def test_a_flood_past_the_reply_cap_is_cut_off_at_the_cap(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    # Sent as fast as the client takes it, with no line end: the client reads
    # no more than the cap before it gives up, long before the bound.
    exc, took = failed_once(fake, client, engine, HOSTILE["no line end, as fast as read"]())
    assert isinstance(exc, family_errors(family).InvalidResponse), repr(exc)
    assert f"{MAX_REPLY_BYTES / 1048576:g} MiB" in str(exc), str(exc)
    assert took < BOUND + SLACK


ARRAYS_PAST_THE_LIMITS: dict[str, Callable[[], Reply]] = {
    # The header, then silence: refused when it arrives, not when the bound ends.
    "two billion elements": HOSTILE["`*2147483647`, then silence"],
    "nested nine deep": HOSTILE["arrays nested 9 deep, then silence"],
}


@pytest.mark.parametrize("array", list(ARRAYS_PAST_THE_LIMITS))
def test_an_array_past_the_limits_is_refused_as_its_header_arrives(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, array: str
) -> None:
    exc, took = failed_once(fake, client, engine, ARRAYS_PAST_THE_LIMITS[array]())
    errors = family_errors(family)
    assert isinstance(exc, (errors.InvalidResponse, errors.ConnectionError)), repr(exc)
    assert re.search(r"past the limits", str(exc)), str(exc)
    assert took < BOUND / 2, f"refused after {took:.2f} s, not as the header arrived"


def test_the_python_engines_cap_error_is_reply_too_large(
    fake: FakeRedis, client: redis.Redis
) -> None:
    flood = itertools.chain([b"+"], itertools.repeat(b"x" * 65536))
    fake.script("fence_set", Stream(flood, every=0.0))
    exc, _ = timed_failure(lambda: make_elector(client, "python").fence_set(1, "k", "v"))
    assert isinstance(exc, ReplyTooLarge), repr(exc)


def async_failed_once(
    fake: FakeRedis, engine: str, family: str, reply: Reply
) -> tuple[BaseException, float]:
    """``failed_once`` for a coroutine's fenced write, on an asyncio client of ``family``."""
    fake.script("fence_set", reply, b":1\r\n")

    async def scenario() -> tuple[BaseException, float, bool]:
        aclient = client_module(family, asyncio=True).Redis(
            host="127.0.0.1", port=fake.port, socket_timeout=BOUND, socket_connect_timeout=BOUND
        )
        e = redlease.aio.Elector(aclient, "svc", engine=engine)
        started = time.monotonic()
        try:
            try:
                returned = await e.fence_set(1, "k", "v")
            except Exception as exc:
                return exc, time.monotonic() - started, await e.fence_set(1, "k", "v")
            pytest.fail(f"returned {returned!r} instead of raising")
        finally:
            await e.stop()
            await aclient.aclose()

    exc, took, next_applied = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert fake.runs("fence_set") == 2  # the bad answer, then the next write's
    assert next_applied is True
    return exc, took


@pytest.mark.parametrize("answer", list(HOSTILE))
def test_an_asyncio_fenced_write_answered_badly_raises_within_its_bound_and_is_sent_once(
    fake: FakeRedis, engine: str, family: str, answer: str
) -> None:
    exc, took = async_failed_once(fake, engine, family, HOSTILE[answer]())
    errors = family_errors(family)
    assert isinstance(exc, family_base_error(family)), repr(exc)
    assert took < BOUND + SLACK, f"the write took {took:.2f} s, its bound is {BOUND} s"
    if answer == "no line end, as fast as read":
        assert isinstance(exc, errors.InvalidResponse), repr(exc)
        assert f"{MAX_REPLY_BYTES / 1048576:g} MiB" in str(exc), str(exc)
    if answer in ("`*2147483647`, then silence", "arrays nested 9 deep, then silence"):
        assert "past the limits" in str(exc), str(exc)
        assert took < BOUND / 2


@pytest.mark.parametrize("answer", list(HOSTILE))
def test_a_pipeline_answered_badly_raises_within_its_bound_and_is_sent_once(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, answer: str
) -> None:
    # The second write of three is answered badly: the pipeline raises, in
    # its bound, and nothing of it is sent again; the next write is applied.
    fake.script("fence_set", b":1\r\n", HOSTILE[answer](), b":1\r\n")
    e = make_elector(client, engine)
    pipe = e.fence_pipeline(1).set("a", "1").set("b", "2").set("c", "3")
    exc, took = timed_failure(pipe.execute)
    errors = family_errors(family)
    assert isinstance(exc, family_base_error(family)), repr(exc)
    assert took < BOUND + SLACK, f"the pipeline took {took:.2f} s, its bound is {BOUND} s"
    if answer in SLOW_ANSWERS:
        assert isinstance(exc, errors.TimeoutError), repr(exc)
    # The fake reads a write only once it has answered the one before.
    assert fake.runs("fence_set") <= 3
    assert e.fence_set(1, "k", "v") is True
    assert fake.runs("fence_set") <= 4


def test_a_notice_connection_whose_reply_never_ends_is_made_again(
    fake: FakeRedis, client: redis.Redis
) -> None:
    # The Python listener's SUBSCRIBE is answered with a line that never
    # ends, bytes arriving all along: once a message starts, it must be whole
    # within the listener's bound, or the connection is dropped and made again.
    endless = itertools.chain([b"*3\r\n$9\r\nsubscribe\r\n+"], itertools.repeat(b"x" * 16))
    fake.command("SUBSCRIBE", Stream(endless, every=0.02))
    sub = pynotices.listen(client, "svc:leader", lambda payload: None)
    try:
        hub = next(h for h in python_hubs() if fake.port in h._key)
        wait_until(lambda: hub.connects >= 2, 20.0, what="the notice connection made again")
    finally:
        sub.cancel()


# -- in a running elector, and under a lock's watchdog ----------------------------------

IN_A_RUN: dict[str, Callable[[], Reply]] = {
    **SLOW_REPLIES,
    "flood": HOSTILE["no line end, as fast as read"],
    **ARRAYS_PAST_THE_LIMITS,
}
"""The slow, endless and oversized answers: each must cost one bounded, reported error."""


def reported_in_family(events: Events, family: str) -> list[BaseException]:
    """What ``on_error`` got, each checked to be a timeout or a broken reply of ``family``."""
    errors = family_errors(family)
    reported: list[BaseException] = events.values("error")
    for exc in reported:
        assert isinstance(
            exc, (errors.TimeoutError, errors.InvalidResponse, errors.ConnectionError)
        ), repr(exc)
    return reported


@contextlib.contextmanager
def running(client: redis.Redis, engine: str) -> Iterator[tuple[Events, Terms]]:
    """An elector running on ``client`` for the block: its events and terms.

    After the block the run is stopped; it must still have been running, and
    end without an error (whatever the server answered, the run carries on).
    """
    events, terms = Events(), Terms()
    # Backing off from 0.1 s after a hostile answer, not the default half TTL.
    elector = make_elector(client, engine, acquire_interval=0.1, observer=events.observer())
    run = RunThread(elector, terms)
    try:
        yield events, terms
        assert run.alive and run.error is None
    finally:
        run.stop()
    assert run.error is None


@pytest.mark.parametrize("hostile", list(IN_A_RUN))
def test_a_running_elector_reports_a_hostile_acquire_and_then_leads(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, hostile: str
) -> None:
    fake.script("acquire", IN_A_RUN[hostile](), won(1))
    with running(client, engine) as (events, terms):
        assert terms.wait_for(1, timeout=15).token == 1
        assert len(reported_in_family(events, family)) == 1
        assert fake.runs("acquire") == 2  # the hostile answer, then the one that elected


@pytest.mark.parametrize("hostile", list(IN_A_RUN))
def test_a_leader_reports_a_hostile_renewal_and_leads_on(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, hostile: str
) -> None:
    # After the hostile renewal every renewal is answered 1, and an acquire after
    # a lost lease elects again: either way the run leads on.
    fake.script("acquire", won(1)).script("renew", IN_A_RUN[hostile]())
    fake.script("acquire", won(2))
    with running(client, engine) as (events, terms):
        terms.wait_for(1, timeout=10)
        wait_until(lambda: events.values("error"), 10, what="the renewal's error reported")
        assert len(reported_in_family(events, family)) >= 1
        wait_until(
            lambda: terms.terms and not terms.terms[-1].ended(), 10, what="leading again"
        )


@pytest.mark.parametrize("hostile", list(IN_A_RUN))
def test_a_locks_watchdog_survives_a_hostile_refresh(
    fake: FakeRedis, client: redis.Redis, engine: str, hostile: str, caplog: Any
) -> None:
    # A TTL of 3 s, refreshed every second: one refresh lost to the server's
    # answer is survived, and the lock stays held (the next refreshes answer 1).
    fake.script("lock_acquire", lock_won(7)).script("lock_refresh", IN_A_RUN[hostile]())
    locker = redlease.RedisLocker(client, engine=engine)
    with caplog.at_level(logging.WARNING, logger="redlease"):
        held = locker.try_acquire("job", ttl=3.0, auto_renew=True)
        try:
            wait_until(lambda: fake.pending("lock_refresh") == 0, 10, what="the hostile refresh")
            wait_until(lambda: fake.runs("lock_refresh") >= 3, 10, what="refreshes after it")
            assert not held.done.is_set(), "the lock was given up over one bad refresh"
            failing = [r for r in caplog.records if "failing" in r.getMessage()]
            assert failing, "the watchdog's error was not logged"
        finally:
            held.release()
    locker.close()


# -- the sentinels' answers ---------------------------------------------------------------


@pytest.mark.parametrize("hostile", ["trickled", "flood", "two billion elements"])
def test_sentinels_that_answer_badly_cost_the_confirmation_no_more_than_its_bound(
    hostile: str,
) -> None:
    # Three sentinels answering SENTINEL MASTER badly: the Python engine's
    # master confirmation asks each within its share of the bound, reads no
    # more than the cap, and says the majority did not answer.
    from redlease._engine.conn.client import Sentinels
    from redlease._engine.conn.failover import SentinelProbes

    fakes = [FakeRedis() for _ in range(3)]
    try:
        for fake in fakes:
            fake.command("SENTINEL", IN_A_RUN[hostile]())
        sentinels = Sentinels(tuple(("127.0.0.1", fake.port) for fake in fakes), "svc")
        probes = SentinelProbes()
        started = time.monotonic()
        why, _named_elsewhere = probes.check(sentinels, ("127.0.0.1", 6379), BOUND)
        took = time.monotonic() - started
        probes.close()
    finally:
        for fake in fakes:
            fake.close()
    assert why is not None and "only 0 of the 3 sentinels answered" in why, why
    assert took < BOUND + SLACK, f"the confirmation took {took:.2f} s, its bound is {BOUND} s"


# -- the same, from coroutines ----------------------------------------------------------


def in_a_loop(scenario: Callable[[Any], Any], fake: FakeRedis, family: str) -> Any:
    """``await scenario(client)`` on a fresh loop, with an asyncio client of ``family``."""

    async def main() -> Any:
        aclient = client_module(family, asyncio=True).Redis(
            host="127.0.0.1", port=fake.port, socket_timeout=BOUND, socket_connect_timeout=BOUND
        )
        try:
            return await scenario(aclient)
        finally:
            await aclient.aclose()

    return asyncio.run(asyncio.wait_for(main(), 60))


@pytest.mark.parametrize("answer", list(HOSTILE))
def test_an_asyncio_pipeline_answered_badly_raises_within_its_bound_and_is_sent_once(
    fake: FakeRedis, engine: str, family: str, answer: str
) -> None:
    fake.script("fence_set", b":1\r\n", HOSTILE[answer](), b":1\r\n")

    async def scenario(aclient: Any) -> tuple[BaseException, float, bool]:
        e = redlease.aio.Elector(aclient, "svc", engine=engine)
        try:
            pipe = e.fence_pipeline(1).set("a", "1").set("b", "2").set("c", "3")
            started = time.monotonic()
            try:
                returned = await pipe.execute()
            except Exception as exc:
                return exc, time.monotonic() - started, await e.fence_set(1, "k", "v")
            pytest.fail(f"returned {returned!r} instead of raising")
        finally:
            await e.stop()

    exc, took, next_applied = in_a_loop(scenario, fake, family)
    assert isinstance(exc, family_base_error(family)), repr(exc)
    assert took < BOUND + SLACK, f"the pipeline took {took:.2f} s, its bound is {BOUND} s"
    assert next_applied is True
    assert fake.runs("fence_set") <= 4


@pytest.mark.parametrize("hostile", list(IN_A_RUN))
def test_an_asyncio_elector_reports_a_hostile_acquire_and_then_leads(
    fake: FakeRedis, engine: str, family: str, hostile: str
) -> None:
    fake.script("acquire", IN_A_RUN[hostile](), won(1))

    async def scenario(aclient: Any) -> tuple[Events, int]:
        events = Events()
        e = redlease.aio.Elector(
            aclient, "svc", ttl=1.0, acquire_interval=0.1, engine=engine, observer=events.observer()
        )
        async with e:
            deadline = time.monotonic() + 15
            while e.token() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return events, e.token() or 0

    events, token = in_a_loop(scenario, fake, family)
    assert token == 1
    assert len(reported_in_family(events, family)) == 1
    assert fake.runs("acquire") == 2


@pytest.mark.parametrize("hostile", list(IN_A_RUN))
def test_an_asyncio_locks_watchdog_survives_a_hostile_refresh(
    fake: FakeRedis, engine: str, family: str, hostile: str
) -> None:
    fake.script("lock_acquire", lock_won(7)).script("lock_refresh", IN_A_RUN[hostile]())

    async def scenario(aclient: Any) -> bool:
        locker = redlease.aio.RedisLocker(aclient, engine=engine)
        try:
            async with locker.hold("job", ttl=3.0) as held:
                deadline = time.monotonic() + 10
                while fake.runs("lock_refresh") < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert fake.runs("lock_refresh") >= 3, "no refreshes after the hostile one"
                return bool(held.done.is_set())
        finally:
            await locker.close()

    assert in_a_loop(scenario, fake, family) is False, "the lock was given up over one refresh"
