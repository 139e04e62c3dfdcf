"""Lease locks: the same behaviour from MemoryLocker and RedisLocker on each engine."""

from __future__ import annotations

import gc
import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

import redlease
from helpers import require_native, require_valkey, stays, wait_until
from redlease._testing import RedisServer
from redlease.lock import (
    DEFAULT_RETRY_INTERVAL,
    LOCK_DEFAULT_TTL,
    MIN_AUTO_RENEW_TTL,
    AutoRenewTTLTooShort,
    Lock,
    Locker,
    MemoryLocker,
    NotAcquired,
    NotHeld,
    RedisLocker,
    with_lock,
)

LOCKERS = ("memory", "redis-python", "redis-native", "valkey-python", "valkey-native")
# The Redis client of each RedisLocker under test, so a test can reach behind it.
_clients: dict[int, redis.Redis] = {}


@pytest.fixture(params=LOCKERS, ids=LOCKERS)
def locker(request: pytest.FixtureRequest) -> Iterator[Locker]:
    """A MemoryLocker, and a RedisLocker on each engine with each client family.

    The native engine is skipped when not built, valkey-py when not installed
    (each a failure where CI requires it).
    """
    kind: str = request.param
    if kind == "memory":
        yield MemoryLocker()
        return
    family, engine = kind.split("-", 1)
    if engine == "native":
        require_native()
    if family == "valkey":
        require_valkey()
    server: RedisServer = request.getfixturevalue("redis_server")
    client: redis.Redis = server.client(
        family=family, socket_timeout=5, socket_connect_timeout=5
    )
    redis_locker = RedisLocker(client, engine=engine)
    _clients[id(redis_locker)] = client
    try:
        yield redis_locker
    finally:
        _clients.pop(id(redis_locker), None)
        redis_locker.close()
        client.close()


def expire_now(locker: Locker, name: str) -> None:
    """End the lease on ``name`` at once, as a TTL running out would."""
    if isinstance(locker, MemoryLocker):
        locker._store.expire(name)
    else:
        assert isinstance(locker, RedisLocker)
        _clients[id(locker)].delete(locker.key(name))


def in_thread(fn: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


# -- exclusion and release -------------------------------------------------------


def test_acquire_of_a_held_lock_raises_not_acquired(locker: Locker) -> None:
    held = locker.acquire("job")
    with pytest.raises(NotAcquired):
        locker.acquire("job")
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    held.release()


def test_not_acquired_is_a_redlease_error(locker: Locker) -> None:
    held = locker.try_acquire("job")
    with pytest.raises(redlease.RedleaseError):
        locker.try_acquire("job")
    held.release()


def test_release_lets_the_next_acquirer_in(locker: Locker) -> None:
    first = locker.try_acquire("job")
    first.release()
    second = locker.try_acquire("job")
    assert second.fencing_token > first.fencing_token
    second.release()


def test_different_names_do_not_exclude_each_other(locker: Locker) -> None:
    a = locker.try_acquire("a")
    b = locker.try_acquire("b")
    a.release()
    b.release()


def test_lock_reports_its_name_and_ttl(locker: Locker) -> None:
    held = locker.try_acquire("report", ttl=timedelta(seconds=2))
    assert held.name == "report"
    assert held.ttl == 2.0
    assert not held.auto_renew
    assert "report" in repr(held)
    held.release()


def test_fencing_tokens_strictly_increase_across_names(locker: Locker) -> None:
    tokens = []
    for i in range(6):
        held = locker.try_acquire(f"name-{i % 3}")
        tokens.append(held.fencing_token)
        held.release()
    assert tokens[0] >= 1
    assert tokens == sorted(set(tokens))


def test_expired_lock_can_be_taken_by_the_next_acquirer(locker: Locker) -> None:
    first = locker.try_acquire("job", ttl=0.1)
    second = wait_until(lambda: _try(locker, "job"), timeout=5.0, what="the lease to expire")
    assert second.fencing_token > first.fencing_token
    second.release()


def _try(locker: Locker, name: str, **opts: Any) -> Lock | None:
    try:
        return locker.try_acquire(name, **opts)
    except NotAcquired:
        return None


def test_second_release_raises_not_held(locker: Locker) -> None:
    held = locker.try_acquire("job")
    held.release()
    with pytest.raises(NotHeld):
        held.release()
    with pytest.raises(NotHeld):
        held.refresh()


def test_threads_taking_turns_never_overlap(locker: Locker) -> None:
    inside = 0
    overlaps = 0
    tokens: list[int] = []
    guard = threading.Lock()

    def worker() -> None:
        nonlocal inside, overlaps
        for _ in range(5):
            with locker.hold("shared", ttl=10.0, wait=30.0, retry_interval=0.01) as held:
                with guard:
                    inside += 1
                    overlaps += inside > 1
                    tokens.append(held.fencing_token)
                time.sleep(0.002)
                with guard:
                    inside -= 1

    threads = [in_thread(worker) for _ in range(4)]
    for thread in threads:
        thread.join(60)
    assert overlaps == 0
    assert len(tokens) == 20
    assert len(set(tokens)) == 20


# -- waiting ---------------------------------------------------------------------------


def test_wait_succeeds_when_the_holder_releases_in_time(locker: Locker) -> None:
    held = locker.try_acquire("job")
    releaser = threading.Timer(0.3, held.release)
    releaser.start()
    started = time.monotonic()
    second = locker.acquire("job", wait=10.0, retry_interval=0.05)
    elapsed = time.monotonic() - started
    releaser.join()
    assert 0.2 <= elapsed < 5.0
    assert second.fencing_token > held.fencing_token
    second.release()


def test_wait_succeeds_when_the_holders_lease_expires(locker: Locker) -> None:
    locker.try_acquire("job", ttl=0.3)
    second = locker.acquire("job", wait=10.0, retry_interval=1.0)
    second.release()


def test_wait_times_out_with_not_acquired_when_the_holder_keeps_it(locker: Locker) -> None:
    held = locker.try_acquire("job")
    started = time.monotonic()
    with pytest.raises(NotAcquired, match="waiting"):
        locker.acquire("job", wait=0.4, retry_interval=0.05)
    elapsed = time.monotonic() - started
    assert 0.35 <= elapsed < 5.0
    held.release()


def test_wait_accepts_a_timedelta(locker: Locker) -> None:
    held = locker.try_acquire("job")
    with pytest.raises(NotAcquired):
        locker.acquire("job", wait=timedelta(milliseconds=100), retry_interval=0.02)
    held.release()


# -- refresh, expiry and takeover ---------------------------------------------------------


def test_refresh_extends_the_lease(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.6)
    for _ in range(4):
        time.sleep(0.3)
        held.refresh()
    # 1.2 s after acquisition a 0.6 s lease is still held thanks to the refreshes.
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    held.release()


def test_refresh_after_expiry_raises_not_held(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.05)
    time.sleep(0.3)
    with pytest.raises(NotHeld):
        held.refresh()


def test_release_after_expiry_raises_not_held(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.05)
    time.sleep(0.3)
    with pytest.raises(NotHeld):
        held.release()


def test_release_and_refresh_after_takeover_raise_not_held_and_spare_the_successor(
    locker: Locker,
) -> None:
    stale = locker.try_acquire("job", ttl=0.1)
    successor = wait_until(lambda: _try(locker, "job", ttl=30.0), timeout=5.0)
    with pytest.raises(NotHeld):
        stale.refresh()
    with pytest.raises(NotHeld):
        stale.release()
    # The successor's lease is intact: still exclusive, still refreshable, still releasable.
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    successor.refresh()
    successor.release()


# -- auto-renewal ----------------------------------------------------------------------


def test_auto_renew_keeps_the_lock_past_three_ttls(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    assert held.auto_renew
    time.sleep(1.2)
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    assert not held.done.is_set()
    held.release()
    locker.try_acquire("job").release()


def test_auto_renew_sets_done_when_the_lock_is_taken_over(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=1.0, auto_renew=True)
    expire_now(locker, "job")
    thief = locker.try_acquire("job", ttl=30.0)
    assert held.done.wait(5.0), "the watchdog should notice the lost lease within a TTL"
    with pytest.raises(NotHeld):
        held.release()
    # The thief's lock survived the old holder's release attempt.
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    thief.release()


def test_done_is_never_set_without_auto_renew(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.05)
    time.sleep(0.2)
    assert not held.done.is_set()


def test_done_stays_clear_after_a_clean_release(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    held.release()
    assert stays(lambda: not held.done.is_set(), 0.5)


def test_auto_renew_with_a_ttl_below_the_minimum_raises(locker: Locker) -> None:
    with pytest.raises(AutoRenewTTLTooShort, match="MIN_AUTO_RENEW_TTL"):
        locker.try_acquire("job", ttl=0.02, auto_renew=True)
    with pytest.raises(AutoRenewTTLTooShort):
        locker.acquire("job", ttl=timedelta(milliseconds=29), auto_renew=True)
    # Nothing was taken.
    locker.try_acquire("job").release()


def test_auto_renew_accepts_the_minimum_ttl(locker: Locker) -> None:
    held = locker.try_acquire("job", ttl=MIN_AUTO_RENEW_TTL, auto_renew=True)
    held.release()


def test_short_ttl_without_auto_renew_is_accepted(locker: Locker) -> None:
    locker.try_acquire("job", ttl=0.01)


# -- hold and with_lock ------------------------------------------------------------------


def test_hold_releases_when_the_body_returns(locker: Locker) -> None:
    with locker.hold("job") as held:
        assert held.auto_renew
        with pytest.raises(NotAcquired):
            locker.try_acquire("job")
    locker.try_acquire("job").release()


def test_hold_releases_when_the_body_raises(locker: Locker) -> None:
    with pytest.raises(ValueError, match="boom"), locker.hold("job"):
        raise ValueError("boom")
    locker.try_acquire("job").release()


def test_hold_releases_on_keyboard_interrupt(locker: Locker) -> None:
    with pytest.raises(KeyboardInterrupt), locker.hold("job"):
        raise KeyboardInterrupt
    locker.try_acquire("job").release()


def test_hold_raises_not_held_when_the_lease_was_lost_even_if_the_body_succeeded(
    locker: Locker,
) -> None:
    with pytest.raises(NotHeld), locker.hold("job", ttl=0.05, auto_renew=False):
        time.sleep(0.3)
        thief = locker.try_acquire("job")
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    thief.release()


def test_hold_chains_not_held_with_the_body_exception(locker: Locker) -> None:
    with pytest.raises(NotHeld) as caught, locker.hold("job", ttl=1.0) as held:
        expire_now(locker, "job")
        locker.try_acquire("job", ttl=30.0)
        held.done.wait(5.0)
        raise ValueError("body failed")
    assert isinstance(caught.value.__cause__, ValueError)
    assert str(caught.value.__cause__) == "body failed"


def test_hold_sets_done_when_the_lease_is_lost_inside_the_body(locker: Locker) -> None:
    with pytest.raises(NotHeld), locker.hold("job", ttl=1.0) as held:
        expire_now(locker, "job")
        locker.try_acquire("job", ttl=30.0)
        assert held.done.wait(5.0)


def test_hold_outlives_its_ttl_thanks_to_auto_renew(locker: Locker) -> None:
    with locker.hold("job", ttl=0.15) as held:
        time.sleep(0.6)
        assert not held.done.is_set()


def test_hold_waits_for_the_lock(locker: Locker) -> None:
    held = locker.try_acquire("job")
    threading.Timer(0.2, held.release).start()
    with locker.hold("job", wait=10.0, retry_interval=0.02) as second:
        assert second.fencing_token > held.fencing_token


def test_with_lock_returns_the_body_result(locker: Locker) -> None:
    result = with_lock(locker, "job", lambda held: ("done", held.name))
    assert result == ("done", "job")
    locker.try_acquire("job").release()


def test_with_lock_passes_options_and_auto_renews(locker: Locker) -> None:
    def body(held: Lock) -> int:
        time.sleep(0.5)
        assert held.auto_renew
        assert not held.done.is_set()
        return held.fencing_token

    assert with_lock(locker, "job", body, ttl=0.15) >= 1


def test_with_lock_without_auto_renew_raises_not_held_when_the_lease_ran_out(
    locker: Locker,
) -> None:
    with pytest.raises(NotHeld):
        with_lock(locker, "job", lambda held: time.sleep(0.3), ttl=0.05, auto_renew=False)


def test_with_lock_releases_and_propagates_the_body_exception(locker: Locker) -> None:
    def body(held: Lock) -> None:
        raise LookupError("nope")

    with pytest.raises(LookupError):
        with_lock(locker, "job", body)
    locker.try_acquire("job").release()


def test_with_lock_raises_not_acquired_when_held(locker: Locker) -> None:
    held = locker.try_acquire("job")
    with pytest.raises(NotAcquired):
        with_lock(locker, "job", lambda h: None)
    held.release()


# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("opts", "rule"),
    [
        ({"ttl": 0}, "ttl must be positive"),
        ({"ttl": -1}, "ttl must be positive"),
        ({"ttl": math.nan}, "NaN"),
        ({"ttl": math.inf}, "finite"),
        ({"ttl": True}, "not a bool"),
        ({"ttl": "30"}, "ttl must be a duration"),
        ({"ttl": 0.0004}, "at least 1 ms"),
        ({"wait": -0.5}, "wait must not be negative"),
        ({"wait": math.nan}, "NaN"),
        ({"wait": False}, "wait must be a duration"),
        ({"retry_interval": 0}, "retry_interval must be positive"),
        ({"retry_interval": math.nan}, "NaN"),
        ({"auto_renew": "yes"}, "auto_renew must be a bool"),
    ],
)
def test_invalid_acquire_settings_raise_config_error_naming_the_rule(
    locker: Locker, opts: dict[str, Any], rule: str
) -> None:
    with pytest.raises(redlease.ConfigError, match=rule) as caught:
        locker.acquire("job", **opts)
    assert isinstance(caught.value, ValueError)
    locker.try_acquire("job").release()


@pytest.mark.parametrize(("name", "rule"), [("", "must not be empty"), (b"job", "must be a str")])
def test_invalid_lock_names_are_rejected(locker: Locker, name: Any, rule: str) -> None:
    with pytest.raises(redlease.ConfigError, match=rule):
        locker.try_acquire(name)
    with pytest.raises(redlease.ConfigError, match=rule):
        locker.acquire(name)


def test_defaults_match_the_contract() -> None:
    assert LOCK_DEFAULT_TTL == 30.0
    assert DEFAULT_RETRY_INTERVAL == 0.1
    assert MIN_AUTO_RENEW_TTL == 0.03


def test_default_ttl_is_thirty_seconds(locker: Locker) -> None:
    held = locker.try_acquire("job")
    assert held.ttl == LOCK_DEFAULT_TTL
    held.release()


def test_hold_lets_an_interrupt_through_even_when_the_lease_was_lost(locker: Locker) -> None:
    with pytest.raises(KeyboardInterrupt), locker.hold("job", ttl=0.05, auto_renew=False):
        time.sleep(0.3)
        thief = locker.try_acquire("job")
        raise KeyboardInterrupt
    with pytest.raises(NotAcquired):
        locker.try_acquire("job")
    thief.release()


def test_release_that_finds_the_lease_lost_sets_done_on_an_auto_renewed_lock(
    locker: Locker,
) -> None:
    held = locker.try_acquire("job", ttl=5.0, auto_renew=True)
    expire_now(locker, "job")
    with pytest.raises(NotHeld):
        held.release()
    assert held.done.is_set()


def test_an_abandoned_auto_renewed_lock_expires_instead_of_renewing_forever(
    locker: Locker,
) -> None:
    held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
    del held
    gc.collect()
    successor = locker.acquire("job", wait=10.0, retry_interval=0.05)
    successor.release()
