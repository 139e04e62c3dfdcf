"""RedisLocker specifics: key layout, replay-safe scripts, failures, native renewal."""

from __future__ import annotations

import os
import re
import socket
import time
import warnings
from collections.abc import Iterator

import pytest
import redis

import redlease
from helpers import gil_call_size, hold_gil, wait_until
from redlease._testing import RedisServer
from redlease.lock import (
    DEFAULT_PREFIX,
    MemoryLocker,
    NotAcquired,
    NotHeld,
    RedisLocker,
    default_locker,
)

KEY = f"{DEFAULT_PREFIX}key:job"
FENCING = f"{DEFAULT_PREFIX}fencing"


@pytest.fixture
def locker(client: redis.Redis, engine: str) -> Iterator[RedisLocker]:
    redis_locker = RedisLocker(client, engine=engine)
    try:
        yield redis_locker
    finally:
        redis_locker.close()


def owner_of(client: redis.Redis, key: str = KEY) -> bytes | None:
    value: bytes | None = client.hget(key, "owner")
    return value


# -- layout ---------------------------------------------------------------------------------


def test_locker_runs_on_the_engine_asked_for(locker: RedisLocker, engine: str) -> None:
    assert locker.engine == engine


def test_lock_is_an_expiring_hash_of_owner_fencing_token_and_holder(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.try_acquire("job", ttl=10.0)
    fields = client.hgetall(KEY)
    assert set(fields) == {b"owner", b"fencing", b"holder"}
    assert fields[b"holder"] == f"{socket.gethostname()}-{os.getpid()}".encode()
    assert re.fullmatch(rb"[0-9a-f]{32}", fields[b"owner"])
    assert int(fields[b"fencing"]) == held.fencing_token
    assert 9000 < client.pttl(KEY) <= 10000
    held.release()
    assert not client.exists(KEY)


def test_fencing_counter_is_one_persistent_key_for_every_name(
    client: redis.Redis, locker: RedisLocker
) -> None:
    a = locker.try_acquire("a")
    b = locker.try_acquire("b")
    assert int(client.get(FENCING) or 0) == b.fencing_token == a.fencing_token + 1
    assert client.pttl(FENCING) == -1
    a.release()
    b.release()
    assert int(client.get(FENCING) or 0) == b.fencing_token


def test_each_acquisition_gets_a_new_ownership_token(
    client: redis.Redis, locker: RedisLocker
) -> None:
    first = locker.try_acquire("job")
    owner = owner_of(client)
    first.release()
    locker.try_acquire("job")
    assert owner_of(client) not in (None, owner)


def test_prefix_places_every_key(client: redis.Redis, engine: str) -> None:
    with RedisLocker(client, prefix="app:{locks}:", engine=engine) as custom:
        held = custom.try_acquire("job")
        assert custom.key("job") == "app:{locks}:key:job"
        assert client.exists("app:{locks}:key:job")
        assert int(client.get("app:{locks}:fencing") or 0) == held.fencing_token
        held.release()
        assert client.exists(f"app:{{locks}}:ack:{held._owner}")


def test_lockers_with_the_same_prefix_share_locks_and_tokens(
    client: redis.Redis, engine: str
) -> None:
    with RedisLocker(client, engine=engine) as one, RedisLocker(client, engine="python") as two:
        held = one.try_acquire("job")
        with pytest.raises(NotAcquired):
            two.try_acquire("job")
        held.release()
        assert two.try_acquire("job").fencing_token == held.fencing_token + 1


def test_refresh_sets_the_full_ttl_again(client: redis.Redis, locker: RedisLocker) -> None:
    held = locker.try_acquire("job", ttl=2.0)
    time.sleep(0.5)
    assert client.pttl(KEY) <= 1600
    held.refresh()
    assert client.pttl(KEY) > 1800
    held.release()


# -- replayed requests -------------------------------------------------------------------------


def test_replayed_acquire_returns_the_original_fencing_token(
    client: redis.Redis, locker: RedisLocker
) -> None:
    owner = "a" * 32
    token, _ = locker._attempt("job", owner, 5000)
    again, _ = locker._attempt("job", owner, 5000)
    assert token >= 1
    assert again == token
    assert int(client.get(FENCING) or 0) == token, "a replay must not allocate a token"
    other, remaining = locker._attempt("job", "b" * 32, 5000)
    assert other == 0
    assert 0 < remaining <= 5.0


def test_replayed_release_reports_success_through_the_acknowledgement(
    client: redis.Redis, locker: RedisLocker
) -> None:
    owner = "c" * 32
    locker._attempt("job", owner, 5000)
    assert locker._release("job", owner)
    assert locker._release("job", owner), "a replayed release is acknowledged"
    ack = f"{DEFAULT_PREFIX}ack:{owner}"
    assert client.exists(ack)
    assert 0 < client.pttl(ack) <= locker._ack_ttl_ms


def test_replayed_release_never_touches_a_successors_lock(
    client: redis.Redis, locker: RedisLocker
) -> None:
    owner = "d" * 32
    locker._attempt("job", owner, 5000)
    assert locker._release("job", owner)
    successor = locker.try_acquire("job")
    successor_owner = owner_of(client)
    assert locker._release("job", owner)
    assert owner_of(client) == successor_owner
    successor.release()


def test_release_by_a_stranger_without_acknowledgement_fails(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.try_acquire("job")
    assert not locker._release("job", "e" * 32)
    assert not locker._refresh("job", "e" * 32, 5000)
    assert client.exists(KEY)
    held.release()


def test_a_retried_release_after_a_lost_reply_succeeds(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.try_acquire("job")
    # The first release reached Redis but its reply never came back.
    assert locker._release("job", held._owner)
    held.release()
    assert not client.exists(KEY)


# -- expiry and takeover at Redis ----------------------------------------------------------------


def test_stale_release_and_refresh_leave_the_successors_key_untouched(
    client: redis.Redis, locker: RedisLocker
) -> None:
    stale = locker.try_acquire("job", ttl=0.1)
    successor = wait_until(lambda: _try(locker, "job"), timeout=5.0)
    before = client.hgetall(KEY)
    ttl_before = client.pttl(KEY)
    with pytest.raises(NotHeld):
        stale.refresh()
    with pytest.raises(NotHeld):
        stale.release()
    assert client.hgetall(KEY) == before
    assert client.pttl(KEY) <= ttl_before
    successor.release()


def _try(locker: RedisLocker, name: str) -> redlease.lock.Lock | None:
    try:
        return locker.try_acquire(name)
    except NotAcquired:
        return None


def test_watchdog_sets_done_when_the_key_is_stolen(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.try_acquire("job", ttl=0.6, auto_renew=True)
    client.hset(KEY, "owner", "thief")
    assert held.done.wait(5.0)
    with pytest.raises(NotHeld):
        held.release()
    assert owner_of(client) == b"thief"


def test_watchdog_keeps_the_key_alive(client: redis.Redis, locker: RedisLocker) -> None:
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    time.sleep(1.0)
    assert client.pttl(KEY) > 0
    assert not held.done.is_set()
    held.release()
    assert not client.exists(KEY)


@pytest.mark.parametrize("engine", ["native"], indirect=True)
def test_auto_renew_survives_a_gil_holding_call_on_the_native_engine(
    client: redis.Redis, locker: RedisLocker
) -> None:
    n = gil_call_size(1.5)
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    owner = owner_of(client)
    held_for = hold_gil(n)  # one C call: the GIL is not released until it returns
    assert held_for > 0.6, "calibration should hold the GIL for well over one TTL"
    assert owner_of(client) == owner
    assert not held.done.is_set()
    held.release()


@pytest.mark.parametrize("engine", ["python"], indirect=True)
def test_the_python_engine_loses_the_lock_through_a_gil_holding_call(
    client: redis.Redis, locker: RedisLocker
) -> None:
    # The limitation the native engine removes: a Python renewer waits for the GIL.
    n = gil_call_size(1.5)
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    assert hold_gil(n) > 0.6
    assert held.done.wait(5.0)
    with pytest.raises(NotHeld):
        held.release()


# -- failures --------------------------------------------------------------------------------------


def test_acquire_fails_closed_when_the_server_is_down(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client(socket_timeout=1, socket_connect_timeout=1)
    with RedisLocker(client, engine=engine) as locker:
        held = locker.try_acquire("warmup")
        redis_server.kill()
        with pytest.raises(redis.RedisError):
            locker.try_acquire("job")
        with pytest.raises(redis.RedisError):
            locker.acquire("job", wait=0.3, retry_interval=0.05)
        with pytest.raises(redis.RedisError):
            held.release()


def test_acquire_is_bounded_when_the_server_hangs(redis_server: RedisServer, engine: str) -> None:
    client = redis_server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    with RedisLocker(client, engine=engine) as locker:
        locker.try_acquire("warmup").release()
        redis_server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(redis.RedisError):
                locker.try_acquire("job")
            assert time.monotonic() - started < 5.0
        finally:
            redis_server.resume()


def test_hold_raises_the_backend_error_when_release_fails_after_a_good_body(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client(socket_timeout=1, socket_connect_timeout=1)
    locker = RedisLocker(client, engine=engine)
    with pytest.raises(redis.RedisError), locker.hold("job", ttl=5.0):
        redis_server.kill()
    locker.close()


def test_hold_keeps_the_body_exception_when_release_fails(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client(socket_timeout=1, socket_connect_timeout=1)
    locker = RedisLocker(client, engine=engine)
    with pytest.raises(ZeroDivisionError) as caught, locker.hold("job", ttl=5.0):
        redis_server.kill()
        1 / 0  # noqa: B018
    locker.close()
    notes = getattr(caught.value, "__notes__", None)
    if notes is not None:  # Python 3.11+
        assert any("releasing lock 'job' failed" in note for note in notes)


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_cannot_release_its_parents_lock(
    client: redis.Redis, locker: RedisLocker
) -> None:
    held = locker.try_acquire("job")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            held.release()
            outcome = b"released"
        except NotHeld:
            outcome = b"not held"
        except BaseException:
            outcome = b"error"
        os.write(write_end, outcome)
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 64) == b"not held"
    os.close(read_end)
    assert client.exists(KEY)
    held.release()


# -- construction ------------------------------------------------------------------------------


def test_a_client_is_required() -> None:
    with pytest.raises(redlease.ConfigError, match="client"):
        RedisLocker(None)


def test_cluster_prefix_without_a_hash_tag_is_rejected() -> None:
    cluster = redis.RedisCluster.__new__(redis.RedisCluster)  # no nodes needed to validate
    for prefix in ("redlease:lock:", "{}:", "locks{"):
        with pytest.raises(redlease.ConfigError, match="hash tag"):
            RedisLocker(cluster, prefix=prefix)


def test_unknown_engine_is_rejected(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match="engine"):
        RedisLocker(client, engine="turbo")


def test_default_locker_without_a_client_warns_and_is_in_memory() -> None:
    with pytest.warns(RuntimeWarning, match="guards nothing across processes"):
        locker = default_locker()
    assert isinstance(locker, MemoryLocker)
    assert locker.engine == "memory"


def test_default_locker_with_a_client_is_a_redis_locker(client: redis.Redis, engine: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        locker = default_locker(client, engine=engine)
    assert isinstance(locker, RedisLocker)
    assert locker.engine == engine
    locker.close()
