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
and lock of the process: no thread per partition. The member's run is
stepped by the process's driver, as an election's (``memberloop``): no
thread of its own, but one for its callbacks when it has any. Each look
reads the group from Redis (``partition_view.lua``), computes this member's
share and acts on it:

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

``Member`` (``member``) is the core both shells drive: ``Partitions`` here
and ``aiopartitions.Partitions`` for asyncio; ``PartitionsShell`` holds
their one signature. The rules of the share are ``balance``'s, what a member
holds ``tenures``', the names and the set ``partnames``', and what its looks
tell ``wait_owned`` and the metrics ``sharewatch``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from .._config import Duration, named_for
from .._on_exit import StopsOnExit
from .elector import Elector, Fencer
from .member import Member
from .partnames import Callback
from .shell import ElectorShell
from .term import Observer

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
        """How the callback thread calls a callback: as it is (the asyncio face: on its loop)."""
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

    Callbacks run on the member's callback thread (never the caller's), one at a
    time, in order per partition:
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
        """Join the group and start the member's run (on the process's driver); returns this
        member.

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
        if not self._core.running:
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
