"""pytest-benchmark suite: a pipeline of 100 fenced writes per engine, against redis-py's.

    pytest benchmarks/bench_fence_pipeline_pytest.py --benchmark-group-by=func

Each round builds and executes one pipeline of ``BATCH`` fenced SETs through
the public API (``Elector.fence_pipeline(token)``), or, for redis-py, its own
pipeline (``transaction=False``) of the same EVALSHAs of the same script. The
printed table, with writes/s and ratios, is ``bench_fence_pipeline.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

import redlease
from redlease import _scripts
from redlease._cli.bench import native_engine_available
from redlease._keys import ElectionKeys

BATCH = 100
KEYS = [f"bench:pipe:{i}" for i in range(BATCH)]


@pytest.mark.parametrize("case", ("native", "python", "redis-py"))
def test_fenced_pipeline_of_100(benchmark: Any, client: redis.Redis, case: str) -> None:
    if case == "redis-py":
        script = _scripts.fenced_file("fence_set")
        client.script_load(script.source)
        applied = ElectionKeys("bench").applied

        def redis_py() -> None:
            pipe = client.pipeline(transaction=False)
            for key in KEYS:
                pipe.evalsha(script.sha, 2, applied, key, 1, "v")
            assert pipe.execute() == [1] * BATCH

        benchmark(redis_py)
        return
    available, why = native_engine_available()
    if case == "native" and not available:
        pytest.skip(why)
    e = redlease.Elector(client, "bench", engine=case)

    def fenced() -> None:
        pipe = e.fence_pipeline(1)
        for key in KEYS:
            pipe.set(key, "v")
        assert pipe.execute() == [True] * BATCH

    benchmark(fenced)
