"""The run loop: run/start/stop, terms and their reasons, resign, failover."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import pytest
import redis

import redlease
from helpers import (
    LEADER_KEY,
    RunThread,
    Terms,
    make_elector,
    require_native,
    stays,
    wait_until,
)
from redlease._testing import RedisServer


class Boom(Exception):
    pass


def test_run_elects_and_releases_the_lock_when_stopped(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    terms = Terms()
    runner = RunThread(e, terms)
    term = terms.wait_for(1)
    assert term.token >= 1
    assert not term.ended()
    assert term.wait(0.05) is False
    assert term.reason is None
    assert client.get(LEADER_KEY) == e.instance_id.encode()
    runner.stop_event.set()
    assert runner.join(5.0), "run() did not return after stop was set"
    assert runner.error is None
    assert term.ended()
    assert term.wait(0) is True
    assert term.reason == "stopped"
    assert client.exists(LEADER_KEY) == 0
    assert e.token() is None


def test_leader_function_receives_a_fencer_for_its_term(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        fencer = terms.fencers[0]
        assert fencer.token == term.token == e.token()
        assert fencer
        assert fencer.set("k", "from the leader")
    assert client.get("k") == b"from the leader"


def test_start_returns_the_elector_and_stop_ends_the_term(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    terms = Terms()
    assert e.start(terms) is e
    term = terms.wait_for(1)
    e.stop()
    assert term.ended()
    assert term.reason == "stopped"
    assert client.exists(LEADER_KEY) == 0


def test_token_driven_style_keeps_the_instance_elected(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    with e:
        token = wait_until(e.token)
        assert e.is_leader()
        f = e.fencer()
        assert f.token == token
        assert f
        assert f.set("k", "token-driven")
        assert e.fence_hset(token, "h", "f", "v")
    assert client.get("k") == b"token-driven"
    assert e.token() is None
    assert not e.is_leader()
    assert not e.fencer()
    assert client.exists(LEADER_KEY) == 0


def test_start_with_no_function_is_token_driven(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    with e.start(None):
        assert wait_until(e.token) >= 1
    assert client.exists(LEADER_KEY) == 0


def test_concurrent_second_run_raises_runtime_error(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    with e:
        wait_until(e.token)
        with pytest.raises(RuntimeError):
            e.start(None)
        with pytest.raises(RuntimeError):
            e.run(None, stop=threading.Event())
        assert e.is_leader()


def test_elector_can_run_again_after_a_run_ended(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    with e:
        first = wait_until(e.token)
    with e:
        second = wait_until(e.token)
    assert second > first


def test_run_with_stop_already_set_returns_at_once_without_touching_redis(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    called = []
    stop = threading.Event()
    stop.set()
    # A frozen server would hang any round trip: returning quickly proves none was made.
    redis_server.pause()
    try:
        started = time.monotonic()
        e.run(lambda term, fencer: called.append(term), stop=stop)
        elapsed = time.monotonic() - started
    finally:
        redis_server.resume()
    assert elapsed < 0.5
    assert called == []
    assert client.keys("*") == []


def test_returning_leader_function_ends_the_term_and_recontends_with_greater_token(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    terms = Terms(returns_after=1)
    with e.start(terms):
        first = terms.wait_for(1)
        second = terms.wait_for(2)
        assert first.ended()
        assert first.reason == "returned"
        assert second.token > first.token
        assert not second.ended()
        assert e.token() == second.token


def test_resign_ends_the_term_and_recontends_with_greater_token(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    terms = Terms()
    with e.start(terms):
        first = terms.wait_for(1)
        e.resign()
        assert first.wait(5.0)
        assert first.reason == "resigned"
        second = terms.wait_for(2)
        assert second.token > first.token
        assert not second.ended()


def test_resign_in_token_driven_style_recontends_with_greater_token(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    with e:
        first = wait_until(e.token)
        e.resign()
        second = wait_until(lambda: (e.token() or 0) > first, what="a second term")
        assert second


def test_resign_when_not_leading_is_a_no_op(client: redis.Redis, engine: str) -> None:
    client.set(LEADER_KEY, "someone-else", px=60_000)
    e = make_elector(client, engine)
    e.resign()
    with e:
        time.sleep(0.2)
        e.resign()
        assert e.token() is None
    assert client.get(LEADER_KEY) == b"someone-else"


def test_exception_in_leader_function_is_reraised_by_run_and_lock_released(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, acquire_interval=0.05)
    boom = Boom("leader failed")
    calls: list[redlease.Term] = []

    def fail(term: redlease.Term, fencer: redlease.Fencer) -> None:
        calls.append(term)
        raise boom

    runner = RunThread(e, fail)
    assert runner.join(5.0), "run() kept going after the leader function raised"
    assert runner.error is boom
    assert len(calls) == 1
    assert calls[0].ended()
    assert client.exists(LEADER_KEY) == 0
    assert e.token() is None


def test_exception_in_leader_function_is_not_followed_by_another_term(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=0.5, acquire_interval=0.02)
    boom = Boom("leader failed")
    calls: list[redlease.Term] = []

    def fail(term: redlease.Term, fencer: redlease.Fencer) -> None:
        calls.append(term)
        raise boom

    e.start(fail)
    wait_until(lambda: calls, what="the leader function")
    wait_until(lambda: client.exists(LEADER_KEY) == 0, 2.0, what="the release")
    assert stays(lambda: len(calls) == 1 and client.exists(LEADER_KEY) == 0, 0.5, 0.02)
    with pytest.raises(Boom) as info:
        e.stop()
    assert info.value is boom


def test_stop_reraises_the_exception_of_a_started_run(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    boom = Boom("leader failed")

    def fail(term: redlease.Term, fencer: redlease.Fencer) -> None:
        raise boom

    e.start(fail)
    wait_until(lambda: client.get("svc:fence") is not None, what="an election")
    with pytest.raises(Boom) as info:
        e.stop(timeout=5.0)
    assert info.value is boom


def test_follower_takes_over_soon_after_the_leader_stops(client: redis.Redis, engine: str) -> None:
    ttl = 4.0
    leader = make_elector(client, engine, ttl=ttl, instance_id="leader")
    follower = make_elector(client, engine, ttl=ttl, acquire_interval=0.1, instance_id="follower")
    leader.start(None)
    first = wait_until(leader.token)
    with follower:
        time.sleep(0.3)
        assert follower.token() is None
        stopped = time.monotonic()
        leader.stop()
        second = wait_until(follower.token, timeout=ttl)
        took = time.monotonic() - stopped
        assert second > first
        # The release deletes the key, so the follower need not wait out the TTL.
        assert took < ttl / 2, f"takeover took {took:.2f} s"


def test_follower_takes_over_when_a_crashed_leaders_lease_expires(
    client: redis.Redis, engine: str
) -> None:
    client.set(LEADER_KEY, "crashed-leader", px=600)
    e = make_elector(client, engine, ttl=2.0, acquire_interval=1.0)
    started = time.monotonic()
    with e:
        wait_until(e.token, timeout=3.0)
        took = time.monotonic() - started
    assert took < 1.5, f"took {took:.2f} s to take over an expired lock"


def test_run_waits_for_the_leader_function_before_releasing_or_recontending(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=3.0, acquire_interval=0.05)
    terms: list[redlease.Term] = []
    returned = threading.Event()
    slow_return = threading.Event()

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term)
        term.wait()
        if len(terms) == 1:
            slow_return.wait(5.0)  # keeps working a while after the term ended
            returned.set()

    with e.start(lead):
        wait_until(lambda: terms, what="the first term")
        e.resign()
        assert terms[0].wait(5.0)
        assert terms[0].reason == "resigned"
        assert e.token() is None
        # fn has not returned: no release, no new term yet.
        assert stays(
            lambda: len(terms) == 1 and client.get(LEADER_KEY) == e.instance_id.encode(), 0.4
        )
        slow_return.set()
        wait_until(lambda: len(terms) == 2, what="the next term after fn returned")
        assert returned.is_set()
        assert terms[1].token > terms[0].token


def test_stop_called_by_the_leader_function_ends_the_run_without_deadlock(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    outcome: list[str] = []
    came_back = threading.Event()

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        # The run cannot finish before fn returns, so stop() here must not wait for it:
        # it may signal and return, or refuse with RuntimeError, but never hang.
        try:
            e.stop()
            outcome.append("returned")
        except RuntimeError:
            outcome.append("refused")
        finally:
            came_back.set()

    e.start(lead)
    assert came_back.wait(3.0), "stop() called inside the leader function never returned"
    assert outcome in (["returned"], ["refused"])
    e.stop(timeout=3.0)
    assert e.token() is None
    assert client.exists(LEADER_KEY) == 0


def test_a_leader_function_that_is_not_callable_is_a_type_error(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    with pytest.raises(TypeError, match="callable"):
        e.run("not a function", stop=threading.Event())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        e.start(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"threading\.Event"):
        e.run(None, stop=True)  # type: ignore[arg-type]
    assert client.exists(LEADER_KEY) == 0, "bad input must not touch Redis"
    with e:  # and the elector still works
        assert wait_until(e.token, timeout=5)


def test_a_resp3_client_is_served_by_the_native_engine(redis_server: RedisServer) -> None:
    require_native()
    resp3 = redis_server.client(protocol=3)
    e = redlease.Elector(resp3, "resp3", ttl=0.5, engine="native")
    with e:
        token = wait_until(e.token, timeout=5)
        assert e.fence_set(token, "resp3:value", "v") is True
        assert e.fence_set(token - 1, "resp3:value", "stale") is False
    assert resp3.get("resp3:value") == b"v"


def test_a_stopped_contender_is_let_go_before_the_step_it_was_scheduled_for(
    client: redis.Redis, engine: str
) -> None:
    """Stopping a run the driver had scheduled far ahead (a contender's next acquire)
    leaves the driver no reference to it: dropped, the elector (its run, and with them
    what only it holds) is collected now, not once that time has passed."""
    holder = redlease.Elector(client, "held-far", ttl=30, engine=engine)
    holder.start(None)
    try:
        wait_until(holder.token, timeout=10, what="the holder leads")
        followed = threading.Event()
        waiting = redlease.Elector(
            client,
            "held-far",
            ttl=30,
            acquire_interval=25,
            engine=engine,
            observer=redlease.Observer(on_follower=followed.set),
        )
        waiting.start(None)
        assert followed.wait(10), "the contender's first acquire found the lease held"
        waiting.stop(10)
        gone = weakref.ref(waiting._core)
        del waiting
        gc.collect()
        assert gone() is None, gc.get_referrers(gone())
    finally:
        holder.stop(10)
