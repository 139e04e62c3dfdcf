"""A slot halfway through a live migration between two cluster masters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._common import LOOPBACK
from .server import RedisServer

if TYPE_CHECKING:
    from .cluster import ClusterSet

__all__ = ["SlotMigration"]

_MIGRATE_BATCH = 100


class SlotMigration:
    """A slot halfway between two masters; ``move_keys()`` then ``finish()``.

    Between ``begin_migration`` and ``finish``, the source answers ``ASK`` for
    keys already moved and the target serves them only after ``ASKING``.
    """

    def __init__(
        self, cluster: ClusterSet, slot: int, source: RedisServer, target: RedisServer
    ) -> None:
        self.cluster, self.slot, self.source, self.target = cluster, slot, source, target

    def keys(self) -> list[str]:
        """Keys of the slot still on the source (at most 1000)."""
        return list(self.cluster._cmd(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, 1000))

    def move_keys(self, limit: int | None = None) -> int:
        """``MIGRATE`` up to ``limit`` (default: all) of the slot's keys; return how many."""
        moved = 0
        port = self.target.address[1]
        while limit is None or moved < limit:
            batch = min(_MIGRATE_BATCH, limit - moved) if limit is not None else _MIGRATE_BATCH
            keys = self.cluster._cmd(self.source, "CLUSTER", "GETKEYSINSLOT", self.slot, batch)
            if not keys:
                break
            self.cluster._cmd(self.source, "MIGRATE", LOOPBACK, port, "", 0, 5000, "KEYS", *keys)
            moved += len(keys)
        return moved

    def finish(self, *, timeout: float | None = None) -> None:
        """Give the slot to the target on every master (target first, then source, then the rest).

        Returns once every live node sees the target owning it. Keys still on
        the source are moved first.
        """
        self.move_keys()
        target_id = self.cluster.node_id(self.target)
        order = [self.target, self.source]
        order += [m for m in self.cluster.masters() if m not in order and m.running]
        for node in order:
            self.cluster._cmd(node, "CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        self.cluster._wait_owner(self.slot, self.target, timeout)
