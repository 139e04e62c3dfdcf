"""A reply a script cannot give raises: never ``applied=False``, never "lost", never NotAcquired.

DESIGN.md section 11. A fenced write returns 0 or 1, renew 0 or 1, acquire
``{token, pttl, holder}`` and lock_acquire ``{token, pttl}``; anything else
(an array where an integer belongs, a bulk, a nil, an integer out of range,
a malformed reply) is an error of the client's family. A caller must never be
told its token is stale, or a leader that it lost its lease, because the
server said something nonsensical. These tests use ``FakeRedis``, which
answers each script with the raw bytes the test chose; the ``:0`` / ``:1``
cases are the controls that show the fake speaks for a real server.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions

import redlease
import redlease.aio
from helpers import (
    NAME,
    Events,
    RunThread,
    Terms,
    family_errors,
    make_elector,
    stays,
    wait_until,
)
from redlease._testing._common import client_module
from redlease._testing.fake import FakeRedis, array, bulk, client_of, lock_won, won

pytestmark = pytest.mark.timeout(120)

HUGE = 64 * 1024 * 1024

UNEXPECTED: dict[str, bytes] = {
    "array": b"*3\r\n:1\r\n:2\r\n:3\r\n",
    "huge_bulk": b"$%d\r\n" % HUGE + b"x" * HUGE + b"\r\n",
    "lying_bulk": b"$2\r\nabcd\r\n",
    "nil": b"$-1\r\n",
    "integer_7": b":7\r\n",
    "integer_minus_1": b":-1\r\n",
}
"""Replies a fenced write (integer 0 or 1) can never give, by name."""

SAYS: dict[str, str] = {
    "array": r"array|list|\[1, 2, 3\]",
    "huge_bulk": r"bulk|bytes|string|too (large|long|big)|cap|limit",
    "lying_bulk": r"bulk|bytes|string|b'ab'|protocol|malformed|invalid",
    "nil": r"nil|none|null",
    "integer_7": r"(?<![\w.])7(?![\w.])",
    "integer_minus_1": r"(?<![\w.])-1(?![\w.])",
}
"""What an error's message must mention, so it says what came back."""

MALFORMED = ("huge_bulk", "lying_bulk")
"""Replies past the reply cap or broken on the wire: ``InvalidResponse`` is a fair answer too."""

KINDS = list(UNEXPECTED)


@pytest.fixture
def client(fake: FakeRedis, family: str) -> Iterator[redis.Redis]:
    with client_of(fake, 3.0, family) as c:
        yield c


def run_async(
    scenario: Callable[[redis.asyncio.Redis], Awaitable[Any]], fake: FakeRedis, family: str
) -> Any:
    """``scenario(client)`` on a fresh loop, with an asyncio client of ``family`` for ``fake``."""

    async def main() -> Any:
        c = client_module(family, asyncio=True).Redis(
            host="127.0.0.1", port=fake.port, socket_timeout=3, socket_connect_timeout=3
        )
        try:
            return await scenario(c)
        finally:
            await c.aclose()

    return asyncio.run(asyncio.wait_for(main(), 60))


def assert_says_what_came_back(exc: BaseException, kind: str, family: str) -> None:
    """``exc`` is the error section 11 asks for, of the client's family, naming the reply."""
    errors = family_errors(family)
    allowed: tuple[type[BaseException], ...] = (errors.ResponseError,)
    if kind in MALFORMED:
        allowed += (errors.InvalidResponse,)
    assert isinstance(exc, allowed), f"{type(exc).__name__}: {exc}"
    assert re.search(SAYS[kind], str(exc), re.IGNORECASE), f"the message hides the reply: {exc}"


def raised_by(call: Callable[[], Any]) -> BaseException:
    """The exception ``call()`` raises; a returned value (False, a Lock...) fails the test."""
    try:
        returned = call()
    except Exception as exc:
        return exc
    pytest.fail(f"returned {returned!r} instead of raising")


async def raised_by_async(call: Callable[[], Awaitable[Any]]) -> BaseException:
    try:
        returned = await call()
    except Exception as exc:
        return exc
    pytest.fail(f"returned {returned!r} instead of raising")


# -- one fenced write ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_fenced_write_answered_with_a_reply_it_cannot_give_raises(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    fake.script("fence_set", UNEXPECTED[kind])
    fencer = redlease.Fencer(make_elector(client, engine), 1)
    assert_says_what_came_back(raised_by(lambda: fencer.set("k", "v")), kind, family)


@pytest.mark.parametrize("kind", KINDS)
def test_fenced_write_answered_with_a_reply_it_cannot_give_is_sent_once(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    fake.script("fence_set", UNEXPECTED[kind])
    fencer = redlease.Fencer(make_elector(client, engine), 1)
    with contextlib.suppress(Exception):
        fencer.set("k", "v")
    assert fake.runs("fence_set") == 1


@pytest.mark.parametrize(
    ("reply", "applied"), [(b":0\r\n", False), (b":1\r\n", True)], ids=["0-rejected", "1-applied"]
)
def test_fenced_write_answered_0_or_1_returns_applied(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, reply: bytes, applied: bool
) -> None:
    fake.script("fence_set", reply)
    assert redlease.Fencer(make_elector(client, engine), 1).set("k", "v") is applied
    assert fake.runs("fence_set") == 1


@pytest.mark.parametrize("kind", KINDS)
def test_async_fenced_write_answered_with_a_reply_it_cannot_give_raises(
    fake: FakeRedis, engine: str, family: str, kind: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> BaseException:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        return await raised_by_async(lambda: fencer.set("k", "v"))

    fake.script("fence_set", UNEXPECTED[kind])
    assert_says_what_came_back(run_async(scenario, fake, family), kind, family)


@pytest.mark.parametrize("kind", KINDS)
def test_async_fenced_write_answered_with_a_reply_it_cannot_give_is_sent_once(
    fake: FakeRedis, engine: str, family: str, kind: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> None:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        with contextlib.suppress(Exception):
            await fencer.set("k", "v")

    fake.script("fence_set", UNEXPECTED[kind])
    run_async(scenario, fake, family)
    assert fake.runs("fence_set") == 1


@pytest.mark.parametrize(
    ("reply", "applied"), [(b":0\r\n", False), (b":1\r\n", True)], ids=["0-rejected", "1-applied"]
)
def test_async_fenced_write_answered_0_or_1_returns_applied(
    fake: FakeRedis, engine: str, family: str, reply: bytes, applied: bool
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> bool:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        return await fencer.set("k", "v")

    fake.script("fence_set", reply)
    assert run_async(scenario, fake, family) is applied
    assert fake.runs("fence_set") == 1


# -- a pipeline of three writes, the second answered unexpectedly ----------------------


def pipeline_of_three(fencer: Any) -> Any:
    return fencer.pipeline().set("a", "1").set("b", "2").set("c", "3")


def assert_pipeline_sent_once(fake: FakeRedis, kind: str) -> None:
    """The three writes of ``pipeline_of_three`` reached the fake once each, none again."""
    # The fake may still be reading the writes sent before the client gave up.
    deadline = time.monotonic() + 2.0
    while fake.runs("fence_set") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sent = fake.runs("fence_set")
    # Past the reply cap a client drops the connection while the fake is still
    # sending the huge reply: the fake then never reads the third write.
    assert sent == 3 or (kind == "huge_bulk" and sent == 2), sent


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_with_a_reply_a_write_cannot_give_raises(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    fake.script("fence_set", b":1\r\n", UNEXPECTED[kind], b":1\r\n")
    pipe = pipeline_of_three(redlease.Fencer(make_elector(client, engine), 1))
    assert_says_what_came_back(raised_by(pipe.execute), kind, family)


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_with_a_reply_a_write_cannot_give_is_sent_once(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    fake.script("fence_set", b":1\r\n", UNEXPECTED[kind], b":1\r\n")
    pipe = pipeline_of_three(redlease.Fencer(make_elector(client, engine), 1))
    with contextlib.suppress(Exception):
        pipe.execute()
    assert_pipeline_sent_once(fake, kind)


def test_pipeline_with_a_reply_a_write_cannot_give_reads_every_reply_before_raising(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    # Were the third reply (":1") left unread, the next write would take it
    # for its own instead of the ":0" the server gave that write.
    fake.script("fence_set", b":1\r\n", UNEXPECTED["array"], b":1\r\n", b":0\r\n")
    fencer = redlease.Fencer(make_elector(client, engine), 1)
    with pytest.raises(family_errors(family).ResponseError):
        pipeline_of_three(fencer).execute()
    assert fencer.set("d", "4") is False
    assert fake.runs("fence_set") == 4


@pytest.mark.parametrize(
    ("replies", "applied"),
    [
        ((b":1\r\n",) * 3, [True, True, True]),
        ((b":1\r\n", b":0\r\n", b":0\r\n"), [True, False, False]),
    ],
    ids=["all-applied", "rejected-from-the-second"],
)
def test_pipeline_answered_0_or_1_returns_applied_per_write(
    fake: FakeRedis,
    client: redis.Redis,
    engine: str, family: str,
    replies: tuple[bytes, ...],
    applied: list[bool],
) -> None:
    fake.script("fence_set", *replies)
    pipe = pipeline_of_three(redlease.Fencer(make_elector(client, engine), 1))
    assert pipe.execute() == applied
    assert fake.runs("fence_set") == 3


@pytest.mark.parametrize("kind", KINDS)
def test_async_pipeline_with_a_reply_a_write_cannot_give_raises(
    fake: FakeRedis, engine: str, family: str, kind: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> BaseException:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        return await raised_by_async(pipeline_of_three(fencer).execute)

    fake.script("fence_set", b":1\r\n", UNEXPECTED[kind], b":1\r\n")
    assert_says_what_came_back(run_async(scenario, fake, family), kind, family)


@pytest.mark.parametrize("kind", KINDS)
def test_async_pipeline_with_a_reply_a_write_cannot_give_is_sent_once(
    fake: FakeRedis, engine: str, family: str, kind: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> None:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        with contextlib.suppress(Exception):
            await pipeline_of_three(fencer).execute()

    fake.script("fence_set", b":1\r\n", UNEXPECTED[kind], b":1\r\n")
    run_async(scenario, fake, family)
    assert_pipeline_sent_once(fake, kind)


def test_async_pipeline_answered_0_or_1_returns_applied_per_write(
    fake: FakeRedis, engine: str, family: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> list[bool]:
        fencer = redlease.aio.Fencer(redlease.aio.Elector(c, NAME, ttl=1.0, engine=engine), 1)
        applied: list[bool] = await pipeline_of_three(fencer).execute()
        return applied

    fake.script("fence_set", b":1\r\n", b":0\r\n", b":0\r\n")
    assert run_async(scenario, fake, family) == [True, False, False]
    assert fake.runs("fence_set") == 3


# -- a running elector: acquire and renew ---------------------------------------------

BAD_ACQUIRES: dict[str, bytes] = {
    "array_of_integers": b"*3\r\n:1\r\n:2\r\n:3\r\n",
    "bulk": bulk(b"hello"),
    "nil": b"$-1\r\n",
    "integer": b":1\r\n",
    "short_array": array(b":1\r\n"),
}
"""Replies acquire (``{token, pttl, holder}``, holder a string) can never give."""


def response_errors(events: Events, family: str) -> list[BaseException]:
    """The errors ``on_error`` got that are ResponseError / InvalidResponse of ``family``."""
    errors = family_errors(family)
    return [
        exc
        for exc in events.values("error")
        if isinstance(exc, (errors.ResponseError, errors.InvalidResponse))
    ]


@contextlib.contextmanager
def stopped_on_failure(run: RunThread) -> Iterator[None]:
    """Stop ``run`` when the block fails, so no elector outlives its test."""
    try:
        yield
    except BaseException:
        run.stop()
        raise


BAD_ACQUIRE_INTERVAL = 0.1
"""Where an election follows bad acquires: the first backoff (it doubles after each error)."""


def elect_after_two_bad_acquires(
    fake: FakeRedis, client: redis.Redis, engine: str, bad: bytes
) -> tuple[RunThread, Events, Terms]:
    """A run whose first two acquires are answered ``bad``, the third with token 1."""
    fake.script("acquire", bad, bad, won(1))
    events, terms = Events(), Terms()
    # Backing off from 0.1 s, not the default half TTL: 0.6 s to the third acquire, not 2 s.
    elector = make_elector(
        client, engine, acquire_interval=BAD_ACQUIRE_INTERVAL, observer=events.observer()
    )
    run = RunThread(elector, terms)
    with stopped_on_failure(run):
        wait_until(lambda: terms.terms or not run.alive, 15, what="an election")
    return run, events, terms


def described(errors: list[Any]) -> list[str]:
    return [f"{type(exc).__name__}: {exc}" for exc in errors]


@pytest.mark.parametrize("kind", list(BAD_ACQUIRES))
def test_acquire_answered_with_a_reply_it_cannot_give_is_reported_to_on_error(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    run, events, _ = elect_after_two_bad_acquires(fake, client, engine, BAD_ACQUIRES[kind])
    try:
        reported = response_errors(events, family)
        assert len(reported) == 2, f"on_error got {described(events.values('error'))}"
        assert events.kinds()[:1] != ["follower"], (
            "an unexpected reply was taken for a lost acquire"
        )
    finally:
        run.stop()


@pytest.mark.parametrize("kind", list(BAD_ACQUIRES))
def test_run_carries_on_after_unexpected_acquire_replies_and_is_elected(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    run, events, terms = elect_after_two_bad_acquires(fake, client, engine, BAD_ACQUIRES[kind])
    try:
        assert terms.wait_for(1, timeout=10).token == 1
        assert fake.runs("acquire") == 3, "elected by a reply acquire cannot give"
        assert events.values("elected") == [1]
        assert run.alive and run.error is None
    finally:
        run.stop()
    assert run.error is None and run.returned


def test_acquire_answered_with_an_error_reply_is_reported_and_then_elected(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    bad = b"-ERR something went wrong\r\n"
    run, events, terms = elect_after_two_bad_acquires(fake, client, engine, bad)
    try:
        assert terms.wait_for(1, timeout=10).token == 1
        assert len(response_errors(events, family)) == 2, (
            f"on_error got {described(events.values('error'))}"
        )
    finally:
        run.stop()


def test_term_lasts_while_renewals_are_answered_1(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    fake.script("acquire", won(1))
    events, terms = Events(), Terms()
    run = RunThread(make_elector(client, engine, observer=events.observer()), terms)
    try:
        term = terms.wait_for(1, timeout=10)
        assert stays(lambda: not term.ended(), 2.0), f"term ended: {term.reason}"
        assert events.values("error") == []
    finally:
        run.stop()
    assert term.reason == "stopped"


def test_async_acquire_answered_with_a_reply_it_cannot_give_is_reported_and_then_elected(
    fake: FakeRedis, engine: str, family: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> tuple[Events, int]:
        events = Events()
        elector = redlease.aio.Elector(
            c,
            NAME,
            ttl=1.0,
            acquire_interval=BAD_ACQUIRE_INTERVAL,
            engine=engine,
            observer=events.observer(),
        )
        tokens: list[int] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            tokens.append(term.token)
            await asyncio.Event().wait()

        stop = asyncio.Event()
        task = asyncio.ensure_future(elector.run(lead, stop=stop))
        deadline = asyncio.get_running_loop().time() + 15
        while not tokens and not task.done() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 10)
        return events, (tokens or [0])[0]

    fake.script("acquire", BAD_ACQUIRES["array_of_integers"], BAD_ACQUIRES["bulk"], won(1))
    events, token = run_async(scenario, fake, family)
    reported = described(events.values("error"))
    assert len(response_errors(events, family)) == 2, f"on_error got {reported}"
    assert token == 1
    assert fake.runs("acquire") == 3


def lead_through_one_bad_renewal(
    fake: FakeRedis, client: redis.Redis, engine: str
) -> tuple[RunThread, Events, redlease.Term]:
    """A leader (TTL 1 s) whose first renewal is answered with an array, every later one ``:1``."""
    fake.script("acquire", won(1)).script("renew", UNEXPECTED["array"])
    events, terms = Events(), Terms()
    run = RunThread(make_elector(client, engine, observer=events.observer()), terms)
    with stopped_on_failure(run):
        term = terms.wait_for(1, timeout=10)
        wait_until(lambda: fake.pending("renew") == 0, 10, what="the bad renewal")
    return run, events, term


def test_renewal_answered_with_a_reply_it_cannot_give_is_reported_to_on_error(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    run, events, _ = lead_through_one_bad_renewal(fake, client, engine)
    try:
        errors = wait_until(lambda: response_errors(events, family), 5, what="the renewal's error")
        assert_says_what_came_back(errors[0], "array", family)
    finally:
        run.stop()


def test_term_survives_a_renewal_answered_with_a_reply_it_cannot_give(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    run, events, term = lead_through_one_bad_renewal(fake, client, engine)
    try:
        # Two TTLs: without the good renewals that followed, the lease would be gone.
        assert stays(lambda: not term.ended(), 2.0), f"term ended: {term.reason}"
        assert "stepped_down" not in events.kinds()
        assert fake.runs("renew") >= 3
    finally:
        run.stop()
    assert term.reason == "stopped"


# -- a lock -----------------------------------------------------------------------

BAD_LOCK_ACQUIRES: dict[str, bytes] = {
    "array": b"*3\r\n:1\r\n:2\r\n:3\r\n",
    "bulk": bulk(b"hello"),
}
"""Replies lock_acquire (``{token, pttl}``) can never give."""


@pytest.mark.parametrize("kind", list(BAD_LOCK_ACQUIRES))
def test_lock_acquire_answered_with_a_reply_it_cannot_give_raises(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str, kind: str
) -> None:
    fake.script("lock_acquire", BAD_LOCK_ACQUIRES[kind])
    locker = redlease.RedisLocker(client, engine=engine)
    exc = raised_by(lambda: locker.try_acquire("x"))
    assert isinstance(exc, family_errors(family).ResponseError), f"{type(exc).__name__}: {exc}"


def test_lock_acquire_answered_with_a_token_returns_the_lock(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    fake.script("lock_acquire", lock_won(7))
    held = redlease.RedisLocker(client, engine=engine).try_acquire("x")
    assert held.fencing_token == 7
    held.release()


def test_lock_acquire_answered_held_elsewhere_raises_not_acquired(
    fake: FakeRedis, client: redis.Redis, engine: str, family: str
) -> None:
    fake.script("lock_acquire", array(b":0\r\n", b":5000\r\n"))
    with pytest.raises(redlease.NotAcquired):
        redlease.RedisLocker(client, engine=engine).try_acquire("x")


@pytest.mark.parametrize("kind", list(BAD_LOCK_ACQUIRES))
def test_async_lock_acquire_answered_with_a_reply_it_cannot_give_raises(
    fake: FakeRedis, engine: str, family: str, kind: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> BaseException:
        locker = redlease.aio.RedisLocker(c, engine=engine)
        try:
            return await raised_by_async(lambda: locker.try_acquire("x"))
        finally:
            await locker.close()

    fake.script("lock_acquire", BAD_LOCK_ACQUIRES[kind])
    exc = run_async(scenario, fake, family)
    assert isinstance(exc, family_errors(family).ResponseError), f"{type(exc).__name__}: {exc}"


def test_async_lock_acquire_answered_with_a_token_returns_the_lock(
    fake: FakeRedis, engine: str, family: str
) -> None:
    async def scenario(c: redis.asyncio.Redis) -> int:
        locker = redlease.aio.RedisLocker(c, engine=engine)
        try:
            held = await locker.try_acquire("x")
            await held.release()
            return held.fencing_token
        finally:
            await locker.close()

    fake.script("lock_acquire", lock_won(7))
    assert run_async(scenario, fake, family) == 7
