"""The native renewer renews many leases in one call of lua/renew_many.lua.

Leases of renew.lua (an elector's string lease) and lock_refresh.lua (a lock
hash) that fall due together are renewed up to 100 to a call; each lease
still has its own outcome: its element of the reply is its alone, and an
error reply to the whole call is every lease's, as if each had had it. On a
Cluster node the call declares no key; a lease whose key the node does not
serve is renewed again at once on its own, so a moved slot is followed.
Against real redis-server processes started here (and the fake server for a
reply no server gives).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from engine_helpers import RENEW, Server, endpoint_at, wait_state
from helpers import require_native, wait_until
from redlease._engine import ACTIVE, LOST
from redlease._engine.rules import replytable
from redlease._scripts import load
from redlease._testing import ClusterSet, RedisServer, key_slot
from redlease._testing.fake import FakeRedis, array
from topology_helpers import close_all_engines

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

REFRESH = load("lock_refresh")
RENEW_MANY = load("renew_many")
TTL = 10.0
"""Long: a lease that is renewed no more would still be ACTIVE for the whole test."""
INTERVAL = 0.2


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


class Leases:
    """Native leases of one engine: string keys (renew.lua) and lock hashes (lock_refresh.lua)."""

    def __init__(self, engine: Any, rc: Any) -> None:
        self.engine, self.rc = engine, rc
        self.made: list[Any] = []
        self.keys: dict[int, str] = {}

    def string(self, key: str, owner: str = "me") -> Any:
        lease = self.engine.keeper(
            (RENEW, [key], [owner, int(TTL * 1000)]), interval=INTERVAL, ttl=TTL
        )
        assert self.rc.set(key, owner, px=int(TTL * 1000))
        return self._made(lease, key)

    def hash(self, key: str, owner: str = "me") -> Any:
        lease = self.engine.keeper(
            (REFRESH, [key], [owner, int(TTL * 1000)]), interval=INTERVAL, ttl=TTL
        )
        self.rc.hset(key, mapping={"owner": owner, "token": 1})
        self.rc.pexpire(key, int(TTL * 1000))
        return self._made(lease, key)

    def _made(self, lease: Any, key: str) -> Any:
        self.made.append(lease)
        self.keys[id(lease)] = key
        return lease

    def begin_all(self) -> None:
        now = time.monotonic()
        for i, lease in enumerate(self.made):
            lease.begin(i + 1, now)

    def wait_renewed(self, leases: list[Any], times: int = 2, timeout: float = 10.0) -> None:
        start = {id(lease): lease.renewals for lease in leases}
        wait_until(
            lambda: all(lease.renewals >= start[id(lease)] + times for lease in leases),
            timeout,
            what=f"{len(leases)} leases renewed {times} more times",
        )

    def close(self) -> None:
        for lease in self.made:
            lease.close()


def native_engine(endpoint: Any) -> Any:
    require_native()
    from redlease._engine.engines.native import NativeEngine

    return NativeEngine(endpoint, write_timeout=None)


@pytest.fixture
def plain() -> Iterator[tuple[Server, redis.Redis, Leases]]:
    server = Server()
    rc = server.client()
    engine = native_engine(server.endpoint())
    leases = Leases(engine, rc)
    try:
        yield server, rc, leases
    finally:
        leases.close()
        engine.close()
        rc.close()
        server.stop()


def evalsha_calls(*clients: Any) -> int:
    total = 0
    for c in clients:
        total += int(c.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    return total


def messages(lease: Any) -> list[str]:
    return [str(e) for e in lease.pop_errors()]


def test_the_core_holds_the_reply_tables_batch_key_elsewhere() -> None:
    assert require_native().reply_batch_elsewhere() == (
        replytable.BATCH_KEY_ELSEWHERE,
        replytable.BATCH_KEY_ELSEWHERE_BEFORE_7,
    )


def test_leases_due_together_are_renewed_many_to_a_call(
    plain: tuple[Server, redis.Redis, Leases],
) -> None:
    _server, rc, leases = plain
    strings = [leases.string(f"s{i}") for i in range(200)]
    hashes = [leases.hash(f"h{i}") for i in range(100)]
    leases.begin_all()
    leases.wait_renewed(leases.made, 1)
    rc.config_resetstat()
    renewer = leases.made[0].renewer
    sent = renewer.sent[0]
    leases.wait_renewed(leases.made, 3)
    renewals = renewer.sent[0] - sent
    calls = evalsha_calls(rc)
    assert calls > 0
    # Up to 100 leases a call: far fewer calls than renewals.
    assert renewals >= 10 * calls, (renewals, calls)
    assert rc.script_exists(RENEW_MANY.sha) == [True]
    assert all(lease.state == ACTIVE for lease in leases.made)
    # Each renewed on the server: a TTL refreshed past the one set at the start.
    rc.pexpire("s0", 3000)
    rc.pexpire("h0", 3000)
    leases.wait_renewed([strings[0], hashes[0]], 2)
    assert rc.pttl("s0") > 3000 and rc.pttl("h0") > 3000
    assert all(messages(lease) == [] for lease in leases.made)


def test_each_lease_of_a_call_has_its_own_outcome(
    plain: tuple[Server, redis.Redis, Leases],
) -> None:
    _server, rc, leases = plain
    strings = [leases.string(f"s{i}") for i in range(20)]
    hashes = [leases.hash(f"h{i}") for i in range(20)]
    leases.begin_all()
    leases.wait_renewed(leases.made, 1)
    rc.config_resetstat()
    deleted, taken, hash_taken = strings[3], strings[5], hashes[2]
    wrong_string, wrong_hash = strings[7], hashes[4]
    rc.delete("s3")
    rc.set("s5", "someone else", px=60_000)
    rc.hset("h2", "owner", "someone else")
    rc.delete("s7")
    rc.hset("s7", "owner", "me")  # a hash where a string lease is: WRONGTYPE
    rc.delete("h4")
    rc.set("h4", "me")  # a string where a lock hash is: WRONGTYPE
    for lost in (deleted, taken, hash_taken):
        assert wait_state(lost, LOST, TTL / 2) is not None
        assert lost.token == 0
    errors: dict[int, list[str]] = {id(wrong_string): [], id(wrong_hash): []}

    def both_failed() -> bool:
        for lease in (wrong_string, wrong_hash):
            errors[id(lease)].extend(messages(lease))
        return all(errors.values())

    wait_until(both_failed, TTL / 2, what="each wrong type's own error")
    assert all("WRONGTYPE" in m for found in errors.values() for m in found), errors
    # An error is tolerated until the deadline, as for a renewal of its own.
    assert wrong_string.state == ACTIVE and wrong_hash.state == ACTIVE
    healthy = [
        lease
        for lease in leases.made
        if lease not in (deleted, taken, hash_taken, wrong_string, wrong_hash)
    ]
    leases.wait_renewed(healthy, 3)
    assert all(lease.state == ACTIVE for lease in healthy)
    assert all(messages(lease) == [] for lease in healthy)
    # They were answered in shared calls, not each on its own.
    assert evalsha_calls(rc) * 5 <= sum(lease.renewals for lease in healthy)


def test_each_wrong_type_is_reported_as_that_leases_error(
    plain: tuple[Server, redis.Redis, Leases],
) -> None:
    _server, rc, leases = plain
    group = [leases.string(f"s{i}") for i in range(10)]
    leases.begin_all()
    leases.wait_renewed(group, 1)
    rc.delete("s4")
    rc.rpush("s4", "me")
    errors: list[str] = []

    def seen() -> bool:
        errors.extend(messages(group[4]))
        return bool(errors)

    wait_until(seen, TTL / 2, what="the wrong type's error")
    assert all("WRONGTYPE" in m for m in errors), errors
    assert group[4].state == ACTIVE
    others = group[:4] + group[5:]
    leases.wait_renewed(others, 2)
    assert all(messages(lease) == [] for lease in others)


def test_a_failover_reply_to_a_call_ends_every_lease_of_it_at_once(
    plain: tuple[Server, redis.Redis, Leases],
) -> None:
    _server, rc, leases = plain
    group = [leases.string(f"s{i}") for i in range(10)] + [leases.hash(f"h{i}") for i in range(5)]
    leases.begin_all()
    leases.wait_renewed(group, 1)
    with RedisServer() as other:
        # The same leases on the new master, so the server that becomes its
        # replica still holds them: its renewals are refused as writes, not 0.
        oc = other.client()
        for key in rc.keys("*"):
            oc.restore(key, 60_000, rc.dump(key), replace=True)
        began = time.monotonic()
        rc.replicaof("127.0.0.1", other.port)
        try:
            for lease in group:
                assert wait_state(lease, LOST, TTL * 0.8) is not None
            assert time.monotonic() - began < TTL * 0.8, "lost at the deadline, not at once"
            for lease in group:
                found = lease.pop_errors()
                assert any(isinstance(e, redis.exceptions.ReadOnlyError) for e in found), found
        finally:
            rc.replicaof("no", "one")
            oc.close()


def test_scripts_flushed_are_loaded_again_and_every_lease_keeps_renewing(
    plain: tuple[Server, redis.Redis, Leases],
) -> None:
    _server, rc, leases = plain
    group = [leases.string(f"s{i}") for i in range(20)] + [leases.hash(f"h{i}") for i in range(20)]
    leases.begin_all()
    leases.wait_renewed(group, 1)
    rc.script_flush()
    assert rc.script_exists(RENEW_MANY.sha) == [False]
    leases.wait_renewed(group, 3)
    assert rc.script_exists(RENEW_MANY.sha) == [True]
    assert all(lease.state == ACTIVE for lease in group)
    assert all(messages(lease) == [] for lease in group)


def per_lease(reply: bytes) -> Callable[[list[bytes], list[bytes]], bytes]:
    """A renew_many reply of ``reply`` for each lease of the call (its keys declared)."""
    return lambda keys, _args: array(*[reply] * len(keys))


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(lambda keys, _args: array(*[b":1\r\n"] * (len(keys) + 1)), id="one-too-many"),
        pytest.param(lambda keys, _args: array(*[b":7\r\n"] * len(keys)), id="an-element-of-7"),
        pytest.param(lambda _keys, _args: b":1\r\n", id="an-integer"),
    ],
)
def test_a_call_answered_with_a_reply_renew_many_cannot_give_is_an_error_for_each_of_its_leases(
    bad: Callable[[list[bytes], list[bytes]], bytes],
) -> None:
    with FakeRedis() as fake:
        fake.script("renew_many", bad, *[per_lease(b":1\r\n")] * 500)
        engine = native_engine(endpoint_at(fake.port))
        group = [
            engine.keeper((RENEW, [f"s{i}"], ["me", int(TTL * 1000)]), interval=INTERVAL, ttl=TTL)
            for i in range(5)
        ]
        try:
            now = time.monotonic()
            for i, lease in enumerate(group):
                lease.begin(i + 1, now)
            wait_until(lambda: fake.runs("renew_many") >= 3, 10, what="three renew_many calls")
            errors = {id(lease): messages(lease) for lease in group}
            hit = [lease for lease in group if errors[id(lease)]]
            # Every lease of that call (at least two) had the error; never a loss.
            assert len(hit) >= 2
            for lease in hit:
                assert all("renew_many answered" in m for m in errors[id(lease)]), errors
            start = {id(lease): lease.renewals for lease in group}
            wait_until(
                lambda: all(lease.renewals > start[id(lease)] for lease in group),
                10,
                what="renewals after the bad reply",
            )
            assert all(lease.state == ACTIVE for lease in group)
        finally:
            for lease in group:
                lease.close()
            engine.close()


# -- on a cluster ------------------------------------------------------------------------


def names_on_every_master(topology: ClusterSet, count: int) -> list[str]:
    keys = [f"{{rb{i}}}:leader" for i in range(count)]
    owners = {topology.master_for_slot(key_slot(k)).port for k in keys}
    assert len(owners) == len(topology.masters())
    return keys


@pytest.fixture
def on_cluster(cluster_set_fresh: ClusterSet) -> Iterator[tuple[ClusterSet, Leases]]:
    require_native()
    from redlease._engine import shared_engine

    topology = cluster_set_fresh
    client = topology.client(socket_timeout=2)
    leases = Leases(shared_engine(client, "native"), client)
    try:
        yield topology, leases
    finally:
        leases.close()
        client.close()


def moved_lease_follows(topology: ClusterSet, leases: Leases, migrate: Callable[..., Any]) -> None:
    keys = names_on_every_master(topology, 30)
    group = [leases.string(k) if i % 2 else leases.hash(k) for i, k in enumerate(keys)]
    leases.begin_all()
    leases.wait_renewed(group, 2, timeout=30)
    masters = [m.client() for m in topology.masters()]
    for m in masters:
        m.config_resetstat()
    sent = group[0].renewer.sent[0]
    leases.wait_renewed(group, 2, timeout=30)
    # Node-wide calls: many leases to a call on every master.
    assert group[0].renewer.sent[0] - sent >= 5 * evalsha_calls(*masters)
    victim, key = group[7], keys[7]
    slot = key_slot(key)
    target = next(m for m in topology.masters() if m is not topology.master_for_slot(slot))
    token = victim.token
    migrate(slot, target)
    leases.wait_renewed(group, 3, timeout=30)
    assert (victim.state, victim.token) == (ACTIVE, token)
    # Renewed where the key is (mid-migration the target serves it after ASKING).
    pipe = target.client().pipeline(transaction=False)
    pipe.execute_command("ASKING")
    pipe.pttl(key)
    assert 0 < pipe.execute()[1] <= TTL * 1000
    # Followed, not failed: no error for the moved lease, none for the others.
    assert all(messages(lease) == [] for lease in group)
    assert all(lease.state == ACTIVE for lease in group)
    for m in masters:
        m.close()


def test_a_lease_whose_slot_moved_is_followed_and_the_others_of_its_call_keep_renewing(
    on_cluster: tuple[ClusterSet, Leases],
) -> None:
    topology, leases = on_cluster
    moved_lease_follows(topology, leases, lambda slot, target: topology.migrate_slot(slot, target))


def test_a_lease_whose_key_left_a_migrating_slot_is_renewed_where_the_key_is(
    on_cluster: tuple[ClusterSet, Leases],
) -> None:
    topology, leases = on_cluster
    holder: list[Any] = []

    def half_migrate(slot: int, target: Any) -> None:
        migration = topology.begin_migration(slot, target)
        assert migration.move_keys() >= 1
        holder.append(migration)

    moved_lease_follows(topology, leases, half_migrate)
    holder[0].finish()
