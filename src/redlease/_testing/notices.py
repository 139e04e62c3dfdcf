"""What the release-notice listeners of this process hold, for tests to look at.

The library never asks: each engine's ``notices(client)`` is its only way
in. A test that checks how waiters share connections (one hub per server,
no Python listener on the native engine, every driven run routed) reads the
listeners' registries here.
"""

from __future__ import annotations

from typing import Any

from .._engine.notices import nativenotices, pynotices

__all__ = ["driver_notices", "native_hubs", "python_hubs"]


def native_hubs(*, sharded: bool | None = None) -> list[Any]:
    """Every native ``NoticeHub`` of this process; ``sharded``: only cluster nodes' (or not)."""
    registry = nativenotices.registry
    with registry.lock:
        return [
            hub
            for (_, on_node), hub in registry.hubs.items()
            if sharded is None or on_node == sharded
        ]


def python_hubs() -> list[Any]:
    """Every Python listener (one connection and thread per server) of this process."""
    return list(pynotices.hubs.values())


def driver_notices() -> nativenotices.DriverNotices | None:
    """The routing of the driver's native notices, once a driven run listened natively."""
    registry = nativenotices.registry
    with registry.lock:
        return registry.driver
