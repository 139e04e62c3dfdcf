"""pytest-benchmark suite for pushed handover: resign -> successor elected, per engine.

    pytest benchmarks/bench_handover_pytest.py --benchmark-group-by=param:engine

Two electors with the default TTL (5 s; without notices a follower polls
every ~2.5 s) hand the lease back and forth against a private redis-server;
each round is one ``resign()`` until the other instance's ``on_elected``.
``benchmarks/handover.py`` prints the same figures as p50/p99 next to the
targets, and the lock waiter's.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

import redlease
from redlease._cli.bench import native_engine_available


@pytest.mark.parametrize("engine", ["python", "native"])
def test_resign_to_successor_elected(benchmark: Any, client: redis.Redis, engine: str) -> None:
    if engine == "native":
        available, why = native_engine_available()
        if not available:
            pytest.skip(why)
    elected = {"a": threading.Event(), "b": threading.Event()}

    def make(me: str) -> redlease.Elector:
        observer = redlease.Observer(on_elected=lambda _token: elected[me].set())
        return redlease.Elector(
            client, f"bench-handover-{engine}", instance_id=me, engine=engine, observer=observer
        )

    a, b = make("a"), make("b")
    a.start()
    assert elected["a"].wait(10)
    b.start()
    time.sleep(0.3)  # b follows and listens
    state = {"leader": "a"}

    def setup() -> None:
        time.sleep(0.02)  # the previous leader is back to waiting
        elected["b" if state["leader"] == "a" else "a"].clear()

    def handover() -> None:
        leader = state["leader"]
        successor = "b" if leader == "a" else "a"
        (a if leader == "a" else b).resign()
        assert elected[successor].wait(10)
        state["leader"] = successor

    try:
        benchmark.pedantic(handover, setup=setup, rounds=50, iterations=1)
    finally:
        a.stop()
        b.stop()
