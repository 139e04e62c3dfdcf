"""A cluster as one node sees it: ``CLUSTER NODES`` parsed, and the slot of a key."""

from __future__ import annotations

from dataclasses import dataclass

from redis.crc import key_slot as _crc_key_slot

__all__ = ["SLOTS", "NodeInfo", "key_slot", "parse_nodes"]

SLOTS = 16384


def key_slot(key: str | bytes) -> int:
    """The cluster slot of ``key`` (hash tags honoured)."""
    return int(_crc_key_slot(key.encode() if isinstance(key, str) else key))


@dataclass(frozen=True)
class NodeInfo:
    """One line of ``CLUSTER NODES``, as one node sees the cluster."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: frozenset[int]

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "pfail", "handshake", "noaddr"})


def parse_nodes(text: str) -> list[NodeInfo]:
    infos = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        slots: set[int] = set()
        for item in parts[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: a migration marker
                continue
            lo, _, hi = item.partition("-")
            slots.update(range(int(lo), int(hi or lo) + 1))
        address = parts[1].split("@")[0]
        infos.append(
            NodeInfo(
                id=parts[0],
                port=int(address.rsplit(":", 1)[1] or 0),
                flags=frozenset(parts[2].split(",")),
                master_id=None if parts[3] == "-" else parts[3],
                slots=frozenset(slots),
            )
        )
    return infos
