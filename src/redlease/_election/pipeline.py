"""Fenced pipelines: many fenced writes with one token, sent in one round trip.

``FencedPipeline`` (threaded) and ``AsyncFencedPipeline`` (asyncio, as
``redlease.aio.FencedPipeline``) share the chainable writes, which validate
their arguments as they are queued; both hand the batch to their
``Fence``, which owns sending it and saying what each reply means.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from .._engine import EncodableT
from .fence import (
    FENCE_HSET,
    FENCE_SET,
    KEY_TYPES,
    VALUE_TYPES,
    Fence,
    FenceRequest,
    check_key,
    check_token,
    check_value,
)

if TYPE_CHECKING:
    from .._scripts import Script


_P = TypeVar("_P", bound="_PipelineWrites")


class _PipelineWrites:
    """The chainable writes of a fenced pipeline, validated as they are added.

    The token is checked once, when the pipeline is made; each write then
    costs only its own arguments' checks (a pipeline is for many writes).
    """

    __slots__ = ("_direct", "_fence", "_requests", "_token_arg", "token")

    def __init__(self, fence: Fence, token: object) -> None:
        self._fence = fence
        self.token = check_token(token)
        # None: the inert and non-positive tokens never write, nor send.
        self._token_arg = self.token if self.token >= 1 else None
        # (mark key, token): what every request of a live token begins its keys
        # and args with, where no key needs a slot check; else None.
        self._direct = fence.direct(self._token_arg)
        self._requests: list[FenceRequest | None] = []

    def set(self: _P, key: str | bytes, value: EncodableT) -> _P:
        """Queue a fenced ``SET key value``; bad arguments raise here, before anything is sent."""
        direct = self._direct
        if direct is not None and type(key) in KEY_TYPES and type(value) in VALUE_TYPES:
            # Exact types, a live token, no slot to check: the request as bind() makes it,
            # built here (a pipeline of many writes pays no call per write for it).
            self._requests.append((FENCE_SET, (direct[0], key), (direct[1], value)))
            return self
        self._add(FENCE_SET, (check_key(key),), (check_value(value),))
        return self

    def hset(self: _P, key: str | bytes, field: str | bytes, value: EncodableT) -> _P:
        """Queue a fenced ``HSET key field value``."""
        self._add(FENCE_HSET, (check_key(key),), (check_value(field, "field"), check_value(value)))
        return self

    def eval(
        self: _P,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> _P:
        """Queue a fenced Lua write (body rules as ``Elector.fence_eval``)."""
        self._add(*self._fence.eval_parts(body, keys, args))
        return self

    def _add(
        self, script: Script, keys: tuple[str | bytes, ...], args: tuple[EncodableT, ...]
    ) -> None:
        token_arg = self._token_arg
        self._requests.append(
            None if token_arg is None else self._fence.bind(token_arg, script, keys, args)
        )

    def __len__(self) -> int:
        return len(self._requests)

    def _take(self) -> list[FenceRequest | None]:
        requests, self._requests = self._requests, []
        return requests


class FencedPipeline(_PipelineWrites):
    """Fenced writes queued with one token and sent together by ``execute()``.

    Made by ``Fencer.pipeline()`` or ``Elector.fence_pipeline(token)``.
    ``set``, ``hset`` and ``eval`` validate their arguments at once (raising
    before anything is sent) and return the pipeline, so calls chain.
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
