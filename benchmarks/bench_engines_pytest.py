"""pytest-benchmark suite: fenced writes and control round trips per engine.

    pytest benchmarks/bench_engines_pytest.py --benchmark-group-by=func

Fenced SET through an Elector on each engine, against redis-py + hiredis
running the same script by EVALSHA, on one private redis-server. Renew
lateness under load is not a per-call figure: see ``renew_lateness.py``.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

import redlease
from redlease import _scripts
from redlease._cli.bench import native_engine_available
from redlease._keys import ElectionKeys

CASES = ("native", "python", "redis-py")


def _engine_or_skip(case: str) -> None:
    available, why = native_engine_available()
    if case == "native" and not available:
        pytest.skip(why)


@pytest.mark.parametrize("case", CASES)
def test_fenced_set(benchmark: Any, client: redis.Redis, case: str) -> None:
    if case == "redis-py":
        script = _scripts.fenced_file("fence_set")
        client.script_load(script.source)

        def write() -> None:
            client.evalsha(script.sha, 2, ElectionKeys("bench").applied, "bench:value", "1", "v")

        benchmark(write)
        return
    _engine_or_skip(case)
    e = redlease.Elector(client, "bench", engine=case)

    def fenced() -> None:
        assert e.fence_set(1, "bench:value", "v")

    benchmark(fenced)


@pytest.mark.parametrize("case", ("native", "python"))
def test_election_cycle(benchmark: Any, client: redis.Redis, case: str) -> None:
    """Start, win, stop (release): the control path end to end."""
    _engine_or_skip(case)
    e = redlease.Elector(client, f"bench-cycle-{case}", ttl=1.0, engine=case)

    def cycle() -> None:
        e.start(None)
        while e.token() is None:
            time.sleep(0)  # yield the GIL: a busy spin would hold it for the switch interval
        e.stop()

    benchmark(cycle)
