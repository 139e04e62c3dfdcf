"""redlease.metrics: the Prometheus exposition of an elector's and a locker's life."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest
import redis

import redlease
from helpers import NAME, make_elector, wait_until
from redlease._engine import LATENESS_BUCKETS
from redlease._testing import RedisServer

prometheus_client = pytest.importorskip("prometheus_client")
import redlease.metrics  # noqa: E402


def sample(registry: object, metric: str, **labels: str) -> float | None:
    value = registry.get_sample_value(metric, labels)  # type: ignore[attr-defined]
    return None if value is None else float(value)


def new_registry() -> prometheus_client.CollectorRegistry:
    return prometheus_client.CollectorRegistry()


def test_every_named_metric_follows_a_term(client: redis.Redis, engine: str) -> None:
    registry = new_registry()
    e = make_elector(client, engine, ttl=1.0)
    assert redlease.metrics.instrument(e, registry) is e
    assert sample(registry, "redlease_leader", name=NAME) == 0
    with e:
        # The term is counted once the run has it in hand (resign() needs that too).
        wait_until(lambda: sample(registry, "redlease_terms_total", name=NAME) == 1)
        token = wait_until(e.token, what="the election")
        assert sample(registry, "redlease_leader", name=NAME) == 1
        assert sample(registry, "redlease_term_token", name=NAME) == token
        assert e.fence_set(token, "k", "v")
        assert e.fence_set(token, "k", "v2")
        e.resign()
        wait_until(
            lambda: sample(registry, "redlease_stepdowns_total", name=NAME, reason="resigned"),
            what="the resignation counted",
        )
        token2 = wait_until(e.token, what="the second election")
        wait_until(lambda: sample(registry, "redlease_terms_total", name=NAME) == 2)
        assert sample(registry, "redlease_term_token", name=NAME) == token2
        assert not e.fence_set(token, "k", "stale")  # the first term's token
    assert sample(registry, "redlease_leader", name=NAME) == 0
    assert sample(registry, "redlease_term_token", name=NAME) == 0
    assert sample(registry, "redlease_stepdowns_total", name=NAME, reason="stopped") == 1
    assert sample(registry, "redlease_stepdowns_total", name=NAME, reason="lost") == 0
    writes = "redlease_fenced_writes_total"
    assert sample(registry, writes, name=NAME, result="applied") == 2
    assert sample(registry, writes, name=NAME, result="rejected") == 1

    text = prometheus_client.generate_latest(registry).decode()
    for metric in (
        "redlease_leader",
        "redlease_term_token",
        "redlease_terms_total",
        "redlease_stepdowns_total",
        "redlease_errors_total",
        "redlease_fenced_writes_total",
        "redlease_renew_lateness_seconds",
    ):
        assert f"# TYPE {metric} " in text, metric


def test_lateness_histogram_has_one_observation_per_renewal(
    client: redis.Redis, engine: str
) -> None:
    registry = new_registry()
    e = make_elector(client, engine, ttl=0.6, renew_interval=0.02)
    redlease.metrics.instrument(e, registry)
    with e:
        wait_until(e.token, what="the election")
        time.sleep(0.5)
        during = sample(registry, "redlease_renew_lateness_seconds_count", name=NAME)
        assert during is not None and during >= 5
        samples = e.renew_lateness_count()
        # Read after: the keeper kept renewing in between.
        after = sample(registry, "redlease_renew_lateness_seconds_count", name=NAME)
        assert after is not None and after >= samples >= during
    # Closed keepers keep counting for the exposition: counters never go back.
    final = sample(registry, "redlease_renew_lateness_seconds_count", name=NAME)
    assert final is not None and final >= after
    inf = sample(registry, "redlease_renew_lateness_seconds_bucket", name=NAME, le="+Inf")
    assert inf == final
    total = sample(registry, "redlease_renew_lateness_seconds_sum", name=NAME)
    assert total is not None and 0 <= total < final * 2.0  # under the TTL on average
    buckets = [
        sample(registry, "redlease_renew_lateness_seconds_bucket", name=NAME, le=repr(b))
        for b in LATENESS_BUCKETS
    ]
    assert buckets == sorted(buckets)  # cumulative


def test_the_renewals_of_a_second_run_add_to_the_first(client: redis.Redis, engine: str) -> None:
    registry = new_registry()
    e = make_elector(client, engine, ttl=0.6, renew_interval=0.02)
    redlease.metrics.instrument(e, registry)
    counts = []
    for _ in range(2):
        with e:
            wait_until(e.token)
            time.sleep(0.2)
        counts.append(sample(registry, "redlease_renew_lateness_seconds_count", name=NAME))
    assert counts[0] is not None and counts[1] is not None
    assert counts[1] > counts[0] > 0


def test_native_and_python_keepers_share_the_bucket_bounds() -> None:
    from helpers import require_native

    native = require_native()
    assert native.LATENESS_BUCKETS == LATENESS_BUCKETS


def test_instrumenting_a_running_elector_counts_its_renewals(
    client: redis.Redis, engine: str
) -> None:
    registry = new_registry()
    e = make_elector(client, engine, ttl=0.6, renew_interval=0.02)
    with e:
        wait_until(e.token)
        redlease.metrics.instrument(e, registry)
        assert sample(registry, "redlease_leader", name=NAME) == 1
        wait_until(
            lambda: (sample(registry, "redlease_renew_lateness_seconds_count", name=NAME) or 0) > 3,
            what="renewals counted",
        )


def test_handled_errors_are_counted_by_class(
    redis_server: RedisServer, client: redis.Redis, engine: str
) -> None:
    registry = new_registry()
    errors: list[Exception] = []
    e = make_elector(
        client, engine, acquire_interval=0.05, observer=redlease.Observer(on_error=errors.append)
    )
    redlease.metrics.instrument(e, registry)
    with e:
        wait_until(e.token, what="the election")
        redis_server.pause()
        try:
            wait_until(
                lambda: sample(registry, "redlease_stepdowns_total", name=NAME, reason="lost"),
                timeout=15.0,
                what="the term lost to the outage",
            )
        finally:
            redis_server.resume()
        wait_until(e.token, timeout=10.0, what="the election after the outage")
    assert len(errors) >= 2
    counted = sum(
        sample(registry, "redlease_errors_total", name=NAME, error=type(exc).__name__) or 0
        for exc in {type(x): x for x in errors}.values()
    )
    assert counted == len(errors)
    assert sample(registry, "redlease_stepdowns_total", name=NAME, reason="lost") == 1


def test_locker_metrics_follow_its_locks(client: redis.Redis, engine: str) -> None:
    registry = new_registry()
    locker = redlease.RedisLocker(client, prefix="m:", engine=engine)
    redlease.metrics.instrument(locker, registry)
    with locker.hold("a", ttl=0.3) as held:
        assert sample(registry, "redlease_leader", name="m:") == 1
        assert sample(registry, "redlease_term_token", name="m:") == held.fencing_token
        time.sleep(0.35)  # three refreshes or so
    lost = locker.acquire("b", ttl=0.3, auto_renew=True)
    client.delete(locker.key("b"))
    assert lost.done.wait(5.0)
    with pytest.raises(redlease.NotHeld):
        lost.release()
    locker.close()
    assert sample(registry, "redlease_leader", name="m:") == 0
    assert sample(registry, "redlease_terms_total", name="m:") == 2
    assert sample(registry, "redlease_stepdowns_total", name="m:", reason="released") == 1
    assert sample(registry, "redlease_stepdowns_total", name="m:", reason="lost") == 1
    count = sample(registry, "redlease_renew_lateness_seconds_count", name="m:")
    assert count is not None and count >= 2
    text = prometheus_client.generate_latest(registry).decode()
    assert "redlease_fenced_writes" not in text  # a locker has no fenced writes


def test_asyncio_elector_is_instrumented_too(redis_server: RedisServer, engine: str) -> None:
    import redis.asyncio

    registry = new_registry()

    async def main() -> redlease.aio.Elector:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        e = redlease.aio.Elector(client, NAME, ttl=1.0, engine=engine)
        redlease.metrics.instrument(e, registry)
        async with e:
            for _ in range(200):
                if e.token() is not None:
                    break
                await asyncio.sleep(0.02)
            token = e.token()
            assert token is not None
            assert await e.fence_set(token, "k", "v")
            assert sample(registry, "redlease_leader", name=NAME) == 1
        await client.aclose()
        return e

    # The exposition lists an instrumented target as long as it exists.
    e = asyncio.run(main())
    assert sample(registry, "redlease_terms_total", name=NAME) == 1
    assert sample(registry, "redlease_fenced_writes_total", name=NAME, result="applied") == 1
    del e


def test_two_targets_of_one_name_in_one_registry_is_an_error(client: redis.Redis) -> None:
    registry = new_registry()
    first = make_elector(client, "python")
    redlease.metrics.instrument(first, registry)
    redlease.metrics.instrument(first, registry)  # the same target again: a no-op
    with pytest.raises(ValueError, match="already instrumented"):
        redlease.metrics.instrument(make_elector(client, "python"), registry)
    with pytest.raises(TypeError, match="Elector, RedisLocker or Partitions"):
        redlease.metrics.instrument(object(), registry)


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    # A fresh interpreter where prometheus_client cannot be imported.
    code = "import sys; sys.modules['prometheus_client'] = None\nimport redlease.metrics\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "pip install 'redlease[metrics]'" in last, out.stderr
    assert "During handling" not in out.stderr


def test_asyncio_locker_is_instrumented_through_its_locks(
    redis_server: RedisServer, engine: str
) -> None:
    import redis.asyncio

    registry = new_registry()

    async def main() -> redlease.aio.RedisLocker:
        client = redis.asyncio.Redis.from_url(redis_server.url)
        locker = redlease.aio.RedisLocker(client, prefix="am:", engine=engine)
        redlease.metrics.instrument(locker, registry)
        async with locker.hold("a", ttl=1.0):
            assert sample(registry, "redlease_leader", name="am:") == 1
        await client.aclose()
        return locker

    locker = asyncio.run(main())
    assert sample(registry, "redlease_terms_total", name="am:") == 1
    assert sample(registry, "redlease_stepdowns_total", name="am:", reason="released") == 1
    assert sample(registry, "redlease_leader", name="am:") == 0
    del locker


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_locker_metrics_count_each_names_waits_and_contention(
    client: redis.Redis, engine: str, kind: str
) -> None:
    registry = new_registry()
    locker = (
        redlease.RedisLocker(client, prefix="w:", engine=engine)
        if kind == "redis"
        else redlease.MemoryLocker()
    )
    name = "w:" if kind == "redis" else "MemoryLocker"
    redlease.metrics.instrument(locker, registry)
    first = locker.acquire("busy", ttl=5.0)  # no wait, no contention
    threading.Timer(0.3, first.release).start()
    second = locker.acquire("busy", ttl=5.0, wait=5.0, retry_interval=0.05)  # waited ~0.3 s
    with pytest.raises(redlease.NotAcquired):
        locker.try_acquire("busy")  # contended, not granted
    second.release()
    sem = locker.semaphore("pool", 1)  # type: ignore[attr-defined]
    permit = sem.try_acquire(ttl=5.0)
    with pytest.raises(redlease.NotAcquired):
        sem.try_acquire()
    permit.release()
    locker.close()

    def of(metric: str, lock: str) -> float | None:
        return sample(registry, metric, name=name, lock=lock)

    assert of("redlease_lock_wait_seconds_count", "busy") == 2
    waited = of("redlease_lock_wait_seconds_sum", "busy")
    assert waited is not None and 0.2 < waited < 3.0
    fast = sample(registry, "redlease_lock_wait_seconds_bucket", name=name, lock="busy", le="0.1")
    assert fast == 1  # the first, which did not wait
    assert of("redlease_lock_contended_total", "busy") == 2
    assert of("redlease_lock_wait_seconds_count", "pool") == 1
    assert of("redlease_lock_contended_total", "pool") == 1


def test_a_partition_member_exports_what_it_owns_and_its_rebalances(
    client: redis.Redis, engine: str
) -> None:
    registry = new_registry()
    first = redlease.Partitions(client, "mp", 6, member_id="a", ttl=1.0, engine=engine)
    second = redlease.Partitions(client, "mp", 6, member_id="b", ttl=1.0, engine=engine)
    assert redlease.metrics.instrument(first, registry) is first
    try:
        first.start()
        wait_until(lambda: len(first.owned()) == 6, 10, what="the lone member owns all")
        wait_until(
            lambda: sample(registry, "redlease_partition_rebalance_seconds_count", name="mp") == 1,
            10,
            what="its first rebalance counted",
        )
        assert sample(registry, "redlease_partitions_owned", name="mp") == 6
        assert sample(registry, "redlease_partitions_assigned_total", name="mp") == 6
        second.start()
        wait_until(lambda: len(first.owned()) == len(second.owned()) == 3, 10, what="balanced")
        assert sample(registry, "redlease_partitions_owned", name="mp") == 3
        assert (
            sample(registry, "redlease_partitions_revoked_total", name="mp", reason="rebalanced")
            == 3
        )
        wait_until(
            lambda: sample(registry, "redlease_partition_rebalance_seconds_count", name="mp") == 2,
            10,
            what="the join's rebalance counted",
        )
        took = sample(registry, "redlease_partition_rebalance_seconds_sum", name="mp")
        assert took is not None and 0 < took < 20
        second.stop(10)
        wait_until(lambda: len(first.owned()) == 6, 10, what="the first takes the rest back")
    finally:
        second.stop(10)
        first.stop(10)
    # The second member stopped first: the first took its three back, then gave all six up.
    assert sample(registry, "redlease_partitions_owned", name="mp") == 0
    assert sample(registry, "redlease_partitions_assigned_total", name="mp") == 9
    assert sample(registry, "redlease_partitions_revoked_total", name="mp", reason="stopped") == 6
