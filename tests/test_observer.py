"""Observer callbacks: order, counts, and callbacks that raise."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
import redis

import redlease
from helpers import LEADER_KEY, Events, RunThread, Terms, make_elector, stays, wait_until


def test_follower_is_reported_once_however_many_attempts_lose(
    client: redis.Redis, engine: str
) -> None:
    client.set(LEADER_KEY, "someone-else", px=60_000)
    events = Events()
    e = make_elector(client, engine, ttl=1.0, acquire_interval=0.02, observer=events.observer())
    with e:
        wait_until(lambda: events.count("follower"), what="on_follower")
        time.sleep(0.4)  # about 20 more lost attempts
    assert events.kinds() == ["follower"]


def test_callbacks_follow_the_leadership_lifecycle_in_order(
    client: redis.Redis, engine: str
) -> None:
    rival = make_elector(client, engine, instance_id="rival")
    rival.start(None)
    wait_until(rival.token)

    events = Events()
    lock = threading.Lock()
    terms: list[redlease.Term] = []

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        with lock:
            terms.append(term)
        events.record("fn_start", term.token)
        term.wait()
        time.sleep(0.05)  # on_stepped_down must still wait for this return
        events.record("fn_end", term.token)

    e = make_elector(
        client, engine, ttl=1.0, acquire_interval=0.05, observer=events.observer()
    )
    with e.start(lead):
        wait_until(lambda: events.count("follower"), what="on_follower")
        rival.stop()
        term = wait_until(lambda: terms and terms[0], what="the election")
        # The lock is stolen: the term is lost, and the next attempt finds a holder.
        client.set(LEADER_KEY, "thief", px=60_000)
        assert term.wait(5.0)
        wait_until(lambda: events.count("follower") == 2, what="on_follower after the term")
    token = term.token
    assert events.kinds() == [
        "follower",
        "elected",
        "fn_start",
        "fn_end",
        "stepped_down",
        "follower",
    ]
    assert events.values("elected") == [token]
    assert events.values("fn_start") == [token]


def test_each_term_reports_elected_with_its_token_and_then_stepped_down(
    client: redis.Redis, engine: str
) -> None:
    events = Events()
    e = make_elector(client, engine, acquire_interval=0.05, observer=events.observer())
    terms = Terms(returns_after=2)
    with e.start(terms):
        terms.wait_for(3)
    assert events.kinds() == ["elected", "stepped_down"] * 3
    assert events.values("elected") == [t.token for t in terms.terms]


def test_stopping_the_run_reports_stepped_down(client: redis.Redis, engine: str) -> None:
    events = Events()
    e = make_elector(client, engine, observer=events.observer())
    with e:
        wait_until(e.token)
    assert events.kinds() == ["elected", "stepped_down"]


def test_raising_callback_goes_to_on_error_and_the_elector_keeps_leading(
    client: redis.Redis, engine: str
) -> None:
    events = Events()
    broken = RuntimeError("on_elected is broken")

    def on_elected(token: int) -> None:
        raise broken

    e = make_elector(client, engine, observer=events.observer(on_elected=on_elected))
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        wait_until(lambda: events.count("error"), what="on_error")
        assert events.values("error") == [broken]
        assert stays(lambda: not term.ended() and e.token() == term.token, 0.3)


def test_raising_follower_callback_does_not_stop_contending(
    client: redis.Redis, engine: str
) -> None:
    client.set(LEADER_KEY, "someone-else", px=300)
    events = Events()

    def on_follower() -> None:
        raise RuntimeError("on_follower is broken")

    e = make_elector(
        client, engine, ttl=1.0, acquire_interval=0.05,
        observer=events.observer(on_follower=on_follower),
    )
    with e:
        wait_until(e.token, timeout=3.0)
    errors = events.values("error")
    assert len(errors) == 1
    assert str(errors[0]) == "on_follower is broken"


def test_raising_on_error_goes_to_the_unraisable_hook(
    client: redis.Redis, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)

    def on_elected(token: int) -> None:
        raise RuntimeError("on_elected is broken")

    def on_error(exc: Exception) -> None:
        raise ValueError("on_error is broken too")

    observer = redlease.Observer(on_elected=on_elected, on_error=on_error)
    e = make_elector(client, engine, observer=observer)
    with e:
        wait_until(e.token)
        wait_until(lambda: unraisable, what="sys.unraisablehook")
        assert isinstance(unraisable[0].exc_value, ValueError)
        assert e.is_leader()


def test_on_error_receives_connection_errors_of_acquire(engine: str, closed_port: Any) -> None:
    events = Events()
    client = redis.Redis(
        host="127.0.0.1", port=closed_port.port, socket_timeout=1, socket_connect_timeout=1
    )
    e = make_elector(client, engine, ttl=0.5, observer=events.observer())
    with e:
        wait_until(lambda: events.count("error") >= 2, what="two acquire errors")
        assert e.token() is None
    errors = events.values("error")
    assert all(isinstance(exc, redis.exceptions.ConnectionError) for exc in errors), errors
    assert "elected" not in events.kinds()


def test_stepped_down_fires_after_the_token_is_cleared_and_the_lock_released(
    redis_server: Any, engine: str
) -> None:
    probe = redis_server.client(socket_timeout=2)
    seen: list[tuple[int | None, int]] = []
    holder: list[redlease.Elector] = []

    def on_stepped_down() -> None:
        seen.append((holder[0].token(), probe.exists(LEADER_KEY)))

    e = make_elector(
        redis_server.client(socket_timeout=2), engine,
        observer=redlease.Observer(on_stepped_down=on_stepped_down),
    )
    holder.append(e)
    with e:
        wait_until(e.token)
    assert seen == [(None, 0)]


def test_renewal_errors_reach_on_error_while_the_server_is_frozen(
    redis_server: Any, engine: str
) -> None:
    events = Events()
    e = make_elector(
        redis_server.client(socket_timeout=2), engine, ttl=1.0, observer=events.observer()
    )
    terms = Terms()
    with e.start(terms):
        term = terms.wait_for(1)
        redis_server.pause()
        try:
            assert term.wait(3.0)
        finally:
            redis_server.resume()
    errors = events.values("error")
    assert errors, "no renewal error was reported"
    assert all(
        isinstance(exc, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError))
        for exc in errors
    ), errors
    kinds = events.kinds()
    assert kinds[:2] == ["elected", "stepped_down"]


def test_callbacks_run_on_the_run_thread(client: redis.Redis, engine: str) -> None:
    idents: dict[str, int] = {}

    def note(kind: str) -> Any:
        return lambda *_: idents.setdefault(kind, threading.get_ident())

    observer = redlease.Observer(on_elected=note("elected"), on_stepped_down=note("stepped_down"))
    e = make_elector(client, engine, observer=observer)
    runner = RunThread(e, Terms(returns_after=1))
    wait_until(lambda: "stepped_down" in idents, what="a finished term")
    runner.stop()
    assert not runner.alive
    assert idents["elected"] == idents["stepped_down"] == runner.ident
