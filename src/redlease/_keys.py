"""The key schema, in one place (wire-compatible with the Go library).

An elector named ``N`` uses ``N:leader`` (the lease: instance id, PX = TTL),
``N:fence`` (the token counter) and ``N:fence:applied`` (the fence's
high-water mark). A ``RedisLocker`` with prefix ``P`` keeps each lock in
``P key:<name>``, one fencing counter in ``P fencing`` and short-lived release
acknowledgements in ``P ack:<owner>``. A partition group ``G`` keeps its
members and partition set in ``G:members`` and ``G:partitions``, and each
partition's lease as an elector named ``G:p:<partition>``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ElectionKeys:
    """The three keys of an elector named ``name``."""

    name: str

    @property
    def leader(self) -> str:
        """The lease: the leader's instance id, expiring after the TTL."""
        return f"{self.name}:leader"

    @property
    def fence(self) -> str:
        """The fencing-token counter (no TTL)."""
        return f"{self.name}:fence"

    @property
    def applied(self) -> str:
        """The fence's high-water mark: the greatest token elected or written (no TTL)."""
        return f"{self.name}:fence:applied"

    def all(self) -> tuple[str, str, str]:
        """``(leader, fence, applied)``: the order the acquire script takes them in."""
        return self.leader, self.fence, self.applied


@dataclass(frozen=True)
class LockKeys:
    """The keys of a ``RedisLocker`` with key prefix ``prefix``."""

    prefix: str

    def lock(self, name: str) -> str:
        """The expiring hash of the lock ``name``."""
        return f"{self.prefix}key:{name}"

    @property
    def fencing(self) -> str:
        """The fencing counter shared by every lock of the prefix."""
        return f"{self.prefix}fencing"

    def ack(self, owner: str) -> str:
        """The short-lived acknowledgement of ``owner``'s release."""
        return f"{self.prefix}ack:{owner}"

    def permits(self, name: str) -> str:
        """The expiring sorted set of the semaphore ``name``'s live permits (owner -> expiry)."""
        return f"{self.prefix}sem:{name}"

    def queue(self, kind: str, name: str) -> tuple[str, str]:
        """Fair waiting's queue of a lock (``kind`` "key") or semaphore ("sem"), and its leases."""
        return f"{self.prefix}queue:{kind}:{name}", f"{self.prefix}queue-alive:{kind}:{name}"

    def permit_info(self, name: str) -> str:
        """The expiring hash of those permits' fencing tokens and holders."""
        return f"{self.prefix}sem-info:{name}"


@dataclass(frozen=True, slots=True)
class PartitionKeys:
    """The keys of a partition group named ``name`` (``redlease.Partitions``).

    Each partition ``p`` is an elector-style lease named ``<name>:p:<p>``
    (its three ``ElectionKeys``); the group adds ``<name>:members`` (the live
    members, a sorted set member -> expiry) and ``<name>:partitions`` (its
    partition set).
    """

    name: str

    @property
    def members(self) -> str:
        return f"{self.name}:members"

    @property
    def partitions(self) -> str:
        return f"{self.name}:partitions"

    def lease(self, partition: str) -> str:
        """The elector name of ``partition``'s lease."""
        return f"{self.name}:p:{partition}"


def has_hash_tag(text: str) -> bool:
    """Whether ``text`` carries a Redis Cluster hash tag: a non-empty ``{...}``.

    Cluster hashes only the part between the first ``{`` and the next ``}``
    when that part is not empty, so keys that share it share a slot.
    """
    start = text.find("{")
    if start < 0:
        return False
    end = text.find("}", start + 1)
    return end > start + 1
