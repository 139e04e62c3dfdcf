"""The one small internal interface both engines implement.

An engine owns three things for one Elector (or one locker):

* ``execute`` — every script call: a batch of one or many, on the engine's *own*
  connections, never on the user's client, so a client configured with
  retries or no timeout can never stretch it; one deadline for the whole
  round trip; replies checked against what each script can answer; with
  the replication guard, the WAIT on the same connection.
* ``loop_writer`` — fenced writes for coroutines, pipelined on a connection
  the event loop drives.
* ``keeper`` — a lease on the engine's one renewer, which renews every lease
  of the engine on time (natively: one native thread, pipelining the
  renewals due together); each lease keeps its own deadline, token and state.

The native engine implements them in Cython with the GIL released; the
pure-Python engine with redis-py connections and a Python thread. The
Elector and the lockers never branch on which engine they hold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..._scripts import Script
from ..rules.encodable import EncodableT as EncodableT
from ..rules.replication import ReplicationGuard

if TYPE_CHECKING:
    from .aiowriter import LoopWriter

ScriptRequest = tuple[Script, Sequence["str | bytes"], Sequence[EncodableT]]
"""One script to run: the script, its keys and its args."""


class ScriptSeries:
    """Many calls of one script in a batch, held as two lists instead of a request per call.

    Call ``i`` runs ``script`` with the keys ``keys`` and the args ``args``,
    then ``firsts[i]`` (as one more key when ``first_is_key``, else as one
    more arg) and ``seconds[i]`` as the last arg. A fenced pipeline's
    ``set_many`` is ``ScriptSeries(FENCE_SET, (mark,), (token,), keys, values,
    True)``: call ``i`` is ``FENCE_SET`` with keys ``(mark, keys[i])`` and
    args ``(token, values[i])``. The lists hold validated arguments and
    are never changed once made. The native engine encodes a run without
    making its calls; ``calls()`` makes them, for the Python engine.
    """

    __slots__ = ("args", "first_is_key", "firsts", "keys", "script", "seconds")

    def __init__(
        self,
        script: Script,
        keys: tuple[str | bytes, ...],
        args: tuple[EncodableT, ...],
        firsts: list[Any],
        seconds: list[EncodableT],
        first_is_key: bool,
    ) -> None:
        if len(firsts) != len(seconds):
            raise ValueError(
                f"a run needs as many firsts as seconds: {len(firsts)} != {len(seconds)}"
            )
        self.script = script
        self.keys = keys
        self.args = args
        self.firsts = firsts
        self.seconds = seconds
        self.first_is_key = first_is_key

    def __len__(self) -> int:
        return len(self.firsts)

    def __repr__(self) -> str:
        return f"<ScriptSeries {self.script.name} x{len(self)}>"

    def calls(self) -> list[ScriptRequest]:
        """Every call of the run, in order, as the request it stands for."""
        script, keys, args = self.script, self.keys, self.args
        if self.first_is_key:
            return [
                (script, (*keys, first), (*args, second))
                for first, second in zip(self.firsts, self.seconds, strict=True)
            ]
        return [
            (script, keys, (*args, first, second))
            for first, second in zip(self.firsts, self.seconds, strict=True)
        ]


BatchItem = ScriptRequest | ScriptSeries
"""What a batch holds: one call, or a series of calls of one script."""


def flatten(batch: Sequence[BatchItem]) -> Sequence[ScriptRequest]:
    """``batch`` with every run replaced by its calls (``batch`` itself when it has none)."""
    if not any(type(item) is ScriptSeries for item in batch):
        return batch  # type: ignore[return-value]
    calls: list[ScriptRequest] = []
    for item in batch:
        if type(item) is ScriptSeries:
            calls.extend(item.calls())
        else:
            calls.append(item)  # type: ignore[arg-type]
    return calls


def batch_size(batch: Sequence[BatchItem]) -> int:
    """How many calls ``batch`` makes (a run counts each of its calls)."""
    return sum(len(item) if type(item) is ScriptSeries else 1 for item in batch)


MIN_STEP = 0.002
"""The shortest wait a round-trip step gets, even past its deadline (seconds).

Time spent waiting for the GIL between steps is not a slow server: each step
still gets this long instead of failing unsent. A hung server still costs at
most the deadline plus a few of these.
"""


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()``), but at least ``MIN_STEP``."""
    return max(deadline - time.monotonic(), MIN_STEP)


MAX_REPLY_BYTES = 4 * 1024 * 1024
"""No round trip on a connection of ours reads more than this many bytes.

Our scripts answer integers and short arrays; a server that sends more is
broken or hostile, and nothing it says makes us buffer past this cap.
"""


MAX_REPLY_ELEMENTS = 65536
"""No array in a reply on a connection of ours may hold more elements than this."""

MAX_REPLY_DEPTH = 8
"""Nor may arrays nest deeper than this many levels.

Both are refused when the array's header arrives, before anything is sized
by the count the server sent (a parser that allocates a list of the
announced length would otherwise be told to make one of two billion).
"""


CALL_CONNECTIONS = 2
"""Control-path connections per engine (acquire, release, lock scripts)."""

CLUSTER_CALL_CONNECTIONS = 8
"""The same on a cluster, where a connection serves one node at a time.

Opened on demand; a call takes a free one already open to its slot's
owner, else one not open yet: with one driver thread acquiring for names
all over the cluster, one connection per master, not a new one per call.
"""

WRITE_CONNECTIONS = 8
"""Fenced-write connections per engine; a single-threaded writer only ever opens one.

Opened on demand, one per thread writing at the same moment: with fewer
than the writing threads, a thread that finds every connection busy waits
for one particular connection, not the first one free, and eight threads
sharing one Elector lost about a third of their throughput that way.
"""

DEFAULT_CALL_TIMEOUT = 5.0
"""Bound on one control round trip (a lock script) when the client sets no ``socket_timeout``."""

DEFAULT_WRITE_TIMEOUT = 30.0
"""Bound on one fenced write when the user's client sets no ``socket_timeout``.

redis-py without a socket timeout would wait forever on a hung server; a
fenced write gives up after this many seconds with ``TimeoutError``.
"""

LATENESS_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
"""Upper bounds (seconds) of the renew-lateness histogram every keeper keeps.

Fixed, and the same on both engines (the native keeper has them as a C
array), so that a metrics scrape can add keepers up without a conversion.
"""

LATENESS_SAMPLES = 128
"""How many of its newest renew-lateness samples a keeper holds (``Keeper.lateness()``).

Bounded so that a lease costs the same after a day as after a minute (100,000
leases in one process); the same on both engines (the native keeper's ring is
checked against it at import). ``lateness_totals()`` counts every renewal.
"""


# Keeper states, shared by both engines (the native one keeps them in C atomics).
IDLE = 0
"""No term has begun since the keeper was made, or the last one was ended."""
ACTIVE = 1
"""A term is running and its lease is being renewed."""
LOST = 2
"""The lease was lost: a renewal answered 0, or no renewal succeeded for a TTL."""
ENDED = 3
"""The term was ended by the owner (``end()``); nothing is renewed any more."""


class Keeper(Protocol):
    """Keeps one lease alive from a dedicated thread.

    ``begin(token, acquired_at)`` starts a term: the first renewal is sent at
    once, then one every ``interval`` on absolute deadlines. Each renewal runs
    ``script`` with the keeper's keys and args; a reply of 1 means renewed, 0
    means lost (the term ends as LOST at once). Errors are tolerated until
    ``ttl`` has passed since the *send* time of the last good renewal (or of
    the acquire), and that deadline is enforced by a timer, not by the next
    tick: at the deadline the term is LOST even if a renewal is in flight.
    Every state change and every error wakes ``wait()`` and makes
    ``fileno()`` readable. A renewal answered READONLY, MASTERDOWN or
    NOREPLICAS (``replies.FAILOVER_REPLIES``) ends the term as LOST at once:
    the server is no longer the master the lease was granted on. A reply the
    script cannot give is an error like any other, never a loss.
    """

    @property
    def token(self) -> int:
        """The running term's token, or 0 when no term is ACTIVE."""
        ...

    @property
    def closed(self) -> bool:
        """True once ``close()`` ran."""
        ...

    @property
    def state(self) -> int:
        """IDLE, ACTIVE, LOST or ENDED."""
        ...

    def begin(self, token: int, acquired_at: float) -> None:
        """Start a term; ``acquired_at`` is the ``time.monotonic()`` send time of the acquire."""
        ...

    def end(self) -> None:
        """End the term (token cleared first); idempotent; a LOST term stays LOST."""
        ...

    def lose(self, error: Exception) -> None:
        """End an ACTIVE term as LOST now and report ``error`` (no-op otherwise)."""
        ...

    def wait(self, timeout: float | None) -> bool:
        """Block until woken (loss, error, ``notify()``); False on timeout. Consumes the wake-up."""
        ...

    def notify(self) -> None:
        """Wake the waiter (used by resign, stop and the leader function's return)."""
        ...

    def pop_errors(self) -> list[Exception]:
        """redis-py exceptions of the failed renewals since the last call, oldest first."""
        ...

    def lateness(self) -> list[float]:
        """Seconds each renewal was sent after its scheduled time, oldest first.

        The newest ``LATENESS_SAMPLES`` only; ``lateness_count()`` counts them all.
        """
        ...

    def lateness_count(self) -> int:
        """How many lateness samples were recorded since the keeper was made, held or not.

        The samples recorded since a moment are the newest (count now - count
        then) of ``lateness()``, as many of them as it still holds.
        """
        ...

    # -- what metrics read at scrape time (cumulative, never reset) -----------

    @property
    def renewals(self) -> int:
        """How many renewals succeeded since the keeper was made."""
        ...

    @property
    def renewed_at(self) -> float:
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        ...

    def lateness_totals(self) -> tuple[list[int], float]:
        """``(counts, sum)``: every renewal's lateness since the keeper was made.

        ``counts`` has one entry per ``LATENESS_BUCKETS`` bound (renewals at
        most that late and later than the bound before) plus a last one for
        the rest; ``sum`` is their total lateness in seconds. Kept by the
        keeper's own thread as it sends (natively: C counters, no GIL);
        readable after ``close()``.
        """
        ...

    def fileno(self) -> int:
        """A file descriptor that is readable while a wake-up is pending."""
        ...

    def close(self) -> None:
        """End any term, stop and join the thread, close sockets and fds. Idempotent."""
        ...


class NoticeSubscription(Protocol):
    """One waiter's interest in the release notices of one lease (see ``_engine.notices``)."""

    def wait(self, timeout: float) -> bool:
        """Sleep until a notice arrives (True, its wake-up delivered) or ``timeout`` passes."""
        ...

    def deliver(self) -> None:
        """Run the wake-up of every notice queued for this thread to handle (if any)."""
        ...

    def cancel(self) -> None:
        """Stop listening; idempotent. Afterwards nothing is woken or signalled any more."""
        ...

    @property
    def refused(self) -> bool:
        """True once the server refused the subscription (an ACL user without the channel).

        Nothing is ever delivered then: the waiter polls. The owner says so
        once (``notices.ChannelRefusals``).
        """
        ...


class Notices(Protocol):
    """An engine's release-notice listener: one subscription connection per server per process."""

    def listen(
        self,
        lease_key: str,
        wake: Callable[[bytes | None], object],
        *,
        signal: Keeper | None = None,
        driven: bool = False,
    ) -> NoticeSubscription:
        """Listen for releases of ``lease_key``; ``signal`` (a keeper) is woken on each too.

        ``wake(payload)`` gets the releaser's payload, or None when notices may
        have been lost. It runs on the listener's thread or, where the engine
        queues notices, in ``deliver()`` / ``wait()`` on the waiter's own.
        ``driven``: the waiter is a run of the process's driver, with no
        thread of its own; ``wake`` then runs on the listener's thread or on
        the driver's, as each notice arrives.
        Never raises for Redis trouble: the waiter polls meanwhile.
        """
        ...


class Engine(Protocol):
    """What an Elector or a locker needs from Redis: one way to run scripts, and a renewer.

    Every script call — acquire, release, a lock's scripts, a fenced write,
    a pipeline — goes through ``execute``; coroutines' fenced writes through
    ``loop_writer``; every lease is renewed by ``keeper``'s one renewer.
    """

    name: str
    reason: str
    """Why the native engine does not serve the client, in one sentence ("" when it does)."""

    def execute(
        self,
        batch: Sequence[BatchItem],
        *,
        timeout: float | None = None,
        wait: ReplicationGuard | None = None,
        slot: int | None = None,
    ) -> tuple[list[Any], int]:
        """Run ``batch`` in one round trip on one of the engine's own connections, in order.

        ``(replies, acknowledged)``, one reply per call (a ``ScriptSeries``
        gives one per call of it, in its place). Each reply is what its script answered,
        checked against the script's reply shape (``replies.check``): an
        error reply, or a reply the script cannot give (``UnexpectedReply``),
        stands in its place as the exception object, not raised, so every
        reply is read first. NOSCRIPT is recovered by sending only the calls
        it answered again, as EVAL. A failure that leaves the outcome unknown
        (the connection broke, the deadline passed) raises redis-py's
        ConnectionError / TimeoutError and sends nothing again.

        ``timeout`` None: a fenced write the user drives, bounded by the
        client's socket timeout (``DEFAULT_WRITE_TIMEOUT`` without one), on
        the write connections. A number: a control call (acquire, release,
        the lock scripts), bounded by that many seconds in all, on the
        control connections. ``wait``: ``WAIT min_replicas timeout_ms``
        follows the batch on the same connection (not after an error reply
        to a single call); ``acknowledged`` is its count (0 without).
        ``slot``: on a cluster, the slot of the first call's first key when
        the caller knows it (a fence computes its name's once, for all its
        writes), so the batch is routed without hashing the key again; None:
        the engine hashes it. Off a cluster it is None, and ignored if not.
        Redirections (MOVED, ASK) are followed as without it.
        Thread-safe.
        """
        ...

    def call_one(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        timeout: float | None = None,
        slot: int | None = None,
    ) -> Any:
        """One call, as ``execute`` sends a single call without ``wait``: its checked reply,
        its error raised. ``timeout`` and ``slot`` as for ``execute`` (None: a fenced
        write; its key's slot not known)."""
        ...

    def loop_writer(self, loop: asyncio.AbstractEventLoop) -> LoopWriter | None:
        """The fenced-write path for coroutines on ``loop``, or None: ``execute`` off the loop.

        One pipelined connection per loop, driven by the loop itself (see
        ``aiowriter``): no thread hop per write. Only from ``loop``'s thread.
        None where the engine cannot (the Python engine on a cluster).
        Renewals never share this connection.
        """
        ...

    def keeper(self, renew: ScriptRequest, *, interval: float, ttl: float) -> Keeper:
        """A new lease on the engine's one renewer, renewed by the call ``renew``.

        ``renew`` is ``(script, keys, args)``, as ``execute`` takes each call; its
        script answers 1 (renewed) or 0 (lost).
        """
        ...

    def confirm_master(self, timeout: float, release: Callable[[], object]) -> None:
        """After an acquire won: raise unless the sentinels still name the master it ran on.

        Behind Sentinel, a majority of the sentinels must name the node the
        last call ran on and none may report it down or being failed over;
        otherwise ``release()`` runs and ``failover.MasterNotConfirmed`` (a
        redis-py ``ConnectionError``) is raised, so no term or lock is handed
        out on a node whose data is about to be thrown away. Bounded by
        ``timeout``. Nothing to do (returns at once) off Sentinel.
        """
        ...

    def notices(self, client: Any) -> Notices:
        """The release-notice listener for this engine and ``client``'s server(s)."""
        ...

    def close(self) -> None:
        """Close the engine's own connections (not the user's client)."""
        ...


class Pools:
    """What both engines share: a pool for control calls, one for fenced writes, their bounds.

    An engine sets ``calls``, ``writes`` and ``write_timeout``; ``pool_for``
    is the one place that says which pool and which bound a ``execute`` gets.
    """

    calls: Any
    writes: Any
    write_timeout: float

    def pool_for(self, timeout: float | None) -> tuple[Any, float]:
        """``(pool, bound)``: the write pool and its timeout for None, else the control pool."""
        if timeout is None:
            return self.writes, self.write_timeout
        return self.calls, timeout

    def call_one(
        self,
        script: Script,
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        timeout: float | None = None,
        slot: int | None = None,
    ) -> Any:
        """One call through ``execute``, its error raised (see ``Engine.call_one``)."""
        reply = self.execute(((script, keys, args),), timeout=timeout, slot=slot)[0][0]  # type: ignore[attr-defined]
        if isinstance(reply, Exception):
            raise reply
        return reply


def execute_one(
    engine: Engine,
    request: ScriptRequest,
    *,
    timeout: float | None = None,
    wait: ReplicationGuard | None = None,
    slot: int | None = None,
) -> tuple[Any, int]:
    """One script call: ``(reply, acknowledged)``; its error raised.

    Without ``wait``, the engine's single-call path (``call_one``); with it,
    ``execute``, which sends the WAIT on the same connection. ``slot`` as for
    ``Engine.execute``.
    """
    if wait is None:
        return engine.call_one(*request, timeout, slot), 0
    replies, acked = engine.execute((request,), timeout=timeout, wait=wait, slot=slot)
    reply = replies[0]
    if isinstance(reply, Exception):
        raise reply
    return reply, acked
