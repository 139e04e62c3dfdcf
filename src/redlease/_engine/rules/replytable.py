"""The reply table: what each error reply means, and what every call site does with it.

Both engines read this table. The Python side uses it directly
(``replies.classify`` and ``replies.resent``); the native core copies its
codes and kinds into C when it is imported (``_native/conn/_replies.pxi``), and
``tests/test_reply_table.py`` checks the copy and drives every code through
both engines. The reply codes are spelled out here and nowhere else in the
sources.

Kinds
-----
``DONE``        not an error: the script's answer (then checked against the
                script's reply shape; a reply it cannot give, a RESP3 null
                where a value was due included, is ``UnexpectedReply``).
``NOSCRIPT``    the server lost its scripts: the call did not run; it is sent
                again as EVAL, once, everywhere.
``MOVED``       a cluster redirection: followed on a cluster client (up to
                ``MAX_REDIRECTS`` per call); anywhere else an error, sent once.
``ASK``         a slot mid-migration: on a cluster client the call goes once
                to the node named (after ASKING); anywhere else an error.
``TRYAGAIN``    the keys are mid-migration: resent once on a cluster client.
``RETRY``       LOADING, CLUSTERDOWN: this server cannot serve the keys now.
``FAILOVER``    READONLY, MASTERDOWN: the server is not (now) the master.
``NOREPLICAS``  the master refuses writes: an answer; a term ends at once.
``ERROR``       any other error reply (BUSY, the script's own error): an
                answer, sent once.

The behaviour rule
------------------
A call is sent again only when its reply proves it did not run, and only
where there is another server to ask: ``resends(kind, wrapped, topology)``.
A client at a fixed address (``PLAIN``) never resends anything but a
NOSCRIPT: the server it would resend to is the one that refused. Through
sentinels (``SENTINEL``) a FAILOVER or RETRY reply makes the engine ask the
sentinels for the master again and resend once; on a cluster (``CLUSTER``)
the same, plus TRYAGAIN, and MOVED / ASK are followed. A FAILOVER code
wrapped in a script error (Redis 6: ``ERR Error running script ...:
-READONLY ...``) is never resent: the script ran, and what it wrote before
the refused command is unknown. Whatever is resent, is resent once: a
second refusal is the answer.

What a call site does with the final reply (``SITES``): a fenced write or
pipeline write raises the error (a pipeline raises the first error after
reading every reply); a FAILOVER or NOREPLICAS reply (wrapped or not) also
ends the term at once. An acquire or release raises the error; a renewal
records it and tries again at its next interval, except FAILOVER and
NOREPLICAS, which end the term at once.
"""

from __future__ import annotations

DONE, NOSCRIPT, MOVED, ASK, TRYAGAIN, RETRY, FAILOVER, NOREPLICAS, ERROR = range(9)

KIND_NAMES = (
    "done", "noscript", "moved", "ask", "tryagain", "retry", "failover", "noreplicas", "error",
)
"""Each kind's name, by its number."""

PLAIN, SENTINEL, CLUSTER = range(3)
"""How the client finds its server: a fixed address, through sentinels, a cluster."""

CODES: tuple[tuple[str, int, bool], ...] = (
    # (the code an error reply starts with, its kind, also read when wrapped in a script error)
    ("NOSCRIPT", NOSCRIPT, False),
    ("MOVED", MOVED, False),
    ("ASK", ASK, False),
    ("TRYAGAIN", TRYAGAIN, False),
    ("LOADING", RETRY, False),
    ("CLUSTERDOWN", RETRY, False),
    ("READONLY", FAILOVER, True),
    ("MASTERDOWN", FAILOVER, True),
    ("NOREPLICAS", NOREPLICAS, True),
    ("BUSY", ERROR, False),
)
"""Every error code a reply's meaning depends on; any other error reply is ``ERROR``."""

FAILOVER_REPLIES = tuple(code for code, kind, _ in CODES if kind in (FAILOVER, NOREPLICAS))
"""Error replies saying the server is no longer the master a lease was granted on.

A term answered with one of them ends at once: its lease lives on a server
that is now a replica, cut off from its replicas, or refusing writes.
"""

BATCH_KEY_ELSEWHERE = "Script attempted to access a non local key"
"""What one lease of a node-wide batched renewal (``lua/renew_many.lua`` with no
declared key, on a Cluster node) is answered when the node does not serve its
key's slot (the slot moved, or is mid-migration and the key already left): an
error reply holding this text, case aside (Redis 7: ``ERR Script attempted to
access a non local key in a cluster node``; Redis 6: ``ERR @user_script: 28: Lua
script attempted to access a non local key in a cluster node``). The
reply says nothing of where the slot went and did not renew that lease: it alone
is renewed again at once on its own, routed by its declared key, so a MOVED or
ASK reply is followed as for any renewal."""

BATCH_KEY_ELSEWHERE_BEFORE_7 = "Lua script attempted to access a non local key"
"""The same reply from a server before Redis 7, found after the place in the script
it names (``@user_script: 28: Lua script attempted ...``)."""

_RESENT: dict[int, frozenset[int]] = {
    NOSCRIPT: frozenset((PLAIN, SENTINEL, CLUSTER)),
    MOVED: frozenset((CLUSTER,)),
    ASK: frozenset((CLUSTER,)),
    TRYAGAIN: frozenset((CLUSTER,)),
    RETRY: frozenset((SENTINEL, CLUSTER)),
    FAILOVER: frozenset((SENTINEL, CLUSTER)),
}

SITES = (
    "fenced write",
    "pipeline",
    "renewal",
    "elector acquire",
    "lock acquire",
    "lock release",
    "lock refresh",
    "semaphore acquire",
    "semaphore release",
    "asyncio write",
    "asyncio pipeline",
)
"""Every call site the table speaks for (each follows ``resends``, then its own rule above)."""

ENDS_TERM = frozenset((FAILOVER, NOREPLICAS))
"""Kinds that end a term at once when they answer a renewal, an acquire or a fenced write."""


def resends(kind: int, wrapped: bool, topology: int) -> bool:
    """Whether a call answered with ``kind`` is sent again (once; MOVED: followed).

    ``wrapped``: the code came inside a script error (the script ran).
    """
    return not wrapped and topology in _RESENT.get(kind, frozenset())


def topology(cluster: bool, sentinel: bool) -> int:
    """``CLUSTER``, ``SENTINEL`` or ``PLAIN``."""
    return CLUSTER if cluster else SENTINEL if sentinel else PLAIN


def wrapped_marker(code: str) -> str:
    """How a script error carries a command's ``code`` (Redis 6): ``": -CODE "``."""
    return f": -{code} "


# -- the first contact: what retrying cannot mend ------------------------------------------
#
# The first call an elector, a partition group or a lock makes on a client
# (``contact.first_contact``) meets the server as the client configured it.
# Most of what can go wrong there mends by itself, and the run retries as it
# does later: a refused or reset connection, a timeout, LOADING, a failover
# in progress (every kind above). What follows never does: the run would
# retry it forever with nothing but a log line to show. Met on a first
# contact, it is raised from ``start()``; after one contact succeeded it is
# handled like any other error (the run retries and reports it).

NOT_RESP = "<not RESP>"
"""What stands for a reply that is not RESP at all (an HTTP server, say): a protocol error."""

WRONGPASS, NOPERM = "WRONGPASS", "NOPERM"
"""The codes a refusal stands for when redis-py stripped them (``replies.refusal_of``)."""

REFUSALS: tuple[tuple[str, str], ...] = (
    # (the code, or the text after ERR, a reply starts with; what the user must fix)
    (WRONGPASS, "the username and password"),
    ("NOAUTH", "the password: the server requires one"),
    ("invalid password", "the password"),  # Redis before 6: "ERR invalid password"
    ("Client sent AUTH, but no password is set", "the password: the server has none"),
    (NOPERM, "the ACL user's permissions (scripts and the name's keys)"),
    ("DB index is out of range", "the db index: the server has fewer databases"),
    (NOT_RESP, "the address: the peer does not speak the Redis protocol"),
)
"""Every failure of a first contact that retrying cannot mend; anything else can be."""


def refusal(code: str) -> str | None:
    """What to fix when a first contact's reply starts with ``code`` (see ``REFUSALS``);
    None when retrying may mend it. ``code`` may carry an ``ERR`` prefix."""
    text = code[4:] if code.startswith("ERR ") else code
    for known, fix in REFUSALS:
        if text.startswith(known):
            return fix
    return None
