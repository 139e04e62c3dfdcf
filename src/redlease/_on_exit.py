"""``with`` blocks that end what they opened: one ``__exit__`` for every stoppable object.

``StopsOnExit`` calls ``stop()`` on the way out of a ``with`` block,
``ClosesOnExit`` calls ``close()``, ``AwaitsStopOnExit`` awaits ``stop()`` on the
way out of an ``async with`` block; the class keeps its own ``__enter__`` (an
elector starts there, a locker only returns itself). Electors, partition
members, lockers, the health server and the test servers share them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import Protocol


class _Stoppable(Protocol):
    def stop(self) -> object: ...


class _Closable(Protocol):
    def close(self) -> object: ...


class _AsyncStoppable(Protocol):
    def stop(self) -> Awaitable[object]: ...


class StopsOnExit:
    """``__exit__`` is ``stop()``: whatever the block raised, the object is stopped."""

    __slots__ = ()

    def __exit__(
        self: _Stoppable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ClosesOnExit:
    """``__exit__`` is ``close()``: whatever the block raised, the object is closed."""

    __slots__ = ()

    def __exit__(
        self: _Closable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AwaitsStopOnExit:
    """``__aexit__`` awaits ``stop()``: whatever the block raised, the object is stopped."""

    __slots__ = ()

    async def __aexit__(
        self: _AsyncStoppable,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
