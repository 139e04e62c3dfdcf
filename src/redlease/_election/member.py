"""A partitioned group's member: the core both ``Partitions`` shells drive.

``Member`` joins its group (``partition_join.lua``, which checks the
partition set), keeps a heartbeat in the group's sorted set on the engine's
one renewer, listens to the group's channel, and is stepped by the process's
driver as an election's run is (``memberloop.MemberLoop``): each look reads
the group (``partition_view.lua``), lets ``balance`` decide this member's
share and acts on it through its ``Tenures`` (take, hand over); the next
comes at the next poll, a notice, a stop, or a lease that stops being
proven. At the end it revokes, releases and leaves (``partition_leave.lua``).
Callbacks run on the member's callback thread (``memberloop.CallbackThread``),
in order; a member without callbacks has no thread of its own.
"""

from __future__ import annotations

import functools
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import _scripts
from .._config import Config, Duration
from .._engine import (
    ACTIVE,
    NO_NOTICES,
    ChannelRefusals,
    Keeper,
    NoticeSubscription,
    call_timeout,
    execute_one,
    is_cluster,
    sharded_notices,
    threaded,
    unexpected_reply,
)
from .._errors import ConfigError
from .._keys import PartitionKeys, has_hash_tag
from .._log import Events, logger
from . import balance
from .election import generation
from .memberloop import MemberLoop
from .partnames import (
    Callback,
    canonical,
    check_callback,
    check_member_id,
    describe_set,
    partition_names,
    stored_set,
)
from .sharewatch import GroupStats, ShareWatch, wait_deadline
from .tenures import Part, Tenure, Tenures, listed
from .term import Observer

POLLS_PER_TTL = 4
"""A member reads its group from Redis this many times per TTL, besides every notice."""

_JOIN = _scripts.load("partition_join")  # the reply shapes are checked here (_check_*)
_HEARTBEAT = _scripts.load("sem_refresh")  # a member's lease in the group's sorted set
_VIEW = _scripts.load("partition_view")


def _check_join(reply: object) -> tuple[bool, Any]:
    """``(True, 1 | 2)`` joined (2: the notice was refused) or ``(False, the stored set)``."""
    if type(reply) is list and len(reply) == 2 and type(reply[0]) is int:
        if reply[0] == 1 and type(reply[1]) is int and reply[1] in (1, 2):
            return True, reply[1]
        if reply[0] == 0 and type(reply[1]) is bytes:
            return False, reply[1]
    raise unexpected_reply("partition_join", "{1, 1 or 2} or {0, a partition set}", reply)


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


Bridge = Callable[[Callback | None], Callback | None]


def _as_is(callback: Callback | None) -> Callback | None:
    return callback


class Member(Tenures):
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
        ident = check_member_id(member_id)
        self.config = Config.resolve(name, ttl=ttl, instance_id=ident)
        self.names = partition_names(partitions)
        check_callback(on_assigned, "on_assigned", "on_assigned(partition, token)")
        check_callback(on_revoked, "on_revoked", "on_revoked(partition, reason)")
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
            p: Part(p, i, make_elector(keys.lease(p), cfg.ttl, ident, engine), ident)
            for i, p in enumerate(self.names)
        }
        for part in self.parts.values():
            part.election.tenure_failover = functools.partial(self.failover_seen, part.name)
        first = self.parts[self.names[0]].election
        self.engine = first.engine
        self.client = first.client
        self.members_key = keys.members
        self.set_key = keys.partitions
        self.canonical = canonical(self.names)
        self.lease_keys = tuple(self.parts[p].lease_key for p in self.names)
        self.sharded = "1" if sharded_notices(self.client) else "0"
        self.poll = cfg.ttl / POLLS_PER_TTL
        self.on_assigned = bridge(on_assigned)
        self.on_revoked = bridge(on_revoked)
        self.on_error = bridge(observer.on_error if observer is not None else None)
        self.events = Events(
            "partitions",
            cfg.name,
            ident,
            adopt=self.family.adopter,
            engine=self.engine.name,
            client=self.client,
        )
        self.refusals = ChannelRefusals(
            f"{shell} {cfg.name!r} member {ident!r}", f"&{cfg.name}*", self.client
        )
        # ``mutex`` guards what the run shares with the callers' threads (held,
        # handing, the loop); ``lifecycle`` makes start() and stop() one at a time.
        self.mutex = threading.Lock()
        self.lifecycle = threading.Lock()
        self.held: dict[str, Tenure] = {}
        self.handing: set[str] = set()
        self.callbacks = any(c is not None for c in (on_assigned, on_revoked, self.on_error))
        self._loop: MemberLoop | None = None
        self.stopping = False
        self.heartbeat: Keeper | None = None
        self.notices: NoticeSubscription = NO_NOTICES
        self.noticed = False
        self.pending: list[Exception] = []
        self.errors_in_row = 0
        self.hurry = 0  # looks in a row at partitions left free (see rebalance)
        self.member_bytes = ident.encode()
        self.stats = GroupStats(self.events)
        self.share = ShareWatch()

    @property
    def loop(self) -> MemberLoop | None:
        """The run going on, or None (in a forked child, a run of the parent is none)."""
        loop = self._loop
        if loop is not None and loop.born != generation():
            self._loop = None
            return None
        return loop

    @property
    def running(self) -> bool:
        return self.loop is not None

    def loop_ended(self, loop: MemberLoop) -> None:
        with self.mutex:
            if self._loop is loop:
                self._loop = None

    def later(self, job: Callable[[], object]) -> None:
        """Run ``job`` on the callback thread after what is queued there (at once without)."""
        loop = self._loop
        if loop is None:
            job()
        else:
            loop.later(job)

    def handed_over(self) -> None:
        """A hand-over is done: after one on the callback thread, look at the group again now."""
        loop = self._loop
        if loop is not None and loop.worker is not None:
            self.noticed = True
            loop.poke()

    def first_end(self) -> float:
        """When the first lease held (and not being handed over) stops being proven."""
        with self.mutex:
            tenures = [t for t in self.held.values() if t.partition not in self.handing]
        return min((self.proven_until(t) for t in tenures), default=math.inf)

    # -- what callers read (and the tenures' owned() and token_of()) ----------------------

    def wait_owned(self, timeout: object) -> dict[str, int]:
        """Block until this member holds its balanced share; ``owned()`` then (see ShareWatch)."""
        deadline = wait_deadline(timeout, "wait_owned")
        return self.share.wait(self.owned, deadline, self.described())

    def described(self) -> str:
        return f"{self.shell} {self.config.name!r} member {self.member_id!r}"

    def part(self, partition: object) -> Part:
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
        NOREPLICAS: that tenure ends now (``owned()`` drops it, and the run,
        poked, reports it ``"lost"``), not at its renewal deadline, as an elector's
        term does."""
        with self.mutex:
            tenure = self.held.get(partition)
            loop = self._loop
        if tenure is not None and token and tenure.token == token:
            tenure.keeper.lose(exc)
            if loop is not None:
                loop.poke()  # its next step sees the lease no longer proven

    def view(
        self, leases: Sequence[str], timeout: float
    ) -> tuple[list[bytes], list[bytes], list[int]]:
        """The group as Redis says: ``(members, holders, pttls)`` (an error raised as it is)."""
        request = (_VIEW, (self.members_key, *leases), ())
        reply, _ = execute_one(self.engine, request, timeout=timeout)
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
        """Join the group and start the run; ConfigError for a different partition set.

        Redis trouble on the way in is not raised: the run keeps trying,
        and its ``on_error`` hears of it (from the callback thread); but what
        retrying cannot mend at the client's first contact is, before
        anything starts (``Election.contact``).
        """
        self.parts[self.names[0]].election.contact()
        cfg = self.config
        with self.lifecycle:
            with self.mutex:
                if self.loop is not None:
                    raise RuntimeError(
                        f"{self.shell} {cfg.name!r} member {self.member_id!r} is already "
                        "running; one run at a time (stop() it first)"
                    )
                loop = MemberLoop(self, cfg.name, self.callbacks)
                self._loop = loop  # claimed: a second start() raises from here on
            self.begin(loop)

    def begin(self, loop: MemberLoop) -> None:
        """Start's body, ``lifecycle`` held: the first join, then the run on the driver."""
        cfg = self.config
        self.share.started()
        self.stopping = False
        self.noticed = False
        self.errors_in_row = 0
        self.hurry = 0
        self.pending = []
        self.handing = set()
        try:
            self.heartbeat = self.engine.keeper(
                (_HEARTBEAT, (self.members_key, self.set_key), (self.member_id, cfg.ttl_ms)),
                interval=cfg.renew_interval,
                ttl=cfg.ttl,
            )
            # Listening before the join: a hand-over right after it still wakes us.
            self.notices = self.engine.notices(self.client).listen(
                self.members_key, self.notice, driven=True
            )
            try:
                self.join()
            except ConfigError:
                raise
            except Exception as exc:  # told by the run's first step; the run joins again
                self.pending.append(exc)
            loop.start(self.heartbeat)
        except BaseException:
            loop.abandon()
            self.notices.cancel()
            self.notices = NO_NOTICES
            if self.heartbeat is not None:
                self.heartbeat.close()
                self.heartbeat = None
            with self.mutex:
                if self._loop is loop:
                    self._loop = None
            self.share.stopped()
            raise

    def request_stop(self) -> None:
        """Ask the run to end (it revokes, releases and leaves); returns at once."""
        self.stopping = True
        self.share.stopped()
        loop = self._loop
        if loop is not None:
            loop.poke()

    def stop(self, timeout: float | None) -> None:
        """End the run: ``on_revoked(p, "stopped")`` for each, leases released, group left."""
        with self.lifecycle:  # not halfway through a start()
            loop = self.loop
            if loop is None:
                return
            self.request_stop()
        loop.stop(timeout)  # from a callback: returns at once, the run ends after it

    # -- the run (stepped by the driver: ``MemberLoop``) ---------------------------------------

    def notice(self, released_by: bytes | None) -> None:
        """A member joined, left or handed partitions over (a notice arrived): look again."""
        if released_by == self.member_bytes:
            return  # our own: nothing new
        self.noticed = True
        loop = self._loop
        if loop is not None:
            loop.poke()

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
        with self.mutex:
            handing = bool(self.handing)
        if handing:
            # A hand-over waits for its on_revoked (on the callback thread): it
            # pokes the run when it is done, and the look at the group comes then.
            return time.monotonic() + self.poll
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
        reply, _ = execute_one(
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
                f"{stored_set(detail)}, but member {self.member_id!r} was given "
                f"{describe_set(self.names)}; every member of a group must pass the same set "
                "(order aside)"
            )
        if detail == 2:
            self.refusals.publish_refused(self.members_key)
        heartbeat.begin(1, sent)
        self.events.debug(f"member {self.member_id} joined")

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
        quota = balance.quota(len(self.names), live, holders, me)
        with self.mutex:
            mine = list(self.held)
        if len(mine) > quota:
            self.stats.looked(False, now)
            self.hand_over(balance.to_hand_over(mine, quota, self.preference), "rebalanced")
            self.hurry = 0
            self.share.looked(quota)
            return next_poll
        wanted = balance.to_take(self.names, holders, mine, me, quota, self.preference)
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
            delay = balance.soon(self.poll, self.hurry, random.random())
            self.hurry += 1
            if short:
                # Partitions of members that are gone run out at their leases' end.
                ending = balance.lease_end(holders, pttls, live)
                if ending is not None:
                    delay = min(delay, ending)
            return now + delay
        self.hurry = 0
        return next_poll

    def preference(self, partition: str) -> int:
        """How much this member prefers ``partition`` (``balance.preference``, computed once)."""
        return self.parts[partition].preference

    def leave(self) -> None:
        """The run's end: ``on_revoked(p, "stopped")`` for each, then release all and leave."""
        heartbeat = self.heartbeat
        tenures: list[Tenure] = []
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
            self.release([t.partition for t in tenures], leaving=True)
            if tenures:
                logger.info(
                    "partitions %r member %s stopped: released %s",
                    self.config.name,
                    self.member_id,
                    listed(t.partition for t in tenures),
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
