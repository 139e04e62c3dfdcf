"""What a partitioned group's member holds: its tenures, their proof, and the round trips
that take, hand over and release them.

A tenure is one partition held without interruption, with its token and its
keeper on the engine's one renewer. ``owned()`` holds a partition only while
its keeper holds the term and less than a TTL has passed since the send time
of its last good renewal (or its acquire), on the monotonic clock: the member
is self-fenced. ``Tenures`` is the part of ``Member`` that keeps them; what it
reads (settings, engine, keys, callbacks) ``Member.__init__`` sets.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import _scripts
from .._config import Config
from .._engine import ChannelRefusals, Keeper, execute_one, unexpected_reply
from .._log import Events, logger
from .balance import preference
from .partnames import MAX_PARTITIONS, Callback
from .sharewatch import GroupStats
from .term import tell_on_error

_RELEASE = _scripts.load("partition_release")  # the reply shapes are checked here (_check_count)
_LEAVE = _scripts.load("partition_leave")
_RENEW = _scripts.load("renew")


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


@dataclass
class Tenure:
    """One partition held without interruption: its token, its keeper, when it was taken."""

    partition: str
    token: int
    keeper: Keeper
    acquired_at: float


class Part:
    """One partition of the group: its elector (keys, acquire, fence) and its place."""

    __slots__ = ("election", "elector", "index", "lease_key", "name", "preference")

    def __init__(self, name: str, index: int, elector: Any, member_id: str) -> None:
        self.name = name
        self.index = index
        self.elector = elector  # the shell's Elector (threaded or asyncio): its Fencer's owner
        self.election = elector._core
        self.lease_key: str = self.election.keys.leader
        self.preference = preference(member_id, name)  # this member's rank of it (balance)


class Tenures:
    """The tenures of a member and what changes them: the part of ``Member`` that holds.

    Taking (``take``), handing over (``hand_over``), losing (``check_held``)
    and releasing (``release``) each tell the user's callbacks and the
    member's ``GroupStats``; a Redis error is reported (``report``), never
    raised. ``held`` is shared with the callers' threads under ``mutex``, and
    ``handing`` names what a hand-over queued on the callback thread (``later``)
    still holds: nothing else of the member touches those.
    """

    # Set by Member.__init__.
    config: Config
    engine: Any
    member_id: str
    members_key: str
    set_key: str
    sharded: str
    parts: dict[str, Part]
    held: dict[str, Tenure]
    handing: set[str]
    mutex: threading.Lock
    stats: GroupStats
    events: Events
    refusals: ChannelRefusals
    on_assigned: Callback | None
    on_revoked: Callback | None
    on_error: Callback | None

    def later(self, job: Callable[[], object]) -> None: ...

    def handed_over(self) -> None: ...

    def proven(self, tenure: Tenure, now: float) -> bool:
        """Whether ``tenure``'s lease is still ours for sure at ``now`` (monotonic).

        The keeper must hold the term, and less than a TTL may have passed
        since the send time of the last good renewal (or of the acquire): the
        lease cannot have expired at Redis before then, whatever the
        renewer's thread is doing.
        """
        return now < self.proven_until(tenure)

    def proven_until(self, tenure: Tenure) -> float:
        """When ``tenure``'s lease stops being proven (monotonic); 0 once its term ended."""
        keeper = tenure.keeper
        if keeper.token != tenure.token:
            return 0.0
        renewed: float = getattr(keeper, "renewed_at", 0.0)
        return max(tenure.acquired_at, renewed) + self.config.ttl

    def owned(self) -> dict[str, int]:
        with self.mutex:
            tenures = list(self.held.values())
        now = time.monotonic()
        proven = [t for t in tenures if self.proven(t, now)]
        proven.sort(key=lambda t: self.parts[t.partition].index)
        return {t.partition: t.token for t in proven}

    def token_of(self, partition: str) -> int:
        """The token of ``partition`` while this member holds it for sure, else 0."""
        with self.mutex:
            tenure = self.held.get(partition)
        if tenure is None or not self.proven(tenure, time.monotonic()):
            return 0
        return tenure.token

    def check_held(self) -> None:
        """Drop every partition whose lease can no longer be proven: ``on_revoked(p, "lost")``.

        What a hand-over holds is left to it (it reports that ``on_revoked`` once)."""
        with self.mutex:
            tenures = [t for t in self.held.values() if t.partition not in self.handing]
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
            listed(t.partition for t in lost),
        )
        for tenure in lost:
            self.stats.tenure_ended("lost")
            self.emit(self.on_revoked, tenure.partition, "lost")

    def take(self, wanted: list[str]) -> int:
        """Acquire ``wanted`` in one round trip; ``on_assigned`` for each won. How many won."""
        cfg = self.config
        parts = [self.parts[p] for p in wanted]
        sent = time.monotonic()
        try:
            replies, _ = self.engine.execute(
                [part.election.acquire_request() for part in parts], timeout=cfg.renew_interval
            )
        except Exception as exc:  # the outcome is unknown: a lease won meanwhile runs out
            self.report(exc)
            return 0
        won: list[Tenure] = []
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
            won.append(Tenure(part.name, token, keeper, sent))
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
            listed(f"{t.partition} (token {t.token})" for t in won),
            len(self.held),
        )
        for tenure in won:
            self.stats.tenure_began()
            self.emit(self.on_assigned, tenure.partition, tenure.token)
        return len(won)

    def hand_over(self, partitions: list[str], reason: str) -> None:
        """``on_revoked(p, reason)`` for each, then release them all, telling the group.

        On the callback thread, after the callbacks queued before it (here,
        without one); until it is done, ``handing`` names the partitions.
        """
        with self.mutex:
            tenures = [
                self.held[p] for p in partitions if p in self.held and p not in self.handing
            ]
            self.handing.update(t.partition for t in tenures)
        if not tenures:
            return
        tenures.sort(key=lambda t: self.parts[t.partition].index)
        self.later(functools.partial(self.give_back, tenures, reason))

    def give_back(self, tenures: list[Tenure], reason: str) -> None:
        """``hand_over``'s body: each ``on_revoked`` returned before the release is sent."""
        try:
            self.revoke_and_release(tenures, reason)
        finally:
            with self.mutex:
                self.handing.difference_update(t.partition for t in tenures)
            self.handed_over()

    def revoke_and_release(self, tenures: list[Tenure], reason: str) -> None:
        for tenure in tenures:
            self.stats.tenure_ended(reason)
            self.emit(self.on_revoked, tenure.partition, reason)
            # Token cleared before the release: owned() drops it first.
            with self.mutex:
                self.held.pop(tenure.partition, None)
            tenure.keeper.end()
        try:
            self.release([t.partition for t in tenures])
        finally:
            for tenure in tenures:
                tenure.keeper.close()
        logger.info(
            "partitions %r member %s handed over %s (%s)",
            self.config.name,
            self.member_id,
            listed(t.partition for t in tenures),
            reason,
        )

    def release(self, partitions: list[str], leaving: bool = False) -> None:
        """Release ``partitions`` (``leaving``: and leave the group), telling the group; errors
        reported, never raised."""
        script, told = (_LEAVE, (1, 2)) if leaving else (_RELEASE, (0, 1, 2))
        group = (self.members_key, self.set_key) if leaving else (self.members_key,)
        keys = (*group, *(self.parts[p].lease_key for p in partitions))
        try:
            reply, _ = execute_one(
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

    # -- reports -----------------------------------------------------------------------------

    def report(self, exc: Exception) -> None:
        """A Redis error the member handled itself: logged (one WARNING per outage), observed."""
        self.events.error(exc)
        self.observe(exc)

    def observe(self, exc: Exception) -> None:
        if self.on_error is not None:
            self.later(functools.partial(tell_on_error, self.on_error, exc))

    def emit(self, callback: Callback | None, partition: str, detail: object) -> None:
        """A user callback, on the callback thread, in order; what it raises is logged and
        observed."""
        if callback is not None:
            self.later(functools.partial(self.call_back, callback, partition, detail))

    def call_back(self, callback: Callback, partition: str, detail: object) -> None:
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


def listed(partitions: Iterable[str], limit: int = 16) -> str:
    """Partition names for a log line: the first ``limit`` of them, and how many."""
    names = list(partitions)
    shown = ", ".join(names[:limit])
    return f"[{shown}{', ...' if len(names) > limit else ''}] ({len(names)})"
