"""What sentinels say: their key/value replies, and ``+switch-master`` announcements."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from ._common import TopologyError

__all__ = ["Address", "SwitchWatcher", "pairs"]

Address = tuple[str, int]


def pairs(reply: Any) -> dict[str, str]:
    """A ``SENTINEL MASTER``-style reply (flat list or RESP3 map) as a dict of strings."""
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    items = list(reply)
    return {str(items[i]): str(items[i + 1]) for i in range(0, len(items) - 1, 2)}


class SwitchWatcher:
    """A subscription to a sentinel's ``+switch-master`` channel; ``close()`` ends it.

    ``events`` holds ``(service, old_address, new_address)`` in arrival order.
    """

    def __init__(self, client: Any) -> None:
        """``client``: a ``redis.Redis`` for one sentinel; closed by ``close()``."""
        self.events: list[tuple[str, Address, Address]] = []
        self._cond = threading.Condition()
        self._client = client
        self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        self._pubsub.subscribe(**{"+switch-master": self._on_message})
        self._thread = self._pubsub.run_in_thread(sleep_time=0.05, daemon=True)

    def _on_message(self, message: dict[str, Any]) -> None:
        data = message["data"]
        parts = (data.decode() if isinstance(data, bytes) else str(data)).split()
        event = (parts[0], (parts[1], int(parts[2])), (parts[3], int(parts[4])))
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def wait(self, count: int = 1, timeout: float = 30.0) -> tuple[str, Address, Address]:
        """The ``count``-th switch (1-based), once announced; ``TopologyError`` at the deadline."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self.events) >= count, timeout):
                raise TopologyError(f"no +switch-master #{count} within {timeout} s")
            return self.events[count - 1]

    def close(self) -> None:
        self._thread.stop()
        with contextlib.suppress(Exception):
            self._thread.join(2)
        self._pubsub.close()
        self._client.close()

    def __enter__(self) -> SwitchWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
