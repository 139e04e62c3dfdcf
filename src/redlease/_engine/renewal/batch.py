"""The Python engine's batched renewals: many leases of one server in one script call.

An elector's renewal (``renew.lua``) and a lock's (``lock_refresh.lua``) due
together on one server go as ``renew_many.lua`` calls of up to ``RENEW_CALL_MAX``
leases each, so the server pays one script call for many; any other renewal
(a semaphore's permit, a group member's heartbeat) goes as its own script
call in the same round trip. Each lease gets the reply its own renewal would
have had: 1, 0, or its error reply, which the renewer reads as it reads a
single renewal's (``renewer.Lease``). An error reply of the whole call is
every lease's reply; a reply the call cannot give (not an array of one 0, 1
or error reply per lease) is an ``UnexpectedReply`` for each of its leases.

On a Cluster the leases are grouped by the master the client's slot map
names for their keys, and each node gets calls that declare no key (the
script reads the keys from its arguments). A lease whose key that node does
not serve (``replies.renewed_elsewhere``) did not renew: the slot map is read
again and that lease is renewed at once on its own, routed by its key, so a
MOVED or ASK reply is followed as for any renewal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._scripts import load, renewed_together
from ..conn.client import slot_owner
from ..conn.pyconn import BoundedConnection
from ..contract.interface import ScriptRequest
from ..rules.replies import UnexpectedReply, check, renewed_elsewhere, unexpected_reply
from ..rules.timing import RENEW_CALL_MAX

RENEW_MANY = load("renew_many")


@dataclass(frozen=True, slots=True)
class Renewal:
    """One lease's renewal as a batch sends it (a ``renewer.Lease``'s ``command``).

    ``kind`` is the lease's kind for ``renew_many.lua`` (None: it goes as its
    own ``request``). On a Cluster, ``single`` is the lease's own renewal
    (routed by its key) and ``reroute`` makes that route be looked up again
    in a slot map read after the given ``time.monotonic()`` instant.
    """

    request: ScriptRequest
    kind: str | None
    single: Callable[[float], Any] | None = None
    reroute: Callable[[float], object] | None = None


def renewal(
    request: ScriptRequest,
    single: Callable[[float], Any] | None = None,
    reroute: Callable[[float], object] | None = None,
) -> Renewal:
    """The batch form of the renewal ``request`` (one key, owner and TTL for ``renew_many``)."""
    script, keys, args = request
    kind = renewed_together(script) if len(keys) == 1 and len(args) == 2 else None
    return Renewal(request, kind, single, reroute)


def batchable(request: ScriptRequest) -> bool:
    """Whether ``renew_many.lua`` renews this renewal as its own script would."""
    return renewal(request).kind is not None


def _many(renewals: Sequence[Renewal], declared: bool) -> ScriptRequest:
    keys: list[Any] = []
    args: list[Any] = []
    for each in renewals:
        _script, lease_keys, (owner, ttl_ms) = each.request
        keys.append(lease_keys[0])
        args += (each.kind, owner, ttl_ms)
    if declared:
        return RENEW_MANY, keys, args
    return RENEW_MANY, (), [*args, *keys]


def _calls(renewals: Sequence[Renewal], declared: bool) -> list[tuple[ScriptRequest, list[int]]]:
    """The script calls that renew ``renewals``, each with the leases (by index) it answers."""
    calls: list[tuple[ScriptRequest, list[int]]] = []
    many: list[int] = []
    for i, each in enumerate(renewals):
        if each.kind is None:
            calls.append((each.request, [i]))
        else:
            many.append(i)
    for start in range(0, len(many), RENEW_CALL_MAX):
        chunk = many[start : start + RENEW_CALL_MAX]
        if len(chunk) == 1 and declared:
            # One lease alone goes as its own renewal.
            calls.append((renewals[chunk[0]].request, chunk))
        else:
            calls.append((_many([renewals[i] for i in chunk], declared), chunk))
    return calls


def _spread(request: ScriptRequest, leases: list[int], reply: Any, out: list[Any]) -> None:
    """Each lease's reply out of one call's ``reply`` (see the module doc)."""
    script = request[0]
    got = check(script, reply)
    if script is not RENEW_MANY:
        out[leases[0]] = got
        return
    if not isinstance(got, Exception) and len(got) != len(leases):
        got = unexpected_reply(
            script.name, f"an array of {len(leases)} replies, one per lease", reply
        )
    for n, i in enumerate(leases):
        out[i] = got if isinstance(got, Exception) else got[n]


def send(conn: BoundedConnection, renewals: Sequence[Renewal], timeout: float) -> list[Any]:
    """Renew ``renewals`` on ``conn`` (one server) in one round trip: a reply per renewal.

    The keys are declared. A connection that carried a reply the calls cannot
    give is dropped: its stream can no longer be trusted. Raises when the
    round trip failed (no reply is known).
    """
    return _send(conn, renewals, timeout, declared=True)


def _send(
    conn: BoundedConnection, renewals: Sequence[Renewal], timeout: float, declared: bool
) -> list[Any]:
    calls = _calls(renewals, declared)
    replies = conn.eval_many([request for request, _ in calls], timeout)
    out: list[Any] = [None] * len(renewals)
    for (request, leases), reply in zip(calls, replies, strict=True):
        _spread(request, leases, reply, out)
    if any(isinstance(reply, UnexpectedReply) for reply in out):
        conn.drop()
    return out


class NodeBatches:
    """A Cluster engine's batched renewals: one connection per master, calls per node.

    Only the renewer thread uses it.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._conns: dict[str, BoundedConnection] = {}

    def send(self, renewals: Sequence[Renewal], timeout: float) -> list[Any]:
        """A reply per renewal (each a result or an error in its place); never raises.

        Each node's round trip, and each renewal sent on its own, is bounded
        by ``timeout`` by itself: a frozen node does not take the time of the
        nodes asked after it.
        """
        asked = time.monotonic()
        out: list[Any] = [None] * len(renewals)
        by_node: dict[str, list[int]] = {}
        alone: list[int] = []
        for i, each in enumerate(renewals):
            node = slot_owner(self._client, each.request[1][0]) if each.kind else None
            if node is None:
                alone.append(i)
            else:
                by_node.setdefault(node, []).append(i)
        for node, leases in by_node.items():
            conn = self._conn(node)
            try:
                replies = _send(conn, [renewals[i] for i in leases], timeout, declared=False)
            except Exception as exc:  # the round trip failed: so did each renewal of it
                # The node may have failed over: the next batch groups by a fresh map.
                self._conns.pop(node, None)
                conn.drop()
                self._reroute(renewals[leases[0]], asked)
                for i in leases:
                    out[i] = exc
                continue
            for i, reply in zip(leases, replies, strict=True):
                if renewed_elsewhere(reply):
                    self._reroute(renewals[i], asked)
                    alone.append(i)
                else:
                    out[i] = reply
        for i in alone:
            single = renewals[i].single
            try:
                if single is None:
                    raise RuntimeError("a cluster renewal without its own route")
                out[i] = single(timeout)
            except Exception as exc:
                out[i] = exc
        return out

    @staticmethod
    def _reroute(each: Renewal, asked: float) -> None:
        if each.reroute is not None:
            each.reroute(asked)

    def _conn(self, node: str) -> BoundedConnection:
        conn = self._conns.get(node)
        if conn is None:
            host, _, port = node.rpartition(":")
            conn = self._conns[node] = BoundedConnection(self._client, None, (host, int(port)))
        return conn

    def invalidate(self) -> None:
        """Every node connection reconnects before its next round trip."""
        for conn in self._conns.values():
            conn.invalidate()

    def close(self) -> None:
        for conn in self._conns.values():
            conn.drop()
        self._conns.clear()
