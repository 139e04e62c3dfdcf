"""A rolling restart of every member, one after another: no partition goes unowned for a ttl.

Three members share 24 partitions; each in turn is stopped gracefully and a
new member takes its place. Meanwhile a reader asks Redis who holds each
partition (``assignment()``) every ~20 ms, and every member's callbacks are
recorded: each partition is owned again within one ttl of being let go, never
by two members at once, with a greater token each time it moves, and the
group ends balanced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis

from helpers import stays
from redlease import Partitions
from test_partitions import Recorder, balanced, wait_balanced
from test_partitions_topologies import assert_one_owner_at_a_time_with_growing_tokens, members_of

N = 24
TTL = 1.0
SAMPLE_EVERY = 0.02


class AssignmentSampler:
    """Asks ``reader.assignment()`` every ``SAMPLE_EVERY`` s on a thread of its own.

    Each sample is kept with the times its question was sent and answered,
    so that the time a partition went unowned is bounded from above: from
    the sending of the last look that saw it owned to the answer of the first
    that saw it owned again.
    """

    def __init__(self, reader: Partitions) -> None:
        self.reader = reader
        self.samples: list[tuple[float, float, dict[str, str | None]]] = []
        self.errors: list[Exception] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, name="assignment-sampler", daemon=True)

    def __enter__(self) -> AssignmentSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)

    def run(self) -> None:
        while not self.done.is_set():
            sent = time.monotonic()
            try:
                assignment = self.reader.assignment()
            except Exception as exc:  # a failed look counts against the test
                self.errors.append(exc)
            else:
                self.samples.append((sent, time.monotonic(), assignment))
            self.done.wait(SAMPLE_EVERY)

    def longest_unowned(self) -> dict[str, float]:
        """Per partition, the longest time it may have had no owner (0 when never seen so)."""
        longest = dict.fromkeys(self.reader.partitions, 0.0)
        for partition in longest:
            owned_since: float | None = None  # the last look that saw it owned was sent then
            gap = False
            for sent, answered, assignment in self.samples:
                if assignment[partition] is None:
                    gap = True
                    continue
                if gap and owned_since is not None:
                    longest[partition] = max(longest[partition], answered - owned_since)
                gap = False
                owned_since = sent
            assert not gap, f"partition {partition} unowned at the last look"
        return longest


def test_a_rolling_restart_of_every_member_leaves_no_partition_unowned_for_a_ttl(
    plain: redis.Redis,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    client = plain
    record = Recorder()
    name = "rolling"
    members = members_of(client, name, engine, ["a1", "b1", "c1"], N, TTL, record)
    record.watch(members)
    group = [started(m) for m in members]
    wait_balanced(group, N, timeout=3 * TTL + 5)
    (reader,) = members_of(client, name, engine, ["reader"], N, TTL)  # never started: reads

    with AssignmentSampler(reader) as sampler:
        for index, successor in enumerate(["a2", "b2", "c2"]):
            (newcomer,) = members_of(client, name, engine, [successor], N, TTL, record)
            record.watch([newcomer])
            leaving = group[index]
            leaving.stop()
            assert leaving.owned() == {}
            group[index] = started(newcomer)
            wait_balanced(group, N, timeout=3 * TTL + 5)
        assert stays(lambda: balanced(group, N), 0.2)

    assert sampler.errors == []
    assert len(sampler.samples) >= 10, "the reader looked too seldom to tell"
    longest = sampler.longest_unowned()
    assert max(longest.values()) < TTL, {p: round(s, 3) for p, s in longest.items() if s}
    # Every partition ends owned, 8 each, as Redis and the members say alike.
    assert sorted(len(m.owned()) for m in group) == [N // 3] * 3
    assert reader.assignment() == {p: m.member_id for m in group for p in m.owned()}
    assert reader.members() == ["a2", "b2", "c2"]

    for member in group:
        member.stop()
    tenures = assert_one_owner_at_a_time_with_growing_tokens(record)
    assert len(tenures) == N
    for old in ("a1", "b1", "c1"):
        # Each member stopped gracefully: every tenure of its own ended "rebalanced" or
        # "stopped", never "lost".
        reasons = {r for spans in tenures.values() for *_, who, _t, r in spans if who == old}
        assert reasons <= {"rebalanced", "stopped"} and "stopped" in reasons, (old, reasons)
