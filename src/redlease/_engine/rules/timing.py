"""Every timing constant both engines use, with one value and one policy each.

The Python engine imports these names. The native engine reads them when
its extension is imported (``_core`` converts each to nanoseconds into its
C globals), so no value here is written anywhere else; ``native_timing()``
in ``_core`` reports what the native side holds, and a test compares it with
this module. Seconds throughout, as floats.

Nothing is imported here: the native extension imports this module while
``redlease`` is still being imported.
"""

from __future__ import annotations

import math

# ---------------------------------------------------------------- leases

MAX_TTL = 1_000_000.0
"""The longest lease TTL (seconds, about 11.6 days) any lease may have: elector, lock, partition.

The bound the engines can honour, not Redis's: the server takes a 64-bit
count of milliseconds in ``PX``/``PEXPIRE`` and the scripts' doubles are
exact to 2^53 ms, far beyond. What binds is every wait a lease makes (a
renewal, an acquire's poll, a backoff, the guard's ``WAIT``), each up to
its TTL, timed in 32-bit milliseconds: the Python engine's driver sleeps in
``poll()`` (at most 2^31-1 ms, about 24.8 days) and the native engine sends
``WAIT`` with a C int of milliseconds. 1e6 s keeps all of them inside that
with room; the native renewer refuses a longer lease too (it reads this
value), and the settings are checked against it first (``_config``).
"""

# ---------------------------------------------------------------- renewals

RENEWALS_PER_TTL = 3
"""A lease is renewed this many times per TTL by default (every TTL/3)."""

RENEW_BATCH_WINDOW = 0.002
"""Renewals due within this much of the earliest due one are sent with it.

The engines had 2 ms (Python) and 1 ms (native). 2 ms it is: a renewal sent
up to this much early only moves its deadline (send time + TTL) the same
amount earlier, never past the TTL, while a wider window puts more leases
due together into one pipelined round trip.
"""

RENEW_CALL_MAX = 100
"""Leases renewed by one ``lua/renew_many.lua`` call, at most (both engines).

A call holds the server for all of its leases at once, so a call is kept
short however many leases fall due together. The native core keeps a
call's size in a byte (at most 255) and checks this value at import.
"""

RENEW_RETRY_FLOOR = 0.001
"""After a failed renewal the next one waits at least this long.

Only the native engine had a floor. It is the sounder policy, now on both:
a refused connect fails at once, and without a floor a renewer behind
schedule would retry in a busy loop until the lease's deadline. The
deadline itself is unchanged by it.
"""


def renew_interval(ttl: float) -> float:
    """The default renewal interval of a lease of ``ttl`` seconds: TTL/3."""
    return ttl / RENEWALS_PER_TTL


# ---------------------------------------------------------------- resends

RESEND_PAUSE = 0.05
"""The pause before the one resend of a call the server did not run (a failover, LOADING...).

Also between two attempts at a master or a slot owner that failed to
answer, and before a cluster renewal answered "not executed" (CLUSTERDOWN,
TRYAGAIN...) is sent again.
"""


# ---------------------------------------------------------------- release notices

NOTICE_READ_SLICE = 0.25
"""How long one read of a notice connection waits before its thread looks around."""

NOTICE_PING_AFTER = 5.0
"""A notice connection silent this long is pinged ..."""

NOTICE_DEAD_AFTER = 10.0
"""... and dropped (then made again) when nothing at all arrived for this long."""

NOTICE_IDLE_CLOSE = 2.0
"""A notice connection with no waiter for this long is closed."""

NOTICE_CATCH_UP = 0.05
"""A started run that follows looks again this long after it began to listen.

A run listens for release notices only once an acquire found the lease
held (most of thousands started on fresh names win their first, and never
subscribe). A release between that acquire and the subscription reaching
the server is heard by no one: this second look finds it, instead of the
holder's expiry. The look is a read of the lease, not an acquire: a
follower's acquires stay at least 0.9 x ``acquire_interval`` apart, and only
a lease the read finds gone is acquired at once (``RunLoop._lease_gone``).
"""

NOTICE_UNSUBSCRIBE_DELAY = 0.05
"""A channel nobody in the process listens to any more is unsubscribed within about this.

Not at once: the last waiter of a channel is usually a run that stops and
then releases, and an UNSUBSCRIBE each (a wake-up of the notice thread and a
reply to read) would make every stop of thousands pay for it. Queued
unsubscribes go out together, with the next subscribe or after this long;
until then a notice on the channel is read and dropped.
"""

NOTICE_CONNECT_TIMEOUT = 5.0
"""Connecting and subscribing, and each send, on a notice connection are bounded by this."""

NOTICE_BACKOFF_MIN = 0.05
"""The first pause before a lost notice connection is made again; it doubles per failure ..."""

NOTICE_BACKOFF_MAX = 1.0
"""... up to this.

The pause starts over at ``NOTICE_BACKOFF_MIN`` when the lost session had
been up for ``NOTICE_DEAD_AFTER`` or longer: a server that stayed up that
long is not flapping, and its listener reconnects at once. (The native
engine did so; the Python one kept the longer pause for good.) There is no
jitter on either engine: a process keeps one notice connection per server,
so the reconnecting crowd after a restart is one connection per process.
"""

NOTICE_REHOME_TRIES = 12
"""A cluster channel seen moving is looked up again this many times, while the
slot map still names its old node ..."""

NOTICE_REHOME_EVERY = 0.25
"""... this many seconds apart."""


def notice_backoff(backoff: float, lived: float | None) -> tuple[float, float]:
    """``(pause now, pause after the next failure)`` for a lost notice session.

    ``backoff`` is the pause this failure is due; ``lived`` how long the lost
    session had been live (None when it never was).
    """
    if lived is not None and lived >= NOTICE_DEAD_AFTER:
        backoff = NOTICE_BACKOFF_MIN
    return backoff, min(backoff * 2, NOTICE_BACKOFF_MAX)


# ---------------------------------------------------------------- WAIT (the replication guard)

DEFAULT_REPLICA_TIMEOUT = 0.1
"""How long ``WAIT`` waits for replicas to confirm, by default (seconds)."""


def wait_ms(seconds: float) -> int:
    """``seconds`` as the whole milliseconds ``WAIT`` takes: rounded up, and never 0.

    ``WAIT n 0`` blocks until the replicas answer, forever if they never do.
    """
    return max(1, math.ceil(seconds * 1000 - 1e-9))


def wait_command(replicas: int, timeout_ms: int) -> tuple[str, int, int]:
    """The ``WAIT replicas timeout_ms`` command, the one form every sender of WAIT uses.

    ValueError for a negative replica count or a timeout under 1 ms (a
    timeout of 0 would make the server block forever).
    """
    if replicas < 0:
        raise ValueError(f"WAIT needs replicas >= 0, got {replicas!r}")
    if timeout_ms < 1:
        raise ValueError(
            f"WAIT needs a timeout of at least 1 ms, got {timeout_ms!r} (0 blocks forever)"
        )
    return ("WAIT", replicas, timeout_ms)


def ns(seconds: float) -> int:
    """``seconds`` as whole nanoseconds (what the native engine keeps)."""
    return round(seconds * 1_000_000_000)
