"""Bad input meets a clear, specific error, at once, naming what was wrong.

* Anything that is no redis-py or valkey-py client (a URL, a dict of
  settings, an int) is a ``ConfigError`` naming its type, for a URL with the
  line that makes a client; a client of the wrong kind for the face (threaded
  or asyncio) names the face to use. One check, ``family.check_client``,
  every face shares.
* A lease TTL is at most ``MAX_TTL``: a lease that long is really kept, on
  both engines and at the server, and one millisecond more is refused.
* A call with an unknown keyword names the public class, never the shared
  base that writes the signature once.
* A ``HealthServer`` on a busy port says which host and port, and what to do.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

import redlease
import redlease.aio
from helpers import wait_until
from redlease._config import MAX_TTL_MS
from redlease._engine.rules.timing import MAX_TTL
from redlease._testing import RedisServer
from redlease.health import HealthServer

ONE_MS_MORE = MAX_TTL + 0.001
SLACK_MS = 60_000  # how much of the lease a slow test may have used up before it looks


def _leader_gate(client: Any) -> Any:
    pytest.importorskip("apscheduler")
    from apscheduler.schedulers.background import BackgroundScheduler

    from redlease.integrations.apscheduler import LeaderGate

    return LeaderGate(BackgroundScheduler(), client, "gated")


THREADED_FACES: dict[str, Callable[[Any], Any]] = {
    "Elector": lambda c: redlease.Elector(c, "name"),
    "RedisLocker": lambda c: redlease.RedisLocker(c),
    "Partitions": lambda c: redlease.Partitions(c, "group", 4),
    "evict": lambda c: redlease.evict(c, "name"),
    "LeaderGate": _leader_gate,
}

ASYNCIO_FACES: dict[str, Callable[[Any], Any]] = {
    "aio.Elector": lambda c: redlease.aio.Elector(c, "name"),
    "aio.RedisLocker": lambda c: redlease.aio.RedisLocker(c),
    "aio.Partitions": lambda c: redlease.aio.Partitions(c, "group", 4),
}

ALL_FACES = {**THREADED_FACES, **ASYNCIO_FACES}


@pytest.fixture
def aio_client(redis_server: RedisServer, family: str) -> Iterator[Any]:
    """An asyncio client of ``family`` for ``redis_server`` (never connected here)."""
    c = redis_server.client(family=family, asyncio=True)
    yield c
    asyncio.run(c.aclose())


# -- the client ---------------------------------------------------------------------------


@pytest.mark.parametrize("face", ALL_FACES)
def test_a_url_is_refused_with_the_line_that_makes_a_client(face: str) -> None:
    url = "redis://localhost:6379/0"
    with pytest.raises(redlease.ConfigError) as raised:
        ALL_FACES[face](url)
    said = str(raised.value)
    assert f"got the str {url!r}" in said
    maker = "redis.asyncio.Redis" if face.startswith("aio.") else "redis.Redis"
    assert f"{maker}.from_url({url!r})" in said
    assert not isinstance(raised.value, AttributeError)


@pytest.mark.parametrize("face", ["Elector", "aio.Elector"])
def test_a_url_s_password_is_never_shown(face: str) -> None:
    with pytest.raises(redlease.ConfigError) as raised:
        ALL_FACES[face]("redis://app:hunter2@cache.internal:6379/0")
    said = str(raised.value)
    assert "hunter2" not in said
    assert "from_url('redis://app:***@cache.internal:6379/0')" in said


def test_a_valkey_url_gets_valkey_s_line() -> None:
    with pytest.raises(redlease.ConfigError, match=r"valkey\.Valkey\.from_url\('valkey://h'\)"):
        redlease.Elector("valkey://h", "name")


@pytest.mark.parametrize("face", ALL_FACES)
@pytest.mark.parametrize(
    ("value", "said"),
    [({"host": "localhost"}, "got a dict"), (6379, "got int 6379"), (None, "got None")],
    ids=["dict", "int", "None"],
)
def test_what_is_no_client_is_refused_naming_its_type(face: str, value: Any, said: str) -> None:
    with pytest.raises(redlease.ConfigError) as raised:
        ALL_FACES[face](value)
    assert said in str(raised.value)
    assert "must be a redis client" in str(raised.value) or "must be an asyncio redis client" in (
        str(raised.value)
    )


@pytest.mark.parametrize("face", ASYNCIO_FACES)
def test_a_threaded_client_on_an_asyncio_face_names_the_threaded_faces(
    client: redis.Redis, face: str
) -> None:
    with pytest.raises(redlease.ConfigError, match=r"redlease\.aio needs an asyncio client") as r:
        ASYNCIO_FACES[face](client)
    assert "redlease.Elector" in str(r.value)


@pytest.mark.parametrize("face", [f for f in THREADED_FACES if f != "evict"])
def test_an_asyncio_client_on_a_threaded_face_names_the_asyncio_faces(
    aio_client: Any, face: str
) -> None:
    with pytest.raises(redlease.ConfigError, match=r"use redlease\.aio") as raised:
        THREADED_FACES[face](aio_client)
    assert "aio.RedisLocker" in str(raised.value)


# -- the TTL bound ------------------------------------------------------------------------


def test_max_ttl_is_within_what_every_engine_and_the_server_take() -> None:
    assert round(MAX_TTL * 1000) == MAX_TTL_MS
    assert MAX_TTL_MS <= 2**31 - 1  # the waits' 32-bit milliseconds
    assert MAX_TTL_MS < 2**53  # the scripts' doubles are exact


@pytest.mark.parametrize(
    "ttl", [ONE_MS_MORE, 1e9, 1e12, timedelta(days=12)], ids=["max+1ms", "1e9", "1e12", "12d"]
)
def test_an_elector_ttl_past_the_bound_is_refused_saying_it(client: redis.Redis, ttl: Any) -> None:
    with pytest.raises(redlease.ConfigError, match=r"ttl must be at most 1000000 s \(about 11\.6"):
        redlease.Elector(client, "name", ttl=ttl)
    with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):
        redlease.Partitions(client, "group", 2, ttl=ttl)


def test_the_message_says_the_value_got(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match=r"got 1000000000000\.0 s"):
        redlease.Elector(client, "name", ttl=1e12)
    with pytest.raises(redlease.ConfigError, match=r"got 1000000\.001 s"):
        redlease.RedisLocker(client).try_acquire("job", ttl=ONE_MS_MORE)


def test_an_elector_of_max_ttl_leads_and_its_lease_has_that_ttl(
    client: redis.Redis, engine: str
) -> None:
    elector = redlease.Elector(client, "long", ttl=MAX_TTL, engine=engine)
    assert elector.config.ttl == MAX_TTL
    with elector.start():
        wait_until(elector.is_leader, 10.0, what="the elector leads")
        pttl = client.pttl("long:leader")
        assert MAX_TTL_MS - SLACK_MS < pttl <= MAX_TTL_MS
        assert elector.is_leader()  # the renewals (every ttl/3) keep it: nothing refused it


@pytest.mark.parametrize("auto_renew", [False, True], ids=["plain", "auto_renew"])
def test_a_lock_of_max_ttl_is_held_with_that_ttl_and_one_ms_more_is_refused(
    client: redis.Redis, engine: str, auto_renew: bool
) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    try:
        held = locker.try_acquire("job", ttl=MAX_TTL, auto_renew=auto_renew)
        try:
            assert held.ttl == MAX_TTL
            holder = locker.holder("job")
            assert holder is not None
            assert MAX_TTL_MS - SLACK_MS < holder.ttl_ms <= MAX_TTL_MS
        finally:
            held.release()
        for take in (locker.try_acquire, locker.acquire):
            with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):
                take("job", ttl=ONE_MS_MORE, auto_renew=auto_renew)
        with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):  # noqa: SIM117
            with locker.hold("job", ttl=ONE_MS_MORE):
                pass
        assert locker.holder("job") is None  # nothing was sent
    finally:
        locker.close()


def test_a_semaphore_permit_of_max_ttl_has_that_ttl(client: redis.Redis, engine: str) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    try:
        sem = locker.semaphore("pool", 2)
        permit = sem.try_acquire(ttl=MAX_TTL, auto_renew=True)
        try:
            (holder,) = sem.holders()
            assert MAX_TTL_MS - SLACK_MS < holder.ttl_ms <= MAX_TTL_MS
        finally:
            permit.release()
        with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):
            sem.try_acquire(ttl=1e12)
    finally:
        locker.close()


def test_a_partition_group_of_max_ttl_holds_its_partition_with_that_ttl(
    client: redis.Redis, engine: str
) -> None:
    member = redlease.Partitions(client, "group", 1, ttl=MAX_TTL, engine=engine)
    with member.start():
        wait_until(lambda: "0" in member.owned(), 10.0, what="the member owns its partition")
        pttl = client.pttl("group:p:0:leader")
        assert MAX_TTL_MS - SLACK_MS < pttl <= MAX_TTL_MS


def test_the_asyncio_faces_share_the_bound(aio_client: Any, engine: str) -> None:
    with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):
        redlease.aio.Elector(aio_client, "name", ttl=ONE_MS_MORE, engine=engine)

    async def take() -> None:
        locker = redlease.aio.RedisLocker(aio_client, engine=engine)
        try:
            held = await locker.try_acquire("job", ttl=MAX_TTL)
            assert held.ttl == MAX_TTL
            await held.release()
            with pytest.raises(redlease.ConfigError, match="ttl must be at most 1000000 s"):
                await locker.try_acquire("job", ttl=ONE_MS_MORE)
        finally:
            await locker.close()

    asyncio.run(take())


# -- unknown keywords ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("face", "make"),
    [
        ("Elector", lambda c, a: redlease.Elector(c, "n", bogus=1)),
        ("aio.Elector", lambda c, a: redlease.aio.Elector(a, "n", bogus=1)),
        ("Partitions", lambda c, a: redlease.Partitions(c, "g", 2, bogus=1)),
        ("aio.Partitions", lambda c, a: redlease.aio.Partitions(a, "g", 2, bogus=1)),
        ("RedisLocker", lambda c, a: redlease.RedisLocker(c, bogus=1)),
        ("aio.RedisLocker", lambda c, a: redlease.aio.RedisLocker(a, bogus=1)),
        ("aio.MemoryLocker", lambda c, a: redlease.aio.MemoryLocker(bogus=1)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_an_unknown_keyword_names_the_public_class(
    client: redis.Redis, aio_client: Any, face: str, make: Callable[[Any, Any], Any]
) -> None:
    with pytest.raises(TypeError) as raised:
        make(client, aio_client)
    assert str(raised.value) == f"{face}.__init__() got an unexpected keyword argument 'bogus'"


def test_a_missing_argument_names_the_public_class(client: redis.Redis) -> None:
    with pytest.raises(TypeError, match=r"^Elector\.__init__\(\) missing 1 required"):
        redlease.Elector(client)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^aio\.Partitions\.__init__\(\) missing 1 required"):
        redlease.aio.Partitions(client, "g")  # type: ignore[call-arg]


def test_a_lock_method_s_unknown_keyword_names_the_class_it_was_called_on(
    client: redis.Redis, aio_client: Any, engine: str
) -> None:
    locker = redlease.RedisLocker(client, engine=engine)
    try:
        with pytest.raises(TypeError, match=r"^RedisLocker\.try_acquire\(\) got an unexpected"):
            locker.try_acquire("job", bogus=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^Semaphore\.acquire\(\) got an unexpected"):
            locker.semaphore("pool", 2).acquire(bogus=1)  # type: ignore[call-arg]
    finally:
        locker.close()

    async def wrong() -> None:
        alocker = redlease.aio.RedisLocker(aio_client, engine=engine)
        try:
            with pytest.raises(TypeError, match=r"^aio\.RedisLocker\.acquire\(\) got an unexp"):
                await alocker.acquire("job", bogus=1)  # type: ignore[call-arg]
            with pytest.raises(TypeError, match=r"^aio\.Semaphore\.try_acquire\(\) got an un"):
                await alocker.semaphore("pool", 2).try_acquire(bogus=1)  # type: ignore[call-arg]
        finally:
            await alocker.close()

    asyncio.run(wrong())


def test_the_signatures_are_still_the_faces_own() -> None:
    import inspect

    for face in (redlease.Elector, redlease.aio.Elector):
        assert "min_replicas" in inspect.signature(face).parameters
    assert list(inspect.signature(redlease.aio.Partitions).parameters)[:3] == [
        "client",
        "name",
        "partitions",
    ]


# -- the health server's port -------------------------------------------------------------


def test_a_busy_port_says_which_host_and_port_and_what_to_do(client: redis.Redis) -> None:
    busy = socket.socket()
    busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        server = HealthServer([redlease.Elector(client, "name")], host="127.0.0.1", port=port)
        with pytest.raises(OSError) as raised:
            server.start()
        assert raised.value.errno == errno.EADDRINUSE
        assert str(raised.value) == (
            f"[Errno {errno.EADDRINUSE}] port {port} on 127.0.0.1 is in use: "
            "pick another port, or port=0 for a free one"
        )
        assert isinstance(raised.value.__cause__, OSError)  # the bind's own error, chained
        with pytest.raises(RuntimeError, match="not started"):
            _ = server.port  # nothing was left half started
    finally:
        busy.close()
