"""Elections: monotonic tokens, takeover, healing, the fence moved on election, PX."""

from __future__ import annotations

import time

import redis

from helpers import (
    APPLIED_KEY,
    FENCE_KEY,
    LEADER_KEY,
    make_elector,
    wait_until,
)


def test_first_election_on_a_fresh_name_mints_token_one(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine)
    with e:
        assert wait_until(e.token) == 1
        assert client.get(FENCE_KEY) == b"1"
        assert client.get(LEADER_KEY) == e.instance_id.encode()


def test_tokens_increase_strictly_across_contenders(client: redis.Redis, engine: str) -> None:
    tokens = []
    for i in range(4):
        e = make_elector(client, engine, instance_id=f"contender-{i}")
        with e:
            tokens.append(wait_until(e.token))
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)


def test_own_leftover_lock_is_taken_over_with_fresh_token_and_reset_ttl(
    client: redis.Redis, engine: str
) -> None:
    client.set(LEADER_KEY, "replica-1", px=60_000)
    client.set(FENCE_KEY, 7)
    client.set(APPLIED_KEY, 7)
    e = make_elector(client, engine, instance_id="replica-1", ttl=1.0)
    started = time.monotonic()
    with e:
        token = wait_until(e.token, timeout=3.0)
        assert time.monotonic() - started < 3.0
        assert token == 8
        assert client.get(APPLIED_KEY) == b"8"
        assert 0 < client.pttl(LEADER_KEY) <= 1000
        assert client.get(LEADER_KEY) == b"replica-1"


def test_lock_held_by_another_instance_is_not_taken(client: redis.Redis, engine: str) -> None:
    client.set(LEADER_KEY, "someone-else", px=60_000)
    e = make_elector(client, engine, ttl=0.5, acquire_interval=0.02)
    with e:
        time.sleep(0.5)
        assert e.token() is None
        assert not e.is_leader()
    assert client.get(LEADER_KEY) == b"someone-else"
    assert client.get(FENCE_KEY) is None


def test_election_moves_the_mark_to_the_new_token(client: redis.Redis, engine: str) -> None:
    client.set(FENCE_KEY, 30)
    client.set(APPLIED_KEY, 12)
    e = make_elector(client, engine)
    with e:
        token = wait_until(e.token)
        assert token == 31
        assert client.get(APPLIED_KEY) == b"31"
        assert not e.fence_set(30, "k", "previous term")
        assert client.get("k") is None


def test_counter_is_healed_from_the_mark_after_a_fenced_write_above_it(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(40, "k", "written at 40")
    with e:
        assert wait_until(e.token) == 41
    assert client.get(FENCE_KEY) == b"41"


def test_counter_is_healed_from_the_mark_after_the_counter_is_lost(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine)
    assert e.fence_set(40, "k", "written at 40")
    with e:
        assert wait_until(e.token) == 41
    client.delete(FENCE_KEY)
    with e:
        assert wait_until(e.token) == 42
    assert client.get(APPLIED_KEY) == b"42"


def test_lease_ttl_is_set_in_milliseconds(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine, ttl=0.2505)
    assert e.config.ttl == 0.25
    with e:
        wait_until(e.token)
        pttl = client.pttl(LEADER_KEY)
    # EX in whole seconds would give 0 (rejected) or 1000: only PX 250 lands here.
    assert 100 < pttl <= 250


def test_lease_ttl_of_one_and_a_half_seconds_is_not_rounded_to_whole_seconds(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, ttl=1.5)
    with e:
        wait_until(e.token)
        pttl = client.pttl(LEADER_KEY)
    assert 1000 < pttl <= 1500


def test_lease_is_renewed_past_its_ttl(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine, ttl=0.5)
    with e:
        token = wait_until(e.token)
        time.sleep(1.5)
        assert e.token() == token
        assert client.get(LEADER_KEY) == e.instance_id.encode()
        assert 0 < client.pttl(LEADER_KEY) <= 500
