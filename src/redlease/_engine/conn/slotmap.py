"""A cluster client's slot map: read by a bounded round trip of ours, then installed.

redis-py refreshes a ``RedisCluster``'s map (``NodesManager.initialize``)
over its own connections, where every read waits the socket timeout afresh:
a node that trickles its ``CLUSTER SLOTS`` answer a byte at a time, or never
ends it, holds the refresh as long as it likes, and nothing caps what it
sends. Here the map is asked for like every other round trip of ours: over a
connection like the client's with a ``BoundedSocket`` under it (``boundedsocket``),
its handshake and the reply ending by one deadline and reading no more than
the reply cap. The known nodes are asked in turn, each within the bound and
all of them within twice it, so one frozen node cannot keep the refresh.

A reply is a map only if every entry is one (``parse``); anything else is an
``UnexpectedReply``, and the next node is asked. The map that passed is
installed with no network I/O (``install``): the ``ClusterNode`` of every
address the client already knew is kept, its connection pool with it; a new
one gets its pool from redis-py's ``create_redis_connections``; the nodes
manager's maps are built aside and replaced whole, never changed in place.
"""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

import redis.cluster
from redis.exceptions import ConnectionError, TimeoutError

from ..contract.interface import remaining
from ..rules.replies import UnexpectedReply
from .boundedsocket import begin_round_trip, bounded_class
from .connect import connection_factory

SLOTS = 16384
"""Hash slots of a Redis Cluster: every range of a map lies in ``0 .. SLOTS - 1``."""

PRIMARY: str = redis.cluster.PRIMARY
REPLICA: str = redis.cluster.REPLICA
_node_cls: Any = redis.cluster.ClusterNode  # unannotated in redis-py

logger = logging.getLogger("redlease")

Range = tuple[int, int, list[tuple[str, int]]]
"""Slots ``first .. last`` and who holds them: the primary's address, then each replica's."""


def refresh(client: Any, bound: float) -> None:
    """Read the slot map from the known nodes of ``client`` in turn and install it.

    Each node is asked within ``bound`` seconds, all of them within twice
    that. A map covering every slot ends the search; a partial one (slots
    not assigned, or a node that knows less) is kept while the other nodes
    are asked, and the one covering most is installed. When no node answered
    with a map, this raises the last node's error and the client's map stays
    as it was.
    """
    manager = client.nodes_manager
    ends = time.monotonic() + 2 * bound
    best: list[Range] = []
    error: Exception = ConnectionError("the cluster client knows no nodes to ask")
    for host, port in known_nodes(manager):
        left = ends - time.monotonic()
        if left <= 0:
            error = TimeoutError(f"no node gave a slot map within {2 * bound:g} s")
            break
        try:
            ranges = parse(ask(client, (host, port), time.monotonic() + min(bound, left)), host)
        except Exception as exc:
            logger.debug("no slot map from %s:%s: %r", host, port, exc)
            error = exc
            continue
        if covered(ranges) > covered(best):
            best = ranges
        if covered(best) == SLOTS:
            break
    if not best:
        raise error
    install(manager, best)


def known_nodes(manager: Any) -> list[tuple[str, int]]:
    """Addresses to ask: the nodes of the current map first, then the startup nodes."""
    nodes = [*list(manager.nodes_cache.values()), *list(manager.startup_nodes.values())]
    return list(dict.fromkeys((str(node.host), int(node.port)) for node in nodes))


def ask(client: Any, address: tuple[str, int], deadline: float) -> Any:
    """``CLUSTER SLOTS`` from the node at ``address``: connected, answered and read by ``deadline``.

    The round trip begins as the socket opens, so the handshake's replies
    (AUTH, HELLO, CLIENT SETINFO) are bound by the same deadline and byte
    cap as the answer. The connection is closed after it, whatever happened.
    """

    def handshake(conn: Any) -> None:
        begin_round_trip(conn, deadline)
        conn.on_connect()

    left = remaining(deadline)
    make = connection_factory(
        client,
        None,
        address,
        wrap=bounded_class,
        socket_timeout=left,
        socket_connect_timeout=left,
        redis_connect_func=handshake,
    )
    conn = make()
    try:
        conn.connect()
        conn.send_command("CLUSTER", "SLOTS", check_health=False)
        return conn.read_response()
    finally:
        conn.disconnect()


def parse(reply: Any, asked: str) -> list[Range]:
    """The slot ranges of a ``CLUSTER SLOTS`` reply from host ``asked``, sorted.

    Each entry is ``[first, last, primary, replica...]`` with ``0 <= first
    <= last < SLOTS``, and each node ``[host, port, node id, ...]``, the
    port in 1..65535 (what follows the id is not used: newer servers add
    metadata there). An empty host is ``asked``, as Redis means it. Anything
    else, or a slot given twice, is an ``UnexpectedReply``.
    """
    if not isinstance(reply, list) or not reply:
        raise _unexpected("not a non-empty array of slot ranges", reply)
    ranges: list[Range] = []
    for entry in reply:
        if not isinstance(entry, list) or len(entry) < 3:
            raise _unexpected("a slot range that is not [first, last, primary, ...]", entry)
        first, last = entry[0], entry[1]
        if not (_is_int(first) and _is_int(last) and 0 <= first <= last < SLOTS):
            raise _unexpected(f"a slot range that is not within 0..{SLOTS - 1}", entry)
        ranges.append((first, last, [_address(node, asked) for node in entry[2:]]))
    ranges.sort(key=lambda r: r[0])
    for before, after in itertools.pairwise(ranges):
        if after[0] <= before[1]:
            raise _unexpected("slot ranges that overlap", [before[:2], after[:2]])
    return ranges


def covered(ranges: list[Range]) -> int:
    """How many slots ``ranges`` (as ``parse`` gives them: none twice) assign."""
    return sum(last - first + 1 for first, last, _ in ranges)


def install(manager: Any, ranges: list[Range]) -> None:
    """Make ``ranges`` the slot map of a redis-py ``NodesManager``.

    A node the manager already knows (by address, after its
    ``remap_host_port``) is kept as the same object, with its pool, its
    role updated in place as redis-py's own MOVED handling does; a new one
    is made and given a pool as redis-py's refresh does. The default node
    stays while it is a primary. The new maps are built aside and each
    attribute is replaced whole: a concurrent reader of one finds the old
    map or the new one, never a map half made.
    """
    old: dict[str, Any] = dict(manager.nodes_cache)
    nodes: dict[str, Any] = {}
    roles: dict[str, str] = {}
    slots: dict[int, list[Any]] = {}

    def node(address: tuple[str, int], role: str) -> Any:
        host, port = manager.remap_host_port(*address)
        made = _node_cls(host, port, role)
        kept = nodes.setdefault(made.name, old.get(made.name, made))
        if role == PRIMARY or made.name not in roles:
            roles[made.name] = role
        return kept

    for first, last, addresses in ranges:
        holders = [node(addresses[0], PRIMARY), *(node(a, REPLICA) for a in addresses[1:])]
        for slot in range(first, last + 1):
            slots[slot] = holders
    manager.create_redis_connections(list(nodes.values()))
    for name, role in roles.items():
        nodes[name].server_type = role
    default = nodes.get(str(getattr(manager.default_node, "name", "")))
    if default is None or default.server_type != PRIMARY:
        default = next(n for n in nodes.values() if n.server_type == PRIMARY)
    manager.nodes_cache = nodes
    manager.slots_cache = slots
    manager.default_node = default


def _address(node: Any, asked: str) -> tuple[str, int]:
    if not isinstance(node, list) or len(node) < 2:
        raise _unexpected("a node that is not [host, port, ...]", node)
    host, port = node[0], node[1]
    if isinstance(host, bytes):
        try:
            host = host.decode("utf-8")
        except UnicodeDecodeError:
            raise _unexpected("a host that is not text", node) from None
    if not isinstance(host, str) or not (_is_int(port) and 0 < port < 65536):
        raise _unexpected("a node whose host or port is not one", node)
    if len(node) > 2 and not isinstance(node[2], (bytes, str)):
        raise _unexpected("a node whose id is not a string", node)
    return host or asked, port


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unexpected(what: str, part: object) -> UnexpectedReply:
    shown = repr(part)
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    return UnexpectedReply(f"CLUSTER SLOTS answered {what}: {shown}; not a slot map")
