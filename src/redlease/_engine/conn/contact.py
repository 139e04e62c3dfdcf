"""The first contact: a client pointed at the wrong server fails at ``start()``, once.

A run that cannot reach its server retries, and reports each failure to
its observer and the log. That is right for what time mends (a refused or
reset connection, a timeout, a server loading or failing over) and wrong
for what it never does: a wrong or missing password, an ACL user that may
not run the scripts, a db index the server does not have, a peer that does
not speak the Redis protocol. Those a run would retry forever, silently
until the application configures logging.

So the first start on a client makes one bounded round trip (a read-only
script call, by the engine that will serve the run) and raises what the
reply table says retrying cannot mend (``replies.refusal_of``), in the
client's family, naming the endpoint and never the password. What retrying
may mend is left to the run, which retries as it always did.

A lock has no start: its first call raises what it meets, as it always
did, and ``named`` gives a refusal the same endpoint in its message.

The contact is made once per connection pool, not per elector: the answer
is kept in a weak map keyed by the pool (a cluster client by itself: one
node that answers is enough; behind Sentinel the pool is the master's, and
the engine asks the master the sentinels name). After a contact succeeded,
no start on that pool makes another, so 100,000 electors on one client
start as fast as one. After a failure retrying may mend, starts in the next
``bound`` seconds make none either (the run retries meanwhile): an outage
costs a burst of starts one bounded wait, not one each.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from typing import Any

from ..contract.interface import Engine, ScriptRequest
from ..process.forksafe import ForkSafeLock
from ..rules.replies import refusal_of
from .connect import is_cluster

_CONTACTED = 0.0
"""The state of a pool whose first contact succeeded (else: when to contact again)."""

_contacts: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
_contacts_lock = ForkSafeLock()


def _pool_of(client: Any) -> Any:
    """What one first contact speaks for: the client's connection pool (a cluster client,
    which has none of its own: the client). Read at every start: no class check."""
    pool = getattr(client, "connection_pool", None)
    return client if pool is None else pool


def due(client: Any) -> bool:
    """Whether a start on ``client`` now would make a first contact (a round trip)."""
    return _due(_pool_of(client))


def _due(key: Any) -> bool:
    try:
        with _contacts_lock:
            state = _contacts.get(key)
    except TypeError:  # not weakly referenceable: contacted each time
        return True
    if state is None:
        return True
    return state != _CONTACTED and time.monotonic() >= state


def _remember(key: Any, state: float) -> None:
    try:
        with _contacts_lock:
            _contacts[key] = state
    except TypeError:
        pass


def first_contact(
    engine: Engine,
    client: Any,
    request: ScriptRequest,
    bound: float,
    adopt: Callable[[BaseException], BaseException],
) -> None:
    """One bounded round trip of ``request`` on ``engine``, unless ``client``'s pool had one.

    Raises the failure (made the user's family's by ``adopt``, the endpoint
    named in its message) when retrying cannot mend it; returns otherwise,
    also when the call failed in a way the run's retries may mend.
    """
    key = _pool_of(client)
    if not _due(key):
        return
    script, keys, args = request
    try:
        engine.call_one(script, keys, args, bound)
    except Exception as exc:
        if not named(exc, client):
            _remember(key, time.monotonic() + bound)
            return
        adopt(exc)
        raise
    _remember(key, _CONTACTED)


_MARK = "Redis at"
"""What a named refusal's message says before the endpoint (so it is named once)."""


def named(exc: BaseException, client: Any) -> bool:
    """Whether ``exc`` is a failure retrying cannot mend (``replies.refusal_of``); if so,
    its message now names ``client``'s endpoint and what to check (in place, once).

    A lock's call raises its error at once anyway: it names the endpoint too.
    """
    fix = refusal_of(exc)
    if fix is None:
        return False
    text = str(exc)
    if _MARK not in text:
        exc.args = (f"{text} ({_MARK} {endpoint(client)}; check {fix})",)
    return True


def endpoint(client: Any) -> str:
    """Where ``client`` points, for a message: ``host:port`` or a unix socket's path (its db
    when not 0), a Sentinel service and its sentinels, a cluster node. Never a password."""
    if is_cluster(client):
        node = client.get_default_node()
        return f"{node.host}:{node.port} (a cluster node)"
    pool = getattr(client, "connection_pool", None)
    kwargs: dict[str, Any] = getattr(pool, "connection_kwargs", {})
    service = getattr(pool, "service_name", None)
    if service is not None:
        manager = pool.sentinel_manager  # type: ignore[union-attr]
        sentinels = ", ".join(
            f"{s.connection_pool.connection_kwargs.get('host', 'localhost')}:"
            f"{s.connection_pool.connection_kwargs.get('port', 26379)}"
            for s in manager.sentinels
        )
        where = f"the master of {service!r} named by the sentinels {sentinels}"
    elif kwargs.get("path"):
        where = str(kwargs["path"])
    else:
        where = f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
    db = kwargs.get("db") or 0
    return f"{where} db {db}" if db else where
