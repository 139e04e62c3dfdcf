"""Partitioned ownership: exclusive, fenced, balanced, sticky, cooperative, on both engines.

Every member here is a real ``Partitions`` on a real redis-server the test
starts; the killed and the frozen member run in processes of their own.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import redis

import redlease
from helpers import stays, wait_until
from redlease import Partitions
from redlease._testing import RedisServer
from tls_helpers import require_native_tls

NAME = "orders"


def make(
    client: Any, engine: str, member_id: str, partitions: Any = 12, **options: Any
) -> Partitions:
    options.setdefault("ttl", 0.5)
    return Partitions(client, NAME, partitions, member_id=member_id, engine=engine, **options)


def listeners(client: redis.Redis) -> int:
    """How many connections listen to the group's notices (one per process and server)."""
    ((_, count),) = client.pubsub_numsub(f"{NAME}:members:released")
    return int(count)


def sizes(*members: Partitions) -> list[int]:
    return sorted(len(m.owned()) for m in members)


def balanced(members: Sequence[Partitions], n: int) -> bool:
    """Every partition owned by exactly one member, each owning floor(n/m) or ceil(n/m)."""
    owned = [m.owned() for m in members]
    every = [p for each in owned for p in each]
    floor, ceil = n // len(members), -(-n // len(members))
    return (
        len(every) == n
        and len(set(every)) == n
        and all(floor <= len(each) <= ceil for each in owned)
    )


def wait_balanced(members: Sequence[Partitions], n: int, timeout: float = 10.0) -> None:
    wait_until(lambda: balanced(members, n), timeout, what=f"{n} partitions balanced")


class Recorder:
    """Callbacks that record (monotonic time, member, event, partition, detail, thread).

    ``on_assigned`` is recorded as it is called, ``on_revoked`` as it returns.
    """

    def __init__(self) -> None:
        self.events: list[tuple[float, str, str, str, Any, threading.Thread]] = []
        self.mutex = threading.Lock()
        self.watched: list[Partitions] = []
        self.doubled: list[tuple[float, str, str, list[str]]] = []

    def watch(self, members: Sequence[Partitions]) -> None:
        """From now on, each ``on_assigned`` also asks ``members`` (and those watched
        before) whether they own the partition.

        A member whose ``owned()`` lists a partition as another member is
        assigned it believed it held the partition at the same time:
        ``doubled`` keeps ``(at, assigned member, partition, the others)``.
        """
        with self.mutex:
            self.watched = [*self.watched, *members]

    def callbacks(self, member_id: str) -> dict[str, Any]:
        def assigned(partition: str, token: int) -> None:
            others = [
                m.member_id
                for m in self.watched
                if m.member_id != member_id and partition in m.owned()
            ]
            if others:
                with self.mutex:
                    self.doubled.append((time.monotonic(), member_id, partition, others))
            self.add(member_id, "assigned", partition, token)

        def revoked(partition: str, reason: str) -> None:
            # Recorded as it returns (a successor may take over only after that),
            # and not at once: a hand-over that did not wait for it would show.
            time.sleep(0.01)
            self.add(member_id, "revoked", partition, reason)

        return {"on_assigned": assigned, "on_revoked": revoked}

    def add(self, member_id: str, event: str, partition: str, detail: Any) -> None:
        with self.mutex:
            self.events.append(
                (time.monotonic(), member_id, event, partition, detail, threading.current_thread())
            )

    def of(self, member_id: str, event: str | None = None) -> list[tuple[str, Any]]:
        with self.mutex:
            return [
                (p, d)
                for _, m, e, p, d, _ in self.events
                if m == member_id and (event is None or e == event)
            ]


# -- arguments ------------------------------------------------------------------------------


BAD_ARGUMENTS = [
    ({"partitions": 0}, "partitions must be at least 1"),
    ({"partitions": -3}, "partitions must be at least 1"),
    ({"partitions": True}, "not a bool"),
    ({"partitions": 2.5}, "got float 2.5"),
    ({"partitions": "abc"}, "a bare str is not a sequence of names"),
    ({"partitions": b"ab"}, "a bare bytes is not a sequence of names"),
    ({"partitions": {"a"}}, "got set"),
    ({"partitions": []}, "at least one partition"),
    ({"partitions": ["a", "b", "a"]}, "must be distinct, got ['a'] more than once"),
    ({"partitions": ["a", ""]}, "must not be empty, got '' at index 1"),
    ({"partitions": ["a", 2]}, "must be a str, got int 2 at index 1"),
    ({"partitions": 70000}, "at most 65536"),
    ({"name": ""}, "name must not be empty"),
    ({"name": 7}, "name must be a str"),
    ({"ttl": 0}, "ttl must be positive"),
    ({"ttl": -1}, "ttl must be positive"),
    ({"ttl": float("nan")}, "NaN"),
    ({"ttl": True}, "not a bool"),
    ({"ttl": 0.05}, "ttl must be at least 0.1 s"),
    ({"ttl": "1"}, "ttl must be a duration"),
    ({"member_id": ""}, "member_id must not be empty"),
    ({"member_id": 5}, "member_id must be a str, got int 5"),
    ({"on_assigned": "print"}, "on_assigned must be callable as on_assigned(partition, token)"),
    ({"on_revoked": 3}, "on_revoked must be callable as on_revoked(partition, reason)"),
    ({"observer": print}, "observer must be a redlease.Observer"),
    ({"engine": "turbo"}, "engine must be one of auto, native, python; got 'turbo'"),
    ({"client": None}, "client must be a redis client"),
]


@pytest.mark.parametrize(
    ("change", "message"), BAD_ARGUMENTS, ids=[str(c) for c, _ in BAD_ARGUMENTS]
)
def test_a_bad_argument_is_a_config_error_naming_the_rule_and_the_value(
    plain: redis.Redis, change: dict[str, Any], message: str
) -> None:
    arguments: dict[str, Any] = {"client": plain, "name": NAME, "partitions": 4}
    arguments.update(change)
    with pytest.raises(redlease.ConfigError) as raised:
        Partitions(
            arguments.pop("client"), arguments.pop("name"), arguments.pop("partitions"), **arguments
        )
    assert message in str(raised.value)


def test_an_asyncio_client_is_refused_with_the_face_to_use(redis_server: RedisServer) -> None:
    client = redis_server.client(asyncio=True)
    with pytest.raises(redlease.ConfigError, match=r"redlease\.aio"):
        Partitions(client, NAME, 4)


def test_fencer_of_a_name_not_in_the_set_is_a_config_error(plain: redis.Redis) -> None:
    parts = Partitions(plain, NAME, 3)
    with pytest.raises(redlease.ConfigError, match=r"partition '7' is not in .*3 partitions"):
        parts.fencer("7")
    with pytest.raises(redlease.ConfigError, match=r"partition names are str: '1'"):
        parts.fencer(1)  # type: ignore[arg-type]


def test_an_int_and_its_names_are_the_same_partitions(plain: redis.Redis) -> None:
    assert Partitions(plain, NAME, 3).partitions == ("0", "1", "2")
    assert Partitions(plain, NAME, ["b", "a"]).partitions == ("b", "a")
    assert Partitions(plain, NAME, 1).member_id  # hostname-hex by default


# -- owning ---------------------------------------------------------------------------------


def test_owned_is_empty_before_start_and_after_stop(client: redis.Redis, engine: str) -> None:
    parts = make(client, engine, "m1", 4)
    assert parts.owned() == {}
    assert parts.engine == engine
    with parts:
        wait_until(lambda: len(parts.owned()) == 4, what="all four owned")
        assert client.zscore(f"{NAME}:members", "m1") is not None
    assert parts.owned() == {}
    assert parts.members() == []
    assert parts.assignment() == {str(i): None for i in range(4)}
    assert not parts.fencer("0")


def test_a_lone_member_owns_every_partition_with_a_token_each(
    client: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    parts = started(make(client, engine, "m1", ["a", "b", "c"]))
    owned = wait_until(lambda: len(parts.owned()) == 3 and parts.owned(), what="all owned")
    assert owned == {"a": 1, "b": 1, "c": 1}
    for p, token in owned.items():
        assert client.get(f"{NAME}:p:{p}:leader") == b"m1"
        assert client.get(f"{NAME}:p:{p}:fence") == str(token).encode()
    assert parts.assignment() == {"a": "m1", "b": "m1", "c": "m1"}
    assert parts.members() == ["m1"]


def test_a_member_can_be_started_again_after_a_stop(plain: redis.Redis, engine: str) -> None:
    parts = make(plain, engine, "m1", 2)
    for _ in range(2):
        parts.start()
        first = wait_until(lambda: len(parts.owned()) == 2 and parts.owned(), what="owned")
        with pytest.raises(RuntimeError, match="already running"):
            parts.start()
        parts.stop()
        assert parts.owned() == {}
    assert first == {"0": 2, "1": 2}  # taken again: new, greater tokens


@pytest.mark.parametrize("n", [12, 7])
def test_joins_balance_one_two_three_members_to_floor_or_ceil(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions], n: int
) -> None:
    members = [started(make(plain, engine, "m1", n))]
    wait_balanced(members, n)
    for member_id in ("m2", "m3"):
        members.append(started(make(plain, engine, member_id, n)))
        wait_balanced(members, n, timeout=3 * 0.5 + 5)
        assert stays(lambda: balanced(members, n), 0.3)
    assert sizes(*members) == sorted([n // 3 + (1 if i < n % 3 else 0) for i in range(3)])
    assignment = members[0].assignment()
    for member in members:
        assert all(assignment[p] == member.member_id for p in member.owned())
    assert members[0].members() == ["m1", "m2", "m3"]


def test_a_join_moves_only_what_the_newcomer_takes(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    first, second = started(make(plain, engine, "m1")), started(make(plain, engine, "m2"))
    wait_balanced([first, second], 12)
    before = {**first.owned(), **second.owned()}
    third = started(make(plain, engine, "m3"))
    wait_balanced([first, second, third], 12)
    taken = third.owned()
    assert len(taken) == 4
    # Every partition the newcomer did not take kept its owner and its token.
    after = {**first.owned(), **second.owned()}
    assert after == {p: t for p, t in before.items() if p not in taken}
    assert all(taken[p] > before[p] for p in taken)


def test_every_join_moves_only_what_the_newcomer_takes_when_shares_are_uneven(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    # 7 over 1..5 members (4/3, 3/2/2, 2/2/2/1, 2/2/1/1/1), each newcomer sorting
    # before the others until the last: no old member gains a partition or a new token.
    members: list[Partitions] = []
    for member_id in ("d", "c", "b", "a", "e"):
        before = [m.owned() for m in members]
        newcomer = started(make(plain, engine, member_id, 7))
        members.append(newcomer)
        wait_balanced(members, 7)
        assert stays(lambda: balanced(members, 7), 0.2)
        given: dict[str, int] = {}
        for member, had in zip(members, before, strict=False):
            now = member.owned()
            assert {p: had[p] for p in now} == now, f"{member.member_id} took or re-took"
            given.update({p: t for p, t in had.items() if p not in now})
        taken = newcomer.owned()
        assert set(taken) == set(given) or not before
        assert all(taken[p] > given[p] for p in given)


def test_a_leave_moves_only_the_departed_members_partitions(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    members = [started(make(plain, engine, f"m{i}", 12)) for i in (1, 2, 3)]
    wait_balanced(members, 12)
    kept = [members[0].owned(), members[1].owned()]
    leaving = members[2].owned()
    members[2].stop()
    wait_balanced(members[:2], 12)
    for survivor, before in zip(members[:2], kept, strict=True):
        now = survivor.owned()
        assert {p: now[p] for p in before} == before  # nothing of its own moved
        assert set(now) - set(before) <= set(leaving)
        assert all(now[p] > leaving[p] for p in set(now) - set(before))


def test_a_graceful_stop_hands_over_at_once_not_at_the_next_poll(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    # ttl 60 s: members poll every 15 s, so a take-over within 1.5 s is the notice's doing.
    stays_on = started(make(plain, engine, "m1", 4, ttl=60))
    # Its notices are subscribed in the background: a join before that would wait a poll.
    wait_until(lambda: listeners(plain) == 1, what="the first member listening")
    leaves = started(make(plain, engine, "m2", 4, ttl=60))
    wait_balanced([stays_on, leaves], 4)
    assert stays(lambda: balanced([stays_on, leaves], 4), 0.2)  # nothing left to look at soon
    stopped_at = time.monotonic()
    leaves.stop()
    assert leaves.owned() == {}
    assert plain.zscore(f"{NAME}:members", "m2") is None  # left before stop() returned
    assert not any(plain.get(f"{NAME}:p:{p}:leader") == b"m2" for p in "0123")
    wait_until(lambda: len(stays_on.owned()) == 4, timeout=1.5, what="taken over")
    assert time.monotonic() - stopped_at < 1.5


def test_no_two_members_hold_a_partition_at_once_through_joins_and_stops(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    record = Recorder()
    members: dict[str, Partitions] = {}

    def join(member_id: str) -> None:
        members[member_id] = started(
            make(plain, engine, member_id, 8, **record.callbacks(member_id))
        )

    for step in ["+a", "+b", "+c", "-a", "+d", "-b", "+a", "-c"]:
        if step[0] == "+":
            join(step[1])
        else:
            members.pop(step[1]).stop()
        wait_balanced(list(members.values()), 8)
    for member in members.values():
        member.stop()
    tenures: dict[str, list[tuple[float, float, str, int]]] = {}
    opened: dict[tuple[str, str], tuple[float, int]] = {}
    for at, member_id, event, partition, detail, _ in record.events:
        if event == "assigned":
            assert (member_id, partition) not in opened
            opened[(member_id, partition)] = (at, detail)
        else:
            assert detail in ("rebalanced", "stopped")
            start, token = opened.pop((member_id, partition))
            tenures.setdefault(partition, []).append((start, at, member_id, token))
    assert not opened, "every tenure ended with on_revoked"
    for partition, spans in tenures.items():
        spans.sort()
        for (_, ended, who, token), (began, _, successor, next_token) in itertools.pairwise(spans):
            assert ended < began, f"{partition}: {who} and {successor} overlapped"
            assert next_token > token, f"{partition}: tokens must increase across owners"


def test_members_on_a_tls_server_share_the_partitions(tls_server: RedisServer, engine: str) -> None:
    if engine == "native":
        require_native_tls()
    client = tls_server.client(socket_timeout=5)
    first, second = make(client, engine, "m1", 4), make(client, engine, "m2", 4)
    with first, second:
        wait_balanced([first, second], 4)
        (partition, token), *_ = second.owned().items()
        assert second.fencer(partition).set(f"data:{partition}", "m2")
        assert client.get(f"{NAME}:p:{partition}:fence:applied") == str(token).encode()
    assert first.owned() == second.owned() == {}
    client.close()


# -- fenced writes -----------------------------------------------------------------------------


def test_a_stale_owners_write_is_rejected_once_a_newer_owner_took_the_partition(
    client: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    old = started(make(client, engine, "m1", 2))
    wait_until(lambda: len(old.owned()) == 2, what="both owned")
    fencers = {p: old.fencer(p) for p in ("0", "1")}
    assert all(f.set(f"data:{p}", "m1") for p, f in fencers.items())
    new = started(make(client, engine, "m2", 2))
    wait_balanced([old, new], 2)
    ((moved, token),) = new.owned().items()
    assert token > fencers[moved].token
    assert not fencers[moved].set(f"data:{moved}", "stale m1")
    assert new.fencer(moved).set(f"data:{moved}", "m2")
    assert client.get(f"data:{moved}") == b"m2"
    kept = next(p for p in fencers if p != moved)
    assert fencers[kept].set(f"data:{kept}", "still m1")  # kept: same tenure, same token
    assert not new.fencer(kept)  # inert: not its partition


# -- callbacks ----------------------------------------------------------------------------------


def test_callbacks_run_on_the_member_thread_in_order_per_partition(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    record = Recorder()
    first = started(make(plain, engine, "m1", 4, **record.callbacks("m1")))
    wait_until(lambda: len(record.of("m1", "assigned")) == 4, what="assigned")
    assert sorted(record.of("m1")) == [(p, 1) for p in "0123"]
    second = started(make(plain, engine, "m2", 4, **record.callbacks("m2")))
    wait_balanced([first, second], 4)
    wait_until(lambda: len(record.of("m2", "assigned")) == 2, what="m2 told")
    moved = {p for p, _ in record.of("m2", "assigned")}
    assert {p: r for p, r in record.of("m1", "revoked")} == {p: "rebalanced" for p in moved}
    first.stop()
    stopped = [(p, r) for p, r in record.of("m1", "revoked") if r == "stopped"]
    assert sorted(stopped) == sorted((p, "stopped") for p in set("0123") - moved)
    threads = {t for _, m, _, _, _, t in record.events if m == "m1"}
    assert len(threads) == 1 and threading.current_thread() not in threads


def test_a_callback_that_raises_is_logged_and_observed_and_the_member_carries_on(
    plain: redis.Redis,
    engine: str,
    started: Callable[[Partitions], Partitions],
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors: list[Exception] = []
    raised: list[Exception] = []

    def failing(partition: str, detail: object) -> None:
        exc = ValueError(f"boom {partition} {detail}")
        raised.append(exc)
        raise exc

    caplog.set_level(logging.WARNING, logger="redlease")
    first = started(
        make(
            plain,
            engine,
            "m1",
            4,
            on_assigned=failing,
            on_revoked=failing,
            observer=redlease.Observer(on_error=errors.append),
        )
    )
    wait_until(lambda: len(first.owned()) == 4 and len(raised) == 4, what="owned, all raised")
    second = started(make(plain, engine, "m2", 4))
    # Its on_revoked raised, and the partitions were handed over all the same.
    wait_balanced([first, second], 4)
    wait_until(lambda: len(raised) == 6, what="the revocations raised too")
    assert [e for e in errors if isinstance(e, ValueError)] == raised
    warned = [
        r for r in caplog.records if r.levelno == logging.WARNING and "boom" in r.getMessage()
    ]
    assert len(warned) == 6


def test_stop_from_a_callback_ends_the_run_once_it_returns(plain: redis.Redis, engine: str) -> None:
    stopped = threading.Event()
    parts: Partitions

    def assigned(partition: str, token: int) -> None:
        parts.stop()  # returns at once: the run ends after this callback
        stopped.set()

    parts = make(plain, engine, "m1", 2, on_assigned=assigned)
    parts.start()
    assert stopped.wait(5)
    wait_until(lambda: plain.zscore(f"{NAME}:members", "m1") is None, what="left")
    parts.stop()
    assert parts.owned() == {}
    assert parts.assignment() == {"0": None, "1": None}


# -- the partition set ------------------------------------------------------------------------


def test_members_with_different_partition_sets_are_refused_at_start(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    first = started(make(plain, engine, "m1", 4))
    other = make(plain, engine, "m2", 5)
    with pytest.raises(redlease.ConfigError) as raised:
        other.start()
    message = str(raised.value)
    assert "4 partitions '0' .. '3'" in message and "5 partitions '0' .. '4'" in message
    assert other.owned() == {}
    assert plain.zscore(f"{NAME}:members", "m2") is None
    # The same set in another order (and N against its names) is the same set.
    same = started(make(plain, engine, "m3", ["3", "1", "2", "0"]))
    wait_balanced([first, same], 4)
    # Once every member of the old set is gone, a new set replaces it.
    first.stop()
    same.stop()
    assert plain.exists(f"{NAME}:partitions") == 0
    replaced = started(make(plain, engine, "m2", 5))
    wait_until(lambda: len(replaced.owned()) == 5, what="the new set owned")


# -- failures -----------------------------------------------------------------------------------


def test_a_failing_redis_shrinks_owned_as_leases_can_no_longer_be_proven(
    redis_server: RedisServer,
    plain: redis.Redis,
    engine: str,
    started: Callable[[Partitions], Partitions],
) -> None:
    record = Recorder()
    errors: list[Exception] = []
    parts = started(
        make(
            plain,
            engine,
            "m1",
            3,
            ttl=0.5,
            observer=redlease.Observer(on_error=errors.append),
            **record.callbacks("m1"),
        )
    )
    before = wait_until(lambda: len(parts.owned()) == 3 and parts.owned(), what="owned")
    redis_server.pause()
    paused_at = time.monotonic()
    try:
        wait_until(lambda: parts.owned() == {}, timeout=5, what="owned() shrank")
        # Never past the TTL from the last renewal it could prove.
        assert time.monotonic() - paused_at < 0.5 + 1.0
        wait_until(lambda: len(record.of("m1", "revoked")) == 3, what="on_revoked lost")
        assert {r for _, r in record.of("m1", "revoked")} == {"lost"}
        assert errors
        assert all(isinstance(e, redis.exceptions.RedisError) for e in errors)
    finally:
        redis_server.resume()
    after = wait_until(lambda: len(parts.owned()) == 3 and parts.owned(), 10, what="back")
    assert all(after[p] > before[p] for p in after)


def test_a_fenced_write_answered_readonly_reports_its_partition_lost_at_once(
    engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    # A ttl of 30 s: the member looks at the group every 7.5 s and renews every 10 s,
    # so only the write's own wake-up reports the loss within a second.
    with RedisServer() as server, RedisServer() as master:
        client = server.client()
        record = Recorder()
        member = started(make(client, engine, "m1", 2, ttl=30.0, **record.callbacks("m1")))
        wait_until(lambda: len(member.owned()) == 2, what="both owned")
        fencer = member.fencer("0")
        assert fencer.set("data:0", "m1")
        client.replicaof(*master.address)  # read-only from now on
        with pytest.raises(redis.exceptions.ReadOnlyError, match="read only replica"):
            fencer.set("data:0", "m1 again")
        answered = time.monotonic()
        assert "0" not in member.owned()
        wait_until(lambda: ("0", "lost") in record.of("m1", "revoked"), 5, what="reported")
        assert time.monotonic() - answered < 1.0
        client.close()


_MEMBER = textwrap.dedent(
    """
    import json, sys, redis
    from redlease import Partitions
    port, name, n, ttl, member_id, engine = sys.argv[1:]
    parts = Partitions(redis.Redis(port=int(port)), name, int(n), ttl=float(ttl),
                       member_id=member_id, engine=engine).start()
    print("ready", flush=True)
    fencers = {}
    for line in sys.stdin:
        command = line.strip()
        if command == "owned":
            print(json.dumps(parts.owned()), flush=True)
        elif command == "keep":
            fencers = {p: parts.fencer(p) for p in parts.owned()}
            print(json.dumps({p: f.token for p, f in fencers.items()}), flush=True)
        elif command == "write":
            applied = {p: f.set(name + ":data:" + p, member_id) for p, f in fencers.items()}
            print(json.dumps(applied), flush=True)
    """
)


class ProcessMember:
    """A ``Partitions`` member in another process, answering one JSON line per command."""

    def __init__(self, server: RedisServer, n: int, ttl: float, member_id: str, engine: str):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _MEMBER,
                str(server.port),
                NAME,
                str(n),
                str(ttl),
                member_id,
                engine,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def ask(self, command: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.proc.pid, sig)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def process_member(redis_server: RedisServer) -> Iterator[Callable[..., ProcessMember]]:
    made: list[ProcessMember] = []

    def spawn(n: int, ttl: float, member_id: str, engine: str) -> ProcessMember:
        member = ProcessMember(redis_server, n, ttl, member_id, engine)
        made.append(member)
        return member

    try:
        yield spawn
    finally:
        for member in made:
            member.signal(signal.SIGCONT)
            member.close()


def test_a_killed_members_partitions_are_taken_within_three_ttls(
    plain: redis.Redis,
    engine: str,
    started: Callable[[Partitions], Partitions],
    process_member: Callable[..., ProcessMember],
) -> None:
    ttl = 0.5
    survivor = started(make(plain, engine, "m1", 8, ttl=ttl))
    doomed = process_member(8, ttl, "doomed", engine)
    wait_until(lambda: len(survivor.owned()) == 4 and len(doomed.ask("owned")) == 4, 10)
    kept, lost = survivor.owned(), doomed.ask("owned")
    doomed.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: len(survivor.owned()) == 8, timeout=3 * ttl + 5, what="all taken")
    assert time.monotonic() - killed_at < 3 * ttl + 5
    now = survivor.owned()
    assert {p: now[p] for p in kept} == kept  # a death moves only the dead member's
    assert all(now[p] > token for p, token in lost.items())
    assert survivor.members() == ["m1"]


def test_a_frozen_members_write_after_it_resumes_is_rejected(
    plain: redis.Redis,
    engine: str,
    started: Callable[[Partitions], Partitions],
    process_member: Callable[..., ProcessMember],
) -> None:
    ttl = 0.5
    survivor = started(make(plain, engine, "m1", 6, ttl=ttl))
    frozen = process_member(6, ttl, "frozen", engine)
    wait_until(lambda: len(survivor.owned()) == 3 and len(frozen.ask("owned")) == 3, 10)
    stale = frozen.ask("keep")
    assert all(frozen.ask("write").values())  # while it owns them, its writes apply
    frozen.signal(signal.SIGSTOP)
    wait_until(lambda: len(survivor.owned()) == 6, timeout=3 * ttl + 5, what="taken over")
    successor = survivor.owned()
    for p, token in stale.items():
        assert successor[p] > token
        assert survivor.fencer(p).set(f"{NAME}:data:{p}", "m1")
    frozen.signal(signal.SIGCONT)
    applied = frozen.ask("write")  # the zombie writes with the tokens it kept
    assert applied == {p: False for p in stale}
    assert all(plain.get(f"{NAME}:data:{p}") == b"m1" for p in stale)
    for p, token in frozen.ask("owned").items():
        assert p not in stale or token > stale[p]  # never an old token again


# -- one renewer ---------------------------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))  # native threads included


def test_every_partition_is_renewed_by_the_engines_one_renewer(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    before = _threads()
    members = [started(make(plain, engine, f"m{i}", 64, ttl=1.0)) for i in (1, 2)]
    wait_balanced(members, 64)
    time.sleep(0.5)  # renewals under way
    # Two run threads, the renewer, the notice listener: never a thread per partition.
    assert _threads() - before <= 2 + 4
    assert all(plain.pttl(f"{NAME}:p:{p}:leader") > 0 for p in range(64))


def test_a_fenced_write_answered_readonly_ends_that_tenure_at_once(
    redis_server: RedisServer, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    # As an elector's term does: a partition whose fenced write finds the server turned
    # replica is dropped from owned() now, not at its lease's end (ttl 30 s here).
    client = redis_server.client(socket_timeout=5)
    member = started(make(client, engine, "solo", 4, ttl=30.0))
    wait_until(lambda: len(member.owned()) == 4, 10, what="the lone member owns all")
    fencer = member.fencer("0")
    assert fencer.set("ro:k", "before") is True
    with RedisServer() as master:
        client.replicaof("127.0.0.1", master.port)
        try:
            with pytest.raises(redis.exceptions.ResponseError, match=r"READONLY|read only"):
                fencer.set("ro:k", "refused")
            assert "0" not in member.owned()
        finally:
            client.replicaof("no", "one")
    client.close()


# -- wait_owned: block until this member holds its balanced share ---------------------------


def _ghost(client: redis.Redis, member: Partitions, partition: str) -> None:
    """Hold ``partition``'s lease at Redis for a member that is not in the group."""
    client.set(member._core.parts[partition].lease_key, "ghost", px=60_000)


def test_wait_owned_one_member_of_n_gets_all_n(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    member = started(make(plain, engine, "a", 12))
    owned = member.wait_owned(timeout=10)
    assert list(owned) == [str(i) for i in range(12)]
    assert all(token > 0 for token in owned.values())
    assert member.wait_owned(timeout=0) == member.owned()  # held: no wait at all


def test_wait_owned_two_members_each_return_their_share_and_cover_the_set(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    a = started(make(plain, engine, "a", 13))
    assert len(a.wait_owned(timeout=10)) == 13
    b = started(make(plain, engine, "b", 13))
    # b's share needs a's hand-over, which a makes on the look that saw b join:
    # once b holds its share, a's last look has computed a's share for two members.
    of_b = b.wait_owned(timeout=10)
    of_a = a.wait_owned(timeout=10)
    assert sorted([len(of_a), len(of_b)]) == [6, 7]
    assert set(of_a) | set(of_b) == {str(i) for i in range(13)}
    assert not set(of_a) & set(of_b)


def test_wait_owned_past_its_timeout_raises_timeout_error(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    member = make(plain, engine, "a", 4)
    _ghost(plain, member, "2")  # a lease no member of the group can take before it ends
    started(member)
    wait_until(lambda: len(member.owned()) == 3, 10, what="the three free partitions taken")
    began = time.monotonic()
    with pytest.raises(TimeoutError, match="balanced share"):
        member.wait_owned(timeout=0.3)
    assert time.monotonic() - began >= 0.3
    plain.delete(member._core.parts["2"].lease_key)  # the ghost is gone: the share completes
    assert len(member.wait_owned(timeout=10)) == 4


def test_wait_owned_raises_runtime_error_when_not_running_and_checks_its_timeout(
    plain: redis.Redis, engine: str
) -> None:
    member = make(plain, engine, "a", 2)
    with pytest.raises(RuntimeError, match="not running"):
        member.wait_owned(timeout=1)
    for bad in (-1, float("nan"), True, "1"):
        with pytest.raises(redlease.ConfigError, match="wait_owned timeout"):
            member.wait_owned(timeout=bad)  # type: ignore[arg-type]
    with member:
        assert len(member.wait_owned(timeout=10)) == 2
    with pytest.raises(RuntimeError, match="not running"):
        member.wait_owned(timeout=1)


def test_wait_owned_wakes_with_runtime_error_when_the_member_stops_meanwhile(
    plain: redis.Redis, engine: str
) -> None:
    member = make(plain, engine, "a", 3)
    _ghost(plain, member, "0")
    member.start()
    failed: list[BaseException] = []

    def waiter() -> None:
        try:
            member.wait_owned()  # forever, but for the stop
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    wait_until(lambda: len(member.owned()) == 2, 10, what="the two free partitions taken")
    member.stop(10)
    thread.join(10)
    assert not thread.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], RuntimeError)


def test_wait_owned_waits_for_the_share_of_the_members_live_now(
    plain: redis.Redis, engine: str, started: Callable[[Partitions], Partitions]
) -> None:
    """The share is recomputed at each look: a join while a member waits lowers its share
    to what two members each hold, and the wait returns with that."""
    a = make(plain, engine, "a", 4)
    _ghost(plain, a, "2")  # alone, a's share is all 4: it cannot get there
    started(a)
    wait_until(lambda: len(a.owned()) == 3, 10, what="the three free partitions taken")
    returned: list[dict[str, int]] = []
    waiter = threading.Thread(target=lambda: returned.append(a.wait_owned(timeout=30)))
    waiter.start()
    assert stays(lambda: not returned, 0.3)  # still short of 4
    b = started(make(plain, engine, "b", 4))
    waiter.join(30)
    assert len(returned) == 1 and len(returned[0]) == 2  # 4 // 2: a handed one to b
    assert "2" not in returned[0]
    with pytest.raises(TimeoutError):
        b.wait_owned(timeout=0.3)  # b's share needs the ghost's partition
