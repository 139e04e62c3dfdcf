"""redlease.health: /livez and /readyz over HTTP, and status(), on both engines.

Real electors on a real redis-server, asked over real HTTP: the codes and
JSON bodies of a leader and a follower, leader-only readiness, a run that
ended (stopped, never started, ended by its leader function), a leader whose
renewals stalled past its ttl, the age of the last renewal, any other path,
and an ``aio.Elector``'s answers (an ended asyncio run included).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

import redlease
import redlease.aio
from helpers import wait_until
from redlease._testing import RedisServer
from redlease.health import HealthServer, status

NAME = "health"
KEYS = {"name", "leader", "token", "engine", "last_renewal_ms_ago"}


def get(server: HealthServer, path: str) -> tuple[int, dict[str, Any]]:
    """``GET path`` from ``server``: the status code and the JSON body."""
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client(socket_timeout=5)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def electors(store: redis.Redis, engine: str) -> Iterator[list[redlease.Elector]]:
    """Make electors with ``electors.append(...)``-style helpers; every one is stopped after."""
    made: list[redlease.Elector] = []
    yield made
    for elector in made:
        elector.stop()


def elector(
    made: list[redlease.Elector], store: redis.Redis, engine: str, **kwargs: Any
) -> redlease.Elector:
    kwargs.setdefault("ttl", 2.0)
    e = redlease.Elector(store, kwargs.pop("name", NAME), engine=engine, **kwargs)
    made.append(e)
    return e


def test_a_leader_is_live_and_ready_with_its_token_and_last_renewal(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine).start()
    token = wait_until(e.token, 10, what="election")
    with HealthServer([e]) as server:
        for path in ("/livez", "/readyz"):
            code, body = get(server, path)
            assert code == 200 and body["ok"] is True
            (answer,) = body["electors"]
            assert set(answer) == KEYS
            assert answer["name"] == NAME and answer["leader"] is True
            assert answer["token"] == token and answer["engine"] == engine
            # Renewed every ttl/3 (667 ms): Redis saw a renewal well within the ttl.
            assert 0 <= answer["last_renewal_ms_ago"] < 2000


def test_a_follower_is_live_and_ready_unless_readiness_is_leader_only(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    leader = elector(electors, store, engine).start()
    wait_until(leader.token, 10, what="election")
    follower = elector(electors, store, engine).start()
    always = HealthServer([follower])
    leader_only = HealthServer([follower], ready="leader")
    with always, leader_only:
        code, body = get(always, "/livez")
        assert code == 200 and body["ok"] is True
        assert body["electors"] == [
            {
                "name": NAME,
                "leader": False,
                "token": None,
                "engine": engine,
                "last_renewal_ms_ago": None,
            }
        ]
        assert get(always, "/readyz") == (code, body)
        assert get(leader_only, "/livez") == (code, body)
        code, body = get(leader_only, "/readyz")
        assert code == 503 and body["ok"] is False
        assert body["electors"][0]["reason"] == 'not the leader (readiness is ready="leader")'
    with HealthServer([leader], ready="leader") as of_the_leader:
        assert get(of_the_leader, "/readyz")[0] == 200


def test_leader_only_readiness_needs_every_elector_to_lead(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    a = elector(electors, store, engine, name="a").start()
    b = elector(electors, store, engine, name="b").start()
    wait_until(lambda: a.token() and b.token(), 10, what="both elections")
    b_elsewhere = elector(electors, store, engine, name="b")
    with HealthServer([a, b], ready="leader") as both:
        assert get(both, "/readyz")[0] == 200
    b.stop()
    b_elsewhere.start()
    wait_until(b_elsewhere.token, 10, what="the other b to lead")
    b.start()  # b follows now
    wait_until(lambda: status(b)["leader"] is False and "reason" not in status(b), 10)
    with HealthServer([a, b], ready="leader") as one:
        code, body = get(one, "/readyz")
        assert code == 503
        assert ["reason" in answer for answer in body["electors"]] == [False, True]
        assert get(one, "/livez")[0] == 200


def test_a_stopped_run_is_not_live(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine).start()
    wait_until(e.token, 10, what="election")
    with HealthServer([e]) as server:
        assert get(server, "/livez")[0] == 200
        e.stop()
        for path in ("/livez", "/readyz"):
            code, body = get(server, path)
            assert code == 503 and body["ok"] is False
            (answer,) = body["electors"]
            assert answer["leader"] is False and answer["token"] is None
            assert answer["reason"] == "its run has ended (or was never started)"


def test_an_elector_never_started_is_not_live(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine)
    assert status(e)["reason"] == "its run has ended (or was never started)"
    with HealthServer([e]) as server:
        assert get(server, "/livez")[0] == 503


def test_a_run_its_leader_function_ended_is_not_live(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        raise ValueError("the leader function gave up")

    e = elector(electors, store, engine)
    e.start(lead)
    wait_until(lambda: "reason" in status(e), 10, what="the run to end")
    with HealthServer([e]) as server:
        assert get(server, "/livez")[0] == 503
    with pytest.raises(ValueError, match="gave up"):
        e.stop()


def test_status_probes_change_nothing_and_a_live_follower_keeps_running(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    follower = elector(electors, store, engine)
    assert "reason" in status(follower)
    assert "reason" in status(follower)  # still never started: asking started nothing
    assert store.keys("*") == []
    follower.start()
    wait_until(follower.token, 10, what="election")
    assert "reason" not in status(follower)


def test_a_leader_whose_renewals_stalled_past_its_ttl_is_not_live(
    store: redis.Redis,
    engine: str,
    electors: list[redlease.Elector],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A keeper that stopped confirming the lease but never ended the term (a wedged run):
    # seen by the clock alone, as the lease was last confirmed more than a ttl ago.
    e = elector(electors, store, engine, ttl=2.0).start()
    token = wait_until(e.token, 15, what="election")
    live = status(e)
    assert "reason" not in live and live["last_renewal_ms_ago"] < 2000
    core = type(e._core)
    real = core.health
    monkeypatch.setattr(core, "health", lambda self: (True, token, 2.5))
    answer = status(e)
    assert answer["leader"] is True and answer["token"] == token
    assert answer["last_renewal_ms_ago"] == 2500
    assert answer["reason"] == (
        f"leads with token {token} but its lease was last confirmed 2.500 s ago, past its ttl "
        "(2.0 s): its renewals stalled and it has not stepped down"
    )
    with HealthServer([e]) as server:
        code, body = get(server, "/livez")
        assert code == 503 and not body["ok"]
        monkeypatch.setattr(core, "health", real)
        code, body = get(server, "/livez")
        assert code == 200 and body["ok"]


def test_the_last_renewal_follows_the_renewals(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    # ttl 3 s, renewed every second: the age stays under a renew interval and a margin, and
    # goes back down at each renewal (a clock that only grew would read a stuck renewer).
    e = elector(electors, store, engine, ttl=3.0, renew_interval=1.0).start()
    wait_until(e.token, 15, what="election")
    ages = []
    for _ in range(12):
        ages.append(status(e)["last_renewal_ms_ago"])
        threading.Event().wait(0.25)
    assert all(0 <= age < 2500 for age in ages), ages
    assert any(later < earlier for earlier, later in itertools.pairwise(ages)), ages


def test_any_other_path_is_404(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine).start()
    with HealthServer([e]) as server:
        for path in ("/", "/healthz", "/livez/x", "/metrics"):
            code, body = get(server, path)
            assert code == 404 and body["ok"] is False
        assert get(server, "/livez?verbose=1")[0] in (200, 503)  # a query string is fine


def test_an_aio_elector_is_reported_like_a_threaded_one(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = redis_server.client(asyncio=True, socket_timeout=5)
        leader = redlease.aio.Elector(client, NAME, ttl=2.0, engine=engine)
        follower = redlease.aio.Elector(client, NAME, ttl=2.0, engine=engine)
        async with leader:
            while leader.token() is None:
                await asyncio.sleep(0.01)
            async with follower:
                await asyncio.sleep(0.1)
                on_loop = status(leader)  # asked from the event loop's own thread
                assert on_loop["leader"] is True and on_loop["token"] == leader.token()
                assert 0 <= on_loop["last_renewal_ms_ago"] < 2000
                server = HealthServer([leader, follower], ready="leader").start()
                try:
                    code, body = await asyncio.to_thread(get, server, "/livez")
                    assert code == 200
                    assert [a["leader"] for a in body["electors"]] == [True, False]
                    assert all(a["engine"] == engine for a in body["electors"])
                    code, body = await asyncio.to_thread(get, server, "/readyz")
                    assert code == 503 and "reason" in body["electors"][1]
                finally:
                    await asyncio.to_thread(server.stop)
        # Both runs ended: each is reported so, as a threaded elector's would be.
        ended = status(follower)
        assert ended["leader"] is False
        assert ended["reason"] == "its run has ended (or was never started)"
        await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_server_starts_stops_and_refuses_bad_settings(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine)
    server = HealthServer([e])
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    with server:
        port = server.port
        assert port > 0
        with pytest.raises(RuntimeError, match="already started"):
            server.start()
    server.stop()  # twice: nothing to do
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5)
    bad: list[tuple[dict[str, Any], str]] = [
        ({"electors": []}, "at least one elector"),
        ({"electors": e}, "must be a sequence"),
        ({"electors": [e, "x"]}, "got str"),
        ({"electors": [e], "ready": "sometimes"}, "ready must be one of always, leader"),
        ({"electors": [e], "port": 70000}, "port must be an int from 0 to 65535"),
        ({"electors": [e], "port": True}, "port must be an int"),
        ({"electors": [e], "host": ""}, "host must be a non-empty str"),
    ]
    for kwargs, message in bad:
        with pytest.raises(redlease.ConfigError, match=message):
            HealthServer(**kwargs)
    with pytest.raises(redlease.ConfigError, match="got object"):
        status(object())  # type: ignore[arg-type]


def test_requests_are_answered_concurrently(
    store: redis.Redis, engine: str, electors: list[redlease.Elector]
) -> None:
    e = elector(electors, store, engine).start()
    wait_until(e.token, 10, what="election")
    with HealthServer([e]) as server:
        codes: list[int] = []
        threads = [
            threading.Thread(target=lambda: codes.append(get(server, "/livez")[0]))
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert codes == [200] * 8
