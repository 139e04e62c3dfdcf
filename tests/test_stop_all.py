"""``redlease.stop_all``: many runs stopped as ``stop()`` would, their releases batched."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
import redis

import redlease
from helpers import elected_token, wait_until, watch_release_batches
from redlease._engine.process.driver import BATCH
from redlease._testing import RedisServer

pytestmark = pytest.mark.usefixtures("engines_closed")


class Recorder(redlease.Observer):
    """Counts step-downs and keeps every error it is told of."""

    def __init__(self) -> None:
        self.stepped_down = 0
        self.errors: list[Exception] = []
        self.lock = threading.Lock()

    def on_stepped_down(self) -> None:
        with self.lock:
            self.stepped_down += 1

    def on_error(self, err: Exception) -> None:
        with self.lock:
            self.errors.append(err)


def _all_lead(group: list[redlease.Elector]) -> list[int]:
    return [wait_until(e.token, timeout=20, what=f"{e.config.name} leads") for e in group]


def test_stop_all_releases_every_lease_in_shared_round_trips(
    client: redis.Redis, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = BATCH + 88  # two batches: a full one and the rest
    observer = Recorder()
    group = [
        redlease.Elector(client, f"many{i}", ttl=30, engine=engine, observer=observer)
        for i in range(count)
    ]
    for e in group:
        e.start(None)
    tokens = _all_lead(group)
    assert all(t >= 1 for t in tokens)
    sizes = watch_release_batches(monkeypatch)
    redlease.stop_all(group)
    assert sizes == [BATCH, count - BATCH], (
        f"the releases did not share round trips: batches {sizes}, errors {observer.errors[:3]}"
    )
    assert all(e.token() is None for e in group)
    assert client.exists(*[f"many{i}:leader" for i in range(count)]) == 0
    assert observer.stepped_down == count
    assert observer.errors == []
    # Each run is over: another stop (or a second stop_all) changes nothing.
    redlease.stop_all(group)
    group[0].stop()
    assert sizes == [BATCH, count - BATCH]


def test_stop_all_batches_the_releases_over_tls(
    make_tls_server: Any, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = make_tls_server()
    client = server.client()
    group = [redlease.Elector(client, f"tls{i}", ttl=30, engine=engine) for i in range(20)]
    for e in group:
        e.start(None)
    _all_lead(group)
    sizes = watch_release_batches(monkeypatch)
    redlease.stop_all(group)
    assert sizes == [20]
    assert client.exists(*[f"tls{i}:leader" for i in range(20)]) == 0
    client.close()


def test_a_lease_stop_all_releases_goes_at_once_to_a_waiting_contender(
    client: redis.Redis, engine: str
) -> None:
    leaders = [redlease.Elector(client, f"handover{i}", ttl=30, engine=engine) for i in range(3)]
    for e in leaders:
        e.start(None)
    tokens = _all_lead(leaders)
    waiting = [redlease.Elector(client, f"handover{i}", ttl=30, engine=engine) for i in range(3)]
    for w in waiting:
        w.start(None)
    try:
        time.sleep(0.2)
        assert all(w.token() is None for w in waiting)
        started = time.monotonic()
        redlease.stop_all(leaders)
        new = _all_lead(waiting)
        # Told by the release, not by a 30 s TTL running out.
        assert time.monotonic() - started < 10
        assert all(n > t for n, t in zip(new, tokens, strict=True))
    finally:
        redlease.stop_all(waiting)


def test_stop_all_releases_only_what_it_still_holds(client: redis.Redis, engine: str) -> None:
    """A lease taken over meanwhile is not deleted: the release is ownership-checked."""
    group = [redlease.Elector(client, f"owned{i}", ttl=5, engine=engine) for i in range(4)]
    for e in group:
        e.start(None)
    _all_lead(group)
    client.set("owned2:leader", "someone-else")
    redlease.stop_all(group)
    assert client.get("owned2:leader") == b"someone-else"
    assert client.exists("owned0:leader", "owned1:leader", "owned3:leader") == 0


def test_stop_all_ends_every_kind_of_run_and_raises_the_first_leader_error(
    client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    class Boom(Exception):
        pass

    def raises(which: str) -> Any:
        def fn(term: redlease.Term, fencer: redlease.Fencer) -> None:
            term.wait()
            raise Boom(which)

        return fn

    held = threading.Event()

    def holds(term: redlease.Term, fencer: redlease.Fencer) -> None:
        held.set()
        term.wait()

    driven = redlease.Elector(client, "kinds-driven", ttl=5, engine=engine)
    first = redlease.Elector(client, "kinds-first", ttl=5, engine=engine)
    second = redlease.Elector(client, "kinds-second", ttl=5, engine=engine)
    working = redlease.Elector(client, "kinds-fn", ttl=5, engine=engine)
    blocking = redlease.Elector(client, "kinds-run", ttl=5, engine=engine)
    idle = redlease.Elector(client, "kinds-idle", ttl=5, engine=engine)
    driven.start(None)
    first.start(raises("first"))
    second.start(raises("second"))
    working.start(holds)
    stop = threading.Event()
    runner = threading.Thread(target=blocking.run, args=(None,), kwargs={"stop": stop})
    runner.start()
    everyone = [driven, first, second, working, blocking]
    _all_lead(everyone)
    assert held.wait(5)
    with caplog.at_level(logging.ERROR, logger="redlease"), pytest.raises(Boom, match="first"):
        redlease.stop_all([idle, driven, first, second, working, blocking])
    assert any("also raised" in r.getMessage() for r in caplog.records)
    runner.join(5)
    assert not runner.is_alive()
    assert all(e.token() is None for e in everyone)
    assert client.exists(*[f"{e.config.name}:leader" for e in everyone]) == 0
    # Raised once: the elector whose error it was has nothing more to raise.
    first.stop()
    second.stop()


def test_stop_all_on_a_server_gone_reports_each_release_and_returns(engine: str) -> None:
    with RedisServer() as server:
        client = server.client(socket_timeout=1)
        observer = Recorder()
        group = [
            redlease.Elector(client, f"gone{i}", ttl=5, engine=engine, observer=observer)
            for i in range(5)
        ]
        for e in group:
            e.start(None)
        _all_lead(group)
        before = len(observer.errors)
        server.stop()
        started = time.monotonic()
        redlease.stop_all(group)
        assert time.monotonic() - started < 15
    assert all(e.token() is None for e in group)
    assert observer.stepped_down == 5
    assert len(observer.errors) > before, "the failed releases were not reported"


def test_stop_all_with_a_timeout_returns_while_a_leader_function_holds_on(
    client: redis.Redis, engine: str
) -> None:
    let_go = threading.Event()

    def stubborn(term: redlease.Term, fencer: redlease.Fencer) -> None:
        let_go.wait(30)

    slow = redlease.Elector(client, "timeout-slow", ttl=5, engine=engine)
    quick = redlease.Elector(client, "timeout-quick", ttl=5, engine=engine)
    slow.start(stubborn)
    quick.start(None)
    _all_lead([slow, quick])
    started = time.monotonic()
    redlease.stop_all([slow, quick], timeout=0.3)
    assert time.monotonic() - started < 5
    assert quick.token() is None
    assert not client.exists("timeout-quick:leader")
    let_go.set()
    slow.stop()
    assert not client.exists("timeout-slow:leader")


@pytest.mark.parametrize(
    ("given", "rule"),
    [
        ([object()], "stop_all takes redlease.Elector instances"),
        (["not an elector"], "got str 'not an elector'"),
    ],
)
def test_stop_all_refuses_what_is_not_an_elector(given: list[Any], rule: str) -> None:
    with pytest.raises(redlease.ConfigError, match=rule):
        redlease.stop_all(given)


@pytest.mark.parametrize("timeout", [-1, float("nan"), "1", True])
def test_stop_all_refuses_a_timeout_that_is_not_a_duration(
    client: redis.Redis, timeout: Any
) -> None:
    e = redlease.Elector(client, "bad-timeout", ttl=5)
    e.start(None)
    token = elected_token(e)
    with pytest.raises(redlease.ConfigError, match="stop_all timeout"):
        redlease.stop_all([e], timeout=timeout)
    # Nothing was stopped: the refusal came first.
    assert e.token() == token
    e.stop()
