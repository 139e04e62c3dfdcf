"""Many contenders, many short terms: the fence's invariants hold under churn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

import redlease
from helpers import make_elector

APPEND = "redis.call('rpush', KEYS[2], ARGV[2])"
CONTENDERS = 8


@pytest.mark.slow
def test_contenders_get_unique_increasing_tokens_and_applied_writes_never_go_back(
    client: redis.Redis, engine: str
) -> None:
    lock = threading.Lock()
    minted: dict[str, list[int]] = {}

    def leader(name: str) -> Callable[[redlease.Term, redlease.Fencer], None]:
        def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
            with lock:
                minted[name].append(term.token)
            # One fenced write per term; the list records the order Redis applied them in.
            fencer.eval(APPEND, keys=["applied-log"], args=[term.token])

        return lead

    electors = []
    for i in range(CONTENDERS):
        name = f"contender-{i}"
        minted[name] = []
        electors.append(
            make_elector(client, engine, ttl=0.3, acquire_interval=0.01, instance_id=name)
        )
    for i, e in enumerate(electors):
        e.start(leader(f"contender-{i}"))
    deadline = time.monotonic() + 15.0
    try:
        while time.monotonic() < deadline:
            with lock:
                if sum(len(v) for v in minted.values()) >= 200:
                    break
            time.sleep(0.05)
    finally:
        for e in electors:
            e.stop()

    all_tokens = [t for tokens in minted.values() for t in tokens]
    assert len(all_tokens) >= 200, f"only {len(all_tokens)} terms in 15 s"
    assert len(set(all_tokens)) == len(all_tokens), "a token was minted twice"
    winners = [name for name, tokens in minted.items() if tokens]
    assert len(winners) >= 2, f"leadership never changed hands: {winners}"
    for name, tokens in minted.items():
        assert tokens == sorted(tokens), f"{name} saw its tokens go backwards: {tokens}"
    applied = [int(t) for t in client.lrange("applied-log", 0, -1)]
    assert applied == sorted(applied), "an applied write carried a token below an earlier one"
    assert set(applied) <= set(all_tokens)
    assert len(applied) >= len(all_tokens) // 2
    assert int(client.get("svc:fence:applied") or 0) == max(all_tokens)
