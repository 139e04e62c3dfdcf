"""Partitioned ownership: N partitions shared by a group of members, each with its own token.

``Partitions(client, name, partitions, ...)`` is one member of the group
``name``. Each partition is a lease of its own, with the keys and scripts of
an elector named ``<name>:p:<partition>`` (``acquire.lua``, ``renew.lua``,
the fence), so a partition's tokens strictly increase across owners and a
fenced write with an older owner's token is rejected at Redis. The group's
own keys:

* ``<name>:members``: the live members, a sorted set member -> expiry (server
  ms), kept by a heartbeat the engine's renewer sends like a renewal;
* ``<name>:partitions``: the group's partition set, its sorted names as one
  JSON list, which every member must match while another member is live.

Every lease of the member (the heartbeat and each partition it holds) is a
keeper on the engine's one renewer, shared with every other group, elector
and lock of the process: no thread per partition. The member's run loop has
one thread; each step reads the group from Redis (``partition_view.lua``),
computes this member's share and acts on it:

* the share: with ``M`` live members (sorted), each owns ``N // M``; the
  ``N % M`` extra partitions go to the members that hold the most now (ties
  by id), so nobody hands over what it would only have to take back;
* sticky: a member keeps what it holds up to its share, takes only free
  partitions (or its own leftovers), and over its share (a newcomer joined)
  hands the excess over: ``on_revoked(p, "rebalanced")``, then the release,
  which tells the group at once (``<name>:members:released``);
* self-fenced: ``owned()`` holds a partition only while its keeper holds the
  term and less than a TTL has passed since the send time of its last good
  renewal (or its acquire), on the monotonic clock.

Joins, leaves and hand-overs announce themselves on the group's channel,
which every member listens to, so the group rebalances within milliseconds
of a change; a death is found when the dead member's heartbeat and leases
run out (within one TTL, then one poll).

Each look ends by telling ``ShareWatch`` whether the member holds its share
for the live members of that look; ``wait_owned`` waits on it (a condition
for threads, a watcher that wakes an event loop for asyncio).

``Member`` is the core both shells drive: ``Partitions`` here and
``aiopartitions.Partitions`` for asyncio.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from .. import _scripts
from .._config import Config, Duration, default_instance_id, named_for, non_negative_seconds
from .._engine import ACTIVE, Keeper, call_timeout, is_cluster, run_one
from .._engine.base import NoticeSubscription
from .._engine.clientfamily import threaded
from .._engine.notices import NO_NOTICES, ChannelRefusals, sharded_notices
from .._engine.replies import unexpected_reply
from .._errors import ConfigError
from .._keys import PartitionKeys, has_hash_tag
from .._log import Events, logger
from .._on_exit import StopsOnExit
from .elector import Elector, Fencer
from .shell import ElectorShell
from .term import Observer, tell_on_error

MAX_PARTITIONS = 65536
"""The most partitions one group may have: one reply's element cap (``MAX_REPLY_ELEMENTS``)."""

POLLS_PER_TTL = 4
"""A member reads its group from Redis this many times per TTL, besides every notice."""

_SHOWN_NAMES = 8
"""How many names of a partition set an error message shows."""


_JOIN = _scripts.load("partition_join")  # the reply shapes are checked here (_check_*)
_HEARTBEAT = _scripts.load("sem_refresh")  # a member's lease in the group's sorted set
_VIEW = _scripts.load("partition_view")
_RELEASE = _scripts.load("partition_release")
_LEAVE = _scripts.load("partition_leave")
_RENEW = _scripts.load("renew")


# -- arguments ------------------------------------------------------------------------


def partition_names(partitions: object) -> tuple[str, ...]:
    """The partition names ``partitions`` stands for, in its order; ConfigError otherwise.

    An int N >= 1 names "0" .. "N-1"; a sequence names itself (distinct,
    non-empty str names). A bare str is not a sequence of names.
    """
    if isinstance(partitions, bool):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of partition names, "
            f"not a bool ({partitions!r})"
        )
    if isinstance(partitions, int):
        if partitions < 1:
            raise ConfigError(
                f"partitions must be at least 1 (an int N names the partitions '0' .. 'N-1'), "
                f"got {partitions!r}"
            )
        if partitions > MAX_PARTITIONS:
            raise ConfigError(
                f"partitions must be at most {MAX_PARTITIONS} (one reply reads them all), "
                f"got {partitions!r}"
            )
        return tuple(str(index) for index in range(partitions))
    if isinstance(partitions, (str, bytes)):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of partition names; a bare "
            f"{type(partitions).__name__} is not a sequence of names, got {partitions!r} "
            f"(pass [{partitions!r}] for one partition of that name)"
        )
    if not isinstance(partitions, Sequence):
        raise ConfigError(
            f"partitions must be an int N >= 1 or a sequence of distinct non-empty str names, "
            f"got {type(partitions).__name__} {_short(partitions)}"
        )
    names = tuple(partitions)
    if not names:
        raise ConfigError("partitions must name at least one partition, got an empty sequence")
    if len(names) > MAX_PARTITIONS:
        raise ConfigError(
            f"partitions must name at most {MAX_PARTITIONS} partitions (one reply reads them "
            f"all), got {len(names)}"
        )
    for index, each in enumerate(names):
        if not isinstance(each, str):
            raise ConfigError(
                f"each partition name must be a str, got {type(each).__name__} {each!r} "
                f"at index {index}"
            )
        if not each:
            raise ConfigError(f"partition names must not be empty, got '' at index {index}")
    if len(set(names)) != len(names):
        counted = Counter(names)
        twice = sorted((each for each, n in counted.items() if n > 1), key=_natural)
        raise ConfigError(f"partition names must be distinct, got {_short(twice)} more than once")
    return names


def _natural(name: str) -> tuple[int, int, str]:
    """Sort key: decimal names by their number first ("2" before "10"), then the rest."""
    if name.isdecimal() and str(int(name)) == name:
        return 0, int(name), ""
    return 1, 0, name


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...]"


def describe_set(names: Iterable[str]) -> str:
    """A partition set in a few words: ``12 partitions '0' .. '11'`` or ``{'a', 'b'}``."""
    ordered = sorted(names, key=_natural)
    if ordered == [str(index) for index in range(len(ordered))]:
        if len(ordered) == 1:
            return "1 partition '0'"
        return f"{len(ordered)} partitions '0' .. '{len(ordered) - 1}'"
    shown = ", ".join(repr(name) for name in ordered[:_SHOWN_NAMES])
    more = f", ... ({len(ordered)} names)" if len(ordered) > _SHOWN_NAMES else ""
    return "{" + shown + more + "}"


def _canonical(names: Iterable[str]) -> str:
    """A partition set as the group's key holds it: the sorted names as one JSON list."""
    return json.dumps(sorted(names), ensure_ascii=False, separators=(",", ":"))


def _stored_set(value: bytes) -> str:
    """The set a group's key holds, described (or as it is, when it is not a set of ours)."""
    try:
        names = json.loads(value.decode("utf-8"))
    except ValueError:
        return repr(value[:80])
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return repr(value[:80])
    return describe_set(names)


def _check_callback(value: object, what: str, signature: str) -> None:
    if value is not None and not callable(value):
        raise ConfigError(
            f"{what} must be callable as {signature} or None, got {type(value).__name__} {value!r}"
        )


def _check_member_id(member_id: object) -> str:
    if member_id is None:
        return default_instance_id()
    if not isinstance(member_id, str):
        raise ConfigError(f"member_id must be a str, got {type(member_id).__name__} {member_id!r}")
    if not member_id:
        raise ConfigError("member_id must not be empty (pass None to generate one)")
    return member_id


# -- replies ----------------------------------------------------------------------------


def _check_join(reply: object) -> tuple[bool, Any]:
    """``(True, 1 | 2)`` joined (2: the notice was refused) or ``(False, the stored set)``."""
    if type(reply) is list and len(reply) == 2 and type(reply[0]) is int:
        if reply[0] == 1 and type(reply[1]) is int and reply[1] in (1, 2):
            return True, reply[1]
        if reply[0] == 0 and type(reply[1]) is bytes:
            return False, reply[1]
    raise unexpected_reply("partition_join", "{1, 1 or 2} or {0, a partition set}", reply)


def _check_count(script: str, reply: object, told: tuple[int, ...]) -> tuple[int, int]:
    """``(leases deleted, notice)`` of a release or a leave."""
    if (
        type(reply) is list
        and len(reply) == 2
        and type(reply[0]) is int
        and 0 <= reply[0] <= MAX_PARTITIONS
        and type(reply[1]) is int
        and reply[1] in told
    ):
        return reply[0], reply[1]
    raise unexpected_reply(script, "{leases deleted, 0, 1 or 2}", reply)


def _check_view(reply: object, leases: int) -> tuple[list[bytes], list[bytes], list[int]]:
    """``(members, holders, pttls)`` of a view of ``leases`` partition leases."""
    if (
        type(reply) is list
        and len(reply) == 3
        and all(type(part) is list for part in reply)
        and len(reply[1]) == len(reply[2]) == leases
        and all(type(m) is bytes for m in reply[0])
        and all(type(h) is bytes for h in reply[1])
        and all(type(t) is int for t in reply[2])
    ):
        return reply[0], reply[1], reply[2]
    raise unexpected_reply(
        "partition_view", f"{{members, {leases} holders, {leases} PTTLs}}", reply
    )


# -- the member ---------------------------------------------------------------------------


@dataclass
class _Tenure:
    """One partition held without interruption: its token, its keeper, when it was taken."""

    partition: str
    token: int
    keeper: Keeper
    acquired_at: float


class _Part:
    """One partition of the group: its elector (keys, acquire, fence) and its place."""

    __slots__ = ("election", "elector", "index", "lease_key", "name", "preference")

    def __init__(self, name: str, index: int, elector: Any, member_id: str) -> None:
        self.name = name
        self.index = index
        self.elector = elector  # the shell's Elector (threaded or asyncio): its Fencer's owner
        self.election = elector._core
        self.lease_key: str = self.election.keys.leader
        # Each member prefers partitions in an order of its own (rendezvous
        # hashing), so members that take free partitions at the same moment
        # mostly reach for different ones, and a member that comes back
        # reaches for those it had.
        digest = hashlib.blake2b(f"{member_id}\0{name}".encode(), digest_size=8).digest()
        self.preference = int.from_bytes(digest, "big")


Callback = Callable[..., object]
Bridge = Callable[[Callback | None], Callback | None]


def _as_is(callback: Callback | None) -> Callback | None:
    return callback


REBALANCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""The bounds (seconds) a member's rebalance durations are counted into (``redlease.metrics``)."""


class GroupStats:
    """What a member counts of its tenures and rebalances, for ``redlease.metrics``.

    A rebalance, as this member sees it, lasts from the first look at the
    group that finds it away from its share (partitions to hand over, to
    take, or still free) to the first look that finds it settled.
    """

    __slots__ = (
        "_mutex",
        "_since",
        "assigned",
        "rebalance_counts",
        "rebalance_sum",
        "rebalances",
        "revoked",
    )

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._since: float | None = None
        self.assigned = 0
        self.revoked: Counter[str] = Counter()
        self.rebalances = 0
        self.rebalance_counts = [0] * (len(REBALANCE_BUCKETS) + 1)
        self.rebalance_sum = 0.0

    def tenure_began(self) -> None:
        with self._mutex:
            self.assigned += 1

    def tenure_ended(self, reason: str) -> None:
        with self._mutex:
            self.revoked[reason] += 1

    def looked(self, settled: bool, now: float) -> None:
        """One look at the group: this member settled at its share, or not."""
        with self._mutex:
            if not settled:
                if self._since is None:
                    self._since = now
                return
            if self._since is None:
                return
            took = max(0.0, now - self._since)
            self._since = None
            self.rebalances += 1
            self.rebalance_sum += took
            self.rebalance_counts[bisect.bisect_left(REBALANCE_BUCKETS, took)] += 1

    def snapshot(self) -> tuple[int, dict[str, int], int, list[int], float]:
        """``(assigned, revoked by reason, rebalances, their bucket counts, their sum)``."""
        with self._mutex:
            return (
                self.assigned,
                dict(self.revoked),
                self.rebalances,
                list(self.rebalance_counts),
                self.rebalance_sum,
            )


def wait_deadline(timeout: object, what: str) -> float:
    """When a wait of ``timeout`` seconds ends (monotonic; ``math.inf`` for None), or ConfigError.

    Zero is allowed (one look, no wait); a bool, NaN or a negative value is a
    mistake, as for every other duration.
    """
    if timeout is None:
        return math.inf
    seconds = non_negative_seconds(
        timeout, f"{what} timeout", "None waits for as long as it takes"
    )
    return time.monotonic() + seconds


class ShareWatch:
    """What the run thread last found of this member's share, for ``wait_owned``.

    Each look at the group (``Member.rebalance``) ends by telling this the
    share the member holds for the live members Redis named at that look
    (``looked(quota)``), or that it is still short (``looked(None)``). The
    share is ``Member.quota``: ``N // M``, plus one for the ``N % M`` members
    ranked first, so the members' shares add up to N whatever M is. A join or
    a leave while someone waits is just another look: the share is computed
    again for the new M, and a waiter wakes only when the member holds that.

    Threads wait on the condition; an event loop registers a watcher (a plain
    callable, called on the run thread at each change) and wakes on it.
    """

    __slots__ = ("_changed", "_quota", "_running", "_watchers")

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._running = False
        self._quota: int | None = None
        self._watchers: set[Callable[[], None]] = set()

    def _tell(self) -> None:
        """Wake every waiter (called with ``_changed`` held)."""
        self._changed.notify_all()
        for watcher in list(self._watchers):
            watcher()

    def started(self) -> None:
        with self._changed:
            self._running, self._quota = True, None
            self._tell()

    def stopped(self) -> None:
        with self._changed:
            self._running, self._quota = False, None
            self._tell()

    def looked(self, quota: int | None) -> None:
        with self._changed:
            if self._running:
                self._quota = quota
                self._tell()

    def watch(self, watcher: Callable[[], None]) -> None:
        with self._changed:
            self._watchers.add(watcher)

    def unwatch(self, watcher: Callable[[], None]) -> None:
        with self._changed:
            self._watchers.discard(watcher)

    @property
    def quota(self) -> int | None:
        """The share the last look found held (None: short of it, or not running)."""
        with self._changed:
            return self._quota

    @property
    def watchers(self) -> int:
        """How many event-loop waiters are registered now."""
        with self._changed:
            return len(self._watchers)

    def ready(self, owned: Callable[[], dict[str, int]], what: str) -> dict[str, int] | None:
        """``owned()`` when it is this member's whole share now, else None; RuntimeError when
        the member is not running."""
        with self._changed:
            if not self._running:
                raise RuntimeError(
                    f"{what} is not running: wait_owned() waits for a started member "
                    "(call start() first; a stopped member owns nothing)"
                )
            if self._quota is None:
                return None
            held = owned()
            return held if len(held) == self._quota else None

    def wait(
        self, owned: Callable[[], dict[str, int]], deadline: float, what: str
    ) -> dict[str, int]:
        """Block until ``ready`` gives the share (TimeoutError past ``deadline``)."""
        with self._changed:
            while True:
                held = self.ready(owned, what)
                if held is not None:
                    return held
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(timed_out(what, self._quota))
                self._changed.wait(None if math.isinf(left) else left)


def timed_out(what: str, quota: int | None) -> str:
    """What ``TimeoutError`` says of a ``wait_owned`` that ran out (``quota``: ``ShareWatch``'s)."""
    seen = (
        "its last look at the group found it short of its share"
        if quota is None
        else f"its last look found its share of {quota} held, but not all of it is proven now"
    )
    return f"{what} did not hold its balanced share of the partitions in time ({seen})"


class Member:
    """One member of a partitioned group: the core the public shells drive.

    ``make_elector(name, ttl, member_id, engine)`` makes the shell's Elector
    for each partition (its fence is the partition's; its Fencer is what
    ``fencer()`` hands out). ``bridge`` wraps each user callback (the asyncio
    shell runs coroutines on its event loop). See the module doc.
    """

    def __init__(
        self,
        client: Any,
        name: str,
        partitions: object,
        *,
        ttl: Duration | None,
        member_id: str | None,
        on_assigned: Callback | None,
        on_revoked: Callback | None,
        observer: Observer | None,
        engine: str | None,
        make_elector: Callable[[str, float, str, str | None], Any],
        asyncio: bool = False,
        bridge: Bridge = _as_is,
        shell: str = "Partitions",
    ) -> None:
        sync_client, self.family = threaded(client, asyncio=asyncio)
        ident = _check_member_id(member_id)
        self.config = Config.resolve(name, ttl=ttl, instance_id=ident)
        self.names = partition_names(partitions)
        _check_callback(on_assigned, "on_assigned", "on_assigned(partition, token)")
        _check_callback(on_revoked, "on_revoked", "on_revoked(partition, reason)")
        if observer is not None and not isinstance(observer, Observer):
            raise ConfigError(
                f"observer must be a redlease.Observer, got {type(observer).__name__}"
            )
        if is_cluster(sync_client) and not has_hash_tag(self.config.name):
            raise ConfigError(
                f"with a RedisCluster client the name needs a hash tag so every key of the "
                f"group shares one slot, e.g. '{{{self.config.name}}}'; "
                f"got {self.config.name!r}"
            )
        self.member_id = ident
        self.shell = shell
        cfg = self.config
        keys = PartitionKeys(cfg.name)
        self.parts = {
            p: _Part(p, i, make_elector(keys.lease(p), cfg.ttl, ident, engine), ident)
            for i, p in enumerate(self.names)
        }
        for part in self.parts.values():
            part.election.tenure_failover = functools.partial(self.failover_seen, part.name)
        first = self.parts[self.names[0]].election
        self.engine = first.engine
        self.client = first.client
        self.members_key = keys.members
        self.set_key = keys.partitions
        self.canonical = _canonical(self.names)
        self.lease_keys = tuple(self.parts[p].lease_key for p in self.names)
        self.sharded = "1" if sharded_notices(self.client) else "0"
        self.poll = cfg.ttl / POLLS_PER_TTL
        self.on_assigned = bridge(on_assigned)
        self.on_revoked = bridge(on_revoked)
        self.on_error = bridge(observer.on_error if observer is not None else None)
        self.events = Events("partitions", cfg.name, ident, adopt=self.family.adopter)
        self.refusals = ChannelRefusals(
            f"{shell} {cfg.name!r} member {ident!r}", f"&{cfg.name}*", self.client
        )
        # ``mutex`` guards what the run thread shares (held, thread); ``lifecycle``
        # makes start() and stop() one at a time.
        self.mutex = threading.Lock()
        self.lifecycle = threading.Lock()
        self.held: dict[str, _Tenure] = {}
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.heartbeat: Keeper | None = None
        self.notices: NoticeSubscription = NO_NOTICES
        self.noticed = False
        self.pending: list[Exception] = []
        self.errors_in_row = 0
        self.hurry = 0  # looks in a row at partitions left free (see rebalance)
        self.member_bytes = ident.encode()
        self.stats = GroupStats()
        self.share = ShareWatch()

    # -- what callers read ----------------------------------------------------------------

    def proven(self, tenure: _Tenure, now: float) -> bool:
        """Whether ``tenure``'s lease is still ours for sure at ``now`` (monotonic).

        The keeper must hold the term, and less than a TTL may have passed
        since the send time of the last good renewal (or of the acquire): the
        lease cannot have expired at Redis before then, whatever the
        renewer's thread is doing.
        """
        return now < self.proven_until(tenure)

    def proven_until(self, tenure: _Tenure) -> float:
        """When ``tenure``'s lease stops being proven (monotonic); 0 once its term ended."""
        keeper = tenure.keeper
        if keeper.token != tenure.token:
            return 0.0
        renewed: float = getattr(keeper, "renewed_at", 0.0)
        return max(tenure.acquired_at, renewed) + self.config.ttl

    def wait_owned(self, timeout: object) -> dict[str, int]:
        """Block until this member holds its balanced share; ``owned()`` then (see ShareWatch)."""
        deadline = wait_deadline(timeout, "wait_owned")
        return self.share.wait(self.owned, deadline, self.described())

    def described(self) -> str:
        return f"{self.shell} {self.config.name!r} member {self.member_id!r}"

    def owned(self) -> dict[str, int]:
        with self.mutex:
            tenures = list(self.held.values())
        now = time.monotonic()
        proven = [t for t in tenures if self.proven(t, now)]
        proven.sort(key=lambda t: self.parts[t.partition].index)
        return {t.partition: t.token for t in proven}

    def part(self, partition: object) -> _Part:
        """The partition named ``partition``; ConfigError for a name not in the set."""
        found = self.parts.get(partition) if isinstance(partition, str) else None
        if found is None:
            hint = ""
            if isinstance(partition, int) and not isinstance(partition, bool):
                hint = f" (partition names are str: {str(partition)!r})"
            raise ConfigError(
                f"partition {partition!r} is not in {self.shell} {self.config.name!r}'s set "
                f"({describe_set(self.names)}){hint}"
            )
        return found

    def failover_seen(self, partition: str, token: int, exc: Exception) -> None:
        """A fenced write with ``partition``'s ``token`` was answered READONLY / MASTERDOWN /
        NOREPLICAS: that tenure ends now (``owned()`` drops it, and the run thread,
        woken, reports it ``"lost"``), not at its renewal deadline, as an elector's
        term does."""
        with self.mutex:
            tenure = self.held.get(partition)
        if tenure is not None and token and tenure.token == token:
            tenure.keeper.lose(exc)
            heartbeat = self.heartbeat
            if heartbeat is not None:
                heartbeat.notify()  # a pause sees the lease no longer proven

    def token_of(self, partition: str) -> int:
        """The token of ``partition`` while this member holds it for sure, else 0."""
        with self.mutex:
            tenure = self.held.get(partition)
        if tenure is None or not self.proven(tenure, time.monotonic()):
            return 0
        return tenure.token

    def view(
        self, leases: Sequence[str], timeout: float
    ) -> tuple[list[bytes], list[bytes], list[int]]:
        """The group as Redis says: ``(members, holders, pttls)`` (an error raised as it is)."""
        reply, _ = run_one(self.engine, (_VIEW, (self.members_key, *leases), ()), timeout=timeout)
        return _check_view(reply, len(leases))

    def assignment(self) -> dict[str, str | None]:
        with self.family.errors():
            _members, holders, _pttls = self.view(self.lease_keys, call_timeout(self.client))
        return {
            p: holder.decode("utf-8", "replace") if holder else None
            for p, holder in zip(self.names, holders, strict=True)
        }

    def members(self) -> list[str]:
        with self.family.errors():
            members, _holders, _pttls = self.view((), call_timeout(self.client))
        return sorted(m.decode("utf-8", "replace") for m in members)

    # -- start and stop (on the caller's thread) ---------------------------------------------

    def start(self) -> None:
        """Join the group and start the run thread; ConfigError for a different partition set.

        Redis trouble on the way in is not raised: the run keeps trying,
        and its ``on_error`` hears of it (from the run thread); but what
        retrying cannot mend at the client's first contact is, before
        anything starts (``Election.contact``).
        """
        self.parts[self.names[0]].election.contact()
        cfg = self.config
        thread = threading.Thread(
            target=self.main, name=f"redlease-partitions-{cfg.name}", daemon=True
        )
        with self.lifecycle:
            with self.mutex:
                if self.thread is not None:
                    raise RuntimeError(
                        f"{self.shell} {cfg.name!r} member {self.member_id!r} is already "
                        "running; one run at a time (stop() it first)"
                    )
                self.thread = thread  # claimed: a second start() raises from here on
            self.begin(thread)

    def begin(self, thread: threading.Thread) -> None:
        """Start's body, ``lifecycle`` held: the first join, then the run thread."""
        cfg = self.config
        self.share.started()
        self.stopping = False
        self.noticed = False
        self.errors_in_row = 0
        self.hurry = 0
        self.pending = []
        try:
            self.heartbeat = self.engine.keeper(
                (_HEARTBEAT, (self.members_key, self.set_key), (self.member_id, cfg.ttl_ms)),
                interval=cfg.renew_interval,
                ttl=cfg.ttl,
            )
            # Listening before the join: a hand-over right after it still wakes us.
            self.notices = self.engine.notices(self.client).listen(
                self.members_key, self.notice, signal=self.heartbeat
            )
            try:
                self.join()
            except ConfigError:
                raise
            except Exception as exc:  # told on the run thread; the run joins again
                self.pending.append(exc)
            thread.start()
        except BaseException:
            self.notices.cancel()
            self.notices = NO_NOTICES
            if self.heartbeat is not None:
                self.heartbeat.close()
                self.heartbeat = None
            with self.mutex:
                self.thread = None
            self.share.stopped()
            raise

    def request_stop(self) -> None:
        """Ask the run to end (it revokes, releases and leaves); returns at once."""
        self.stopping = True
        self.share.stopped()
        heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat.notify()

    def stop(self, timeout: float | None) -> None:
        """End the run: ``on_revoked(p, "stopped")`` for each, leases released, group left."""
        with self.lifecycle:  # not halfway through a start()
            thread = self.thread
            if thread is None:
                return
            self.request_stop()
        if threading.current_thread() is thread:
            return  # from a callback: the run ends as soon as it returns
        thread.join(timeout)

    # -- the run (on its own thread) ---------------------------------------------------------

    def main(self) -> None:
        try:
            for exc in self.pending:
                self.report(exc)
            self.pending = []
            while not self.stopping:
                try:
                    until = self.step()
                except Exception as exc:  # never leaves the loop: the leases are still ours
                    self.report(exc)
                    until = self.backoff()
                self.pause(until)
        finally:
            self.share.stopped()
            try:
                self.leave()
            finally:
                with self.mutex:
                    if self.thread is threading.current_thread():
                        self.thread = None

    def notice(self, released_by: bytes | None) -> None:
        """A member joined, left or handed partitions over (a notice arrived): look again."""
        if released_by == self.member_bytes:
            return  # our own: nothing new
        self.noticed = True
        heartbeat = self.heartbeat
        if heartbeat is not None:
            heartbeat.notify()

    def pause(self, until: float) -> None:
        """Wait until ``until``, a notice, a stop, or the heartbeat's loss.

        A lease that stops being proven meanwhile is reported ``"lost"`` as
        it happens (``check_held``), not at the next step.
        """
        heartbeat = self.heartbeat
        assert heartbeat is not None
        # A heartbeat already down (Redis out of reach) is no news: the backoff holds.
        joined = heartbeat.state == ACTIVE
        while not self.stopping:
            self.notices.deliver()
            if self.noticed or (joined and heartbeat.state != ACTIVE):
                return
            now = time.monotonic()
            with self.mutex:
                tenures = list(self.held.values())
            first_end = min((self.proven_until(t) for t in tenures), default=math.inf)
            if first_end <= now:
                self.check_held()
                continue
            left = until - now
            if left <= 0:
                return
            heartbeat.wait(min(left, self.poll, first_end - now))

    def backoff(self) -> float:
        """When to try again after a failed step: doubling from one poll, capped at the TTL."""
        self.errors_in_row += 1
        delay = min(self.poll * (1 << min(self.errors_in_row, 16)), self.config.ttl)
        return time.monotonic() + delay

    def step(self) -> float:
        """One look at the group and what this member does about it; when to look again."""
        heartbeat = self.heartbeat
        assert heartbeat is not None
        self.notices.deliver()
        self.noticed = False
        if self.notices.refused:
            self.refusals.subscribe_refused(self.members_key)
        for exc in heartbeat.pop_errors():
            self.report(exc)
        self.check_held()
        if heartbeat.state != ACTIVE:
            try:
                self.join()
            except Exception as exc:  # a different set (ConfigError) included: tried again
                self.report(exc)
                return self.backoff()
        try:
            members, holders, pttls = self.view(self.lease_keys, self.config.renew_interval)
        except Exception as exc:
            self.report(exc)
            return self.backoff()
        self.check_held()  # a lease lost while the group was read is reported now
        self.errors_in_row = 0
        self.events.ok()
        return self.rebalance(members, holders, pttls)

    def join(self) -> None:
        """Enter the group (or come back to it); ConfigError for a different partition set."""
        cfg = self.config
        heartbeat = self.heartbeat
        assert heartbeat is not None
        sent = time.monotonic()
        reply, _ = run_one(
            self.engine,
            (
                _JOIN,
                (self.members_key, self.set_key),
                (self.member_id, cfg.ttl_ms, self.canonical, self.sharded),
            ),
            timeout=cfg.renew_interval,
        )
        joined, detail = _check_join(reply)
        if not joined:
            raise ConfigError(
                f"{self.shell} {cfg.name!r}: the group's live members share the partition set "
                f"{_stored_set(detail)}, but member {self.member_id!r} was given "
                f"{describe_set(self.names)}; every member of a group must pass the same set "
                "(order aside)"
            )
        if detail == 2:
            self.refusals.publish_refused(self.members_key)
        heartbeat.begin(1, sent)
        self.events.debug(f"member {self.member_id} joined")

    def check_held(self) -> None:
        """Drop every partition whose lease can no longer be proven: ``on_revoked(p, "lost")``."""
        with self.mutex:
            tenures = list(self.held.values())
        now = time.monotonic()
        lost = []
        for tenure in tenures:
            for exc in tenure.keeper.pop_errors():
                self.report(exc)
            if not self.proven(tenure, now):
                lost.append(tenure)
        if not lost:
            return
        with self.mutex:
            for tenure in lost:
                self.held.pop(tenure.partition, None)
        for tenure in lost:
            tenure.keeper.close()
        logger.warning(
            "partitions %r member %s lost %s: their leases could not be kept",
            self.config.name,
            self.member_id,
            _listed(t.partition for t in lost),
        )
        for tenure in lost:
            self.stats.tenure_ended("lost")
            self.emit(self.on_revoked, tenure.partition, "lost")

    def quota(self, live: list[bytes], holders: list[bytes]) -> int:
        """How many partitions this member should hold, of ``len(self.names)``, among ``live``.

        ``N // M`` each; the ``N % M`` extra ones go to the live members that
        hold the most now, ties broken by id, so a member that already holds
        one more keeps it and nobody takes what another must give up.
        """
        base, extra = divmod(len(self.names), len(live))
        if extra == 0:
            return base
        alive = set(live)
        counts = Counter(h for h in holders if h in alive)
        ranked = sorted(live, key=lambda member: (-counts[member], member))
        return base + (1 if self.member_bytes in ranked[:extra] else 0)

    def rebalance(self, members: list[bytes], holders: list[bytes], pttls: list[int]) -> float:
        """Hand over what is above this member's share, or take free partitions up to it.

        Returns when to look again: at the next poll, or soon while some
        partitions are free (others are taking them, and who gets the extra
        ones of ``share`` may still change), or when a departed member's
        lease runs out.
        """
        now = time.monotonic()
        next_poll = now + self.poll * (1 - 0.1 * random.random())
        live = sorted(set(members))
        me = self.member_bytes
        if me not in live:
            # The heartbeat lapsed at Redis: take nothing until the member is back
            # (its keeper learns so at its next renewal, and the member joins again).
            self.stats.looked(False, now)
            self.share.looked(None)
            return now + min(self.poll, self.config.renew_interval)
        quota = self.quota(live, holders)
        with self.mutex:
            mine = list(self.held)
        if len(mine) > quota:
            excess = sorted(mine, key=lambda p: self.parts[p].preference)[: len(mine) - quota]
            self.stats.looked(False, now)
            self.hand_over(excess, "rebalanced")
            self.hurry = 0
            self.share.looked(quota)
            return next_poll
        taken = 0
        if len(mine) < quota:
            held = set(mine)
            free = [
                p
                for p, holder in zip(self.names, holders, strict=True)
                if p not in held and (not holder or holder == me)
            ]
            free.sort(key=lambda p: self.parts[p].preference, reverse=True)
            wanted = free[: quota - len(mine)]
            taken = self.take(wanted) if wanted else 0
        short = len(mine) + taken < quota
        self.share.looked(None if short else quota)
        unsettled = short or sum(1 for holder in holders if not holder) > taken
        self.stats.looked(not unsettled and not taken, now)
        if unsettled:
            # Partitions still free, or this member still short of its share:
            # the others are taking or handing over now (and who gets the extra
            # ones may still change), so look again soon, jittered and slowing
            # down while nothing moves, in case a notice was missed.
            if taken:
                self.hurry = 0
            delay = min(self.poll, 0.005 * (1 << min(self.hurry, 10)) * (1 + random.random()))
            self.hurry += 1
            if short:
                # Partitions of members that are gone run out at their leases' end.
                alive = set(live)
                ending = [
                    pttl
                    for holder, pttl in zip(holders, pttls, strict=True)
                    if holder and holder not in alive and pttl >= 0
                ]
                if ending:
                    delay = min(delay, min(ending) / 1000 + 0.001)
            return now + delay
        self.hurry = 0
        return next_poll

    def take(self, wanted: list[str]) -> int:
        """Acquire ``wanted`` in one round trip; ``on_assigned`` for each won. How many won."""
        cfg = self.config
        parts = [self.parts[p] for p in wanted]
        sent = time.monotonic()
        try:
            replies, _ = self.engine.run(
                [part.election.acquire_request() for part in parts], timeout=cfg.renew_interval
            )
        except Exception as exc:  # the outcome is unknown: a lease won meanwhile runs out
            self.report(exc)
            return 0
        won: list[_Tenure] = []
        for part, reply in zip(parts, replies, strict=True):
            if isinstance(reply, Exception):
                self.report(reply)
                continue
            try:
                token = part.election.acquired(reply)[0]
            except Exception as exc:  # not confirmed behind Sentinel: given back
                self.report(exc)
                continue
            if token <= 0:
                continue
            keeper = self.engine.keeper(
                (_RENEW, (part.lease_key,), (self.member_id, cfg.ttl_ms)),
                interval=cfg.renew_interval,
                ttl=cfg.ttl,
            )
            keeper.begin(token, sent)
            won.append(_Tenure(part.name, token, keeper, sent))
        if not won:
            return 0
        won.sort(key=lambda t: self.parts[t.partition].index)
        with self.mutex:
            for tenure in won:
                self.held[tenure.partition] = tenure
        logger.info(
            "partitions %r member %s assigned %s (holds %d)",
            cfg.name,
            self.member_id,
            _listed(f"{t.partition} (token {t.token})" for t in won),
            len(self.held),
        )
        for tenure in won:
            self.stats.tenure_began()
            self.emit(self.on_assigned, tenure.partition, tenure.token)
        return len(won)

    def hand_over(self, partitions: list[str], reason: str) -> None:
        """``on_revoked(p, reason)`` for each, then release them all, telling the group."""
        with self.mutex:
            tenures = [self.held[p] for p in partitions if p in self.held]
        tenures.sort(key=lambda t: self.parts[t.partition].index)
        for tenure in tenures:
            self.stats.tenure_ended(reason)
            self.emit(self.on_revoked, tenure.partition, reason)
            # Token cleared before the release: owned() drops it first.
            with self.mutex:
                self.held.pop(tenure.partition, None)
            tenure.keeper.end()
        try:
            self.release(_RELEASE, [t.partition for t in tenures], (0, 1, 2))
        finally:
            for tenure in tenures:
                tenure.keeper.close()
        logger.info(
            "partitions %r member %s handed over %s (%s)",
            self.config.name,
            self.member_id,
            _listed(t.partition for t in tenures),
            reason,
        )

    def release(
        self, script: _scripts.Script, partitions: list[str], told: tuple[int, ...]
    ) -> None:
        """Run a release (or leave) script for ``partitions``; errors reported, never raised."""
        group = (self.members_key, self.set_key) if script is _LEAVE else (self.members_key,)
        keys = (*group, *(self.parts[p].lease_key for p in partitions))
        try:
            reply, _ = run_one(
                self.engine,
                (script, keys, (self.member_id, self.sharded)),
                timeout=self.config.renew_interval,
            )
            _released, notice = _check_count(script.name, reply, told)
        except Exception as exc:  # the leases run out at their TTL instead
            self.report(exc)
            return
        if notice == 2:
            self.refusals.publish_refused(self.members_key)

    def leave(self) -> None:
        """The run's end: ``on_revoked(p, "stopped")`` for each, then release all and leave."""
        heartbeat = self.heartbeat
        tenures: list[_Tenure] = []
        try:
            self.check_held()
            with self.mutex:
                tenures = sorted(self.held.values(), key=lambda t: self.parts[t.partition].index)
            for tenure in tenures:
                self.stats.tenure_ended("stopped")
                self.emit(self.on_revoked, tenure.partition, "stopped")
                with self.mutex:
                    self.held.pop(tenure.partition, None)
                tenure.keeper.end()
            if heartbeat is not None:
                heartbeat.end()
            self.release(_LEAVE, [t.partition for t in tenures], (1, 2))
            if tenures:
                logger.info(
                    "partitions %r member %s stopped: released %s",
                    self.config.name,
                    self.member_id,
                    _listed(t.partition for t in tenures),
                )
        finally:
            with self.mutex:
                rest, self.held = list(self.held.values()), {}
            for tenure in (*tenures, *rest):
                tenure.keeper.close()
            self.notices.cancel()
            self.notices = NO_NOTICES
            if heartbeat is not None:
                heartbeat.close()
            self.heartbeat = None

    # -- reports -----------------------------------------------------------------------------

    def report(self, exc: Exception) -> None:
        """A Redis error the member handled itself: logged (one WARNING per outage), observed."""
        self.events.error(exc)
        self.observe(exc)

    def observe(self, exc: Exception) -> None:
        tell_on_error(self.on_error, exc)

    def emit(self, callback: Callback | None, partition: str, detail: object) -> None:
        """A user callback, on the run thread; what it raises is logged and observed."""
        if callback is None:
            return
        try:
            callback(partition, detail)
        except Exception as exc:
            logger.warning(
                "partitions %r member %s: callback %s(%r, %r) raised %s: %s",
                self.config.name,
                self.member_id,
                getattr(callback, "__name__", "callback"),
                partition,
                detail,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            self.observe(exc)


def _listed(partitions: Iterable[str], limit: int = 16) -> str:
    names = list(partitions)
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"



# -- the shells --------------------------------------------------------------------------------


Assigned = TypeVar("Assigned", bound=Callable[..., object])
Revoked = TypeVar("Revoked", bound=Callable[..., object])


class PartitionsShell(Generic[Assigned, Revoked]):
    """What the threaded and the asyncio ``Partitions`` share: their signature, core and identity.

    The arguments of a member are written here once; each face says how it
    names itself (``_face``), whose fencers its partitions hand out
    (``_elector``), how its callbacks run (``_bridge``) and what else it
    keeps (``_shell_init``). The type parameters are the callbacks' types.
    """

    __slots__ = ("__weakref__", "_core")

    _face = "Partitions"  # how the face names itself (repr, errors)
    _asyncio = False  # whether its callbacks may be coroutine functions
    _elector: type[ElectorShell] = Elector  # what a partition's fencer belongs to

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # As ``ElectorShell``'s: each face's copy of the signature is named for the face.
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            cls.__init__ = named_for(  # type: ignore[method-assign]
                PartitionsShell.__init__, f"{cls._face}.__init__"
            )

    def __init__(
        self,
        client: Any,
        name: str,
        partitions: int | Sequence[str],
        *,
        ttl: Duration | None = None,
        member_id: str | None = None,
        on_assigned: Assigned | None = None,
        on_revoked: Revoked | None = None,
        observer: Observer | None = None,
        engine: str | None = "auto",
    ) -> None:
        self._shell_init()
        elector = self._elector

        def make(pname: str, pttl: float, ident: str, engine_name: str | None) -> Any:
            return elector(client, pname, ttl=pttl, instance_id=ident, engine=engine_name)

        self._core = Member(
            client,
            name,
            partitions,
            ttl=ttl,
            member_id=member_id,
            on_assigned=on_assigned,
            on_revoked=on_revoked,
            observer=observer,
            engine=engine,
            make_elector=make,
            asyncio=self._asyncio,
            bridge=self._bridge,
            shell=self._face,
        )

    def _bridge(self, callback: Callback | None) -> Callback | None:
        """How the run thread calls a callback: as it is (the asyncio face: on its loop)."""
        return callback

    def _shell_init(self) -> None:
        """What the face keeps besides its core, set before the core is made."""

    def __repr__(self) -> str:
        core = self._core
        return (
            f"<redlease.{self._face} {core.config.name!r} member={self.member_id!r} "
            f"owned={len(core.owned())}/{len(core.names)}>"
        )

    @property
    def member_id(self) -> str:
        """This member's identity: the value of every partition lease it holds."""
        return self._core.member_id

    @property
    def name(self) -> str:
        """The group's name (its keys' prefix)."""
        return self._core.config.name

    @property
    def ttl(self) -> float:
        """Every lease's TTL in seconds (the heartbeat's and each partition's)."""
        return self._core.config.ttl

    @property
    def partitions(self) -> tuple[str, ...]:
        """The partition names, in the order given."""
        return self._core.names

    @property
    def engine(self) -> str:
        """The engine that runs this member: ``"native"`` or ``"python"``."""
        return str(self._core.engine.name)


class Partitions(
    PartitionsShell[Callable[[str, int], object], Callable[[str, str], object]], StopsOnExit
):
    """One member of a group that shares N partitions, each owned by one live member at a time.

    ``partitions`` is an int N (names "0" .. "N-1") or a sequence of distinct
    names; every member of ``name`` must pass the same set. Each partition is
    a lease with its own fencing token, renewed by the engine's one renewer
    (the native one on ``auto``/``native``), as an elector's.

    Guarantees: at most one member holds a partition's lease at Redis at any
    moment; ``owned()`` drops a partition before its lease can have expired
    (self-fenced on the monotonic clock); a partition's tokens strictly
    increase across owners, and a write fenced with an older owner's token is
    rejected at Redis. With M live members, within 3 x ttl of a join, leave
    or death every partition is owned and each member owns N // M or
    N // M + 1. A join moves only what the newcomer takes; a departure moves
    only the departed member's partitions. A partition goes to a new owner
    only after its old owner's ``on_revoked`` returned and it released (the
    new owner takes it within milliseconds), or after its lease expired.

    Callbacks run on the member's run thread, in order per partition:
    ``on_assigned(partition, token)``, then ``on_revoked(partition, reason)``
    with reason "rebalanced" (handed to another member), "lost" (the lease
    could not be kept) or "stopped". What one raises is logged (WARNING) and
    passed to ``observer.on_error``; the member carries on. ``on_error``
    also receives every Redis error the member handled itself.

    What it does not do: keep a partition through a Redis outage longer than
    its TTL (``owned()`` shrinks to what it can prove), or stop a member's
    code from acting after a loss; carry the token into the storage the
    partition owns (``fencer(p)``) for anything that must be safe.
    """

    __slots__ = ()

    def start(self) -> Partitions:
        """Join the group and start the member's run thread; returns this member.

        Raises ``ConfigError`` when the group's live members share another
        partition set (naming both), ``RuntimeError`` when already running.
        Redis trouble is not raised: the member keeps trying and tells
        ``observer.on_error``; but a failure retrying cannot mend at the
        client's first contact is (as ``Elector.start`` says).
        """
        self._core.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """End the run: ``on_revoked(p, "stopped")`` for each partition held, then every
        lease is released and the member leaves the group, all before this returns.

        With ``timeout``, returns after that many seconds at most (the run
        then ends on its own). From a callback it returns at once, and the
        run ends as soon as the callback returns. No-op when not running.
        """
        self._core.stop(timeout)

    def __enter__(self) -> Partitions:
        if self._core.thread is None:
            self.start()
        return self


    def owned(self) -> dict[str, int]:
        """``{partition: token}`` this member holds now, proven (``{}`` when not running).

        A partition keeps its token while this member holds it without
        interruption, and gets a new, greater one when it is taken again. A
        snapshot: carry the token into fenced writes (``fencer``).
        """
        return self._core.owned()

    def wait_owned(self, timeout: float | None = None) -> dict[str, int]:
        """Block until this member holds its balanced share, then return ``owned()``.

        The share is this member's part of a complete assignment among the
        live members Redis names: with M of them and N partitions, N // M or
        N // M + 1, the extra ones going to the members ranked first, so the
        shares add up to N. When a member joins or leaves while this waits,
        the share is the one for the new M. Wakes on each look the member
        takes at its group (every notice, join, release and poll), not on a
        sleep of its own. A snapshot, as ``owned()``: the share can move
        right after it returns.

        ``timeout`` in seconds (or a ``timedelta``; 0 looks once; None waits
        for as long as it takes); ``TimeoutError`` past it, ``ConfigError``
        for a negative, NaN or bool one. ``RuntimeError`` before ``start()``,
        after ``stop()``, or when the member stops while this waits: calls in
        the wrong state raise ``RuntimeError`` here, as a second ``start()``
        does.
        """
        return self._core.wait_owned(timeout)

    def fencer(self, partition: str) -> Fencer:
        """A ``Fencer`` with ``partition``'s token while this member holds it; inert (token 0)
        otherwise. Its writes are rejected at Redis once a newer owner took the partition.
        ``ConfigError`` for a name not in the set."""
        part = self._core.part(partition)
        return Fencer(part.elector, self._core.token_of(part.name))

    def assignment(self) -> dict[str, str | None]:
        """``{partition: member id or None}``: who holds each partition's lease, as Redis says.

        One round trip; a snapshot.
        """
        return self._core.assignment()

    def members(self) -> list[str]:
        """The live members of the group (sorted ids), as Redis says. One round trip."""
        return self._core.members()
