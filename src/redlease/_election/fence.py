"""Fenced writes: the token check and the write in one atomic script.

``FencedWrites`` is the fenced-write machinery of one elector name, shared by the
threaded and the asyncio front ends: it validates a write into a request
(script, keys, args) before anything is sent, caches ``fence_eval`` bodies,
and sends every request through the engine's one way to run scripts
(``run``; coroutines' through the loop writer, pipelines included), so the
two front ends differ only in how they wait for the reply.

One path for every write. Its request is built by ``set_request``,
``hset_request`` or ``eval_request`` (a pipeline's ``set_many`` and
``hset_many`` by ``bind_series``), whichever face it comes from:
``Elector.fence_*``, ``Fencer``, a pipeline, threaded or asyncio. One write
is sent by ``write`` from a thread, and by ``write_async`` for a coroutine,
whose future the face awaits itself; a pipeline's batch by ``write_many`` /
``write_many_async``. The common case (exact types, a live token, no slot
to check, no replication guard) takes this path too, with nothing checked
twice and no call it does not need.

A fenced write is sent at most once. When its outcome is unknown (the
connection broke or the deadline passed after the script may have reached
the server) it raises redis-py's ``ConnectionError`` / ``TimeoutError``: the
write may or may not have landed, and it is never sent again behind the
caller's back — a resent script could apply twice, or be "rejected" by the
mark its own first copy raised. The same holds for every write of a batch.

The pipelines (``pipeline``) queue fenced writes with one token for one
round trip; the public ``Fencer`` handles (threaded and asyncio) live
beside their electors and hold a ``FencedWrites``.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol, cast

from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

from .. import _scripts
from .._engine import (
    MAX_TOKEN,
    EncodableT,
    Engine,
    ForkSafeLock,
    ReplicationGuard,
    ScriptSeries,
    execute_one,
    flatten,
    is_failover_reply,
    split_pairs,
)
from .._errors import TooManyEvalBodies
from .._log import Events

if TYPE_CHECKING:
    from .._engine import LoopWriter
    from .._scripts import Script

MAX_EVAL_BODIES = 256
"""Distinct ``fence_eval`` bodies one Elector caches before TooManyEvalBodies."""

FENCE_SET = _scripts.fenced_file("fence_set")
FENCE_HSET = _scripts.fenced_file("fence_hset")

FenceRequest = tuple["Script", tuple["str | bytes", ...], tuple[EncodableT, ...]]
"""What one fenced write sends: the script, its keys and its args."""

KEY_TYPES = frozenset((str, bytes))
VALUE_TYPES = frozenset((str, bytes, int, float))
"""The exact types of keys and values that need no further check (bool is not an int here)."""

_PAIR_TYPES = frozenset((tuple, list))
_PAIR_LENGTHS = frozenset((2,))


_running_loop = asyncio.get_running_loop


def _no_loop() -> asyncio.AbstractEventLoop | None:
    """The loop of a FencedWrites's cached loop writer before any loop wrote: none."""
    return None


_NO_LOOP_WRITER: tuple[Callable[[], asyncio.AbstractEventLoop | None], LoopWriter | None] = (
    _no_loop,
    None,
)

# One lock for every fence's cache of eval bodies (looked up under it for a
# moment per fence_eval): a lock per elector would cost more than it saves.
_EVAL_BODIES = ForkSafeLock()


def check_token(token: object) -> int:
    """A fencing token as an int: TypeError for non-ints (bools included),
    ValueError at or above 2**53, where Redis' comparison stops being exact."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, got {type(token).__name__} {token!r}")
    if token >= MAX_TOKEN:
        raise ValueError(
            f"fencing token must be below 2**53 (Redis compares tokens as doubles), got {token}"
        )
    return token


def check_key(key: object, what: str = "key") -> str | bytes:
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"{what} must be str or bytes, got {type(key).__name__} {key!r}")
    return key


def check_value(value: object, what: str = "value") -> EncodableT:
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
        raise TypeError(
            f"{what} must be str, bytes, int or float, got {type(value).__name__} {value!r}"
        )
    return value


def check_pairs(
    items: object, what: str, first: str, first_types: frozenset[type]
) -> tuple[list[Any], list[EncodableT]]:
    """``items`` (a mapping, or an iterable of 2-item pairs) as two lists: every pair's
    first (checked as a ``first``: a key, or a field) and every pair's value.

    The lists are a snapshot: changing ``items`` afterwards changes nothing.
    A bad item raises TypeError naming the rule, the item's place and its
    value. A dict or list of plainly good items is split in one C call
    (``split_pairs``); otherwise exact types are checked for the whole list
    at once, and the first bad one is then looked for item by item.
    """
    plain = split_pairs(items, first_types is KEY_TYPES)
    if plain is not None:
        return plain
    if isinstance(items, Mapping):
        firsts: list[Any] = list(items)
        seconds: list[Any] = list(items.values())
    elif isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise TypeError(
            f"{what} takes a mapping or an iterable of ({first}, value) pairs, "
            f"got {type(items).__name__} {items!r}"
        )
    else:
        rows = items if type(items) is list else list(items)
        if _PAIR_TYPES.issuperset(map(type, rows)) and _PAIR_LENGTHS.issuperset(map(len, rows)):
            flat = list(chain.from_iterable(rows))
            firsts, seconds = flat[0::2], flat[1::2]
        else:
            firsts, seconds = [], []
            for i, row in enumerate(rows):
                if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or len(row) != 2:
                    raise TypeError(
                        f"{what}: item {i} must be a ({first}, value) pair, "
                        f"got {type(row).__name__} {row!r}"
                    )
                firsts.append(row[0])
                seconds.append(row[1])
    if not first_types.issuperset(map(type, firsts)):
        check = check_key if first_types is KEY_TYPES else check_value
        for i, one in enumerate(firsts):
            check(one, f"{what}: the {first} of item {i}")
    if not VALUE_TYPES.issuperset(map(type, seconds)):
        for i, value in enumerate(seconds):
            check_value(value, f"{what}: the value of item {i}")
    return firsts, seconds


def _check_sequence(value: object, what: str, of: str) -> Sequence[object]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of {of}, got {type(value).__name__}")
    return value


class FailoverSink(Protocol):
    """Who is told that a fenced write found its server no longer the master."""

    def failover_seen(self, token: int, exc: Exception) -> None: ...


class FencedWrites:
    """The fenced writes of one elector name, on one engine. Thread-safe.

    Each ``*_request`` validates its arguments and returns the request, or
    None when the token can never write (0 and negative tokens: the inert
    Fencer): every face builds its writes with them, pipelines included
    (whose ``set_many`` and ``hset_many`` are ``bind_series``'s). ``write``
    sends one request from a thread and returns ``applied``; ``write_async``
    is its future for a coroutine; ``write_many`` / ``write_many_async``
    send a pipeline's batch.
    """

    __slots__ = (
        "_applied_key",
        "_engine",
        "_eval_scripts",
        "_events",
        "_failovers",
        "_guard",
        "_loop_writer",
        "_name",
        "_slot",
        "_wait",
    )

    def __init__(
        self,
        engine: Engine,
        applied_key: str,
        name: str,
        events: Events,
        *,
        cluster: bool = False,
        guard: ReplicationGuard | None = None,
        failovers: FailoverSink | None = None,
    ) -> None:
        self._engine = engine
        self._guard = guard or ReplicationGuard()
        # What run() takes as ``wait`` (the guard is frozen): None when it is off.
        self._wait = self._guard.wait
        # Told when a write with a token is answered READONLY / MASTERDOWN /
        # NOREPLICAS, so the term holding that token can end at once (its
        # Election itself: a bound method each would cost a lease 64 bytes).
        self._failovers = failovers
        self._applied_key = applied_key
        self._name = name
        # On a cluster every key of a write must live in the name's slot: the
        # one hash of the name, which every write carries to the engine (its
        # first key, the mark, is in it), so none is hashed again to be routed.
        self._slot = _slot(applied_key) if cluster else None
        self._eval_scripts: dict[str, Script] | None = None  # made by the first fence_eval
        self._events = events  # its Election's: fenced-write results are reported there
        # The engine's loop writer for the loop that wrote last, so a loop's
        # writes look it up once (weak: a loop must stay collectable).
        self._loop_writer: tuple[
            Callable[[], asyncio.AbstractEventLoop | None], LoopWriter | None
        ] = _NO_LOOP_WRITER

    # -- the one request builder ---------------------------------------------------

    def set_request(self, token: object, key: object, value: object) -> FenceRequest | None:
        """A ``set``'s request, validated: what every face's set sends (a pipeline's too)."""
        if (
            type(token) is int
            and 0 < token < MAX_TOKEN
            and type(key) in KEY_TYPES
            and type(value) in VALUE_TYPES
            and self._slot is None
        ):
            # Exact types, a live token, no slot to check (the common case): the
            # request as bind() makes it, with nothing to check one by one.
            return FENCE_SET, (self._applied_key, key), (token, value)  # type: ignore[return-value]
        return self._request(token, FENCE_SET, (check_key(key),), (check_value(value),))

    def hset_request(
        self, token: object, key: object, field: object, value: object
    ) -> FenceRequest | None:
        return self._request(
            token,
            FENCE_HSET,
            (check_key(key),),
            (check_value(field, "field"), check_value(value)),
        )

    def eval_request(
        self, token: object, body: object, keys: object, args: object
    ) -> FenceRequest | None:
        check_token(token)
        return self._request(token, *self._eval_parts(body, keys, args))

    def _eval_parts(
        self, body: object, keys: object, args: object
    ) -> tuple[Script, tuple[str | bytes, ...], tuple[EncodableT, ...]]:
        """A ``fence_eval``'s script, keys and args, validated (the token aside)."""
        if not isinstance(body, str):
            raise TypeError(f"body must be a str of Lua, got {type(body).__name__}")
        checked_keys = tuple(
            check_key(k, "each key") for k in _check_sequence(keys, "keys", "str/bytes")
        )
        checked_args = tuple(
            check_value(a, "each arg") for a in _check_sequence(args, "args", "values")
        )
        return self._eval_script(body), checked_keys, checked_args

    def _request(
        self,
        token: object,
        script: Script,
        keys: tuple[str | bytes, ...],
        args: tuple[EncodableT, ...],
    ) -> FenceRequest | None:
        checked = check_token(token)
        if checked < 1:
            return None  # the inert and non-positive tokens never write
        return self.bind(checked, script, keys, args)

    def bind(
        self,
        token: int,
        script: Script,
        keys: tuple[str | bytes, ...],
        args: tuple[EncodableT, ...],
    ) -> FenceRequest:
        """The request of a validated write with a positive ``token``.

        The token goes as an int: both engines send an int as its decimal,
        the bytes a ``str(token)`` would be. On a cluster, a key outside the
        name's slot raises here.
        """
        if self._slot is not None:
            self._check_slots(keys)
        return script, (self._applied_key, *keys), (token, *args)

    def bind_series(
        self,
        token: int,
        script: Script,
        keys: tuple[str | bytes, ...],
        firsts: list[Any],
        seconds: list[EncodableT],
        first_is_key: bool,
    ) -> ScriptSeries:
        """``bind`` for many writes of one script at once, as one ``ScriptSeries``.

        Write ``i`` is what ``bind(token, script, keys + (firsts[i],),
        (seconds[i],))`` makes when ``first_is_key`` (a ``set_many``), else
        ``bind(token, script, keys, (firsts[i], seconds[i]))`` (an
        ``hset_many``). On a cluster every key's slot is checked here.
        """
        if self._slot is not None:
            self._check_slots((*keys, *firsts) if first_is_key else keys)
        return ScriptSeries(
            script, (self._applied_key, *keys), (token,), firsts, seconds, first_is_key
        )

    def _check_slots(self, keys: tuple[str | bytes, ...]) -> None:
        """Refuse, before anything is sent, a cluster write with a key outside the name's slot.

        The fence mark lives in the name's slot and the script reads it and
        writes the keys atomically, which one node can only do for keys of
        its own slot. The error is the one the server would give, with the
        keys named. The mark's own slot was computed once, with the fence;
        each of these keys' is computed here, once per write (the engine
        routes by the mark's, which every write hands it).
        """
        foreign = [k for k in keys if _slot(k) != self._slot]
        if foreign:
            error = ResponseError(
                f"CROSSSLOT Keys in request don't hash to the same slot: fenced write keys "
                f"{foreign!r} are not in slot {self._slot} of {self._name!r}; on a cluster "
                f"give every key the name's hash tag"
            )
            self._events.adopt(error)
            raise error

    # -- the senders: one write, or a batch; from a thread, or from a coroutine -------

    def write(self, request: FenceRequest | None) -> bool:
        """Send one write's ``request`` once and return whether it was applied.

        Every face's single write from a thread goes through here: without
        the replication guard, in one call to the engine (its single-call
        path). With the guard on, the write is followed by ``WAIT`` on its
        connection, and an applied write that fewer than ``min_replicas``
        replicas confirmed raises ``NotReplicated``.
        """
        if request is None:
            return False
        wait = self._wait
        try:
            if wait is None:
                script, keys, args = request  # a call with its arguments laid out is cheaper
                reply = self._engine.call_one(script, keys, args, None, self._slot)
            else:
                reply, acked = execute_one(self._engine, request, wait=wait, slot=self._slot)
        except RedisError as exc:
            self._failed(request, exc)
            raise
        applied = self.settled(reply)
        if applied and wait is not None:
            wait.require(
                acked,
                f"fenced write on {self._name!r} was applied on the master but",
                "a failover now could lose it",
            )
        return applied

    def write_async(self, request: FenceRequest | None) -> asyncio.Future[bool]:
        """``write`` for a coroutine: the future of its ``applied``, to be awaited at once.

        Every face's single write from a coroutine goes through here, and the
        face awaits this future itself, with no coroutine of the fence's
        between (a coroutine more costs each write its frame and its steps).
        The write is pipelined on the engine's connection for the running
        loop, which settles the future through the fence (``settled``,
        ``raised``): its ``applied`` counted, an error reported. Where the
        engine has no loop writer (see ``Engine.loop_writer``), or the
        replication guard is on (WAIT must follow on the write's own
        connection), the future is ``write``'s on the loop's default executor.
        """
        if request is None:
            inert: asyncio.Future[bool] = _running_loop().create_future()
            inert.set_result(False)
            return inert
        writer = self._loop_writer[1]  # the loop's that wrote last
        if writer is None or not writer.running_here():
            loop = _running_loop()
            writer = self._writer(loop)
            if writer is None:
                return loop.run_in_executor(None, self.write, request)
        script, keys, args = request
        try:
            return writer.write(script, keys, args, self, self._slot)
        except RedisError as exc:  # the engine was closed
            self._failed(request, exc)
            raise

    def settled(self, reply: object) -> bool:
        """A single write's reply (checked: 0 or 1) as its ``applied``, counted."""
        applied: bool = reply == 1
        if self._events.sinks:
            self._events.fenced(applied)
        return applied

    def raised(self, args: Sequence[EncodableT], exc: BaseException) -> None:
        """A single write with ``args`` (its token first) failed with ``exc``: reported."""
        if isinstance(exc, RedisError):
            self.failed(args[0], exc)

    def failed(self, token: EncodableT, exc: RedisError) -> None:
        """A write with ``token`` raised ``exc``: made the client family's, and a failover
        reply reported."""
        self._events.adopt(exc)
        if self._failovers is not None and is_failover_reply(exc):
            self._failovers.failover_seen(int(token), exc)

    def _failed(self, request: FenceRequest | ScriptSeries, exc: RedisError) -> None:
        """``request`` raised ``exc``: ``failed`` with its token (its first arg)."""
        args = request.args if type(request) is ScriptSeries else request[2]  # type: ignore[index]
        self.failed(args[0], exc)

    def _writer(self, loop: asyncio.AbstractEventLoop) -> LoopWriter | None:
        """The engine's loop writer for ``loop``; None where writes go through ``write``.

        Remembered for the loop that asked last, but never with the guard on,
        so that a write finds it without a call.
        """
        if self._guard.enabled:
            return None
        loop_ref, writer = self._loop_writer
        if loop_ref() is not loop:
            writer = self._engine.loop_writer(loop)
            self._loop_writer = (weakref.ref(loop), writer)
        return writer

    def write_many(self, requests: Sequence[FenceRequest | ScriptSeries | None]) -> list[bool]:
        """Send ``requests`` in one round trip, in order; one ``applied`` per write
        (a ``ScriptSeries`` of a ``set_many`` is one write per call of it).

        An empty batch sends nothing, nor does one of the inert token (its
        requests are None, one per write). The first error reply is raised
        once every reply was read.
        """
        if not requests:
            return []
        if requests[0] is None:
            return self._rejected(len(requests))
        batch = cast(list[FenceRequest | ScriptSeries], requests)
        try:
            return self._write_batch(batch)
        except RedisError as exc:
            # READONLY / MASTERDOWN / NOREPLICAS raised or in a reply: as for
            # a single write, the term this token belongs to ends now.
            self._failed(batch[0], exc)
            raise

    def _write_batch(self, batch: list[FenceRequest | ScriptSeries]) -> list[bool]:
        wait = self._wait
        # With the guard, one WAIT follows the batch on its connection.
        replies, acked = self._engine.execute(batch, wait=wait, slot=self._slot)
        applied = self._results(replies)
        if wait is not None and any(applied):
            wait.require(
                acked,
                f"fenced pipeline on {self._name!r}: {sum(applied)} of {len(applied)} writes "
                "applied on the master but",
                "a failover now could lose them",
            )
        return applied

    async def write_many_async(
        self, requests: Sequence[FenceRequest | ScriptSeries | None]
    ) -> list[bool]:
        """``write_many`` for a coroutine: pipelined on the engine's connection for this loop.

        Every write of the batch is queued on the loop writer at once, in
        order, so they travel together; where there is no loop writer the
        blocking batch runs on the loop's default executor.
        """
        if not requests:
            return []
        loop = asyncio.get_running_loop()
        if requests[0] is None:
            return self._rejected(len(requests))  # the inert token: nothing to send
        writer = self._writer(loop)
        if writer is None:
            return await loop.run_in_executor(None, self.write_many, requests)
        batch = cast(list[FenceRequest | ScriptSeries], requests)
        slot = self._slot
        futures = [writer.write(*request, None, slot) for request in flatten(batch)]
        replies: list[Any] = []
        lost: BaseException | None = None
        try:
            for future in futures:
                try:
                    replies.append(await future)
                except ResponseError as exc:  # an error reply: in its place, as run() gives it
                    replies.append(exc)
                except RedisError as exc:
                    # The connection failed: every write still in flight fails with it.
                    lost = lost or exc
        finally:
            for future in futures:
                if not future.done():
                    future.add_done_callback(_retrieve)
        try:
            if lost is not None:
                raise lost
            return self._results(replies)
        except RedisError as exc:
            self._failed(batch[0], exc)
            raise

    def _rejected(self, n: int) -> list[bool]:
        applied = [False] * n
        self._report(applied)
        return applied

    def _results(self, replies: list[Any]) -> list[bool]:
        """One ``applied`` per reply; the first error reply raised once all are reported.

        The engine checked every reply: 0, 1, or an exception in its place
        (an error reply, or a reply the script cannot give).
        """
        n = len(replies)
        ones = replies.count(1)  # no exception equals 0 or 1
        if ones == n or ones + replies.count(0) == n:
            applied = [True] * n if ones == n else [reply == 1 for reply in replies]
            self._report(applied)
            return applied
        applied = [reply == 1 for reply in replies]
        failures = [reply for reply in replies if isinstance(reply, Exception)]
        # Writes that met an error reply raised: they were neither applied nor rejected.
        ran = zip(applied, replies, strict=True)
        self._report([done for done, reply in ran if not isinstance(reply, Exception)])
        raise failures[0]

    def _report(self, applied: list[bool]) -> None:
        if self._events.sinks:
            for done in applied:
                self._events.fenced(done)

    def _eval_script(self, body: str) -> Script:
        with _EVAL_BODIES:
            scripts = self._eval_scripts
            if scripts is None:
                scripts = self._eval_scripts = {}
            script = scripts.get(body)
            if script is None:
                if len(scripts) >= MAX_EVAL_BODIES:
                    raise TooManyEvalBodies(
                        f"more than {MAX_EVAL_BODIES} distinct fence_eval bodies on Elector "
                        f"{self._name!r}; keep bodies constant and pass variable data "
                        "through keys and args"
                    )
                script = _scripts.fenced("fence_eval", body)
                scripts[body] = script
        return script


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Take a dropped write's outcome, so asyncio does not report it as never retrieved."""
    if not future.cancelled():
        future.exception()


def _slot(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))
