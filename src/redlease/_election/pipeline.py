"""Fenced pipelines: many fenced writes with one token, sent in one round trip.

``FencedPipeline`` (threaded) and ``AsyncFencedPipeline`` (asyncio, as
``redlease.aio.FencedPipeline``) share the chainable writes, which validate
their arguments as they are queued; both hand the batch to their
``FencedWrites``, which owns sending it and saying what each reply means.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .._engine import EncodableT, ScriptSeries
from .fence import (
    FENCE_HSET,
    FENCE_SET,
    KEY_TYPES,
    VALUE_TYPES,
    FencedWrites,
    FenceRequest,
    check_key,
    check_pairs,
    check_token,
)

if TYPE_CHECKING:
    from .._scripts import Script


_P = TypeVar("_P", bound="_PipelineWrites")

Pairs = Mapping[str | bytes, EncodableT] | Iterable[tuple[str | bytes, EncodableT]]
"""What ``set_many`` takes: a mapping of keys to values, or an iterable of 2-item pairs."""

FieldPairs = Mapping[EncodableT, EncodableT] | Iterable[tuple[EncodableT, EncodableT]]
"""What ``hset_many`` takes: a mapping of fields to values, or an iterable of pairs."""


class _PipelineWrites:
    """The chainable writes of a fenced pipeline, validated as they are added.

    The token is checked once, when the pipeline is made; each write then
    costs only its own arguments' checks (a pipeline is for many writes).
    """

    __slots__ = ("_fence", "_requests", "token")

    def __init__(self, fence: FencedWrites, token: object) -> None:
        self._fence = fence
        self.token = check_token(token)
        # A request per write (None for each of the inert and non-positive
        # tokens, which never write, nor send), or a ScriptSeries for many.
        self._requests: list[FenceRequest | ScriptSeries | None] = []

    # Each write's request is the fence's, as a single write of any face builds it.

    def set(self: _P, key: str | bytes, value: EncodableT) -> _P:
        """Queue a fenced ``SET key value``; bad arguments raise here, before anything is sent."""
        self._requests.append(self._fence.set_request(self.token, key, value))
        return self

    def hset(self: _P, key: str | bytes, field: str | bytes, value: EncodableT) -> _P:
        """Queue a fenced ``HSET key field value``."""
        self._requests.append(self._fence.hset_request(self.token, key, field, value))
        return self

    def set_many(self: _P, items: Pairs) -> _P:
        """Queue a fenced ``SET key value`` for each ``(key, value)`` of ``items``, in order.

        ``items`` is a mapping (``{key: value}``, as redis-py's ``mset``
        takes) or an iterable of ``(key, value)`` pairs (a key may repeat;
        the last write wins, as it would on the server). The same as calling
        ``set(key, value)`` for each, in one call: every write is fenced on
        its own, in order, a write after a rejected one is rejected too, and
        ``execute()`` returns one ``applied`` per write, in its place among
        the pipeline's other writes. Every item is checked first: a bad one
        raises ``TypeError`` naming the rule, its place and its value, and
        then nothing of ``items`` is queued. The items are read once, now;
        changing ``items`` afterwards changes nothing. On the native engine
        the writes are encoded straight from the two lists this makes, with
        no per-write request, which is what makes it cheaper than a loop of
        ``set``. Empty ``items`` queue nothing.
        """
        keys, values = check_pairs(items, "set_many", "key", KEY_TYPES)
        self._add_series(FENCE_SET, (), keys, values, True)
        return self

    def hset_many(self: _P, key: str | bytes, mapping: FieldPairs) -> _P:
        """Queue a fenced ``HSET key field value`` for each ``(field, value)`` of ``mapping``.

        ``mapping`` is a mapping (``{field: value}``) or an iterable of
        ``(field, value)`` pairs. Each field is a write of its own, as if
        ``hset(key, field, value)`` were called for each in order (not one
        HSET of every field): each is fenced on its own and has its own
        ``applied`` in ``execute()``'s result. Arguments are checked first,
        as ``set_many``'s are: a bad key, field or value raises ``TypeError``
        and nothing is queued. Empty ``mapping`` queues nothing.
        """
        checked_key = check_key(key)
        fields, values = check_pairs(mapping, "hset_many", "field", VALUE_TYPES)
        self._add_series(FENCE_HSET, (checked_key,), fields, values, False)
        return self

    def eval(
        self: _P,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> _P:
        """Queue a fenced Lua write (body rules as ``Elector.fence_eval``)."""
        self._requests.append(self._fence.eval_request(self.token, body, keys, args))
        return self

    def _add_series(
        self,
        script: Script,
        keys: tuple[str | bytes, ...],
        firsts: list[Any],
        seconds: list[EncodableT],
        first_is_key: bool,
    ) -> None:
        if not firsts:
            return
        token = self.token
        if token < 1:
            self._requests.extend([None] * len(firsts))  # one rejected write each
            return
        self._requests.append(
            self._fence.bind_series(token, script, keys, firsts, seconds, first_is_key)
        )

    def __len__(self) -> int:
        """How many writes are queued (each of a ``set_many`` counts)."""
        return sum(len(r) if type(r) is ScriptSeries else 1 for r in self._requests)

    def _take(self) -> list[FenceRequest | ScriptSeries | None]:
        requests, self._requests = self._requests, []
        return requests


class FencedPipeline(_PipelineWrites):
    """Fenced writes queued with one token and sent together by ``execute()``.

    Made by ``Fencer.pipeline()`` or ``Elector.fence_pipeline(token)``.
    ``set``, ``hset`` and ``eval`` validate their arguments at once (raising
    before anything is sent) and return the pipeline, so calls chain;
    ``set_many(items)`` and ``hset_many(key, mapping)`` queue many SETs (or
    HSETs of one hash) in one call, each a fenced write of its own, and are
    the cheap way to queue many writes.
    ``execute()`` sends every queued write in one round trip and returns one
    ``applied`` per write, in order. Each write is fenced on its own (token
    check, write, mark advanced), in order: once one is rejected every later
    one is rejected too, because the mark only rises. An error reply raises
    its ``ResponseError`` after every reply was read (the other writes are
    as Redis did them). A write whose script the server had lost (NOSCRIPT)
    did not run, and only it is sent again, as EVAL, after the rest. The
    pipeline is empty again after ``execute()``, whatever it raised. Like
    redis-py's pipelines, one pipeline belongs to one thread at a time;
    any number of pipelines may execute at once.
    """

    __slots__ = ()

    def execute(self) -> list[bool]:
        """Send the queued writes in one round trip; ``[]`` without one when none are queued."""
        return self._fence.write_many(self._take())

    def __repr__(self) -> str:
        return f"<redlease.FencedPipeline token={self.token} writes={len(self)}>"


class AsyncFencedPipeline(_PipelineWrites):
    """``FencedPipeline`` for asyncio, as ``redlease.aio.FencedPipeline``.

    ``await pipe.execute()`` sends the batch, pipelined on the engine's
    connection for the running loop (no thread hop) where it has one.
    """

    __slots__ = ()

    async def execute(self) -> list[bool]:
        """Send the queued writes in one round trip; ``[]`` without one when none are queued."""
        return await self._fence.write_many_async(self._take())

    def __repr__(self) -> str:
        return f"<redlease.aio.FencedPipeline token={self.token} writes={len(self)}>"
