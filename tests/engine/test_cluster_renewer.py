"""One native renewer for every topology: on a Redis Cluster too, every lease
of an engine is renewed by the engine's one renewer thread, over one
connection per master, each lease routed by its key's slot and keeping its
own deadline. And a renewal reply the script cannot give is an error, never
a loss."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import redlease
from engine_helpers import RENEW, endpoint_at, native_ref, threads, wait_state
from helpers import require_native, wait_until
from redlease._engine import ACTIVE, LOST
from redlease._engine.contract.interface import LATENESS_BUCKETS
from redlease._testing import ClusterSet, key_slot
from topology_helpers import close_all_engines

pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

NAME = "renewer-test"
"""The client name every connection of the engines here announces."""


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


def threads_named(name: str) -> int:
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                count += f.read().strip() == name
        except OSError:
            pass  # gone meanwhile
    return count


def named_clients(node: redis.Redis) -> int:
    return sum(1 for c in node.client_list() if c.get("name") == NAME)


def renewal_clients(renewer: Any, node: redis.Redis) -> int:
    """How many of ``node``'s clients are connections of ``renewer`` (by their local address)."""
    local = set()
    for _, fd in renewer.connections:
        with socket.socket(fileno=os.dup(fd)) as sock:
            host, port = sock.getsockname()[:2]
            local.add(f"{host}:{port}")
    return sum(1 for c in node.client_list() if c.get("addr") in local)


def names_on_every_master(topology: ClusterSet, count: int) -> list[str]:
    """``count`` names on distinct hash tags, spread over every master."""
    names = [f"{{rt{i}}}" for i in range(count)]
    owners = {topology.master_for_slot(key_slot(n)).port for n in names}
    assert len(owners) == len(topology.masters())
    return names


def lease_of(e: redlease.Elector) -> Any:
    """The native lease of ``e``'s running term."""
    run = e._core.run  # type: ignore[attr-defined]
    assert run is not None
    return run.keeper


def start_leading(electors: list[redlease.Elector], timeout: float = 60.0) -> None:
    for e in electors:
        e.start(None)
    wait_until(lambda: all(e.token() for e in electors), timeout, what="every elector leading")


def test_200_cluster_electors_share_one_renewer_thread_and_one_renewal_connection_per_master(
    cluster_set: ClusterSet,
) -> None:
    require_native()
    client = cluster_set.client(socket_timeout=2, client_name=NAME)
    masters = [m.client() for m in cluster_set.masters()]
    before_threads = threads()
    # Engines of earlier tests may still be alive (a renewer of their own
    # each): count what these electors add.
    before_renewers = threads_named("redlease-renew")
    before_clients = [named_clients(m) for m in masters]
    group = [
        redlease.Elector(client, n, ttl=2.0, engine="native")
        for n in names_on_every_master(cluster_set, 200)
    ]
    try:
        start_leading(group)
        renewers = {id(lease_of(e).renewer) for e in group}
        assert len(renewers) == 1
        renewer = lease_of(group[0]).renewer
        # ``leases`` counts those waiting in the timer heap: one whose renewal is in
        # flight is out of it for that round trip.
        wait_until(lambda: renewer.leases == len(group), 10, what="every lease in the heap")
        # A renewal connection opens with the first renewal it carries, a
        # third of a TTL after the acquires (which may all be done sooner).
        wait_until(
            lambda: all(renewal_clients(renewer, m) >= 1 for m in masters),
            10,
            what="a renewal connection on every master",
        )
        assert [renewal_clients(renewer, m) for m in masters] == [1] * len(masters)
        assert threads_named("redlease-renew") - before_renewers == 1
        # The driver, the renewer, the process's one notice reader (every
        # master's notices in one poll) and at most its connector: never a
        # thread per lease, nor one per master.
        assert threads() - before_threads <= 4, (
            threads_named("redlease-notice"),
            threads_named("redlease-nconn"),
        )
        # The engine's other connections (calls, writes) are a few per engine;
        # a connection per lease would be ~67 per master.
        added = [named_clients(m) - b for m, b in zip(masters, before_clients, strict=True)]
        assert all(1 <= n <= 4 for n in added), added
        tokens = {e.config.name: e.token() for e in group}
        time.sleep(3.0)
        assert {e.config.name: e.token() for e in group} == tokens
    finally:
        for e in group:
            e.stop()
        client.close()
        for m in masters:
            m.close()


def test_leases_on_the_other_masters_keep_renewing_while_one_master_is_killed(
    cluster_set_fresh: ClusterSet,
) -> None:
    require_native()
    topology = cluster_set_fresh
    client = topology.client(socket_timeout=1)
    names = names_on_every_master(topology, 30)
    victim = topology.master_for_slot(key_slot(names[0]))
    # While the failover is agreed every node answers CLUSTERDOWN (full
    # coverage): a ttl longer than that lets the leases elsewhere ride it out.
    group = [redlease.Elector(client, n, ttl=6.0, engine="native") for n in names]
    elsewhere = [
        e for e in group if topology.master_for_slot(key_slot(e.config.name)) is not victim
    ]
    try:
        start_leading(group)
        tokens = {e.config.name: e.token() for e in elsewhere}
        renewed = {e.config.name: lease_of(e).renewals for e in elsewhere}
        topology.kill_master(key_slot(names[0]))
        assert {e.config.name: e.token() for e in elsewhere} == tokens
        # Still renewing, each on its own schedule, after the kill.
        time.sleep(2.0)
        assert {e.config.name: e.token() for e in elsewhere} == tokens
        assert all(
            lease_of(e).renewals > renewed[e.config.name] for e in elsewhere
        )
    finally:
        for e in group:
            e.stop()
        client.close()


class ScriptedServer:
    """A tiny RESP server on loopback: +OK to everything, the given reply to EVALSHA / EVAL."""

    def __init__(self, renew_reply: bytes) -> None:
        self.renew_reply = renew_reply
        self.connections = 0
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port = self._sock.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _commands(buf: bytearray) -> Iterator[list[bytes]]:
        while True:
            if not buf.startswith(b"*") or b"\r\n" not in buf:
                return
            head, _, rest = bytes(buf).partition(b"\r\n")
            args: list[bytes] = []
            for _ in range(int(head[1:])):
                line, sep, rest = rest.partition(b"\r\n")
                if not sep:
                    return
                size = int(line[1:])
                if len(rest) < size + 2:
                    return
                args.append(rest[:size])
                rest = rest[size + 2 :]
            del buf[: len(buf) - len(rest)]
            yield args

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                buf += data
                out = b""
                for args in self._commands(buf):
                    verb = args[0].upper()
                    if verb in (b"EVALSHA", b"EVAL"):
                        out += self.renew_reply
                    elif verb == b"SCRIPT":
                        out += b"$40\r\n" + b"0" * 40 + b"\r\n"
                    else:
                        out += b"+OK\r\n"
                conn.sendall(out)

    def close(self) -> None:
        self._stop = True
        self._sock.close()


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        (b"*3\r\n:1\r\n:2\r\n:3\r\n", "an array of 3 elements"),
        (b"$2\r\nok\r\n", "a bulk string of 2 bytes"),
        (b"$-1\r\n", "nil"),
        (b":7\r\n", "the integer 7"),
    ],
)
def test_a_renewal_reply_the_script_cannot_give_is_an_error_until_the_deadline_not_a_loss(
    reply: bytes, said: str
) -> None:
    native = require_native()
    server = ScriptedServer(reply)
    renewer = native.Renewer(native.Target(endpoint_at(server.port)))
    lease = native.Lease(
        renewer, native_ref(RENEW), ["lease"], ["me", 2000], 0.1, 2.0
    )
    try:
        lease.begin(7, time.monotonic())
        wait_until(lambda: server.connections >= 2, 5.0, what="a new connection after each reply")
        assert lease.state == ACTIVE and lease.token == 7
        errors = lease.pop_errors()
        assert errors and all(isinstance(e, redis.ResponseError) for e in errors)
        assert f"renew answered {said} where it returns 0 or 1" in str(errors[0])
        assert wait_state(lease, LOST, 10.0) is not None
    finally:
        lease.close()
        renewer.close()
        server.close()


def test_the_native_lateness_buckets_are_the_engine_contracts() -> None:
    assert require_native().LATENESS_BUCKETS == LATENESS_BUCKETS


def test_a_cluster_lease_ends_lost_at_once_on_a_failover_reply_and_keeps_leading_through_moved(
    cluster_set_fresh: ClusterSet,
) -> None:
    require_native()
    from redlease._engine import shared_engine

    topology = cluster_set_fresh
    client = topology.client(socket_timeout=1)
    engine = shared_engine(client, "native")
    key = "{rt-fo}:leader"
    slot = key_slot(key)
    ttl = 10.0
    lease = engine.keeper((RENEW, [key], ["me", int(ttl * 1000)]), interval=0.2, ttl=ttl)
    try:
        t0 = time.monotonic()
        assert client.set(key, "me", px=int(ttl * 1000))
        lease.begin(3, t0)
        wait_until(lambda: lease.renewals >= 2, 5.0, what="renewing")
        # The slot moves: MOVED, the slot map updated, the lease renewed on the new owner.
        target = next(m for m in topology.masters() if m is not topology.master_for_slot(slot))
        assert topology.migrate_slot(slot, target) >= 1
        after = lease.renewals
        wait_until(lambda: lease.renewals >= after + 3, 5.0, what="renewals on the new owner")
        assert (lease.state, lease.token) == (ACTIVE, 3)
        assert 0 < target.client().pttl(key) <= ttl * 1000
        # The new owner refuses writes as a failover leaves it: NOREPLICAS.
        target.client().config_set("min-replicas-to-write", "5")
        try:
            began = time.monotonic()
            assert wait_state(lease, LOST, ttl / 2) is not None
            assert time.monotonic() - began < ttl / 2, "lost at the deadline, not at once"
            assert any("NOREPLICAS" in str(e) for e in lease.pop_errors())
        finally:
            target.client().config_set("min-replicas-to-write", "0")
    finally:
        lease.close()
        client.close()
