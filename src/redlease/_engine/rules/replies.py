"""What a reply means: the one place the Python side of both engines decides it.

Two questions, each answered here and nowhere else:

* ``classify(reply)``: the kind of an error reply, by the reply table
  (``replytable``: its codes, its kinds, and ``resent``, whether a call so
  answered is sent again). redis-py maps some codes to classes and strips them from the message,
  others it keeps as text; Redis 6 wraps a command's error inside a script
  ("Error running script ...: -READONLY ..."), Redis 7 passes the code on:
  every form lands in the same kind.
* ``refusal_of(error)``: whether retrying can mend a first contact's
  failure (``replytable.REFUSALS``), and if not, what the user must fix.
* ``check(script, reply)``: whether ``reply`` is one ``script`` can give.
  Every script of ours has a known reply shape (0 or 1; a release's 0, 1
  or 2; a token array; a holder or nil). Anything else — an array where an integer belongs, a bulk
  string, an integer out of range — is not a result but a broken or foreign
  server: it comes back as an ``UnexpectedReply`` (a ``ResponseError``) in
  the reply's place, so the caller raises it instead of reading "rejected",
  "lost" or "not acquired" into it. The engines check every reply they hand
  out (control calls, fenced writes, pipelines, the loop writer, renewals)
  and drop a connection that carried one.

The native core copies the table's codes and kinds into C when it is
imported (``_native/conn/_replies.pxi``), for the replies it reads without the
GIL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    InvalidResponse,
    MasterDownError,
    MovedError,
    NoPermissionError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)

if TYPE_CHECKING:
    from ..._scripts import Script

from .replytable import (
    ASK,
    BATCH_KEY_ELSEWHERE,
    BATCH_KEY_ELSEWHERE_BEFORE_7,
    CODES,
    DONE,
    ERROR,
    FAILOVER,
    MOVED,
    NOPERM,
    NOREPLICAS,
    NOT_RESP,
    RETRY,
    TRYAGAIN,
    WRONGPASS,
    refusal,
    resends,
    wrapped_marker,
)
from .replytable import FAILOVER_REPLIES as FAILOVER_REPLIES
from .replytable import NOSCRIPT as NOSCRIPT

_SENTINEL_DEMOTED = "The previous master is now a slave"
"""What redis-py's Sentinel connections make of a READONLY reply."""


_BY_CLASS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (NoScriptError, NOSCRIPT),
    ((ReadOnlyError, MasterDownError), FAILOVER),
    (MovedError, MOVED),
    (AskError, ASK),
    (TryAgainError, TRYAGAIN),
    ((BusyLoadingError, ClusterDownError), RETRY),
)
"""The kinds redis-py's own exception classes stand for, looked at before any code (redis-py
strips the codes of these). In order: MasterDownError is a ClusterDownError, MovedError an
AskError, BusyLoadingError a ConnectionError."""


def kind_and_wrapped(reply: object) -> tuple[int, bool]:
    """The kind of ``reply`` (``replytable``), and whether its code came in a script error."""
    if not isinstance(reply, Exception):
        return DONE, False
    for classes, kind in _BY_CLASS:
        if isinstance(reply, classes):
            return kind, False
    if isinstance(reply, ResponseError):
        text = str(reply).lstrip()
        for code, kind, wraps in CODES:
            if text.startswith(code):
                return kind, False
            if wraps and wrapped_marker(code) in text:
                return kind, True
        return ERROR, False
    if isinstance(reply, ConnectionError) and str(reply) == _SENTINEL_DEMOTED:
        return FAILOVER, False
    return ERROR, False


def classify(reply: object) -> int:
    """The kind of ``reply`` (see the module doc); ``DONE`` for anything not an error."""
    return kind_and_wrapped(reply)[0]


def resent(reply: object, topology: int) -> bool:
    """Whether a call answered ``reply`` is sent again by an engine on ``topology``.

    The one question both of the Python engine's paths (one script, a
    pipeline) and the asyncio writer ask (``replytable.resends``). Not
    NOSCRIPT: the connection that got it sends the call again as EVAL, once,
    itself; a NOSCRIPT left after that is an answer.
    """
    kind, wrapped = kind_and_wrapped(reply)
    return kind != NOSCRIPT and resends(kind, wrapped, topology)


def rerouted(reply: object, topology: int) -> bool:
    """Whether a call of a batch answered ``reply`` goes again alone, on its single-call path.

    A batch goes to the node of its first call's keys; on a cluster a call
    whose keys that node does not serve is answered MOVED or ASK, did not
    run, and is sent again by itself, to its own node, where the single-call
    path follows the redirection as the table says (``replytable.resends``).
    Anywhere the table does not follow them, MOVED and ASK are answers.
    """
    kind, wrapped = kind_and_wrapped(reply)
    return kind in (MOVED, ASK) and resends(kind, wrapped, topology)


def is_failover_reply(reply: object) -> bool:
    """READONLY, MASTERDOWN or NOREPLICAS: a term answered so ends at once."""
    return classify(reply) in (FAILOVER, NOREPLICAS)


def renewed_elsewhere(reply: object) -> bool:
    """One lease of a node-wide batched renewal whose key the node does not serve
    (``replytable.BATCH_KEY_ELSEWHERE``): not renewed, and renewed again on its own.

    The rule, the native core's too (``node_is_elsewhere``): an error the table
    calls ERROR whose text, after an ``ERR`` code, starts with
    ``BATCH_KEY_ELSEWHERE`` (Redis 7 and later), or that holds
    ``BATCH_KEY_ELSEWHERE_BEFORE_7`` (Redis 6's Lua error).
    """
    if not isinstance(reply, ResponseError) or classify(reply) != ERROR:
        return False
    text = str(reply).removeprefix("ERR ")
    return text.startswith(BATCH_KEY_ELSEWHERE) or BATCH_KEY_ELSEWHERE_BEFORE_7 in text


def server_changed(reply: object) -> bool:
    """This server no longer serves the keys (not the master, loading, cluster down)."""
    return classify(reply) in (FAILOVER, RETRY)


_REFUSED_BY_CLASS: tuple[tuple[type[Exception], str], ...] = (
    (NoPermissionError, NOPERM),
    (AuthenticationError, WRONGPASS),
    (InvalidResponse, NOT_RESP),
)
"""The refusal redis-py's own classes stand for when neither the code nor the text says
more: it strips the codes of these, and raises an ``AuthenticationError`` of its own for
a HELLO the server refused. ``InvalidResponse`` is a protocol error (a peer that does not
speak RESP, an HTTP server say), ``ReplyTooLarge`` included."""


_SERVICE = "Service '"
"""How the native core's Sentinel connect begins the message of a reply it met."""


def refusal_of(error: BaseException) -> str | None:
    """What the user must fix when a first contact failed with ``error``; None when
    retrying may mend it (``replytable.REFUSALS``).

    Both engines raise redis-py's classes: the native core's failures become
    them with the GIL taken (``_native/conn/_pool.pxi``: an error reply through
    redis-py's own parser, a malformed reply as ``InvalidResponse``), so this
    one reading decides for both.
    """
    if not isinstance(error, RedisError):
        return None
    text = str(error)
    # redis-py 5.3+ keeps the code it stripped; the text after it comes next, then the
    # reply the native core names behind Sentinel as "Service 'name': <the reply>".
    service, sep, reply = text.partition("': ")
    said_behind = reply if sep and service.startswith(_SERVICE) else None
    for said in (getattr(error, "status_code", None), text, said_behind):
        if isinstance(said, str) and said:
            fix = refusal(said)
            if fix is not None:
                return fix
    for cls, code in _REFUSED_BY_CLASS:
        if isinstance(error, cls):
            return refusal(code)
    return None


# -- what each script may answer ------------------------------------------------------


class ReplyTooLarge(InvalidResponse):
    """A server sent more than a round trip may read (``MAX_REPLY_BYTES``).

    Never a result: the connection is dropped with the bytes read so far,
    and the outcome of the call is unknown. redis-py's ``InvalidResponse``,
    as a malformed reply is.
    """

    @classmethod
    def past(cls, cap: int, read: int) -> ReplyTooLarge:
        """The error for ``read`` bytes read without a whole reply, past ``cap``."""
        return cls(
            f"the server sent {read:,} bytes, more than the {cap / 1048576:g} MiB a reply "
            "may hold on this connection: a broken or foreign server (the connection is dropped)"
        )

    @classmethod
    def past_limits(
        cls, elements: int, depth: int, max_elements: int, max_depth: int
    ) -> ReplyTooLarge:
        """The error for an array of ``elements`` elements opened at nesting ``depth``."""
        return cls(
            f"the server sent an array of {elements:,} elements at nesting depth {depth}, past "
            f"the limits on one reply ({max_elements:,} elements, {max_depth} levels): "
            "a broken or foreign server (the connection is dropped)"
        )


class UnexpectedReply(ResponseError):
    """A reply the script cannot give: the server is broken, or not a Redis server.

    Never a result: the outcome of the call is unknown, and it is not sent
    again. A ``redis.exceptions.ResponseError``, so callers that handle
    Redis errors handle it.
    """


MAX_TOKEN = 2**53
"""Tokens at or above this cannot be compared exactly by Redis' Lua (doubles)."""


def _is_int(value: object, low: int, high: int) -> bool:
    return type(value) is int and low <= value < high


def _flag(reply: object) -> bool:
    return type(reply) is int and (reply == 0 or reply == 1)


RELEASED_UNANNOUNCED = 2
"""A release script's reply: released, but the server refused a release notice.

An ACL user without the notice channel (``&<prefix>*``): the lease is gone
at Redis all the same, and waiters find out by polling.
"""


def _release(reply: object) -> bool:
    return type(reply) is int and 0 <= reply <= RELEASED_UNANNOUNCED


def released(reply: int) -> tuple[bool, bool]:
    """What a release script's checked reply says: ``(released, notice_refused)``.

    1: released (or an acknowledged replay); 2: released, but the server
    refused a notice (the user may not publish to the channel); 0: not ours
    to release (expired, or another owner's).
    """
    return reply != 0, reply == RELEASED_UNANNOUNCED


Check = Callable[[object], bool]


def _array(*elements: Check) -> Check:
    """An array of exactly ``len(elements)`` elements, each one what its check accepts."""

    def fits(reply: object) -> bool:
        return (
            type(reply) is list
            and len(reply) == len(elements)
            and all(check(value) for check, value in zip(elements, reply, strict=True))
        )

    return fits


def _or_nil(shape: Check) -> Check:
    return lambda reply: reply is None or shape(reply)


def _token(value: object) -> bool:
    return _is_int(value, 0, MAX_TOKEN)


def _integer(value: object) -> bool:
    return type(value) is int


def _bulk(value: object) -> bool:
    return type(value) is bytes


_acquire = _array(_token, _integer, _bulk)  # {token, pttl, holder}
_evict = _array(_token, _bulk)  # {mark, holder or ""}
_lock_acquire = _array(_token, _integer)  # {fencing token, pttl}
_leader = _or_nil(_array(_bulk, _integer))  # nil, or {holder, pttl}
_holder_entry = _array(_bulk, _token, _integer)  # {holder label, fencing token, pttl}
_lock_holder = _or_nil(_holder_entry)
# {fencing token, ttl}, {0, ms until a permit frees} or {-1, the permits the name has}
_sem_acquire = _array(lambda value: _is_int(value, -1, MAX_TOKEN), _integer)


def _sem_holders(reply: object) -> bool:
    # an array of {holder label, fencing token, pttl}
    return type(reply) is list and all(_holder_entry(each) for each in reply)


def _renew_many(reply: object) -> bool:
    # one reply per lease, in order: 0, 1, or that lease's own error reply (its
    # length is checked where the leases are known)
    return type(reply) is list and all(isinstance(each, Exception) or _flag(each) for each in reply)


_SHAPES = {
    "flag": (_flag, "0 or 1"),
    "release": (_release, "0, 1 or 2"),
    "acquire": (_acquire, "an array of a token below 2**53, a PTTL and a holder"),
    "lock_acquire": (_lock_acquire, "an array of a fencing token below 2**53 and a PTTL"),
    "leader": (_leader, "nil or an array of a holder and a PTTL"),
    "lock_holder": (
        _lock_holder,
        "nil or an array of a holder, a fencing token below 2**53 and a PTTL",
    ),
    "sem_acquire": (_sem_acquire, "an array of a fencing token (or 0 or -1) and a number"),
    "sem_holders": (_sem_holders, "an array of [holder, fencing token, PTTL] arrays"),
    "renew_many": (_renew_many, "an array of 0, 1 or an error reply per lease"),
    "evict": (_evict, "an array of a mark below 2**53 and a holder"),
    "any": (lambda _reply: True, "anything"),
}


def fits(shape: str, reply: object) -> bool:
    """Whether ``reply`` is one a script of reply shape ``shape`` can give, or an error reply."""
    return isinstance(reply, Exception) or _SHAPES[shape][0](reply)


def describe(reply: object) -> str:
    """``reply`` in a few words, for an error message (never its whole content)."""
    if reply is None:
        return "nil"
    if type(reply) is int:
        return f"the integer {reply}"
    if isinstance(reply, bytes):
        head = reply[:16]
        more = "..." if len(reply) > 16 else ""
        return f"a bulk string of {len(reply)} bytes ({head!r}{more})"
    if isinstance(reply, list):
        return f"an array of {len(reply)} elements"
    return f"a {type(reply).__name__}"


def check(script: Script, reply: Any) -> Any:
    """``reply`` itself when ``script`` can give it (or it is an error reply), else an
    ``UnexpectedReply`` naming both, in its place."""
    shape = script.reply
    if type(reply) is int and (reply == 0 or reply == 1) and shape == "flag":
        return reply  # the common case, first
    if fits(shape, reply):
        return reply
    return unexpected(script.name, shape, reply)


def unexpected(name: str, shape: str, reply: object) -> UnexpectedReply:
    """The error for a reply script ``name`` (of reply ``shape``) cannot give."""
    return unexpected_reply(name, _SHAPES[shape][1], reply)


def unexpected_reply(name: str, wanted: str, reply: object) -> UnexpectedReply:
    """The one message for a reply script ``name`` cannot give (it returns ``wanted``).

    Worded as the native core words it (``reply_describe``).
    """
    return UnexpectedReply(
        f"{name} answered {describe(reply)} where it returns {wanted}: "
        "the server is broken or not Redis; the outcome is unknown"
    )


def checked(script: Script, reply: Any) -> Any:
    """``check``, raising the error it finds (an error reply or an ``UnexpectedReply``)."""
    reply = check(script, reply)
    if isinstance(reply, Exception):
        raise reply
    return reply
