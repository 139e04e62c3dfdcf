"""Hearing a Sentinel failover the moment the sentinels announce it.

After a failover the old master keeps answering as a master until the
sentinels reconfigure it (about ten seconds on default settings): a lease
renewed there, and a fenced write sent there, land on a server whose data is
about to be thrown away. The sentinels announce the switch on their
``+switch-master`` channel (``<service> <old ip> <old port> <new ip> <new
port>``); ``SwitchListener`` listens there and calls back at once, so the
engine can end every term the old master granted and look for the new one.

One listener per engine, started with its first keeper, on a daemon thread
that only listens: losing its subscription costs nothing but the early
notice (the renewal deadline still bounds every term), and it resubscribes,
trying the sentinels in turn.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import Connection, SSLConnection
from redis.retry import Retry

from .boundedsocket import begin_round_trip, bounded_class
from .client import TLS, Sentinels
from .connect import pooled_connection

SWITCH_CHANNEL = "+switch-master"
_POLL = 0.2
_RETRY = 0.5


def _tls_kwargs(tls: TLS | None) -> dict[str, Any]:
    if tls is None:
        return {}
    return {
        "ssl": True,
        "ssl_ca_certs": tls.ca_certs,
        "ssl_ca_path": tls.ca_path,
        "ssl_ca_data": tls.ca_data,
        "ssl_certfile": tls.certfile,
        "ssl_keyfile": tls.keyfile,
        "ssl_password": tls.key_password,
        "ssl_cert_reqs": tls.cert_reqs,
        "ssl_check_hostname": tls.check_hostname,
    }


def sentinel_client(sentinels: Sentinels, address: tuple[str, int], timeout: float) -> Any:
    """A ``redis.Redis`` for one sentinel: its credentials and TLS, no retries, ``timeout``.

    Its connections read through a ``BoundedSocket``: a round trip begun
    with ``begin_round_trip`` ends by its deadline and reads no more than
    the reply cap, however the sentinel trickles or floods its answer.
    """
    tls = _tls_kwargs(sentinels.tls)
    cls = SSLConnection if tls.pop("ssl", False) else Connection
    pool = redis.ConnectionPool(
        connection_class=bounded_class(cls),
        host=address[0],
        port=address[1],
        username=sentinels.username,
        password=sentinels.password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        **tls,
    )
    return redis.Redis(connection_pool=pool)


def parse_switch(data: object) -> tuple[str, tuple[str, int], tuple[str, int]] | None:
    """``(service, old address, new address)`` from a ``+switch-master`` message, or None."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data)
    parts = text.split()
    if len(parts) != 5:
        return None
    try:
        return parts[0], (parts[1], int(parts[2])), (parts[3], int(parts[4]))
    except ValueError:
        return None


class SwitchListener:
    """Calls ``on_switch(old, new)`` when the sentinels switch ``sentinels.service``'s master."""

    def __init__(
        self,
        sentinels: Sentinels,
        on_switch: Callable[[tuple[str, int], tuple[str, int]], object],
        still_wanted: Callable[[], bool] = lambda: True,
    ) -> None:
        self._sentinels = sentinels
        # Weakly held: the listening thread must not keep its engine alive,
        # and ends once the engine is gone.
        self._on_switch = weakref.WeakMethod(on_switch)
        self._still_wanted = weakref.WeakMethod(still_wanted) if hasattr(
            still_wanted, "__self__"
        ) else (lambda: still_wanted)
        self._closed = threading.Event()
        self._pid = os.getpid()
        self._thread = threading.Thread(
            target=self._main, name=f"redlease-sentinel-{sentinels.service}", daemon=True
        )
        _live_listeners.add(self)
        self._thread.start()

    def stop(self) -> None:
        """Let the thread end at its next poll, without waiting for it (from any thread)."""
        self._closed.set()

    def close(self) -> None:
        """Stop listening and join the thread (bounded by one poll). Idempotent."""
        self._closed.set()
        if self._thread is not threading.current_thread() and os.getpid() == self._pid:
            self._thread.join(2.0)

    def _wanted(self) -> bool:
        if self._closed.is_set() or self._on_switch() is None:
            return False
        still_wanted = self._still_wanted()
        if still_wanted is None or not still_wanted():
            self._closed.set()
            return False
        return True

    def _main(self) -> None:
        turn = 0
        while self._wanted():
            host, port = self._sentinels.addresses[turn % len(self._sentinels.addresses)]
            turn += 1
            try:
                self._listen(host, port)
            except Exception:
                # Any failure only costs the early notice: try the next sentinel.
                self._closed.wait(_RETRY)

    def _listen(self, host: str, port: int) -> None:
        client = sentinel_client(self._sentinels, (host, port), _POLL * 5)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(SWITCH_CHANNEL)
            while self._wanted():
                # Each message read within a bound and under the reply cap.
                begin_round_trip(pubsub.connection, time.monotonic() + _POLL * 5)
                message = pubsub.get_message(timeout=_POLL)
                on_switch = self._on_switch()
                if on_switch is None:
                    return  # the engine that listened is gone
                if message is None or message.get("type") != "message":
                    continue
                switch = parse_switch(message.get("data"))
                if switch is not None and switch[0] == self._sentinels.service:
                    on_switch(switch[1], switch[2])
                del on_switch
        finally:
            with contextlib.suppress(Exception):
                pubsub.close()
            with contextlib.suppress(Exception):
                client.close()


_live_listeners: weakref.WeakSet[SwitchListener] = weakref.WeakSet()


def _forget_after_fork() -> None:
    # The listening thread does not exist in a forked child.
    for listener in list(_live_listeners):
        listener.stop()


os.register_at_fork(after_in_child=_forget_after_fork)


class MasterNotConfirmed(redis.exceptions.ConnectionError):
    """The sentinels did not confirm the master an acquire ran on: no term starts there."""


# SENTINEL MASTER flags under which no new term may start on the master:
# the sentinels agree it is down, or a failover of it is under way.
_UNSAFE_FLAGS = frozenset({"o_down", "failover_in_progress"})


class SentinelProbes:
    """Short-lived questions to the sentinels: who is the master, and is it being replaced?"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, int], Any] = {}
        self._failed: dict[tuple[str, int], float] = {}  # sentinel -> when it last failed

    def check(
        self, sentinels: Sentinels, address: tuple[str, int], timeout: float
    ) -> tuple[str | None, bool]:
        """``(why not, named elsewhere)``; ``(None, False)`` when the sentinels confirm ``address``.

        Every sentinel that answers is asked (those that failed last time
        only until a majority answered): a majority must answer, none may
        report the master ``o_down`` or being failed over (the sentinel
        leading a failover says so from its start to the switch), and the
        newest configuration among the answers (the highest config epoch)
        must name ``address``. An older one naming another node is a
        sentinel that has not heard of a switch yet, not a refusal.
        """
        deadline = time.monotonic() + timeout
        need = len(sentinels.addresses) // 2 + 1
        failures: list[str] = []
        answers: list[tuple[int, tuple[str, int], tuple[str, int]]] = []
        service = sentinels.service
        where = f"{address[0]}:{address[1]}"
        # Those that answered last time first: a dead or frozen sentinel
        # costs its share of the time once, not on every confirmation.
        order = sorted(sentinels.addresses, key=lambda a: self._failed.get(a, 0.0))
        for asked, sentinel in enumerate(order):
            if len(answers) >= need and sentinel in self._failed:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                failures.append(f"{sentinel[0]}:{sentinel[1]}: no time left")
                continue
            try:
                # Each bounded by its share of what is left, so one that
                # never answers leaves time to ask the others.
                state = self._ask(sentinels, sentinel, left / (len(order) - asked))
            except (redis.RedisError, OSError) as exc:
                self._failed[sentinel] = time.monotonic()
                failures.append(f"{sentinel[0]}:{sentinel[1]}: {type(exc).__name__}: {exc}")
                continue
            self._failed.pop(sentinel, None)
            flags = set(str(state.get("flags") or "").split(","))
            unsafe = sorted(flags & _UNSAFE_FLAGS)
            if unsafe:
                return (
                    f"the sentinel at {sentinel[0]}:{sentinel[1]} reports the master of "
                    f"{service!r} as {','.join(unsafe)}: no term starts on a master being "
                    f"replaced (the lease was acquired on {where})",
                    False,
                )
            named = (str(state.get("ip")), int(state.get("port") or 0))
            answers.append((int(state.get("config-epoch") or 0), named, sentinel))
        if len(answers) < need:
            return (
                f"only {len(answers)} of the {len(sentinels.addresses)} sentinels answered "
                f"about {where} as the master of {service!r} (a majority, {need}, must)"
                + (f"; {'; '.join(failures)}" if failures else ""),
                False,
            )
        newest = max(epoch for epoch, _, _ in answers)
        for epoch, named, sentinel in answers:
            if epoch == newest and named != address:
                return (
                    f"the sentinel at {sentinel[0]}:{sentinel[1]} names {named[0]}:{named[1]} "
                    f"as the master of {service!r} (config epoch {epoch}), not {where} where "
                    "the lease was just acquired: no term starts on a node the sentinels no "
                    "longer name",
                    True,
                )
        return None, False

    def _ask(self, sentinels: Sentinels, sentinel: tuple[str, int], timeout: float) -> Any:
        # One client per sentinel, kept: a confirmation is one round trip on
        # an open connection, bounded by ``timeout`` (connecting by the first
        # caller's; each read below by its own).
        with self._lock:
            client = self._clients.get(sentinel)
            if client is None:
                client = self._clients[sentinel] = sentinel_client(sentinels, sentinel, timeout)
        pool = client.connection_pool
        conn = pooled_connection(pool)
        try:
            # The whole answer by ``timeout``: a trickle cannot renew the wait.
            begin_round_trip(conn, time.monotonic() + timeout)
            conn.send_command("SENTINEL", "MASTER", sentinels.service)
            if not conn.can_read(timeout=timeout):
                raise redis.exceptions.TimeoutError(f"no answer within {timeout:.3f} s")
            reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return _pairs(reply)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()


def _pairs(reply: Any) -> dict[str, str]:
    """A ``SENTINEL MASTER`` reply (RESP2 pairs or a RESP3 map) as text fields."""
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, list) and len(reply) % 2 == 0:
        items = list(zip(reply[0::2], reply[1::2], strict=True))
    else:
        raise redis.exceptions.ResponseError(f"unexpected SENTINEL MASTER reply: {reply!r}")
    return {_text(key): _text(value) for key, value in items}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class MasterSwitches:
    """The keepers of one engine, and the listener that ends their terms on a switch.

    ``track(keeper)`` starts the listener with the first keeper of a
    Sentinel-managed engine (nothing happens for other endpoints). On a
    switch, ``forget_master()`` runs first (the engine drops what points at
    the old master), then the ACTIVE term of every tracked keeper that the
    OLD master granted is lost with a ConnectionError that says why.

    A notice can arrive late: after a renewal answered READONLY ended the
    term and a new one was won on the new master. That term must survive
    it, so ``began(keeper, token)`` records, as each term starts, the master
    the engine last ran a call on (``master_now()``, right after the
    acquire); a notice ends a term unless it was recorded as granted on a
    master other than the notice's old one. Unknown (no address recorded,
    or a term begun since) errs towards ending it.
    """

    def __init__(
        self,
        sentinels: Sentinels | None,
        forget_master: Callable[[], object],
        master_now: Callable[[], tuple[str, int] | None] = lambda: None,
    ) -> None:
        self._sentinels = sentinels
        self._forget_master = weakref.WeakMethod(forget_master)
        self._master_now = master_now
        self._keepers: weakref.WeakSet[Any] = weakref.WeakSet()
        # keeper -> (token, master address the term was granted on)
        self._granted: weakref.WeakKeyDictionary[Any, tuple[int, tuple[str, int] | None]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()
        self._listener: SwitchListener | None = None
        self._probes = SentinelProbes()

    def track(self, keeper: Any) -> None:
        if self._sentinels is None:
            return
        with self._lock:
            self._keepers.add(keeper)
            if self._listener is None:
                self._listener = SwitchListener(self._sentinels, self._switched, self._wanted)

    def began(self, keeper: Any, token: int) -> None:
        """``keeper``'s term ``token`` just started, on the master the engine last used."""
        if self._sentinels is None:
            return
        address = self._master_now()
        with self._lock:
            self._granted[keeper] = (token, address)

    def _granted_elsewhere(self, keeper: Any, old: tuple[str, int]) -> bool:
        # Caller holds the lock.
        granted = self._granted.get(keeper)
        if granted is None:
            return False
        token, address = granted
        if address is None:
            return False
        return bool(token == keeper.token and (str(address[0]), int(address[1])) != old)

    def confirm(self, timeout: float, release: Callable[[], object]) -> None:
        """Raise unless a majority of the sentinels name the master the engine last used.

        Called right after an acquire won there, before a term or a lock is
        handed out. A node the sentinels no longer name (the old master after
        a failover, a killed master restarted empty before the sentinels
        demote it), or one the sentinels are failing over or agree is down,
        is about to have its data thrown away: a term started there could be
        handed out again. The sentinels the client lists are asked in turn,
        each bounded by its share of ``timeout`` (see ``SentinelProbes.check``).

        On refusal ``release()`` runs first (the lease goes back on the node
        that granted it), then, if the sentinels name another master, the
        engine forgets this one so the next call asks them again; then
        ``MasterNotConfirmed`` (a redis-py ``ConnectionError``) says why.
        Nothing happens for endpoints that are not Sentinel-managed.
        """
        sentinels = self._sentinels
        if sentinels is None:
            return
        address = self._master_now()
        if address is None:
            return  # no call ran yet: nothing was acquired on a known node
        address = (str(address[0]), int(address[1]))
        reason, elsewhere = self._probes.check(sentinels, address, timeout)
        if reason is None:
            return
        with contextlib.suppress(Exception):
            release()
        if elsewhere:
            forget_master = self._forget_master()
            if forget_master is not None:
                forget_master()
        raise MasterNotConfirmed(reason)

    def _wanted(self) -> bool:
        # Listen while a run is going: its keeper is open (terms and follower
        # polls alike); a stopped elector's engine stops listening. Decided
        # under the lock track() takes, so a new run always gets a listener.
        with self._lock:
            wanted = any(not keeper.closed for keeper in self._keepers)
            if not wanted and self._listener is not None:
                self._listener.stop()
                self._listener = None
            return wanted

    def _switched(self, old: tuple[str, int], new: tuple[str, int]) -> None:
        forget_master = self._forget_master()
        if forget_master is not None:
            forget_master()
        assert self._sentinels is not None
        error = redis.exceptions.ConnectionError(
            f"the sentinels switched {self._sentinels.service!r} from {old[0]}:{old[1]} to "
            f"{new[0]}:{new[1]}: a term the old master granted has ended"
        )
        old = (str(old[0]), int(old[1]))
        with self._lock:
            keepers = [k for k in self._keepers if not self._granted_elsewhere(k, old)]
        for keeper in keepers:
            keeper.lose(error)

    def close(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        self._probes.close()

    def __del__(self) -> None:
        # The engine is gone without close(): let the listening thread go too.
        listener = self._listener
        if listener is not None:
            listener.stop()
