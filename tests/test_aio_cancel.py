"""asyncio cancellation: a cancelled call raises ``CancelledError`` and leaves nothing held.

Every coroutine of ``redlease.aio`` that takes, keeps or gives back a lease
(lock and semaphore acquire, try_acquire, hold, release, refresh; an
``aio.Elector``'s run and ``async with``) and every fenced write is
cancelled hundreds of times: at random delays of 0-3 ms, and after exactly
N turns of the event loop for every N until the call completes first. Then,
at once (never after a TTL), Redis holds no lock, no permit, no queue place
and no lease for it, and the same locker, elector and client answer every
later call with its own reply.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from redlease._testing import RedisServer

# Each test also runs with the asyncio writer's uncompiled source (conftest).
pytestmark = pytest.mark.usefixtures("writer_build")

PREFIX = "t:cancel:"
TASKS = 300
"""Concurrent calls cancelled at random per scenario."""

SWEEP = 60
"""Most loop turns a sweep cancels after (it stops once the call completes first)."""


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro_fn(), 60)

    return asyncio.run(bounded())


@pytest.fixture
def plain(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain client that inspects what is left at Redis."""
    client = redis_server.client()
    try:
        yield client
    finally:
        client.close()


def async_client(server: RedisServer) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(host="127.0.0.1", port=server.port, socket_timeout=5)


def assert_nothing_held(plain: redis.Redis, prefix: str = PREFIX) -> None:
    """No lock, no live permit, no queue place under ``prefix``: checked now, not after a TTL."""
    locks = plain.keys(f"{prefix}key:*")
    assert not locks, f"locks left held: {sorted(locks)[:5]} ({len(locks)})"
    for kind in ("sem", "queue"):
        for key in plain.keys(f"{prefix}{kind}:*"):
            kind_of = plain.type(key)
            size = plain.zcard(key) if kind_of == b"zset" else plain.hlen(key)
            assert not size, f"{key!r} still has {size} entries"


def cancel_after_turns(task: asyncio.Future[Any], turns: int) -> None:
    """Cancel ``task`` after exactly ``turns`` more iterations of the running loop."""
    loop = asyncio.get_running_loop()

    def step(left: int) -> None:
        if left <= 0:
            task.cancel()
        else:
            loop.call_soon(step, left - 1)

    step(turns)


async def storm(
    call: Callable[[int], Awaitable[Any]], count: int = TASKS, spread: float = 0.003
) -> tuple[list[Any], int]:
    """Start ``count`` calls at once, cancel each 0-``spread`` s later; their outcomes.

    Returns what the calls that finished before their cancel returned, and how
    many were cancelled. A cancel that found its task still running must reach
    it: such a task ends in ``CancelledError``, never in a result.
    """
    loop = asyncio.get_running_loop()
    tasks = [asyncio.ensure_future(call(i)) for i in range(count)]
    hit: dict[int, bool] = {}

    def cancel(i: int) -> None:
        hit[i] = tasks[i].cancel()

    for i in range(count):
        loop.call_later(random.uniform(0, spread), cancel, i)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    while len(hit) < count:  # a cancel scheduled after its task ended
        await asyncio.sleep(0.001)
    completed: list[Any] = []
    cancelled = 0
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, asyncio.CancelledError):
            cancelled += 1
            continue
        if isinstance(outcome, BaseException):
            raise outcome
        assert not hit[i], f"call {i} was cancelled while running but returned {outcome!r}"
        completed.append(outcome)
    return completed, cancelled


async def sweep(
    call: Callable[[int], Awaitable[Any]], after: Callable[[int, Any], Awaitable[None]]
) -> int:
    """Cancel ``call(n)`` after exactly n loop turns, for n = 0, 1, ... until it completes first.

    ``after(n, outcome)`` checks what is left (``outcome`` is None when cancelled).
    Returns how many turns the uncancelled call took.
    """
    for turns in range(SWEEP):
        task = asyncio.ensure_future(call(turns))
        cancel_after_turns(task, turns)
        try:
            outcome = await task
        except asyncio.CancelledError:
            await after(turns, None)
            continue
        await after(turns, outcome)
        return turns
    return SWEEP


def make_locker(server: RedisServer, engine: str) -> redlease.aio.RedisLocker:
    return redlease.aio.RedisLocker(async_client(server), prefix=PREFIX, engine=engine)


async def assert_answers_in_step(locker: redlease.aio.RedisLocker, plain: redis.Redis) -> None:
    """Later calls on the same locker each get their own reply."""
    tokens = []
    for i in range(20):
        held = await locker.try_acquire(f"after-{i}", ttl=30)
        holder = await locker.holder(f"after-{i}")
        assert holder is not None and holder.fencing_token == held.fencing_token
        with pytest.raises(redlease.NotAcquired):
            await locker.try_acquire(f"after-{i}")
        tokens.append(held.fencing_token)
        await held.release()
        assert await locker.holder(f"after-{i}") is None
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    assert_nothing_held(plain)


# -- locks ----------------------------------------------------------------------------


def test_cancelled_holds_leave_no_lock_held(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """300 ``async with hold`` blocks cancelled 0-3 ms in: none is held afterwards."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)

        async def block(i: int) -> None:
            async with locker.hold(f"job-{i}", ttl=30):
                await asyncio.sleep(0.002)

        for _ in range(2):
            await storm(block)
            assert_nothing_held(plain)
        await assert_answers_in_step(locker, plain)

    run(scenario)


def test_cancel_at_every_turn_of_a_hold_leaves_no_lock_held(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """Cancelled after each number of loop turns in turn: in acquire, in the block, in release."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)

        async def block(n: int) -> int:
            async with locker.hold(f"job-{n}", ttl=30) as held:
                await asyncio.sleep(0)
            return held.fencing_token

        async def after(n: int, _outcome: object) -> None:
            assert_nothing_held(plain)

        turns = await sweep(block, after)
        assert turns > 0
        await assert_answers_in_step(locker, plain)

    run(scenario)


def test_cancelled_hold_exit_still_releases(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """A block that never awaits: each cancel lands in the acquire or in the release."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)

        async def block(i: int) -> int:
            async with locker.hold(f"job-{i}", ttl=30) as held:
                pass
            return held.fencing_token

        _, cancelled = await storm(block, spread=0.01)
        assert cancelled > 0
        assert_nothing_held(plain)
        await assert_answers_in_step(locker, plain)

    run(scenario)


@pytest.mark.parametrize("method", ["acquire", "try_acquire"])
def test_cancelled_acquire_leaves_no_lock_held(
    redis_server: RedisServer, plain: redis.Redis, engine: str, method: str
) -> None:
    """An acquire cancelled after its script may have run gives the lock back before raising."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)
        take = getattr(locker, method)

        async def acquire(i: int) -> redlease.aio.Lock:
            held: redlease.aio.Lock = await take(f"job-{i}", ttl=30, auto_renew=i % 2 == 0)
            return held

        completed, _ = await storm(acquire)
        assert len(plain.keys(f"{PREFIX}key:*")) == len(completed)
        for held in completed:  # those that won before their cancel hold their lock
            await held.release()
        assert_nothing_held(plain)

        async def after(n: int, outcome: redlease.aio.Lock | None) -> None:
            if outcome is not None:
                await outcome.release()
            assert_nothing_held(plain)

        await sweep(lambda n: acquire(1000 + n), after)
        await assert_answers_in_step(locker, plain)

    run(scenario)


@pytest.mark.parametrize("fair", [False, True], ids=["plain", "fair"])
def test_cancelled_waiting_acquire_stops_waiting_and_takes_nothing(
    redis_server: RedisServer, plain: redis.Redis, engine: str, fair: bool
) -> None:
    """Cancelled while waiting for a held lock: it stops at once, queue place included."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)
        first = await locker.acquire("busy", ttl=30)

        async def wait_for_it(i: int) -> redlease.aio.Lock:
            return await locker.acquire(
                "busy", ttl=30, wait=30, retry_interval=0.02, fair=fair
            )

        began = time.monotonic()
        completed, cancelled = await storm(wait_for_it, count=50, spread=0.05)
        assert not completed and cancelled == 50
        assert time.monotonic() - began < 10, "the cancelled waits ran on"
        holder = await locker.holder("busy")
        assert holder is not None and holder.fencing_token == first.fencing_token
        await first.release()
        assert_nothing_held(plain)
        # Nobody waits for the lock any more: the next acquirer has it at once.
        again = await locker.try_acquire("busy", ttl=30)
        await asyncio.sleep(0.1)  # a waiter still running would have tried by now
        holder = await locker.holder("busy")
        assert holder is not None and holder.fencing_token == again.fencing_token
        await again.release()
        assert_nothing_held(plain)
        await assert_answers_in_step(locker, plain)

    run(scenario)


def test_cancelled_release_is_completed_before_the_error(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """A release cancelled at any point has released when ``CancelledError`` arrives."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)
        held = [await locker.acquire(f"job-{i}", ttl=30, auto_renew=True) for i in range(TASKS)]

        async def release(i: int) -> None:
            await held[i].release()

        await storm(release)
        assert_nothing_held(plain)
        for lock in held[:20]:  # each was released: a second release says so
            with pytest.raises(redlease.NotHeld):
                await lock.release()

        swept = [await locker.acquire(f"swept-{n}", ttl=30) for n in range(SWEEP)]

        async def after(n: int, _outcome: object) -> None:
            if n == 0:
                # Cancelled before its first step, the task never called release.
                await swept[0].release()
            assert not plain.exists(f"{PREFIX}key:swept-{n}")

        turns = await sweep(lambda n: swept[n].release(), after)
        for lock in swept[turns + 1 :]:  # the sweep ended once a release beat its cancel
            await lock.release()
        await assert_answers_in_step(locker, plain)

    run(scenario)


def test_cancelled_refresh_keeps_the_lock_ours_and_releasable(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """A cancelled refresh leaves the lock held by its acquisition, which then releases it."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)
        held = [await locker.acquire(f"job-{i}", ttl=30) for i in range(TASKS)]

        async def refresh(i: int) -> None:
            await held[i].refresh()

        await storm(refresh)
        for i in range(0, TASKS, 15):
            holder = await locker.holder(f"job-{i}")
            assert holder is not None and holder.fencing_token == held[i].fencing_token
        for lock in held:
            await lock.release()  # each still ours: no NotHeld
        assert_nothing_held(plain)
        await assert_answers_in_step(locker, plain)

    run(scenario)


# -- semaphores -----------------------------------------------------------------------


def test_cancelled_semaphore_calls_leave_no_permit_held(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """acquire, try_acquire, hold and release of permits, cancelled: no permit left taken."""

    async def scenario() -> None:
        locker = make_locker(redis_server, engine)
        sems = [locker.semaphore(f"pool-{i}", 3) for i in range(30)]

        async def acquire(i: int) -> redlease.aio.Lock:
            sem = sems[i % len(sems)]
            if i % 2:
                return await sem.try_acquire(ttl=30)
            return await sem.acquire(ttl=30, wait=5, retry_interval=0.02, fair=i % 4 == 0)

        # Ten callers per three-permit semaphore: some wait, some get one.
        completed, _ = await storm(acquire)
        for permit in completed:
            await permit.release()
        assert_nothing_held(plain)

        async def block(i: int) -> None:
            async with sems[i % len(sems)].hold(ttl=30, wait=5, retry_interval=0.02):
                await asyncio.sleep(0.001)

        await storm(block)
        assert_nothing_held(plain)

        permits = [await sems[i % len(sems)].acquire(ttl=30) for i in range(3 * len(sems))]

        async def release(i: int) -> None:
            await permits[i].release()

        await storm(release, count=len(permits))
        assert_nothing_held(plain)

        async def after(n: int, outcome: redlease.aio.Lock | None) -> None:
            if outcome is not None:
                await outcome.release()
            assert_nothing_held(plain)

        await sweep(acquire, after)
        # Every permit is free again: three at once, the fourth refused.
        sem = sems[0]
        taken = [await sem.try_acquire(ttl=30) for _ in range(3)]
        with pytest.raises(redlease.NotAcquired):
            await sem.try_acquire(ttl=30)
        assert len(await sem.holders()) == 3
        for permit in taken:
            await permit.release()
        assert_nothing_held(plain)
        await assert_answers_in_step(locker, plain)

    run(scenario)


# -- aio.Elector ----------------------------------------------------------------------


def assert_no_lease(plain: redis.Redis, names: list[str]) -> None:
    left = [name for name in names if plain.exists(f"{name}:leader")]
    assert not left, f"leases left: {left[:5]} ({len(left)})"


def test_cancelled_elector_runs_leave_no_lease(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """``run`` cancelled while contending, leading or stepping down: the lease is gone."""

    async def scenario() -> None:
        client = async_client(redis_server)
        names = [f"t:run:{i}" for i in range(100)]
        electors = [redlease.aio.Elector(client, n, ttl=5, engine=engine) for n in names]
        led: list[int] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            led.append(term.token)
            await fencer.set("t:run:state", "x")
            await asyncio.sleep(10)

        async def contend(i: int) -> None:
            await electors[i].run(lead)

        # Cancels from 0 to 20 ms: some land before the first win, some in a term.
        for spread in (0.003, 0.03):
            _, cancelled = await storm(contend, count=len(electors), spread=spread)
            assert cancelled == len(electors)
            assert_no_lease(plain, names)
        assert led, "no cancel landed in a term"

        async def after(n: int, _outcome: object) -> None:
            assert_no_lease(plain, names)

        await sweep(lambda n: contend(n % len(electors)), after)
        await assert_elects_again(client, electors[0], plain)
        await client.aclose()

    run(scenario)


async def assert_elects_again(
    client: redis.asyncio.Redis, elector: redlease.aio.Elector, plain: redis.Redis
) -> None:
    """The elector and its client still work: a new term, fenced writes with their own replies."""
    async with elector:
        deadline = time.monotonic() + 10
        while (token := elector.token()) is None:
            assert time.monotonic() < deadline, "the elector never led again"
            await asyncio.sleep(0.005)
        name = elector.config.name
        for i in range(10):
            assert await elector.fence_set(token, f"{name}:k{i}", f"v{i}")
            assert not await elector.fence_set(token - 1, f"{name}:k{i}", "stale")
        assert [await client.get(f"{name}:k{i}") for i in range(10)] == [
            f"v{i}".encode() for i in range(10)
        ]
    assert not plain.exists(f"{name}:leader")


def test_cancelled_async_with_elector_leaves_no_lease(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """``async with elector`` cancelled in its block or in its exit: the lease is gone."""

    async def scenario() -> None:
        client = async_client(redis_server)
        names = [f"t:with:{i}" for i in range(100)]
        electors = [redlease.aio.Elector(client, n, ttl=5, engine=engine) for n in names]

        async def lead_a_while(i: int) -> None:
            async with electors[i]:
                await asyncio.sleep(random.uniform(0, 0.01))

        async def exit_at_once(i: int) -> None:
            async with electors[i]:
                pass  # every cancel lands in the exit (stop)

        for body in (lead_a_while, exit_at_once):
            await storm(body, count=len(electors), spread=0.02)
            assert_no_lease(plain, names)

        async def after(n: int, _outcome: object) -> None:
            assert_no_lease(plain, names)

        await sweep(lambda n: exit_at_once(n % len(electors)), after)
        await assert_elects_again(client, electors[1], plain)
        await client.aclose()

    run(scenario)


# -- fenced writes --------------------------------------------------------------------

COUNT_ONCE = "redis.call('INCR', KEYS[2])"
"""A fenced write that counts how often it was applied (KEYS[1] is the fence's own)."""


def test_cancelled_fenced_writes_are_never_resent_and_replies_stay_in_step(
    redis_server: RedisServer, plain: redis.Redis, engine: str
) -> None:
    """Cancelled writes and pipelines: each applied at most once; every later reply its own."""

    async def scenario() -> None:
        client = async_client(redis_server)
        elector = redlease.aio.Elector(client, "t:fence", ttl=5, engine=engine)
        async with elector:
            deadline = time.monotonic() + 10
            while (token := elector.token()) is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.005)
            fencer = elector.fencer()

            async def write(key: str) -> bool:
                return await fencer.eval(COUNT_ONCE, [key])

            async def pipelined(keys: list[str]) -> list[bool]:
                pipe = fencer.pipeline()
                for key in keys:
                    pipe.eval(COUNT_ONCE, [key])
                return await pipe.execute()

            def assert_at_most_once(keys: list[str], completed: int) -> None:
                counts = [plain.get(key) for key in keys]
                assert set(counts) <= {None, b"1"}, "a cancelled write was sent twice"
                assert counts.count(b"1") >= completed

            for round_ in range(3):
                if round_ == 1:
                    plain.script_flush()  # NOSCRIPT: a write not cancelled yet goes as EVAL
                keys = [f"t:fence:n:{round_}:{i}" for i in range(TASKS)]
                completed, cancelled = await storm(lambda i, keys=keys: write(keys[i]))
                assert all(completed) and cancelled > 0
                assert_at_most_once(keys, len(completed))
                if round_ == 1:
                    plain.script_flush()
                batches = [[f"t:fence:p:{round_}:{i}:{part}" for part in range(3)]
                           for i in range(100)]
                done, _ = await storm(
                    lambda i, batches=batches: pipelined(batches[i]), count=len(batches)
                )
                assert all(all(applied) for applied in done)
                assert_at_most_once([key for batch in batches for key in batch], 3 * len(done))

            async def after(n: int, outcome: bool | None) -> None:
                assert_at_most_once([f"t:fence:s:{n}"], outcome is not None)
                if outcome is not None:
                    assert outcome

            await sweep(lambda n: write(f"t:fence:s:{n}"), after)
            # In step: each write gets its own reply, in order.
            for i in range(50):
                assert await fencer.set(f"t:fence:v:{i}", f"v{i}")
                assert not await elector.fence_set(token - 1, f"t:fence:v:{i}", "stale")
                assert await fencer.eval(COUNT_ONCE, [f"t:fence:c:{i}"])
            assert [plain.get(f"t:fence:v:{i}") for i in range(50)] == [
                f"v{i}".encode() for i in range(50)
            ]
            assert [plain.get(f"t:fence:c:{i}") for i in range(50)] == [b"1"] * 50
        assert not plain.exists("t:fence:leader")
        await client.aclose()

    run(scenario)
