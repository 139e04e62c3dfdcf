"""A Sentinel-managed Redis for tests: a master, its replicas, three sentinels, and faults.

``SentinelSet()`` prepares; ``start()`` launches one master, ``replicas``
replicas (1 by default) and ``sentinels`` sentinel processes (3, quorum 2)
monitoring service ``"svc"``, and returns once every sentinel knows the
master, every replica and every other sentinel. Every process is a
``RedisServer`` on a free loopback port; ``stop()`` (or interpreter exit)
removes them all.

Faults: ``failover()`` (``SENTINEL FAILOVER``), ``kill_master()`` (SIGKILL,
then the sentinels' own failover), ``freeze(node)`` / ``thaw(node)``
(SIGSTOP / SIGCONT of a data node or a sentinel). Each waits until the
sentinels name the new master and it answers ``ROLE`` as a master; the old
master rejoining as a replica takes the sentinels several seconds more, which
``wait_settled()`` waits for when a test needs it.

Every failover is announced on each sentinel's ``+switch-master`` pub/sub
channel as ``"<service> <old-ip> <old-port> <new-ip> <new-port>"``;
``watch_switches()`` records them.

``SentinelSet(tls=TLSMaterials())`` makes every process TLS-only: the data
nodes replicate over TLS (``tls-replication yes``), the sentinels listen on
TLS and reach the data nodes over it, and every client here (``manager()``,
``master_for()``, the probes) verifies them against the materials' CA.
With ``tls_sentinels=False`` too, the sentinels listen in plain text (and
still reach the TLS-only data nodes over TLS): TLS to the master only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from .._on_exit import StopsOnExit
from ._common import (
    LOOPBACK,
    RedisServerError,
    TopologyError,
    client_module,
    client_settings,
    poll,
    register,
    unregister,
)
from ._sentinel_events import Address, SwitchWatcher, pairs
from .server import RedisServer
from .tls import ServerTLS, TLSMaterials, tls_binary

__all__ = ["SentinelSet", "SwitchWatcher"]

# Data nodes may all become masters: diskless full syncs without the default
# 5 s wait for more replicas keep a (re)joining replica's first sync quick.
# The harness's own look at a node: one try, a short wait.
_PROBE: dict[str, Any] = {"socket_timeout": 1.0, "socket_connect_timeout": 1.0, "retry": None}
_DATA_ARGS = ("--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")


def _pairs(args: list[str]) -> list[tuple[str, str]]:
    """``["--a", "1", "--b", "2"]`` as config lines' ``("a", "1"), ("b", "2")``."""
    return [(args[i].removeprefix("--"), args[i + 1]) for i in range(0, len(args), 2)]


class SentinelSet(StopsOnExit):
    """One master, replicas and sentinels on loopback; see the module docstring."""

    def __init__(
        self,
        *,
        service: str = "svc",
        replicas: int = 1,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 4000,
        password: str | None = None,
        sentinel_password: str | None = None,
        binary: str | None = None,
        timeout: float = 30.0,
        tls: TLSMaterials | None = None,
        tls_sentinels: bool = True,
    ) -> None:
        if replicas < 1 or sentinels < 1 or not 1 <= quorum <= sentinels:
            raise RedisServerError(
                "a Sentinel set needs a replica, a sentinel and 1 <= quorum <= sentinels"
            )
        self.service = service
        self.password = password
        self.sentinel_password = sentinel_password
        self.timeout = timeout
        self._n_replicas = replicas
        self._n_sentinels = sentinels
        self._quorum = quorum
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._binary = binary
        self.tls = tls
        self._server_tls = ServerTLS(tls) if tls is not None else None
        self._sentinel_tls = self._server_tls if tls_sentinels else None
        self.data_nodes: list[RedisServer] = []
        self.sentinels: list[RedisServer] = []
        self._lock = threading.RLock()

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> SentinelSet:
        """Launch master, replicas and sentinels; return once the sentinels agree on all."""
        with self._lock:
            if self.data_nodes:
                raise RedisServerError("the Sentinel set is already started")
            register(self)
            try:
                master = self._data_node([])
                for _ in range(self._n_replicas):
                    self._data_node(["--replicaof", LOOPBACK, str(master.port)])
                for _ in range(self._n_sentinels):
                    self._sentinel(master)
                self.wait_settled()
            except BaseException:
                self.stop()
                raise
            register(self)
            return self

    def stop(self) -> None:
        """Stop every sentinel, then every data node; idempotent."""
        with self._lock:
            for node in [*self.sentinels, *self.data_nodes]:
                with contextlib.suppress(Exception):
                    node.stop()
            self.sentinels, self.data_nodes = [], []
            unregister(self)

    def __enter__(self) -> SentinelSet:
        if not self.data_nodes:
            self.start()
        return self


    def __repr__(self) -> str:
        return f"<SentinelSet {self.service} data={self.data_nodes} sentinels={self.sentinels}>"

    def _data_node(self, extra: Sequence[str]) -> RedisServer:
        args = [*_DATA_ARGS, *extra]
        if self.tls is not None:
            args += ["--tls-replication", "yes"]
        if self.password is not None:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        auth = {"password": self.password} if self.password is not None else None
        node = RedisServer(
            args=args, binary=self._binary, client_defaults=auth, tls=self._server_tls
        )
        self.data_nodes.append(node)
        node.start()
        return node

    def _sentinel(self, master: RedisServer) -> RedisServer:
        svc = self.service
        lines = [
            f"sentinel monitor {svc} {LOOPBACK} {master.port} {self._quorum}",
            f"sentinel down-after-milliseconds {svc} {self._down_after_ms}",
            f"sentinel failover-timeout {svc} {self._failover_timeout_ms}",
            f"sentinel parallel-syncs {svc} 1",
        ]
        if self.password is not None:
            lines.append(f"sentinel auth-pass {svc} {self.password}")
        if self.sentinel_password is not None:
            lines.append(f"requirepass {self.sentinel_password}")
        if self.tls is not None:
            # A sentinel reaches the data nodes (and its peers) over TLS only with this.
            lines.append("tls-replication yes")
            if self._sentinel_tls is None and self._server_tls is not None:
                # Listening in plain text, but a TLS client of the data nodes:
                # the certificate it shows them and the CA it checks them with.
                lines += [" ".join(pair) for pair in _pairs(self._server_tls.server_args())]
        auth = {"password": self.sentinel_password} if self.sentinel_password is not None else None
        binary = self._binary
        if self._server_tls is not None and self._sentinel_tls is None:
            binary = tls_binary(binary)  # plain listener, TLS client: a TLS build all the same
        node = RedisServer(
            args=["--sentinel"],
            config="\n".join(lines) + "\n",
            binary=binary,
            client_defaults=auth,
            tls=self._sentinel_tls,
        )
        self.sentinels.append(node)
        node.start()
        return node

    # -- clients ---------------------------------------------------------------------

    def sentinel_addresses(self) -> list[Address]:
        """Every sentinel's ``(host, port)``, frozen ones included."""
        return [s.address for s in self.sentinels]

    def sentinel_client(self, node: RedisServer | None = None, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` for one sentinel (the first by default), password included."""
        node = node or self.sentinels[0]
        kwargs.setdefault("decode_responses", True)
        client: redis.Redis = node.client(**kwargs)
        return client

    def node_client(self, node: RedisServer, **kwargs: Any) -> redis.Redis:
        """A ``redis.Redis`` for one data node, password included (``node.client()`` too)."""
        client: redis.Redis = node.client(**kwargs)
        return client

    def manager(self, *, family: str = "redis", asyncio: bool = False, **kwargs: Any) -> Any:
        """A redis-py ``Sentinel`` for this set; ``kwargs`` go to the data connections.

        ``family="valkey"`` makes valkey-py's, ``asyncio=True`` the asyncio one.

        The sentinel connections get the sentinels' password, a 1 s timeout
        and no retries; on a TLS set both kinds of connection verify against
        the test CA (``ssl_*`` in ``kwargs`` win for the data connections).
        """
        # No retries on a sentinel connection: a silent sentinel costs one
        # timeout, then redis-py asks the next.
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": 1.0,
            "socket_connect_timeout": 1.0,
            "retry": None,
        }
        if self.sentinel_password is not None:
            sentinel_kwargs["password"] = self.sentinel_password
        if self.password is not None:
            kwargs.setdefault("password", self.password)
        if self.tls is not None:
            if self._sentinel_tls is not None:
                sentinel_kwargs.update(self.tls.client_kwargs())
            for key, value in self.tls.client_kwargs().items():
                kwargs.setdefault(key, value)
        # Unannotated in redis-py.
        sentinel_cls: Any = client_module(family, asyncio=asyncio).sentinel.Sentinel
        return sentinel_cls(
            self.sentinel_addresses(), sentinel_kwargs=sentinel_kwargs, **client_settings(kwargs)
        )

    def master_for(
        self,
        service: str | None = None,
        *,
        family: str = "redis",
        asyncio: bool = False,
        **kwargs: Any,
    ) -> Any:
        """``Sentinel(...).master_for(service)``: a client that follows the master.

        ``family`` and ``asyncio`` as for ``manager``.
        """
        manager: Any = self.manager(family=family, asyncio=asyncio)
        return manager.master_for(service or self.service, **self._auth(kwargs))

    def replica_for(self, service: str | None = None, **kwargs: Any) -> redis.Redis:
        """``Sentinel(...).slave_for(service)``: a client of the replicas."""
        manager: Any = self.manager()
        client: redis.Redis = manager.slave_for(service or self.service, **self._auth(kwargs))
        return client

    def _auth(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.password is not None:
            kwargs.setdefault("password", self.password)
        return kwargs

    # -- what the sentinels say --------------------------------------------------------

    def _live_sentinels(self) -> list[RedisServer]:
        return [s for s in self.sentinels if s.running and not s.paused]

    def _ask(self, node: RedisServer, *args: Any) -> Any:
        client: Any = self.sentinel_client(node, **_PROBE)
        try:
            return client.execute_command("SENTINEL", *args)
        finally:
            client.close()

    def master_addresses(self) -> list[Address]:
        """The master's address according to each live sentinel that answers."""
        found = []
        for node in self._live_sentinels():
            with contextlib.suppress(redis.RedisError):
                reply = self._ask(node, "GET-MASTER-ADDR-BY-NAME", self.service)
                if reply:
                    found.append((str(reply[0]), int(reply[1])))
        return found

    def master_address(self) -> Address:
        """The master's ``(host, port)`` as most live sentinels name it."""
        found = self.master_addresses()
        if not found:
            raise TopologyError("no live sentinel names a master")
        return Counter(found).most_common(1)[0][0]

    def node_at(self, address: Address) -> RedisServer:
        """The data node at ``address``."""
        for node in self.data_nodes:
            if node.port == address[1]:
                return node
        raise RedisServerError(f"no data node of this set at {address}")

    def master(self) -> RedisServer:
        """The data node the sentinels name as master."""
        return self.node_at(self.master_address())

    def replicas(self) -> list[RedisServer]:
        """Every data node but the master (running or not)."""
        master = self.master()
        return [n for n in self.data_nodes if n is not master]

    def role(self, node: RedisServer) -> list[Any]:
        """``ROLE`` of a data node: ``["master", ...]`` / ``["slave", host, port, state, ...]``."""
        client: Any = self.node_client(node, **_PROBE)
        try:
            reply: list[Any] = client.execute_command("ROLE")
        finally:
            client.close()
        return [x.decode() if isinstance(x, bytes) else x for x in reply]

    def _answers_as_master(self, address: Address) -> bool:
        node = self.node_at(address)
        return node.running and not node.paused and self.role(node)[0] == "master"

    # -- waiting -------------------------------------------------------------------------

    def settled(self) -> bool:
        """True when the sentinels and every live data node agree on one healthy topology."""
        live = self._live_sentinels()
        addresses = self.master_addresses()
        if not live or len(addresses) != len(live) or len(set(addresses)) != 1:
            return False
        master = self.node_at(addresses[0])
        if not master.running or master.paused or self.role(master)[0] != "master":
            return False
        replicas = [n for n in self.data_nodes if n is not master and n.running and not n.paused]
        for node in replicas:
            role = self.role(node)
            if role[0] != "slave" or int(role[2]) != master.port or role[3] != "connected":
                return False
        want = {n.port for n in replicas}
        for sentinel in live:
            state = pairs(self._ask(sentinel, "MASTER", self.service))
            flags = set(state["flags"].split(","))
            if flags != {"master"} or int(state["num-other-sentinels"]) < len(self.sentinels) - 1:
                return False
            # A sentinel refreshes a replica's INFO (its master-link-status)
            # only every 10 s, so that is not waited for: a replica it knows
            # and reaches is enough.
            seen = set()
            for reply in self._ask(sentinel, "REPLICAS", self.service):
                r = pairs(reply)
                if set(r["flags"].split(",")) == {"slave"}:
                    seen.add(int(r["port"]))
            if not want <= seen:
                return False
        return True

    def wait_settled(self, timeout: float | None = None) -> None:
        """Wait until ``settled()``: one master, live replicas synced, sentinels agreeing.

        After ``failover()`` this takes about 10 s: the sentinels notice the
        old master still claims the role only at their next INFO of it (a
        fixed 10 s period) and only then make it a replica.
        """
        poll(
            self.settled,
            timeout=timeout or self.timeout,
            what="the Sentinel set to settle",
            describe=self._describe,
        )

    def _describe(self) -> str:
        parts = [f"sentinels name {self.master_addresses()}"]
        for node in self.data_nodes:
            state = "down" if not node.running else "frozen" if node.paused else None
            if state is None:
                try:
                    state = " ".join(str(x) for x in self.role(node)[:4])
                except redis.RedisError as exc:
                    state = repr(exc)
            parts.append(f"{node.port}: {state}")
        return "; ".join(parts)

    def wait_new_master(self, old: Address, timeout: float | None) -> Address:
        """Wait until every live sentinel names one master other than ``old``; its address."""

        def moved() -> Address | None:
            found = self.master_addresses()
            live = self._live_sentinels()
            if not found or len(found) < len(live) or len(set(found)) != 1 or found[0] == old:
                return None
            return found[0] if self._answers_as_master(found[0]) else None

        return poll(
            moved,
            timeout=timeout or self.timeout,
            what=f"the sentinels to name a new master instead of {old}",
            describe=self._describe,
        )

    # -- faults ---------------------------------------------------------------------------

    def failover(self, *, timeout: float | None = None) -> Address:
        """``SENTINEL FAILOVER``: promote a replica; return the new master's address.

        Returns once every live sentinel names the new master and it answers
        ``ROLE`` as a master (the old master becomes its replica later).
        """
        old = self.master_address()
        deadline = time.monotonic() + (timeout or self.timeout)

        def ordered() -> bool:
            # NOGOODSLAVE / INPROG right after a start or a previous failover
            # pass once the sentinel has fresh replica state; ask again.
            self._ask(self._live_sentinels()[0], "FAILOVER", self.service)
            return True

        poll(
            ordered,
            timeout=max(deadline - time.monotonic(), 0.1),
            interval=0.2,
            what="a sentinel to accept SENTINEL FAILOVER",
            describe=self._describe,
        )
        return self.wait_new_master(old, max(deadline - time.monotonic(), 0.1))

    def kill_master(self, *, restart: bool = False, timeout: float | None = None) -> Address:
        """SIGKILL the master, wait for the sentinels to promote a replica; return its address.

        With ``restart=True`` the killed node is started again afterwards
        (empty, on its old port); the sentinels turn it into a replica of the
        new master a few seconds later (``wait_settled()`` waits for that).
        """
        old = self.master_address()
        victim = self.node_at(old)
        victim.kill()
        new = self.wait_new_master(old, timeout)
        if restart:
            victim.restart()
        return new

    def freeze(self, node: RedisServer) -> None:
        """SIGSTOP a data node or a sentinel; a master frozen past ``down_after_ms`` is replaced."""
        node.pause()

    def thaw(self, node: RedisServer) -> None:
        """SIGCONT a frozen node."""
        node.resume()

    def watch_switches(self, node: RedisServer | None = None) -> SwitchWatcher:
        """Record ``+switch-master`` announcements of one sentinel (the first by default)."""
        return SwitchWatcher(self.sentinel_client(node or self.sentinels[0]))
