"""Operators take a lease away: ``redlease.evict`` for an elector, ``force_release`` for a lock.

The holder is fenced out at once: its fenced writes are rejected from that
moment, its next renewal (or refresh) finds the lease gone, and the next
holder's token is greater than every earlier one. On both engines and both
client families, the asyncio faces, ``MemoryLocker``, a Sentinel set and a
Cluster; the command line prints who was evicted and the new mark.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis

import redlease
import redlease.aio
from helpers import wait_until
from redlease._testing import ClusterSet, RedisServer, SentinelSet

TTL = 1.0


class Steps:
    """A leader function that records how each term ended: ``(token, reason)``."""

    def __init__(self) -> None:
        self.ended: list[tuple[int, str | None]] = []
        self.event = threading.Event()

    def __call__(self, term: redlease.Term, _fencer: redlease.Fencer) -> None:
        term.wait()
        self.ended.append((term.token, term.reason))
        self.event.set()


@pytest.fixture
def leading(client: redis.Redis, engine: str) -> Iterator[tuple[redlease.Elector, Steps]]:
    steps = Steps()
    elector = redlease.Elector(client, "evicted", ttl=TTL, engine=engine)
    elector.start(steps)
    try:
        wait_until(elector.is_leader, 10.0, what="the elector leads")
        yield elector, steps
    finally:
        elector.stop(timeout=10.0)


# -- an elector ---------------------------------------------------------------------------


def test_evict_fences_the_leader_out_at_once_and_ends_its_term(
    client: redis.Redis, leading: tuple[redlease.Elector, Steps]
) -> None:
    elector, steps = leading
    token = elector.token()
    assert token is not None
    fencer = elector.fencer()
    assert fencer.set("evict:k", "before") is True

    mark = redlease.evict(client, "evicted")

    assert mark > token
    assert int(client.get("evicted:fence:applied")) == mark
    assert fencer.set("evict:k", "after") is False  # rejected from this moment
    assert client.get("evict:k") == b"before"
    assert steps.event.wait(TTL * 3), "the evicted leader's next renewal ends its term"
    assert steps.ended[0] == (token, "lost")
    # It contends again, and its new term's token is above the mark.
    wait_until(elector.is_leader, 10.0, what="a new term")
    new = elector.token()
    assert new is not None and new > mark
    assert elector.fencer().set("evict:k", "new term") is True


def test_evicting_a_name_nobody_holds_changes_nothing(client: redis.Redis, engine: str) -> None:
    assert redlease.evict(client, "nobody") == 0
    assert client.keys("nobody*") == []
    client.set("held-before:fence:applied", 41)
    client.set("held-before:fence", 41)
    assert redlease.evict(client, "held-before") == 41
    assert client.get("held-before:fence:applied") == b"41"


def test_evict_twice_raises_the_mark_once(
    client: redis.Redis, leading: tuple[redlease.Elector, Steps]
) -> None:
    _elector, steps = leading
    first = redlease.evict(client, "evicted")
    assert steps.event.wait(TTL * 3)
    # Before the run re-contends (or after, with its fresh term), the mark never goes back.
    second = redlease.evict(client, "evicted")
    assert second >= first


def test_evict_tells_the_contenders_at_once(client: redis.Redis, engine: str) -> None:
    # A follower with a long acquire interval takes over within the notice, not its poll.
    holder = redlease.Elector(client, "pushed", ttl=30.0, engine=engine)
    follower = redlease.Elector(client, "pushed", ttl=30.0, acquire_interval=10.0, engine=engine)
    holder.start()
    try:
        wait_until(holder.is_leader, 10.0, what="the first elector leads")
        follower.start()
        time.sleep(0.3)  # the follower has polled once and listens
        began = time.monotonic()
        redlease.evict(client, "pushed")
        wait_until(lambda: follower.is_leader() or holder.is_leader(), 5.0, what="a new leader")
        assert time.monotonic() - began < 5.0  # not the 10 s poll, nor the 30 s TTL
    finally:
        follower.stop(timeout=10.0)
        holder.stop(timeout=10.0)


def test_evict_checks_its_arguments(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match="client must be a redis client"):
        redlease.evict(None, "x")
    with pytest.raises(redlease.ConfigError, match="name must not be empty"):
        redlease.evict(client, "")
    with pytest.raises(redlease.ConfigError, match="name must be a str"):
        redlease.evict(client, 7)  # type: ignore[arg-type]


def test_evict_through_an_asyncio_client(redis_server: RedisServer, engine: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(port=redis_server.port)
        elector = redlease.aio.Elector(client, "aio-evicted", ttl=TTL, engine=engine)
        elector.start()
        try:
            for _ in range(1000):
                if elector.is_leader():
                    break
                await asyncio.sleep(0.01)
            token = elector.token()
            assert token is not None
            mark = await asyncio.get_running_loop().run_in_executor(
                None, redlease.evict, client, "aio-evicted"
            )
            assert mark > token
            assert await elector.fencer().set("aio:k", "v") is False
        finally:
            await elector.stop()
            await client.aclose()

    asyncio.run(main())


def test_evict_on_a_sentinel_set_goes_to_the_master(sentinel_set: SentinelSet, engine: str) -> None:
    client = sentinel_set.master_for(socket_timeout=2)
    elector = redlease.Elector(client, "sentinel-evicted", ttl=TTL, engine=engine)
    elector.start()
    try:
        wait_until(elector.is_leader, 10.0, what="the elector leads")
        token = elector.token()
        assert token is not None
        fencer = elector.fencer()
        mark = redlease.evict(client, "sentinel-evicted")
        assert mark > token
        assert (
            sentinel_set.master().client().get("sentinel-evicted:fence:applied")
            == str(mark).encode()
        )
        assert fencer.set("s:k", "v") is False
    finally:
        elector.stop(timeout=10.0)
        client.close()


def test_evict_on_a_cluster_needs_a_hash_tag_and_fences(
    cluster_set: ClusterSet, engine: str
) -> None:
    client = cluster_set.client(socket_timeout=2)
    try:
        with pytest.raises(redlease.ConfigError, match="hash tag"):
            redlease.evict(client, "untagged")
        elector = redlease.Elector(client, "{cl-evicted}", ttl=TTL, engine=engine)
        elector.start()
        try:
            wait_until(elector.is_leader, 10.0, what="the elector leads")
            token = elector.token()
            assert token is not None
            fencer = elector.fencer()
            assert redlease.evict(client, "{cl-evicted}") > token
            assert fencer.set("{cl-evicted}:k", "v") is False
        finally:
            elector.stop(timeout=10.0)
    finally:
        client.close()


# -- a lock -------------------------------------------------------------------------------


def test_force_release_takes_the_lock_and_fences_its_holder_out(
    client: redis.Redis, engine: str
) -> None:
    with redlease.RedisLocker(client, engine=engine, prefix="fr:") as locker:
        held = locker.acquire("job", ttl=30.0)
        assert locker.force_release("job") is True
        assert locker.holder("job") is None
        assert int(client.get("fr:fencing")) > held.fencing_token
        with pytest.raises(redlease.NotHeld):
            held.refresh()
        with pytest.raises(redlease.NotHeld):
            held.release()
        again = locker.acquire("job", ttl=30.0)
        assert again.fencing_token > held.fencing_token + 1  # past the counter's move
        again.release()
        assert locker.force_release("job") is False  # nobody holds it: nothing changes
        assert locker.force_release("never") is False


def test_force_release_ends_an_auto_renewed_lock_and_wakes_a_waiter(
    client: redis.Redis, engine: str
) -> None:
    with redlease.RedisLocker(client, engine=engine, prefix="frw:") as locker:
        held = locker.acquire("job", ttl=1.0, auto_renew=True)
        got: list[redlease.Lock] = []
        waiter = threading.Thread(
            target=lambda: got.append(
                locker.acquire("job", ttl=5.0, wait=20.0, retry_interval=10.0)
            )
        )
        waiter.start()
        time.sleep(0.3)
        assert locker.force_release("job") is True
        waiter.join(5.0)  # woken by the notice, not its 10 s poll
        assert got and got[0].fencing_token > held.fencing_token
        assert held.done.wait(5.0), "the watchdog finds the lease lost"
        got[0].release()


def test_force_release_on_a_memory_locker() -> None:
    locker = redlease.MemoryLocker(holder="box")
    held = locker.acquire("job", ttl=30.0)
    assert locker.force_release("job") is True
    with pytest.raises(redlease.NotHeld):
        held.refresh()
    again = locker.acquire("job", ttl=30.0)
    assert again.fencing_token > held.fencing_token + 1
    assert locker.force_release("missing") is False
    with pytest.raises(redlease.ConfigError):
        locker.force_release("")


def test_force_release_on_the_asyncio_lockers(redis_server: RedisServer, engine: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(port=redis_server.port)
        async with redlease.aio.RedisLocker(client, engine=engine, prefix="afr:") as locker:
            held = await locker.acquire("job", ttl=30.0)
            assert await locker.force_release("job") is True
            assert await locker.force_release("job") is False
            with pytest.raises(redlease.NotHeld):
                await held.release()
        memory = redlease.aio.MemoryLocker()
        await memory.acquire("m", ttl=30.0)
        assert await memory.force_release("m") is True
        await client.aclose()

    asyncio.run(main())


def test_force_release_on_a_cluster(cluster_set: ClusterSet, engine: str) -> None:
    client = cluster_set.client(socket_timeout=2)
    try:
        with redlease.RedisLocker(client, engine=engine, prefix="{frc}:") as locker:
            held = locker.acquire("job", ttl=30.0)
            assert locker.force_release("job") is True
            with pytest.raises(redlease.NotHeld):
                held.release()
    finally:
        client.close()
