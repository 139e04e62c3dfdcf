"""Faults: refused, hung, frozen and crashed servers, theft, SCRIPT FLUSH."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import redlease
from helpers import (
    APPLIED_KEY,
    LEADER_KEY,
    BlackHole,
    ClosedPort,
    Events,
    Terms,
    make_elector,
    stays,
    wait_until,
)
from redlease._testing import RedisServer


def loopback_client(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def test_acquire_errors_back_off_exponentially_capped_at_the_ttl(
    engine: str, closed_port: ClosedPort
) -> None:
    ttl, poll = 0.4, 0.01
    events = Events()
    e = make_elector(
        loopback_client(closed_port.port), engine,
        ttl=ttl, acquire_interval=poll, observer=events.observer(),
    )
    window = 2.5
    with e:
        time.sleep(window)
    times = events.times("error")
    # Polling at the acquire interval would make ~250 attempts; doubling from
    # 10 ms up to the 0.4 s cap makes about a dozen.
    assert 4 <= len(times) <= 25, f"{len(times)} acquire attempts in {window} s"
    spacing = gaps(times)
    assert max(spacing) <= ttl + 0.3, f"a retry waited longer than the TTL cap: {spacing}"
    late = [g for g, t in zip(spacing, times[1:], strict=True) if t - times[0] > 1.5]
    assert late, spacing
    assert min(late) >= ttl * 0.5, f"retries are not held at the TTL cap: {spacing}"


def test_acquire_backoff_resets_once_redis_answers_again(
    aof_server: RedisServer, engine: str
) -> None:
    ttl, poll = 1.0, 0.02
    client = aof_server.client(socket_timeout=2)
    # A holder that survives the restarts (AOF, no TTL) keeps the elector a follower.
    client.set(LEADER_KEY, "holder")
    events = Events()
    e = make_elector(
        aof_server.client(socket_timeout=1, socket_connect_timeout=1), engine,
        ttl=ttl, acquire_interval=poll, observer=events.observer(),
    )
    with e:
        wait_until(lambda: events.count("follower"), what="a first answer")
        aof_server.kill()
        time.sleep(2.5)  # long enough for the backoff to reach the TTL cap
        ramped = gaps(events.times("error"))
        assert ramped and ramped[-1] >= ttl * 0.5, f"backoff never reached the cap: {ramped}"
        aof_server.restart()
        answered = time.monotonic()
        # Answers ("held by another") come back within one capped retry.
        time.sleep(ttl + 0.5)
        errors_before = events.count("error")
        aof_server.kill()
        wait_until(lambda: events.count("error") >= errors_before + 3, timeout=3.0,
                   what="three errors after the second crash")
    after = [t for t in events.times("error") if t > answered][:3]
    spacing = gaps(after)
    # Reset: the retries start again near the acquire interval, not at the 1 s cap.
    assert all(g < ttl * 0.5 for g in spacing), f"backoff did not reset: {spacing}"
    assert e.token() is None


def test_start_and_stop_are_bounded_against_a_server_that_never_answers(
    engine: str, black_hole: BlackHole
) -> None:
    e = make_elector(loopback_client(black_hole.port), engine, ttl=1.0)
    started = time.monotonic()
    e.start(None)
    time.sleep(0.3)  # an acquire is now in flight, waiting for a reply that never comes
    e.stop()
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"start + stop took {elapsed:.2f} s against a black hole"
    assert e.token() is None


def test_acquire_against_a_server_that_never_answers_reports_an_error(
    engine: str, black_hole: BlackHole
) -> None:
    events = Events()
    client = redis.Redis(host="127.0.0.1", port=black_hole.port, socket_timeout=30)
    e = make_elector(client, engine, ttl=1.0, observer=events.observer())
    with e:
        # Every round trip is bounded by the elector, not by the client's 30 s timeout.
        wait_until(lambda: events.count("error"), timeout=3.0, what="a bounded acquire error")
    exc = events.values("error")[0]
    assert isinstance(exc, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)), exc


def test_leader_steps_down_within_the_ttl_after_the_server_freezes(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    ttl = 1.0
    e = make_elector(client, engine, ttl=ttl)
    renew = e.config.renew_interval
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        time.sleep(0.2)
        redis_server.pause()
        paused = time.monotonic()
        assert term.wait(ttl + 2.0), "the leader never stepped down"
        took = time.monotonic() - paused
        assert term.reason == "lost"
        assert e.token() is None
        assert not e.fencer()
        # The deadline is TTL after the send time of the last good renewal,
        # which went out at most one renew interval before the freeze.
        assert ttl - renew - 0.05 <= took <= ttl + 0.5, f"stepped down {took:.2f} s after freeze"
        redis_server.resume()


def test_leader_is_reelected_with_greater_token_after_a_frozen_server_resumes(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=0.5, acquire_interval=0.05)
    terms = Terms()
    with e.start(terms):
        first = terms.wait_for(1)
        redis_server.pause()
        assert first.wait(3.0)
        redis_server.resume()
        second = terms.wait_for(2, timeout=5.0)
        assert second.token > first.token
        assert client.get(APPLIED_KEY) == str(second.token).encode()


def test_stop_is_bounded_while_the_server_is_frozen(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=1.0)
    with e.start(Terms()):
        wait_until(e.token)
        redis_server.pause()
        started = time.monotonic()
    elapsed = time.monotonic() - started
    assert elapsed < 2.0, f"stop() took {elapsed:.2f} s against a frozen server"


def test_stolen_lock_ends_the_term_quickly_and_the_thief_keeps_it(
    client: redis.Redis, engine: str
) -> None:
    ttl = 2.0
    e = make_elector(client, engine, ttl=ttl, acquire_interval=0.05)
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        client.set(LEADER_KEY, "thief", px=10_000)
        stolen = time.monotonic()
        assert term.wait(ttl), "the leader did not notice the theft"
        took = time.monotonic() - stolen
        assert term.reason == "lost"
        assert took < e.config.renew_interval + 0.5, f"noticed the theft after {took:.2f} s"
        assert e.token() is None
        assert stays(lambda: client.get(LEADER_KEY) == b"thief", 0.5)
        assert len(terms.terms) == 1
    assert client.get(LEADER_KEY) == b"thief"
    assert 0 < client.pttl(LEADER_KEY) <= 10_000


def test_script_flush_mid_term_neither_ends_the_term_nor_breaks_fenced_writes(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=0.6)
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        fencer = terms.fencers[0]
        deadline = time.monotonic() + 1.5
        writes = 0
        while time.monotonic() < deadline:
            client.script_flush()
            assert fencer.set("k", writes)
            writes += 1
            time.sleep(0.05)
        assert not term.ended()
        assert e.token() == term.token
    assert client.get("k") == str(writes - 1).encode()


def test_token_keeps_increasing_across_a_server_crash_with_aof(
    aof_server: RedisServer, engine: str
) -> None:
    client = aof_server.client(socket_timeout=2)
    e = make_elector(
        aof_server.client(socket_timeout=1, socket_connect_timeout=1), engine,
        ttl=0.5, acquire_interval=0.05,
    )
    terms = Terms()
    with e.start(terms):
        first = terms.wait_for(1)
        assert terms.fencers[0].set("k", "before the crash")
        aof_server.kill()
        assert first.wait(3.0)
        aof_server.restart()
        second = terms.wait_for(2, timeout=5.0)
    assert second.token > first.token
    assert client.get("k") == b"before the crash"


def test_fenced_write_to_a_refusing_server_raises_connection_error(
    engine: str, closed_port: ClosedPort
) -> None:
    e = make_elector(loopback_client(closed_port.port), engine)
    with pytest.raises(redis.exceptions.ConnectionError):
        e.fence_set(1, "k", "v")


def test_fenced_write_to_a_server_that_never_answers_raises_timeout_error(
    engine: str, black_hole: BlackHole
) -> None:
    client = redis.Redis(
        host="127.0.0.1", port=black_hole.port, socket_timeout=0.3, socket_connect_timeout=0.3,
        retry=Retry(NoBackoff(), 0),
    )
    e = make_elector(client, engine)
    started = time.monotonic()
    with pytest.raises(redis.exceptions.TimeoutError):
        e.fence_set(1, "k", "v")
    # Bounded by the client's own socket timeout: the write never hangs.
    assert time.monotonic() - started < 3.0


def test_freeze_shorter_than_the_ttl_does_not_end_the_term(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=2.0)
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        time.sleep(0.1)
        redis_server.pause()
        time.sleep(0.5)
        redis_server.resume()
        assert stays(lambda: not term.ended(), 2.0), f"term ended: {term.reason}"
        assert e.token() == term.token
        assert terms.fencers[0].set("k", "still leading")


def test_an_unexpected_acquire_failure_is_reported_and_retried(
    client: redis.Redis, engine: str
) -> None:
    errors: list[Exception] = []
    e = make_elector(client, engine, ttl=0.4, observer=redlease.Observer(on_error=errors.append))
    # The client's first contact made first: the failures below meet the run's acquires.
    e._core.contact()
    # A lone acquire is one call: the engine's single-call path sends it.
    real_call = e._core.engine.call_one
    failures = [RuntimeError("malformed reply"), ValueError("bad value")]

    def flaky_call(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop(0)
        return real_call(*args, **kwargs)

    e._core.engine.call_one = flaky_call  # type: ignore[method-assign]
    with e:
        wait_until(e.token, timeout=10, what="election after the failures")
    assert [type(x) for x in errors[:2]] == [RuntimeError, ValueError]


# The dying thread's exception is re-raised on purpose (threading.excepthook
# reports it): a renewer must never die silently.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dying_python_renewer_ends_the_term_instead_of_leaving_it_unguarded(
    client: redis.Redis,
) -> None:
    e = make_elector(client, "python", ttl=0.5)
    terms: list[redlease.Term] = []

    class Crash(BaseException):
        pass

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term)
        term.wait()

    with e.start(lead):
        wait_until(lambda: terms, timeout=5, what="election")
        run = e._core.run
        assert run is not None

        def crash(*args: Any, **kwargs: Any) -> Any:
            raise Crash("renewer thread killed")

        run.keeper._renew = crash  # type: ignore[attr-defined]
        if hasattr(run.keeper, "batch"):
            # Renewals pipelined with others' go through the engine's batch call.
            run.keeper.batch = crash
        assert terms[0].wait(3), "the term must end when its renewer dies"
        assert terms[0].reason == "lost"
        assert e.token() is None or e.token() != terms[0].token
