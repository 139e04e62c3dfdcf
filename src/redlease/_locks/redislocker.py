"""``RedisLocker``: locks and semaphore permits leased at Redis, ``default_locker``, ``with_lock``.

What a lock guarantees, and what it does not, is told in ``redlease.lock``
(the public module, which re-exports this one's names).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from redis.exceptions import AskError

from .._config import Duration, replication_guard
from .._engine import (
    ChannelRefusals,
    Engine,
    Keeper,
    ScriptRequest,
    call_timeout,
    execute_one,
    is_cluster,
    make_engine,
    named,
    released,
    sharded_notices,
    threaded,
)
from .._errors import ConfigError
from .._keys import LockKeys, has_hash_tag
from .._log import Events
from .._scripts import Script, load
from .args import check_name
from .fair import redis_place_keeper, since
from .holders import SCAN_COUNT, LockHolder, check_label, from_reply, label, lease_keys
from .lock import (
    DEFAULT_RETRY_INTERVAL,
    DEFAULT_WAIT,
    LOCK_DEFAULT_TTL,
    LeaseStore,
    Lock,
    Locker,
    LockerCore,
)
from .memory import MemoryLocker
from .semaphore import Semaphore, check_permits, mismatch

T = TypeVar("T")

DEFAULT_PREFIX = "redlease:lock:"
"""Key prefix of ``RedisLocker``: locks live at ``<prefix>key:<name>``."""

# A replayed release must still find its acknowledgement: it lives a few
# seconds, and at least two round-trip timeouts, then disappears on its own.
_MIN_ACK_TTL_MS = 5_000


class RedisLocker(Locker):
    """Locks shared by every process using the same Redis server and key prefix.

    Keys: the expiring hash ``<prefix>key:<name>`` holds the ownership token
    and the fencing token; ``<prefix>fencing`` is the persistent fencing
    counter shared by every name; ``<prefix>ack:<owner>`` briefly
    acknowledges a release. Acquire, refresh and release are each one atomic,
    token-guarded Lua script, idempotent across retries: a replayed
    acquisition returns the original fencing token, a replayed release still
    reports success, and neither touches a successor's lock.

    ``client`` is a ``redis.Redis`` (TCP or unix socket), a Sentinel
    ``master_for`` client or a ``redis.RedisCluster``. On a cluster the
    prefix must contain one hash tag (e.g. ``"{locks}:"``) so that a lock and
    the fencing counter live on one shard; a prefix without one is a
    ``ConfigError``. ``engine`` picks the engine as for ``Elector``
    (``"auto"``, whose meaning ``REDLEASE_ENGINE`` may set, ``"native"`` or
    ``"python"``). Every round trip runs on the
    engine's own connection, bounded by the client's ``socket_timeout`` (5 s
    when it has none). Targets one Redis server; not Redlock.

    ``holder`` labels this locker's leases for people (``holder(name)``,
    ``held()``, ``redlease locks``); None gives ``<hostname>-<pid>``. It is
    stored with each lease and never decides anything: ownership stays the
    random token.

    ``min_replicas=N`` (default 0, off) follows each acquisition with ``WAIT
    N replica_timeout`` (default 0.1 s) on the same connection: one that
    fewer than N replicas confirmed is released again and ``acquire`` /
    ``try_acquire`` raise ``NotReplicated``. A refresh answered READONLY,
    MASTERDOWN or NOREPLICAS loses the lease at once.
    """

    def __init__(
        self,
        client: Any,
        prefix: str = DEFAULT_PREFIX,
        engine: str | None = "auto",
        holder: str | None = None,
        *,
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
    ) -> None:
        # The engines run on a threaded redis-py client; errors go out in the user's family.
        # Anything that is no threaded client is refused here (``family.check_client``).
        client, self._family = threaded(client)
        self._label = check_label(holder)
        if not isinstance(prefix, str):
            raise ConfigError(f"prefix must be a str, got {type(prefix).__name__} {prefix!r}")
        if is_cluster(client) and not has_hash_tag(prefix):
            raise ConfigError(
                "with a RedisCluster client the prefix must contain a {hash tag} "
                f"(e.g. '{{locks}}:') so each lock and the fencing counter share a slot; "
                f"got {prefix!r}"
            )
        self._guard = replication_guard(min_replicas, replica_timeout)
        self._prefix = prefix
        self._keys = LockKeys(prefix)
        self._timeout = call_timeout(client)
        self._ack_ttl_ms = max(_MIN_ACK_TTL_MS, math.ceil(2000 * self._timeout))
        self._acquire_script = load("lock_acquire")
        self._refresh_script = load("lock_refresh")
        self._release_script = load("lock_release")
        self._holder_script = load("lock_holder")
        self._leave_script = load("queue_leave")
        self._force_script = load("lock_force_release")
        self._sem_scripts: tuple[Script, Script, Script, Script] = (
            load("sem_acquire"), load("sem_refresh"), load("sem_release"), load("sem_holders")
        )
        self._engine: Engine = make_engine(client, engine)
        self._client = client
        # Releases announce in the lock's slot on a cluster (SPUBLISH).
        self._sharded_notice = "1" if sharded_notices(client) else "0"
        # An ACL user without the notice channels is told once, not at every release.
        self._refusals = ChannelRefusals(f"RedisLocker prefix={prefix!r}", f"&{prefix}*", client)

    @property
    def engine(self) -> str:
        """``"native"`` or ``"python"``: the engine that runs the scripts and the watchdog."""
        return self._engine.name

    @functools.cached_property
    def _core(self) -> LockerCore:
        """As ``Locker._core``, with the errors its locks report made the client family's."""
        return LockerCore(
            Events(
                "locker",
                self._prefix,
                adopt=self._family.adopter,
                engine=self._engine.name,
                client=self._client,
            )
        )

    @property
    def engine_reason(self) -> str:
        """Why the native engine does not serve this locker ("" when it does)."""
        return self._engine.reason

    @property
    def prefix(self) -> str:
        """The key prefix every lock of this locker lives under."""
        return self._prefix

    def key(self, name: str) -> str:
        """The Redis key of the lock ``name`` (``<prefix>key:<name>``)."""
        return self._keys.lock(name)

    def close(self) -> None:
        """Close the engine's own connections (never the user's client)."""
        self._engine.close()

    @property
    def min_replicas(self) -> int:
        """Replicas that must confirm each acquisition (0: no replication guard)."""
        return self._guard.min_replicas

    @property
    def replica_timeout(self) -> float:
        """How long each acquisition waits for its replicas, in seconds."""
        return self._guard.replica_timeout

    def _call(self, request: ScriptRequest, wait: Any = None) -> tuple[Any, int]:
        """One script on the engine within the client's timeout; errors in the client's family."""
        try:
            with self._family.errors():
                return execute_one(self._engine, request, timeout=self._timeout, wait=wait)
        except Exception as exc:
            named(exc, self._client)  # a refusal names the endpoint, as a start's does
            raise

    def _attempt(
        self, name: str, owner: str, ttl_ms: int, queue_ms: int = 0, began: float | None = None
    ) -> tuple[int, float]:
        keys: tuple[str, ...] = (self.key(name), self._keys.fencing)
        args: tuple[Any, ...] = (owner, ttl_ms, label(self._label))
        if queue_ms:
            keys, args = (*keys, *self._keys.queue("key", name)), (*args, queue_ms, since(began))
        request = (self._acquire_script, keys, args)
        token, pttl = self._granted(request, f"lock {name!r}", lambda: self._give_back(name, owner))
        return (token, 0.0) if token > 0 else (0, max(pttl, 0) / 1000)

    def _granted(
        self, request: ScriptRequest, what: str, give_back: Callable[[], None]
    ) -> tuple[int, int]:
        """An acquire script's ``(token, number)``; a token > 0 confirmed as the guard asks.

        Unconfirmed (fewer replicas than ``min_replicas``, or the server is
        no longer the master), the grant is given back and this raises.
        """
        guard = self._guard
        reply, acked = self._call(request, guard.wait)
        token, number = int(reply[0]), int(reply[1])
        if token > 0:
            with self._family.errors():
                guard.confirm_won(
                    self._engine, acked, f"{what} was acquired on the master but",
                    "released again", give_back, self._timeout,
                )
        return token, number

    def _leave(self, name: str, owner: str) -> None:
        self._leave_queue("key", name, owner)

    def _leave_queue(self, kind: str, name: str, owner: str) -> None:
        self._call((self._leave_script, self._keys.queue(kind, name), (owner,)))

    def _place_keeper(self, name: str, owner: str, life_ms: int, kind: str = "key") -> Keeper:
        return redis_place_keeper(self._engine, self._keys.queue(kind, name), owner, life_ms)

    def _give_back(self, name: str, owner: str) -> None:
        # An unconfirmed acquisition is not returned, so nobody would release
        # it: release it here. If that fails too, the lease expires in one TTL.
        with contextlib.suppress(Exception):
            self._release(name, owner)

    def _refresh(self, name: str, owner: str, ttl_ms: int) -> bool:
        reply, _ = self._call((self._refresh_script, (self.key(name),), (owner, ttl_ms)))
        return bool(reply == 1)

    def _release(self, name: str, owner: str) -> bool:
        keys = (self.key(name), self._keys.ack(owner), self._keys.queue("key", name)[0])
        reply, _ = self._call(
            (self._release_script, keys, (owner, self._ack_ttl_ms, self._sharded_notice))
        )
        return self._released(reply, keys[0])

    def _force_release(self, name: str) -> tuple[int, str | None]:
        keys = (self.key(name), self._keys.fencing, self._keys.queue("key", name)[0])
        reply, _ = self._call((self._force_script, keys, (self._sharded_notice,)))
        mark, holder = reply
        return int(mark), (holder.decode("utf-8", "replace") if holder else None)

    def _released(self, reply: int, key: str) -> bool:
        """A release script's reply as ``_release`` reports it; a refused notice said once."""
        done, refused = released(reply)
        if refused:
            self._refusals.publish_refused(key)
        return done

    def semaphore(self, name: str, permits: int) -> Semaphore:
        """At most ``permits`` holders of ``name`` at once, each holding a fenced permit.

        See ``Semaphore``: its permits are ``Lock`` objects with their own
        leases and fencing tokens (from this locker's counter), kept under
        ``<prefix>sem:<name>`` and counted at Redis in one script.
        """
        permits = check_permits(permits)
        store = _RedisPermits(self._share(), permits)
        return Semaphore(store, check_name(name), permits, functools.partial(store.holders, name))

    def _share(self) -> _RedisShare:
        """What this locker lends the permits of its semaphores (and nothing more)."""
        return _RedisShare(
            core=self._core,
            engine=self._engine,
            keys=self._keys,
            holder=self._label,
            scripts=self._sem_scripts,
            ack_ttl_ms=self._ack_ttl_ms,
            sharded_notice=self._sharded_notice,
            call=self._call,
            granted=self._granted,
            released=self._released,
            leave_queue=self._leave_queue,
            place_keeper=self._place_keeper,
            listening=self._listening,
        )

    def _holder(self, name: str) -> LockHolder | None:
        reply, _ = self._call((self._holder_script, (self.key(name),), ()))
        return from_reply(reply)

    def _held(self) -> list[tuple[str, LockHolder]]:
        locks = self._read_all("key", self._holder_script, lambda key: (key,))
        sem_holders = self._sem_scripts[3]
        start = len(self._keys.permits(""))
        permits = self._read_all(
            "sem", sem_holders, lambda key: (key, self._keys.permit_info(key[start:]))
        )
        found = [(name, who) for name, reply in locks if (who := from_reply(reply)) is not None]
        found += [
            (name, who)
            for name, reply in permits
            for each in reply
            if (who := from_reply(each)) is not None
        ]
        return found

    def _read_all(
        self, kind: str, script: Script, keys_of: Callable[[str], tuple[str, ...]]
    ) -> list[tuple[str, Any]]:
        """``script`` on every ``<prefix><kind>:<name>`` key: ``(name, reply)``, by SCAN."""
        start = len(f"{self._prefix}{kind}:")
        cluster = is_cluster(self._client)
        read: list[tuple[str, Any]] = []
        with self._family.errors():
            keys = list(dict.fromkeys(lease_keys(self._client, self._prefix, cluster, kind)))
            for first in range(0, len(keys), SCAN_COUNT):
                chunk = keys[first : first + SCAN_COUNT]
                batch = [(script, keys_of(key), ()) for key in chunk]
                replies, _ = self._engine.execute(batch, timeout=self._timeout)
                for key, reply in zip(chunk, replies, strict=True):
                    if isinstance(reply, AskError):
                        # Mid-migration, this key has moved: a read, so asked
                        # again on its own, which follows the redirection.
                        reply = self._call((script, keys_of(key), ()))[0]
                    if isinstance(reply, Exception):
                        raise reply
                    read.append((key[start:], reply))
        return read

    def _waiting(
        self, name: str, waiter: str | None = None
    ) -> contextlib.AbstractContextManager[Callable[[float], None]]:
        if waiter is not None:
            # A fair waiter is told when it is first in the queue, not at every release.
            return self._listening(f"{self._keys.queue('key', name)[0]}:{waiter}")
        return self._listening(self.key(name))

    @contextlib.contextmanager
    def _listening(self, key: str) -> Iterator[Callable[[float], None]]:
        # A waiting acquire listens for the release notice of ``key`` (a
        # lock's, or a semaphore's permits): the pause between attempts ends
        # the moment a holder releases, and polling at retry_interval stays
        # the fallback for a lost notice. On the native engine the pause
        # sleeps with the GIL released and a native thread wakes it.
        notices = self._engine.notices(self._client).listen(key, lambda _by: None)

        def pause(seconds: float) -> None:
            notices.wait(seconds)
            if notices.refused:  # an ACL user without the channel: polling only
                self._refusals.subscribe_refused(key)

        try:
            yield pause
        finally:
            notices.cancel()

    def _keeper(self, name: str, owner: str, ttl_ms: int, interval: float) -> Keeper:
        return self._engine.keeper(
            (self._refresh_script, (self.key(name),), (owner, ttl_ms)),
            interval=interval,
            ttl=ttl_ms / 1000,
        )

    def __repr__(self) -> str:
        return f"<redlease.RedisLocker prefix={self._prefix!r} engine={self.engine!r}>"


@dataclasses.dataclass(frozen=True)
class _RedisShare:
    """What a ``RedisLocker`` lends the permits of its semaphores: the one interface between them.

    The permits run on the locker's engine and connection, take their fencing
    tokens from its counter, are confirmed by its replication guard and
    announce releases as its locks do; each item is one of the locker's own
    parts or operations, named here so the permits never reach into it.
    """

    core: LockerCore
    engine: Engine
    keys: LockKeys
    holder: str | None
    scripts: tuple[Script, Script, Script, Script]  # acquire, refresh, release, holders
    ack_ttl_ms: int
    sharded_notice: str
    call: Callable[[ScriptRequest], tuple[Any, int]]
    granted: Callable[[ScriptRequest, str, Callable[[], None]], tuple[int, int]]
    released: Callable[[int, str], bool]
    leave_queue: Callable[[str, str, str], None]
    place_keeper: Callable[[str, str, int, str], Keeper]
    listening: Callable[[str], contextlib.AbstractContextManager[Callable[[float], None]]]


class _RedisPermits(LeaseStore):
    """The permits of one ``RedisLocker`` semaphore count: the store a ``Semaphore`` wraps.

    The lock's store operations, on ``<prefix>sem:<name>`` (the live permits,
    a sorted set of owner -> expiry by the server's clock) and
    ``<prefix>sem-info:<name>`` (their tokens and holders), through what the
    locker shares (``_RedisShare``).
    """

    def __init__(self, share: _RedisShare, permits: int) -> None:
        self._share = share
        self._permits = permits
        self._acquire_script, self._refresh_script, self._release_script, self._holders_script = (
            share.scripts
        )

    @property
    def engine(self) -> str:
        return self._share.engine.name

    @property
    def _core(self) -> LockerCore:
        return self._share.core

    def _keys_of(self, name: str) -> tuple[str, str]:
        keys = self._share.keys
        return keys.permits(name), keys.permit_info(name)

    def _attempt(
        self, name: str, owner: str, ttl_ms: int, queue_ms: int = 0, began: float | None = None
    ) -> tuple[int, float]:
        share = self._share
        keys: tuple[str, ...] = (*self._keys_of(name), share.keys.fencing)
        args: tuple[Any, ...] = (owner, ttl_ms, self._permits, label(share.holder))
        if queue_ms:
            keys, args = (*keys, *share.keys.queue("sem", name)), (*args, queue_ms, since(began))
        token, number = share.granted(
            (self._acquire_script, keys, args),
            f"a permit of semaphore {name!r}",
            lambda: self._give_back(name, owner),
        )
        if token < 0:
            raise mismatch(name, self._permits, number)
        return (token, 0.0) if token > 0 else (0, max(number, 0) / 1000)

    def _give_back(self, name: str, owner: str) -> None:
        with contextlib.suppress(Exception):
            self._release(name, owner)

    def _leave(self, name: str, owner: str) -> None:
        self._share.leave_queue("sem", name, owner)

    def _place_keeper(self, name: str, owner: str, life_ms: int) -> Keeper | None:
        return self._share.place_keeper(name, owner, life_ms, "sem")

    def _refresh(self, name: str, owner: str, ttl_ms: int) -> bool:
        reply, _ = self._share.call((self._refresh_script, self._keys_of(name), (owner, ttl_ms)))
        return bool(reply == 1)

    def _release(self, name: str, owner: str) -> bool:
        share = self._share
        keys = (*self._keys_of(name), share.keys.ack(owner), share.keys.queue("sem", name)[0])
        args = (owner, share.ack_ttl_ms, share.sharded_notice)
        reply, _ = share.call((self._release_script, keys, args))
        return share.released(reply, keys[0])

    def _keeper(self, name: str, owner: str, ttl_ms: int, interval: float) -> Keeper:
        return self._share.engine.keeper(
            (self._refresh_script, self._keys_of(name), (owner, ttl_ms)),
            interval=interval,
            ttl=ttl_ms / 1000,
        )

    def _waiting(
        self, name: str, waiter: str | None = None
    ) -> contextlib.AbstractContextManager[Callable[[float], None]]:
        if waiter is not None:
            queue = self._share.keys.queue("sem", name)[0]
            return self._share.listening(f"{queue}:{waiter}")
        return self._share.listening(self._keys_of(name)[0])

    def _taken(self, name: str) -> str:
        return f"all {self._permits} permits of semaphore {name!r} are taken"

    def holders(self, name: str) -> list[LockHolder]:
        reply, _ = self._share.call((self._holders_script, self._keys_of(name), ()))
        return [who for who in map(from_reply, reply) if who is not None]


def default_locker(
    client: Any = None, *, prefix: str = DEFAULT_PREFIX, engine: str | None = "auto"
) -> Locker:
    """The locker for the deployment: ``RedisLocker`` when given a client, else ``MemoryLocker``.

    Applications reach for a distributed lock because they run several
    replicas, and a silently local lock stops guarding anything the moment a
    second one starts; so without a client this warns (``RuntimeWarning``)
    that the ``MemoryLocker`` it returns guards nothing across processes.
    """
    if client is not None:
        return RedisLocker(client, prefix=prefix, engine=engine)
    warnings.warn(
        "redlease.default_locker() got no Redis client: using MemoryLocker, which is in-process "
        "only and guards nothing across processes or replicas",
        RuntimeWarning,
        stacklevel=2,
    )
    return MemoryLocker()


def with_lock(
    locker: Locker,
    name: str,
    fn: Callable[[Lock], T],
    *,
    ttl: Duration = LOCK_DEFAULT_TTL,
    wait: Duration = DEFAULT_WAIT,
    retry_interval: Duration = DEFAULT_RETRY_INTERVAL,
    auto_renew: bool = True,
) -> T:
    """Run ``fn(held)`` while holding the lock ``name`` and return its result.

    The same guarantees as ``locker.hold``: auto-renewal on unless disabled,
    ``held.done`` set if the lease is lost (``fn`` should check it in long
    work), the lock released on every path, and ``NotHeld`` raised when the
    release finds the lease lost, even if ``fn`` succeeded (chained with
    ``fn``'s exception when it raised one).
    """
    with locker.hold(
        name, ttl=ttl, wait=wait, retry_interval=retry_interval, auto_renew=auto_renew
    ) as held:
        return fn(held)
