"""The balance of a partitioned group: who should hold how many, and which ones.

Pure functions of one look at the group (its live members, each
partition's holder and lease PTTL): no Redis, no clock, no randomness of
their own (a jitter comes in as an argument), so each rule reads, and is
tested, on its own. ``Member.rebalance`` acts on what they decide:

* ``quota``: with ``M`` live members each owns ``N // M``; the ``N % M``
  extra partitions go to the members that hold the most now (ties by id), so
  nobody hands over what it would only have to take back;
* ``preference``: each member ranks the partitions in an order of its own
  (rendezvous hashing), so members taking free partitions at the same moment
  mostly reach for different ones, and a member that comes back reaches for
  those it had;
* ``to_hand_over`` / ``to_take``: sticky, a member keeps what it holds up to
  its quota, hands over the excess it prefers least, and takes only free
  partitions (or its own leftovers), those it prefers most;
* ``soon`` and ``lease_end``: how soon to look again while the group is
  still moving.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence


def preference(member_id: str, partition: str) -> int:
    """How much ``member_id`` prefers ``partition`` (greater first): a stable hash of both."""
    digest = hashlib.blake2b(f"{member_id}\0{partition}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def quota(partitions: int, live: Sequence[bytes], holders: Iterable[bytes], me: bytes) -> int:
    """How many of ``partitions`` the member ``me`` should hold among ``live`` (sorted, with it).

    ``N // M`` each; the ``N % M`` extra ones go to the live members that
    hold the most now, ties broken by id, so a member that already holds
    one more keeps it and nobody takes what another must give up. The
    quotas of the live members add up to ``partitions``.
    """
    base, extra = divmod(partitions, len(live))
    if extra == 0:
        return base
    alive = set(live)
    counts = Counter(h for h in holders if h in alive)
    ranked = sorted(live, key=lambda member: (-counts[member], member))
    return base + (1 if me in ranked[:extra] else 0)


def to_hand_over(mine: Iterable[str], quota: int, prefers: Callable[[str], int]) -> list[str]:
    """What a member holding ``mine`` hands over to come down to ``quota``: the least preferred."""
    held = list(mine)
    return sorted(held, key=prefers)[: max(0, len(held) - quota)]


def to_take(
    names: Sequence[str],
    holders: Sequence[bytes],
    mine: Iterable[str],
    me: bytes,
    quota: int,
    prefers: Callable[[str], int],
) -> list[str]:
    """What a member holding ``mine`` tries to take to reach ``quota``: the free partitions
    (no holder, or ``me``: a lease of ours the member no longer counts), most preferred first.

    ``holders`` are the holders of ``names``, in their order (empty: free).
    """
    held = set(mine)
    if len(held) >= quota:
        return []
    free = [
        p
        for p, holder in zip(names, holders, strict=True)
        if p not in held and (not holder or holder == me)
    ]
    free.sort(key=prefers, reverse=True)
    return free[: quota - len(held)]


def soon(poll: float, hurry: int, jitter: float) -> float:
    """How soon to look again while the group is still moving: 5 ms, doubling with each look
    in a row that finds it so (``hurry``), capped at one ``poll``; ``jitter`` in [0, 1) spreads
    the members' looks."""
    return min(poll, 0.005 * (1 << min(hurry, 10)) * (1 + jitter))


def lease_end(
    holders: Sequence[bytes], pttls: Sequence[int], live: Iterable[bytes]
) -> float | None:
    """Seconds until the first lease held by a member no longer live runs out (and one
    millisecond more), or None when there is none: when its partition is free to take."""
    alive = set(live)
    ending = [
        pttl
        for holder, pttl in zip(holders, pttls, strict=True)
        if holder and holder not in alive and pttl >= 0
    ]
    return min(ending) / 1000 + 0.001 if ending else None
