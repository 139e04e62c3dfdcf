"""Fenced writes: the token check and the write in one atomic script.

``Fence`` is the fenced-write machinery of one elector name, shared by the
threaded and the asyncio front ends: it validates a write into a request
(script, keys, args) before anything is sent, caches ``fence_eval`` bodies,
and sends every request through the engine's one write path, so the two
front ends differ only in how they wait for the reply.

A fenced write is sent at most once. When its outcome is unknown (the
connection broke or the deadline passed after the script may have reached
the server) it raises redis-py's ``ConnectionError`` / ``TimeoutError``: the
write may or may not have landed, and it is never sent again behind the
caller's back — a resent script could apply twice, or be "rejected" by the
mark its own first copy raised.

``Fencer`` is the public handle of a term's token.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

from . import _scripts
from ._config import ReplicationGuard
from ._engine import EncodableT, Engine, is_failover_reply
from ._errors import NotReplicated, TooManyEvalBodies
from ._log import Events

if TYPE_CHECKING:
    from ._elector import Elector
    from ._scripts import Script

MAX_EVAL_BODIES = 256
"""Distinct ``fence_eval`` bodies one Elector caches before TooManyEvalBodies."""

MAX_TOKEN = 2**53
"""Tokens at or above this cannot be compared exactly by Redis' Lua (doubles)."""

_FENCE_SET = _scripts.fenced_file("fence_set")
_FENCE_HSET = _scripts.fenced_file("fence_hset")

FenceRequest = tuple["Script", tuple["str | bytes", ...], tuple[EncodableT, ...]]
"""What one fenced write sends: the script, its keys and its args."""


def check_token(token: object) -> int:
    """A fencing token as an int: TypeError for non-ints (bools included),
    ValueError at or above 2**53, where Redis' comparison stops being exact."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, got {type(token).__name__} {token!r}")
    if token >= MAX_TOKEN:
        raise ValueError(
            f"fencing token must be below 2**53 (Redis compares tokens as doubles), got {token}"
        )
    return token


def _check_key(key: object, what: str = "key") -> str | bytes:
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"{what} must be str or bytes, got {type(key).__name__} {key!r}")
    return key


def _check_value(value: object, what: str = "value") -> EncodableT:
    if isinstance(value, bool) or not isinstance(value, (str, bytes, int, float)):
        raise TypeError(
            f"{what} must be str, bytes, int or float, got {type(value).__name__} {value!r}"
        )
    return value


def _check_sequence(value: object, what: str, of: str) -> Sequence[object]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be a sequence of {of}, got {type(value).__name__}")
    return value


class Fence:
    """The fenced writes of one elector name, on one engine. Thread-safe.

    Each ``*_request`` validates its arguments and returns the request, or
    None when the token can never write (0 and negative tokens: the inert
    Fencer). ``write``/``write_async`` send a request and return ``applied``.
    """

    def __init__(
        self,
        engine: Engine,
        applied_key: str,
        name: str,
        events: Events,
        *,
        cluster: bool = False,
        guard: ReplicationGuard | None = None,
        on_failover: Callable[[int, Exception], object] | None = None,
    ) -> None:
        self._engine = engine
        self._guard = guard or ReplicationGuard()
        # Told when a write with a token is answered READONLY / MASTERDOWN /
        # NOREPLICAS, so the term holding that token can end at once.
        self._on_failover = on_failover
        self._applied_key = applied_key
        self._name = name
        # On a cluster every key of a write must live in the name's slot.
        self._slot = _slot(applied_key) if cluster else None
        self._mutex = threading.Lock()
        self._eval_scripts: dict[str, Script] = {}
        self._events = events  # its Election's: fenced-write results are reported there

    def set_request(self, token: object, key: object, value: object) -> FenceRequest | None:
        return self._request(_FENCE_SET, token, (_check_key(key),), (_check_value(value),))

    def hset_request(
        self, token: object, key: object, field: object, value: object
    ) -> FenceRequest | None:
        return self._request(
            _FENCE_HSET,
            token,
            (_check_key(key),),
            (_check_value(field, "field"), _check_value(value)),
        )

    def eval_request(
        self, token: object, body: object, keys: object, args: object
    ) -> FenceRequest | None:
        check_token(token)
        if not isinstance(body, str):
            raise TypeError(f"body must be a str of Lua, got {type(body).__name__}")
        checked_keys = tuple(
            _check_key(k, "each key") for k in _check_sequence(keys, "keys", "str/bytes")
        )
        checked_args = tuple(
            _check_value(a, "each arg") for a in _check_sequence(args, "args", "values")
        )
        return self._request(self._eval_script(body), token, checked_keys, checked_args)

    def write(self, request: FenceRequest | None) -> bool:
        """Send ``request`` once and return whether it was applied.

        With the replication guard on, the write is followed by ``WAIT`` on
        its connection, and an applied write that fewer than
        ``min_replicas`` replicas confirmed raises ``NotReplicated``.
        """
        if request is None:
            return False
        guard = self._guard
        try:
            if guard.enabled:
                reply, acked = self._engine.write_replicated(
                    *request, guard.min_replicas, guard.timeout_ms
                )
            else:
                reply, acked = self._engine.write(*request), 0
        except RedisError as exc:
            self._failover_seen(request, exc)
            raise
        return self._outcome(reply, acked)

    async def write_async(self, request: FenceRequest | None) -> bool:
        """``write`` for a coroutine: the round trip runs off the event loop."""
        if request is None:
            return False
        return await asyncio.get_running_loop().run_in_executor(None, self.write, request)

    def _outcome(self, reply: object, acked: int) -> bool:
        applied = reply == 1
        self._events.fenced(applied)
        guard = self._guard
        if applied and guard.enabled and acked < guard.min_replicas:
            raise NotReplicated(
                f"fenced write on {self._name!r} was applied on the master but confirmed by "
                f"{acked} of the {guard.min_replicas} replicas required within "
                f"{guard.timeout_ms} ms; a failover now could lose it",
                applied=True,
                replicas=acked,
            )
        return applied

    def _failover_seen(self, request: FenceRequest, exc: RedisError) -> None:
        if self._on_failover is not None and is_failover_reply(exc):
            self._on_failover(int(request[2][0]), exc)

    def _eval_script(self, body: str) -> Script:
        with self._mutex:
            script = self._eval_scripts.get(body)
            if script is None:
                if len(self._eval_scripts) >= MAX_EVAL_BODIES:
                    raise TooManyEvalBodies(
                        f"more than {MAX_EVAL_BODIES} distinct fence_eval bodies on Elector "
                        f"{self._name!r}; keep bodies constant and pass variable data "
                        "through keys and args"
                    )
                script = _scripts.fenced("fence_eval", body)
                self._eval_scripts[body] = script
        return script

    def _request(
        self,
        script: Script,
        token: object,
        keys: tuple[str | bytes, ...],
        args: tuple[EncodableT, ...],
    ) -> FenceRequest | None:
        checked = check_token(token)
        if checked < 1:
            return None  # the inert and non-positive tokens never write
        if self._slot is not None:
            self._check_slots(keys)
        return script, (self._applied_key, *keys), (str(checked), *args)

    def _check_slots(self, keys: tuple[str | bytes, ...]) -> None:
        """Refuse, before anything is sent, a cluster write with a key outside the name's slot.

        The fence mark lives in the name's slot and the script reads it and
        writes the keys atomically, which one node can only do for keys of
        its own slot. The error is the one the server would give, with the
        keys named.
        """
        foreign = [k for k in keys if _slot(k) != self._slot]
        if foreign:
            raise ResponseError(
                f"CROSSSLOT Keys in request don't hash to the same slot: fenced write keys "
                f"{foreign!r} are not in slot {self._slot} of {self._name!r}; on a cluster "
                f"give every key the name's hash tag"
            )


class Fencer:
    """A term's fencing token bound to the Elector that minted it.

    Every write applies only when the token is at least the fence high-water
    mark, checked and written in one atomic script, and returns ``applied``:
    False means the token is stale (a newer term was elected or has written)
    and the caller should stop. All writes share one mark. A Fencer with token
    0 is inert: falsy, and every write is rejected.
    """

    __slots__ = ("_elector", "token")

    def __init__(self, elector: Elector, token: int) -> None:
        from ._elector import Elector

        if not isinstance(elector, Elector):
            raise TypeError(f"elector must be a redlease.Elector, got {type(elector).__name__}")
        self._elector = elector
        self.token = check_token(token)

    def set(self, key: str | bytes, value: EncodableT) -> bool:
        """Fenced ``SET key value``; see ``Elector.fence_set``."""
        return self._elector.fence_set(self.token, key, value)

    def hset(self, key: str | bytes, field: str | bytes, value: EncodableT) -> bool:
        """Fenced ``HSET key field value``; see ``Elector.fence_hset``."""
        return self._elector.fence_hset(self.token, key, field, value)

    def eval(
        self,
        body: str,
        keys: Sequence[str | bytes] = (),
        args: Sequence[EncodableT] = (),
    ) -> bool:
        """Fenced Lua write; see ``Elector.fence_eval``."""
        return self._elector.fence_eval(self.token, body, keys, args)

    def __bool__(self) -> bool:
        return self.token > 0

    def __repr__(self) -> str:
        return f"<redlease.Fencer {self._elector.config.name!r} token={self.token}>"


def _slot(key: str | bytes) -> int:
    return int(key_slot(key.encode() if isinstance(key, str) else key))
