"""The native engine: the ``Engine`` interface over the Cython core in ``_native``.

Every round trip runs with the GIL released on the engine's own connections,
opened like the user's client (address, db, credentials, client name) but
never borrowed from it, so the client's retry and timeout settings cannot
stretch a call. Every lease of an engine is renewed by its one
``_native.Renewer`` thread, which never takes the GIL.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from redis.exceptions import ResponseError

from ... import _scripts
from ..._scripts import Script
from .._native import _core as _native
from ..conn.client import Endpoint
from ..conn.failover import MasterSwitches
from ..contract.aiowriter import LoopWriter
from ..contract.interface import (
    CALL_CONNECTIONS,
    CLUSTER_CALL_CONNECTIONS,
    DEFAULT_WRITE_TIMEOUT,
    WRITE_CONNECTIONS,
    BatchItem,
    EncodableT,
    Notices,
    Pools,
    ScriptRequest,
    ScriptSeries,
    flatten,
)
from ..notices.nativenotices import NativeNotices
from ..rules.replication import ReplicationGuard
from ..rules.replies import check
from ..rules.replytable import topology


class _Tracked:
    """Tells the engine's switch tracker where each term began (behind Sentinel)."""

    __slots__ = ()  # thousands of leases: no instance dict
    switches: weakref.ReferenceType[MasterSwitches] | None  # a slot of each subclass

    def begin(self, token: int, acquired_at: float) -> None:
        # Before the token shows: a switch notice heard right after must
        # already know where this term began.
        ref = getattr(self, "switches", None)  # set only behind Sentinel
        switches = ref() if ref is not None else None
        if switches is not None:
            switches.began(self, token)
        super().begin(token, acquired_at)  # type: ignore[misc]


class _Lease(_native.Lease):
    """A lease renewed by the engine's one shared renewer."""

    __slots__ = ()


class _TrackedLease(_Tracked, _native.Lease):
    """A lease behind Sentinel: the switch tracker learns where each of its terms began."""

    __slots__ = ("switches",)


class NativeEngine(Pools):
    """Runs scripts and keeps leases with the native core (see ``_engine.Engine``).

    ``execute`` is safe from any number of threads: it takes a free connection
    from a small pool (waiting for one counts against the timeout), runs
    EVALSHA (EVAL once on NOSCRIPT) with the GIL released, and raises
    redis-py's own exception types. A fenced write is bounded by
    ``write_timeout`` seconds, or ``DEFAULT_WRITE_TIMEOUT`` when it is None.
    """

    name = "native"
    reason = ""

    def __init__(self, endpoint: Endpoint, write_timeout: float | None) -> None:
        self.endpoint = endpoint
        self.write_timeout = (
            DEFAULT_WRITE_TIMEOUT if write_timeout is None else float(write_timeout)
        )
        self._target = _native.Target(endpoint)
        cluster = endpoint.kind == "cluster"
        self.calls = _native.Pool(
            self._target, CLUSTER_CALL_CONNECTIONS if cluster else CALL_CONNECTIONS
        )
        self.writes = _native.Pool(self._target, WRITE_CONNECTIONS)
        self._refs: dict[str, _native.ScriptRef] = {}
        # One native thread renews every lease of this engine: over one
        # connection (following the master behind Sentinel), or one per
        # slot-owning master on a cluster. Made with the first keeper.
        self._renewer: _native.Renewer | None = None
        self._renewer_lock = threading.Lock()
        self._switches = MasterSwitches(
            endpoint.sentinels, self._forget_master, self._target.master_address
        )
        self._notices: NativeNotices | None = None  # made by the first notices()
        # asyncio writes: one pipelined connection per event loop.
        self._loop_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWriter] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"<NativeEngine {self.endpoint.address} db={self.endpoint.db}>"

    def _ref(self, script: Script) -> _native.ScriptRef:
        ref = self._refs.get(script.sha)
        if ref is None:
            ref = self._refs.setdefault(script.sha, _native.ScriptRef(script.sha, script.source))
        return ref

    def execute(
        self,
        batch: Sequence[BatchItem],
        *,
        timeout: float | None = None,
        wait: ReplicationGuard | None = None,
        slot: int | None = None,
    ) -> tuple[list[Any], int]:
        """Script calls in one round trip on a pooled connection, GIL released (see ``Engine``).

        A ``ScriptSeries`` is encoded by the core straight from its lists, with
        no request made per call.
        """
        if not batch:
            return [], 0
        refs = self._refs
        first = batch[0]
        if len(batch) == 1 and type(first) is not ScriptSeries:
            # One call, the common case: the pool's single-script path.
            script, keys, args = cast(ScriptRequest, first)
            try:
                if wait is None:
                    return [self.call_one(script, keys, args, timeout, slot)], 0
                pool, bound = self.pool_for(timeout)
                ref = refs.get(script.sha) or self._ref(script)
                reply, acked = pool.execute_wait(
                    ref, keys, args, bound, wait.min_replicas, wait.timeout_ms, slot
                )
            except ResponseError as exc:  # an error reply (or UnexpectedReply): in its place
                return [exc], 0
            return [check(script, reply)], acked
        requests: list[BatchItem] = batch if type(batch) is list else list(batch)
        pool, bound = self.pool_for(timeout)
        if wait is None:
            replies, acked, flags = _native.execute_scripts(
                pool, requests, refs, self._ref, bound, 0, 0, slot
            )
        else:
            replies, acked, flags = _native.execute_scripts(
                pool, requests, refs, self._ref, bound, wait.min_replicas, wait.timeout_ms, slot
            )
        script = first.script if isinstance(first, ScriptSeries) else first[0]
        if flags and script.reply == "flag":
            # One script for the whole batch, whose replies are 0 or 1, and the
            # core saw only 0s and 1s: every reply is one it can give.
            return replies, acked
        calls = flatten(batch)
        return [check(s, r) for (s, _k, _a), r in zip(calls, replies, strict=True)], acked

    def call_one(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        timeout: float | None = None,
        slot: int | None = None,
    ) -> Any:
        """One call, its error raised: ``execute``'s single-call path without a batch around
        it (a sync fenced write's, or a release's, whole cost is this call)."""
        ref = self._refs.get(script.sha) or self._ref(script)
        pool, bound = self.pool_for(timeout)
        reply = check(script, pool.execute(ref, keys, args, bound, slot))
        if isinstance(reply, Exception):
            raise reply
        return reply

    def loop_writer(self, loop: asyncio.AbstractEventLoop) -> LoopWriter | None:
        """The pipelined writer on ``loop`` (made on first use)."""
        writer = self._loop_writers.get(loop)
        if writer is None:
            conn = _native.LoopConn(self._target, self._refs, self._ref)
            where = topology(self.endpoint.kind == "cluster", self.endpoint.kind == "sentinel")
            writer = LoopWriter(loop, conn, conn.put, self.write_timeout, self.call_one, where)
            self._loop_writers[loop] = writer
        return writer

    def keeper(self, renew: ScriptRequest, *, interval: float, ttl: float) -> _native.Lease:
        """A new lease renewed with the call ``renew`` by the engine's one shared renewer.

        Every lease of the engine is renewed by one native thread: over one
        connection on a fixed address or behind Sentinel (it follows the
        master the sentinels name), over one connection per slot-owning
        master on a cluster (each lease routed by its key's slot). The
        leases of renew.lua and lock_refresh.lua that fall due together are
        renewed many to a call of lua/renew_many.lua.
        """
        # close() reaches these through the renewer, which ends them all.
        script, keys, args = renew
        # renew.lua's and lock_refresh.lua's leases are renewed many to a call.
        together = _scripts.renewed_together(script) if len(keys) == 1 else None
        many = self._ref(_scripts.load("renew_many")) if together is not None else None
        made = (
            self._shared_renewer(),
            self._ref(script),
            keys,
            args,
            interval,
            ttl,
            together,
            many,
        )
        if self.endpoint.sentinels is None:
            return _Lease(*made)
        keeper = _TrackedLease(*made)
        keeper.switches = weakref.ref(self._switches)
        self._switches.track(keeper)
        return keeper

    def _shared_renewer(self) -> _native.Renewer:
        with self._renewer_lock:
            if self._renewer is None or self._renewer.closed:
                self._renewer = _native.Renewer(self._target)
            return self._renewer

    @property
    def renewer(self) -> _native.Renewer | None:
        """The shared renewer, once a keeper was made (else None)."""
        return self._renewer

    def _forget_master(self) -> None:
        # The sentinels named a new master: the next connect must ask them again.
        self._target.forget_master()

    def confirm_master(self, timeout: float, release: Callable[[], object]) -> None:
        self._switches.confirm(timeout, release)

    def notices(self, client: Any) -> Notices:
        """The native listener.

        A cluster's notice travels in its name's slot, whose owner moves with
        failovers and migrations: it is heard on a hub per node, and re-homed
        after the slot map of the user's cluster ``client``.
        """
        if self.endpoint.kind == "cluster":
            return NativeNotices(self.endpoint, cluster=client)
        notices = self._notices
        if notices is None:
            notices = self._notices = NativeNotices(self.endpoint)
        return notices

    def close(self) -> None:
        """Close every connection of this engine, its keepers' included. Idempotent."""
        self._switches.close()
        for writer in list(self._loop_writers.values()):
            writer.close()
        if self._renewer is not None:
            self._renewer.close()
        self.calls.close()
        self.writes.close()
