"""pytest-benchmark suite for uncontended lock cycles (acquire + release).

    pytest benchmarks/bench_lock_pytest.py --benchmark-group-by=param:case

Same cases as ``bench_lock.py``: MemoryLocker, RedisLocker on each engine,
and redis-py's ``redis.lock.Lock`` as the baseline, against a private
redis-server started for the session.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from redlease import MemoryLocker, RedisLocker
from redlease._cli.bench import native_engine_available

CASES = ("memory", "redis-python", "redis-native", "redis-py")


@pytest.mark.parametrize("case", CASES)
def test_uncontended_acquire_release(benchmark: Any, client: redis.Redis, case: str) -> None:
    if case == "redis-py":

        def cycle() -> None:
            lock = client.lock("bench:redis-py", timeout=30.0)
            assert lock.acquire(blocking=False)
            lock.release()

        benchmark(cycle)
        return
    if case == "memory":
        locker: MemoryLocker | RedisLocker = MemoryLocker()
    else:
        engine = case.split("-", 1)[1]
        available, why = native_engine_available()
        if engine == "native" and not available:
            pytest.skip(why)
        locker = RedisLocker(client, engine=engine)

    def locker_cycle() -> None:
        locker.try_acquire("bench", ttl=30.0).release()

    benchmark(locker_cycle)
    locker.close()
