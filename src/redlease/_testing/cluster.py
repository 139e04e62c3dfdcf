"""A Redis Cluster for tests: three masters with a replica each, and the faults of a cluster.

``ClusterSet()`` prepares; ``start()`` launches six ``--cluster-enabled``
``RedisServer`` processes on free loopback ports (each with its bus port, port
+ 10000, free too), splits the 16384 slots over the masters with ``CLUSTER
ADDSLOTS``, joins them with ``CLUSTER MEET``, attaches a replica to each
master with ``CLUSTER REPLICATE``, and returns once every node says
``cluster_state:ok``, all agree on who owns each slot and every replica is
synced. No ``redis-cli`` involved. ``stop()`` (or interpreter exit) removes
every process and file.

Faults: ``failover(slot)`` (``CLUSTER FAILOVER`` on the replica of the slot's
master), ``kill_master(slot)`` (SIGKILL, then the replica's own election),
``migrate_slot(slot, to)`` (a live migration: ``IMPORTING`` / ``MIGRATING``,
``MIGRATE`` of the keys, ``SETSLOT ... NODE`` everywhere; ``begin_migration``
stops halfway, where clients get ``ASK``), ``freeze(node)`` / ``thaw(node)``
(SIGSTOP / SIGCONT; a master frozen past ``node_timeout_ms`` is failed over).

``ClusterSet(tls=TLSMaterials())`` makes every node TLS-only, its cluster bus
and replication included (``tls-cluster yes``, ``tls-replication yes``), and
``client()`` a ``RedisCluster(ssl=True, ...)`` verifying against the test CA.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import redis

from .._on_exit import StopsOnExit
from ._cluster_nodes import SLOTS, NodeInfo, key_slot, parse_nodes
from ._common import (
    LOOPBACK,
    RedisServerError,
    TopologyError,
    client_module,
    client_settings,
    free_cluster_port,
    poll,
    register,
    unregister,
)
from .server import RedisServer
from .tls import ServerTLS, TLSMaterials

__all__ = ["ClusterSet", "NodeInfo", "SlotMigration", "key_slot"]

_MIGRATE_BATCH = 100  # keys per MIGRATE of a live slot migration


class SlotMigration:
    """A slot halfway between two masters; ``move_keys()`` then ``finish()``.

    Between ``begin_migration`` and ``finish``, the source answers ``ASK`` for
    keys already moved and the target serves them only after ``ASKING``.
    """

    def __init__(
        self, cluster: ClusterSet, slot: int, source: RedisServer, target: RedisServer
    ) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target

    def keys(self) -> list[str]:
        """Keys of the slot still on the source (at most 1000)."""
        return list(self.cluster._cmd(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, 1000))

    def move_keys(self, limit: int | None = None) -> int:
        """``MIGRATE`` up to ``limit`` (default: all) of the slot's keys; return how many."""
        moved = 0
        port = self.target.address[1]
        while limit is None or moved < limit:
            batch = min(_MIGRATE_BATCH, limit - moved) if limit is not None else _MIGRATE_BATCH
            keys = self.cluster._cmd(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, batch)
            if not keys:
                break
            self.cluster._cmd(self.source, "MIGRATE", LOOPBACK, port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        return moved

    def finish(self, *, timeout: float | None = None) -> None:
        """Give the slot to the target on every master (target first, then source, then the rest).

        Returns once every live node sees the target owning it. Keys still on
        the source are moved first.
        """
        self.move_keys()
        target_id = self.cluster.node_id(self.target)
        order = [self.target, self.source]
        order += [m for m in self.cluster.masters() if m not in order and m.running]
        for node in order:
            self.cluster._cmd(node, "CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        self.cluster._wait_owner(self.slot, self.target, timeout)


class ClusterSet(StopsOnExit):
    """``masters`` masters with ``replicas_per_master`` replicas each; see the module docstring."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 1,
        node_timeout_ms: int = 1500,
        args: Sequence[str] = (),
        binary: str | None = None,
        timeout: float = 30.0,
        tls: TLSMaterials | None = None,
    ) -> None:
        if masters < 1 or replicas_per_master < 0:
            raise RedisServerError("a cluster needs a master and a non-negative replica count")
        self.node_timeout_ms = node_timeout_ms
        self.timeout = timeout
        self._n_masters = masters
        self._n_replicas = replicas_per_master
        self._args = [
            "--cluster-enabled", "yes",
            "--cluster-node-timeout", str(node_timeout_ms),
            # Any replica may take over, however long it was cut off: tests
            # freeze and kill nodes on purpose.
            "--cluster-replica-validity-factor", "0",
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            *args,
        ]  # fmt: skip
        if tls is not None:
            # The bus (on the TLS port + 10000) and replication speak TLS too.
            self._args += ["--tls-cluster", "yes", "--tls-replication", "yes"]
        self.tls = tls
        self._server_tls = ServerTLS(tls) if tls is not None else None
        self._binary = binary
        self.nodes: list[RedisServer] = []
        self._ids: dict[int, str] = {}  # port -> node id
        self._lock = threading.RLock()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> ClusterSet:
        """Build the cluster; return once it is healthy (see ``wait_healthy``)."""
        with self._lock:
            if self.nodes:
                raise RedisServerError("the cluster is already started")
            register(self)
            try:
                self._build()
            except BaseException:
                self.stop()
                raise
            register(self)
            return self

    def _build(self) -> None:
        total = self._n_masters * (1 + self._n_replicas)
        for _ in range(total):
            node = RedisServer(
                args=self._args,
                binary=self._binary,
                port_picker=free_cluster_port,
                tls=self._server_tls,
            )
            self.nodes.append(node)
            node.start()
        for i, node in enumerate(self.nodes):
            c: Any = node.client(decode_responses=True)
            self._ids[self._port(node)] = str(c.execute_command("CLUSTER", "MYID"))
            # Distinct epochs up front, as redis-cli does: no collisions to resolve.
            c.execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            c.close()
        masters = self.nodes[: self._n_masters]
        share = SLOTS // len(masters)
        for i, node in enumerate(masters):
            end = SLOTS if i == len(masters) - 1 else (i + 1) * share
            self._cmd(node, "CLUSTER", "ADDSLOTS", *range(i * share, end))
        for node in self.nodes[1:]:
            self._cmd(node, "CLUSTER", "MEET", LOOPBACK, self._port(self.nodes[0]))
        poll(
            self._all_met,
            timeout=self.timeout,
            what="every node to know every other node",
            describe=self._describe,
        )
        for i, node in enumerate(self.nodes[self._n_masters :]):
            master = masters[i % self._n_masters]
            self._cmd(node, "CLUSTER", "REPLICATE", self.node_id(master))
        self.wait_healthy()

    def stop(self) -> None:
        """Stop every node; idempotent."""
        with self._lock:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    node.stop()
            self.nodes = []
            self._ids.clear()
            unregister(self)

    def __enter__(self) -> ClusterSet:
        if not self.nodes:
            self.start()
        return self


    def __repr__(self) -> str:
        return f"<ClusterSet {[self._ids.get(n.port or 0, '?')[:8] for n in self.nodes]}>"

    # -- nodes and clients --------------------------------------------------------------

    @staticmethod
    def _port(node: RedisServer) -> int:
        if node.port is None:
            raise RedisServerError(f"{node!r} has no port")
        return node.port

    def _cmd(self, node: RedisServer, *args: Any) -> Any:
        c: Any = node.client(
            decode_responses=True, socket_timeout=5, socket_connect_timeout=2, retry=None
        )
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def client(self, *, family: str = "redis", asyncio: bool = False, **kwargs: Any) -> Any:
        """A ``redis.RedisCluster`` started from every running node (socket timeout 2 s).

        ``family="valkey"`` makes a ``valkey.ValkeyCluster``, ``asyncio=True``
        the asyncio cluster client of the family.

        On a TLS cluster it verifies the nodes against the test CA unless
        ``kwargs`` say otherwise.
        """
        kwargs.setdefault("socket_timeout", 2.0)
        if self.tls is not None:
            for key, value in self.tls.client_kwargs().items():
                kwargs.setdefault(key, value)
        module = client_module(family, asyncio=asyncio)
        node_cls: Any = module.cluster.ClusterNode  # unannotated in redis-py
        startup = [node_cls(LOOPBACK, self._port(n)) for n in self.nodes if n.running]
        return module.RedisCluster(startup_nodes=startup, **client_settings(kwargs))

    def node_id(self, node: RedisServer) -> str:
        """The cluster node id of ``node``."""
        return self._ids[self._port(node)]

    def node_by_id(self, node_id: str) -> RedisServer:
        for node in self.nodes:
            if self._ids.get(self._port(node)) == node_id:
                return node
        raise RedisServerError(f"no node {node_id} in this cluster")

    def live_nodes(self) -> list[RedisServer]:
        """Running, unfrozen nodes."""
        return [n for n in self.nodes if n.running and not n.paused]

    def view(self, node: RedisServer | None = None) -> list[NodeInfo]:
        """``CLUSTER NODES`` as ``node`` (default: the first live node) sees it."""
        if node is None:
            live = self.live_nodes()
            if not live:
                raise TopologyError("no live node in the cluster")
            node = live[0]
        return parse_nodes(str(self._cmd(node, "CLUSTER", "NODES")))

    def _owners(self, node: RedisServer) -> dict[str, frozenset[int]]:
        return {i.id: i.slots for i in self.view(node) if i.is_master and i.slots}

    def masters(self) -> list[RedisServer]:
        """The nodes owning slots, as the first live node sees it."""
        return [self.node_by_id(node_id) for node_id in self._owners(self.live_nodes()[0])]

    def master_for_slot(self, slot: int) -> RedisServer:
        """The node owning ``slot``, as the first live node sees it."""
        for node_id, slots in self._owners(self.live_nodes()[0]).items():
            if slot in slots:
                return self.node_by_id(node_id)
        raise TopologyError(f"no node owns slot {slot}")

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The node owning ``key``'s slot."""
        return self.master_for_slot(key_slot(key))

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        """The nodes replicating ``master``, as the first live node sees it."""
        wanted = self.node_id(master)
        return [self.node_by_id(i.id) for i in self.view() if i.master_id == wanted]

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A (running) replica of ``master``."""
        replicas = [r for r in self.replicas_of(master) if r.running]
        if not replicas:
            raise TopologyError(f"{master!r} has no running replica")
        return replicas[0]

    def info(self, node: RedisServer) -> dict[str, str]:
        """``CLUSTER INFO`` of ``node`` as a dict of strings."""
        text = str(self._cmd(node, "CLUSTER", "INFO"))
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    # -- waiting --------------------------------------------------------------------------

    def _all_met(self) -> bool:
        for node in self.nodes:
            infos = self.view(node)
            if len(infos) != len(self.nodes) or any(i.failed for i in infos):
                return False
        return True

    def healthy(self) -> bool:
        """Every live node: ``cluster_state:ok``, one picture of the cluster, replicas synced.

        One picture: every live node sees the same owner for every slot and
        the same master for every live replica.
        """
        live = self.live_nodes()
        live_ids = {self.node_id(n) for n in live}
        pictures = []
        for node in live:
            if self.info(node).get("cluster_state") != "ok":
                return False
            view = self.view(node)
            pictures.append(
                (
                    {i.id: i.slots for i in view if i.is_master and i.slots},
                    {i.id: i.master_id for i in view if i.id in live_ids and not i.is_master},
                )
            )
        if not pictures or any(p != pictures[0] for p in pictures):
            return False
        owners = set(pictures[0][0])
        for node in live:
            if self.node_id(node) in owners:
                continue
            role = self._cmd(node, "ROLE")
            if role[0] != "slave" or role[3] != "connected":
                return False
        return True

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Wait until ``healthy()``; ``TopologyError`` with the state seen at the deadline."""
        poll(
            self.healthy,
            timeout=timeout or self.timeout,
            what="the cluster to be healthy",
            describe=self._describe,
        )

    def _describe(self) -> str:
        parts = []
        for node in self.nodes:
            if not node.running or node.paused:
                parts.append(f"{node.port}: {'frozen' if node.paused else 'down'}")
                continue
            try:
                state = self.info(node).get("cluster_state")
                lines = [
                    f"{i.port} {','.join(sorted(i.flags))} {len(i.slots)}" for i in self.view(node)
                ]
                parts.append(f"{node.port} [{state}]: " + " | ".join(lines))
            except redis.RedisError as exc:
                parts.append(f"{node.port}: {exc!r}")
        return "; ".join(parts)

    def _wait_owner(self, slot: int, node: RedisServer, timeout: float | None) -> None:
        wanted = self.node_id(node)

        def owns() -> bool:
            for other in self.live_nodes():
                owners = self._owners(other)
                if slot not in owners.get(wanted, ()):
                    return False
                if self.info(other).get("cluster_state") != "ok":
                    return False
            return True

        poll(
            owns,
            timeout=timeout or self.timeout,
            what=f"every live node to see {node!r} owning slot {slot}",
            describe=self._describe,
        )

    # -- faults ---------------------------------------------------------------------------

    def failover(
        self, slot: int, *, mode: str | None = None, timeout: float | None = None
    ) -> RedisServer:
        """``CLUSTER FAILOVER`` on a replica of ``slot``'s master; return the new master.

        ``mode`` is ``None`` (the coordinated manual failover: no write is
        lost), ``"FORCE"`` (no agreement from the master, e.g. a frozen one)
        or ``"TAKEOVER"`` (no vote either). Returns once every live node sees
        the replica owning ``slot`` and says ``cluster_state:ok``.
        """
        replica = self.replica_of(self.master_for_slot(slot))
        self._cmd(replica, "CLUSTER", "FAILOVER", *([mode] if mode else []))
        self._wait_owner(slot, replica, timeout)
        return replica

    def kill_master(
        self, slot: int, *, restart: bool = False, timeout: float | None = None
    ) -> RedisServer:
        """SIGKILL ``slot``'s master; wait for its replica's promotion; return the new master.

        Takes about ``node_timeout_ms`` for the failure to be agreed plus up
        to a second of election delay. With ``restart=True`` the killed node
        is started again (same port, same ``nodes.conf``) and rejoins as a
        replica of the new master before this returns.
        """
        master = self.master_for_slot(slot)
        replica = self.replica_of(master)
        master.kill()
        self._wait_owner(slot, replica, timeout)
        if restart:
            master.restart()
            self.wait_healthy(timeout)
        return replica

    def begin_migration(self, slot: int, to_master: RedisServer) -> SlotMigration:
        """Mark ``slot`` IMPORTING on ``to_master`` and MIGRATING on its owner; move no key yet."""
        source = self.master_for_slot(slot)
        if source is to_master:
            raise RedisServerError(f"slot {slot} is already on {to_master!r}")
        self._cmd(to_master, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self._cmd(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(to_master))
        return SlotMigration(self, slot, source, to_master)

    def migrate_slot(
        self, slot: int, to_master: RedisServer, *, timeout: float | None = None
    ) -> int:
        """Move ``slot`` and its keys to ``to_master`` live; return how many keys moved."""
        migration = self.begin_migration(slot, to_master)
        moved = migration.move_keys()
        migration.finish(timeout=timeout)
        return moved

    def freeze(self, node: RedisServer) -> None:
        """SIGSTOP ``node``; a master frozen past ``node_timeout_ms`` gets failed over."""
        node.pause()

    def thaw(self, node: RedisServer) -> None:
        """SIGCONT a frozen node (a master failed over meanwhile rejoins as a replica)."""
        node.resume()
