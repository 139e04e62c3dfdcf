"""The pure-Python engine: redis-py connections and a Python renewal thread.

It is the reference the native engine is measured against, and the engine
for clients the native one cannot serve (TLS, where the build lacks it). Its
renewals run on a Python thread, so they are late whenever another thread
holds the GIL for long: that is the limitation the native engine removes.

Its one connection type, ``BoundedConnection``, is in ``pyconn``; here are
the pools of them and the engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from redis.exceptions import (
    ResponseError,
    TimeoutError,
)

from ..conn.client import is_cluster, master_node, sentinels_of
from ..conn.connect import connection_factory
from ..conn.failover import MasterSwitches
from ..conn.pyconn import BoundedConnection
from ..conn.pyloopconn import PyLoopConn
from ..contract.aiowriter import LoopWriter
from ..contract.interface import (
    CALL_CONNECTIONS,
    DEFAULT_WRITE_TIMEOUT,
    WRITE_CONNECTIONS,
    BatchItem,
    Notices,
    Pools,
    ScriptRequest,
    flatten,
    remaining,
)
from ..notices.pynotices import PythonNotices
from ..renewal.batch import NodeBatches, Renewal, batchable, renewal
from ..renewal.batch import send as send_batch
from ..renewal.renewer import Lease, Renewer
from ..rules.replication import ReplicationGuard
from ..rules.replies import UnexpectedReply, check, classify, fits, resent
from ..rules.replytable import ASK, MOVED, topology
from ..rules.timing import RESEND_PAUSE, wait_command

_MAX_REDIRECTS = 3
"""MOVED replies followed per call (on a cluster client)."""


def _send_again(reply: object, topology: int, sends: int, deadline: float) -> bool:
    """Whether a call (or batch) answered ``reply`` after ``sends`` sends goes out again.

    The reply table decides (``replies.resent``); a MOVED is followed up to
    ``_MAX_REDIRECTS`` times, anything else resent is resent once. Pauses
    before a resend that is not a redirection.
    """
    if not resent(reply, topology) or time.monotonic() >= deadline:
        return False
    if classify(reply) == MOVED:
        return sends <= _MAX_REDIRECTS
    if sends > 1:
        return False
    time.sleep(min(RESEND_PAUSE, max(deadline - time.monotonic(), 0.0)))
    return True


class _Attempt:
    """One send of a call or batch: a pooled connection taken on entry, given back on exit."""

    __slots__ = (
        "_conn",
        "_deadline",
        "_generation",
        "_key",
        "_pool",
        "_route",
        "_slot",
        "keep",
        "sends",
    )

    def __init__(
        self,
        pool: _Pool,
        key: str | bytes | None,
        slot: int | None,
        deadline: float,
        sends: int,
    ) -> None:
        self._pool, self._key, self._slot, self._deadline = pool, key, slot, deadline
        self.sends = sends  # this send's number, from 1
        self.keep = True  # give the connection back (False: its stream can't be trusted)

    def __enter__(self) -> BoundedConnection:
        pool, key = self._pool, self._key
        # Looked up on every send: a MOVED or a failover changes the route
        # (the slot map's owner of the key's slot, hashed only when not given).
        self._route = master_node(pool._client, key, self._slot).name if key is not None else None
        self._conn, self._generation = pool._take(self._route, key, self._deadline)
        return self._conn

    def __exit__(self, *exc_info: object) -> None:
        self._pool._give(self._route, self._conn, self._generation, self.keep)


class _Pool:
    """A few bounded connections, opened on demand, shared by threads.

    With a cluster client there is one set per node, routed by the first
    key's slot (one per node, not per key: lock names are unbounded). At
    most ``size`` round trips run at once; waiting for a free connection
    counts against the caller's deadline.
    """

    def __init__(self, client: Any, size: int) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self.topology = topology(self._cluster, bool(sentinels_of(client)))
        self._size = size
        self._cond = threading.Condition()
        self._busy = 0
        self._generation = 0
        self._idle: dict[object, list[BoundedConnection]] = {}
        # Where the last script that ran went (the master a Sentinel named then).
        self.served: tuple[str, int] | None = None

    def eval_script(
        self,
        request: ScriptRequest,
        timeout: float,
        wait: tuple[int, int] | None = None,
        slot: int | None = None,
    ) -> Any:
        """``BoundedConnection.eval_script`` on one pooled connection (see ``eval_many``)."""
        deadline = time.monotonic() + timeout
        script, keys, _ = request
        key = keys[0] if keys and self._cluster else None
        for attempt in self._attempts(key, slot, deadline):
            with attempt as conn:
                try:
                    reply = conn.eval_script(request, remaining(deadline), wait=wait)
                    self.served = conn.address
                    got = check(script, reply[0] if wait is not None else reply)
                    if isinstance(got, UnexpectedReply):
                        # Whatever else the server sent is still on the wire.
                        attempt.keep = False
                        raise got
                    return reply
                except ResponseError as exc:
                    # Nothing ran when the table says to send again (the route was
                    # looked up again): send to the new owner or master.
                    attempt.keep = False
                    if not _send_again(exc, self.topology, attempt.sends, deadline):
                        raise
        raise AssertionError("unreachable: the attempts never end")  # pragma: no cover

    def eval_many_wait(
        self,
        requests: Sequence[ScriptRequest],
        timeout: float,
        replicas: int,
        wait_ms: int,
        slot: int | None = None,
    ) -> tuple[list[Any], int]:
        """``eval_many``, then one ``WAIT replicas wait_ms`` on the connection that ran it."""
        wait_command(replicas, wait_ms)  # checked before anything is sent
        acked: list[int] = []
        replies = self.eval_many(requests, timeout, wait=(replicas, wait_ms, acked), slot=slot)
        return replies, (acked[0] if acked else 0)

    def eval_many(
        self,
        requests: Sequence[ScriptRequest],
        timeout: float,
        wait: tuple[int, int, list[int]] | None = None,
        slot: int | None = None,
    ) -> list[Any]:
        """``BoundedConnection.eval_many`` on one pooled connection.

        On a cluster the batch goes to the owner of its first key's slot
        (``slot`` when the caller knows it: the key is not hashed again).
        When every reply says the write did not run on this server (MOVED;
        READONLY, MASTERDOWN, LOADING: no longer the master), the route is
        looked up again and the whole batch sent again while the deadline
        allows; when every reply is ASK, the batch goes once to the node
        named, each write after its own ASKING. As after a single write's
        error, a batch with any error reply gives its connection up: the
        next one connects afresh.
        """
        deadline = time.monotonic() + timeout
        key = requests[0][1][0] if self._cluster and requests[0][1] else None
        for attempt in self._attempts(key, slot, deadline):
            with attempt as conn:
                replies = conn.eval_many(requests, remaining(deadline))
                replies = [check(r[0], reply) for r, reply in zip(requests, replies, strict=True)]
                if not any(isinstance(reply, Exception) for reply in replies):
                    return _then_wait(conn, replies, wait, deadline)
                attempt.keep = False
                if self._cluster and all(classify(reply) == ASK for reply in replies):
                    # The slot is migrating and the keys have left: every write,
                    # none of which ran, goes once to the node named.
                    target = BoundedConnection(self._client, key, replies[0].node_addr)
                    try:
                        replies = target.eval_many(requests, remaining(deadline), asking=True)
                        replies = [
                            check(r[0], reply) for r, reply in zip(requests, replies, strict=True)
                        ]
                        return _then_wait(target, replies, wait, deadline)
                    finally:
                        target.drop()
                if not all(resent(reply, self.topology) for reply in replies):
                    return _then_wait(conn, replies, wait, deadline)
                if classify(replies[0]) == MOVED:
                    conn.reroute()
                if not _send_again(replies[0], self.topology, attempt.sends, deadline):
                    return replies
        raise AssertionError("unreachable: the attempts never end")  # pragma: no cover

    def _attempts(
        self, key: str | bytes | None, slot: int | None, deadline: float
    ) -> Iterator[_Attempt]:
        """Sends of one call or batch, each on a connection to ``key``'s route as it is then
        (``key``'s slot is ``slot`` when not None).

        The caller ends the loop (a result, or an error it raises); each
        attempt, used as a context manager, gives its connection back, or
        drops it when the attempt said ``keep = False``.
        """
        sends = 0
        while True:
            sends += 1
            yield _Attempt(self, key, slot, deadline, sends)

    def _give(self, route: object, conn: BoundedConnection, generation: int, keep: bool) -> None:
        with self._cond:
            self._busy -= 1
            if keep and generation == self._generation:
                self._idle.setdefault(route, []).append(conn)
            else:
                conn.drop()  # rerouted, or opened before the server changed
            self._cond.notify()

    def _take(
        self, route: object, key: str | bytes | None, deadline: float
    ) -> tuple[BoundedConnection, int]:
        with self._cond:
            while self._busy >= self._size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("redlease: every connection busy past the deadline")
                self._cond.wait(left)
            self._busy += 1
            generation = self._generation
            idle = self._idle.get(route)
            if idle:
                return idle.pop(), generation
        return BoundedConnection(self._client, key), generation

    def invalidate(self) -> None:
        """Every connection reconnects before its next round trip (busy ones included)."""
        with self._cond:
            self._generation += 1
            conns = [conn for idle in self._idle.values() for conn in idle]
            self._idle.clear()
        for conn in conns:
            conn.drop()

    def close(self) -> None:
        with self._cond:
            conns = [conn for idle in self._idle.values() for conn in idle]
            self._idle.clear()
        for conn in conns:
            conn.drop()


def _then_wait(
    conn: BoundedConnection,
    replies: list[Any],
    wait: tuple[int, int, list[int]] | None,
    deadline: float,
) -> list[Any]:
    """With ``wait``, one WAIT on ``conn`` after its batch; the count goes into ``wait[2]``."""
    if wait is not None:
        replicas, wait_ms, acked = wait
        reply = conn.execute(wait_command(replicas, wait_ms), wait_ms / 1000 + remaining(deadline))
        acked.append(int(reply))
    return replies


class PythonEngine(Pools):
    """The Engine protocol on redis-py (see ``_engine.Engine``).

    Control calls and fenced writes each run on small pools of the engine's
    own connections, opened like the user's client but with no retries and a
    deadline per call: a fenced write is sent at most once, whatever retry
    policy the client carries, and raises when its outcome is unknown.
    """

    name = "python"
    reason = ""

    def __init__(self, client: Any, write_timeout: float | None = None) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self.write_timeout = (
            DEFAULT_WRITE_TIMEOUT if write_timeout is None else float(write_timeout)
        )
        self.calls = _Pool(client, CALL_CONNECTIONS)
        self.writes = _Pool(client, WRITE_CONNECTIONS)
        self._keeper_conns: weakref.WeakSet[BoundedConnection] = weakref.WeakSet()
        # One thread renews every keeper of this engine; off a cluster, over
        # one connection (only that thread uses it).
        self._renewer = Renewer()
        weakref.finalize(self, self._renewer.stop, 1.0)
        self._renew_conn = BoundedConnection(client)
        self._keeper_conns.add(self._renew_conn)
        self._node_batches = NodeBatches(client)
        self._switches = MasterSwitches(
            sentinels_of(client), self._forget_master, lambda: self.calls.served
        )
        self._loop_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWriter] = (
            weakref.WeakKeyDictionary()
        )
        self._loop_ok = not is_cluster(client)
        self._master_generation = 0  # bumped when the sentinels announce a new master

    def execute(
        self,
        batch: Sequence[BatchItem],
        *,
        timeout: float | None = None,
        wait: ReplicationGuard | None = None,
        slot: int | None = None,
    ) -> tuple[list[Any], int]:
        """Script calls in one round trip on a pooled connection (see ``Engine``)."""
        pool: _Pool
        pool, bound = self.pool_for(timeout)
        batch = flatten(batch)  # a run's calls, made here: redis-py sends call by call
        if not batch:
            return [], 0
        if len(batch) == 1:
            try:
                if wait is None:
                    return [pool.eval_script(batch[0], bound, slot=slot)], 0
                reply, acked = pool.eval_script(
                    batch[0], bound, wait=(wait.min_replicas, wait.timeout_ms), slot=slot
                )
            except ResponseError as exc:
                return [exc], 0
            return [reply], acked
        if wait is None:
            return pool.eval_many(batch, bound, slot=slot), 0
        return pool.eval_many_wait(batch, bound, wait.min_replicas, wait.timeout_ms, slot)

    def loop_writer(self, loop: asyncio.AbstractEventLoop) -> LoopWriter | None:
        """The pipelined writer on ``loop`` (made on first use), or None where unserved."""
        writer = self._loop_writers.get(loop)
        if writer is None and self._loop_ok:
            conn = PyLoopConn(
                connection_factory(self._client, None), lambda: self._master_generation
            )
            writer = LoopWriter(
                loop, conn, conn.put, self.write_timeout, self.call_one, self.calls.topology
            )
            self._loop_writers[loop] = writer
        return writer

    def keeper(self, renew: ScriptRequest, *, interval: float, ttl: float) -> Lease:
        """A lease renewed by the engine's one renewer thread (``renewer.Renewer``).

        On one server all leases share one renewal connection, and renewals
        due together go in one round trip on it, an elector's and a lock's
        in ``renew_many`` calls (``renewal.batch``); on a cluster each has a
        connection of its own, routed by its key's slot, for the renewals it
        makes alone, and those ``renew_many`` can renew go in calls per node.
        A reply the renew script cannot give drops the connection (its
        stream can no longer be trusted).
        """
        script, keys, args = renew[0], tuple(renew[1]), tuple(renew[2])
        request = (script, keys, args)
        on_close: Callable[[], object] | None = None
        if self._cluster:
            conn = BoundedConnection(self._client, keys[0] if keys else None)
            self._keeper_conns.add(conn)
            on_close = conn.drop
        else:
            conn = self._renew_conn

        def renew_once(timeout: float) -> Any:
            reply = conn.eval_script(request, timeout)
            if not fits("flag", reply):
                conn.drop()
            return reply

        switches = weakref.ref(self._switches)

        def began(token: int) -> None:
            tracker = switches()
            if tracker is not None:
                tracker.began(lease_ref(), token)

        command: Renewal | None = None
        send: Callable[[list[Any], float], list[Any]] | None = None
        if not self._cluster:
            # Renewals falling due together share one write and one read.
            command, send = renewal(request), self._renew_batch
        elif batchable(request):
            command = renewal(request, renew_once, conn.reroute)
            send = self._node_batches.send
        lease = Lease(
            self._renewer,
            renew_once,
            interval=interval,
            ttl=ttl,
            on_close=on_close,
            on_begin=began,
            command=command,
            batch=send,
        )
        lease_ref = weakref.ref(lease)
        self._switches.track(lease)
        return lease

    def _renew_batch(self, renewals: list[Renewal], timeout: float) -> list[Any]:
        """Renewals in one round trip on the renewal connection (``batch.send``)."""
        return send_batch(self._renew_conn, renewals, timeout)

    def _forget_master(self) -> None:
        self._master_generation += 1
        self.calls.invalidate()
        self.writes.invalidate()
        for conn in list(self._keeper_conns):
            conn.invalidate()
        self._node_batches.invalidate()

    def confirm_master(self, timeout: float, release: Callable[[], object]) -> None:
        self._switches.confirm(timeout, release)

    def notices(self, client: Any) -> Notices:
        """The Python listener thread (``pynotices.PythonNotices``)."""
        return PythonNotices(client)

    def close(self) -> None:
        self._switches.close()
        for writer in list(self._loop_writers.values()):
            writer.close()
        self.calls.close()
        self.writes.close()
        self._renewer.stop()
        self._renew_conn.drop()
        self._node_batches.close()


__all__ = ["BoundedConnection", "PythonEngine"]
