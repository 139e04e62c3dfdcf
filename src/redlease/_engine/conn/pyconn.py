"""The Python engine's connection: one redis-py connection with a deadline on every call.

``BoundedConnection`` bounds each round trip (connect included; every read
of a reply too, and the bytes it may read: see ``boundedsocket``), pipelines
a batch of commands, runs scripts (EVALSHA, then EVAL once on NOSCRIPT;
one ASK redirection followed on a cluster) and drops itself after any
error, to reconnect on the next call. The pools and the engine built on it
are in ``python``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import (
    AskError,
    ConnectionError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
)

from ..contract.interface import EncodableT, ScriptRequest, remaining
from ..rules.replies import server_changed
from ..rules.timing import wait_command
from .boundedsocket import begin_round_trip, bounded_class
from .client import is_cluster, refresh_slot_map
from .connect import connection_factory


class BoundedConnection:
    """One connection whose every round trip, connect included, has a deadline.

    Not thread-safe by itself; callers serialize. After any error the
    connection is dropped and reopened on the next call.
    """

    def __init__(
        self,
        client: Any,
        key: str | bytes | None = None,
        node_addr: tuple[str, int] | None = None,
    ) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._key = key
        self._node_addr = node_addr
        self._make = connection_factory(client, key, node_addr, wrap=bounded_class)
        self._conn: Any = None
        self._stale = False

    def invalidate(self) -> None:
        """Reconnect before the next round trip: the server behind this one has changed."""
        self._stale = True

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)`` of the server this connection talks to, when connected."""
        conn = self._conn
        host, port = getattr(conn, "host", None), getattr(conn, "port", None)
        if host is None or port is None:
            return None
        return str(host), int(port)

    def execute(self, args: Sequence[Any], timeout: float) -> Any:
        deadline = time.monotonic() + timeout

        # Every read ends by the deadline: the BoundedSocket under the
        # connection enforces it (read_response has no per-call timeout
        # before redis-py 8.0, and needs none here).
        def one(conn: Any) -> Any:
            conn.send_command(*args)
            return conn.read_response()

        return self._round_trip(one, deadline)

    def execute_many(self, commands: Sequence[Sequence[Any]], timeout: float) -> list[Any]:
        """Send every command at once, then read every reply, in order.

        An error reply is kept in the list as the ResponseError it is (not
        raised), so the connection stays in step and the caller sees every
        reply; a failure that leaves replies unread raises and drops the
        connection.
        """
        deadline = time.monotonic() + timeout

        def many(conn: Any) -> list[Any]:
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
            replies: list[Any] = []
            try:
                for _ in commands:
                    try:
                        replies.append(conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                # Replies are still owed (an interrupt between two reads, too):
                # the connection is out of step and must not be used again.
                conn.disconnect()
                raise
            return replies

        replies: list[Any] = self._round_trip(many, deadline)
        return replies

    def _round_trip(self, exchange: Callable[[Any], Any], deadline: float) -> Any:
        if self._stale:
            self._stale = False
            self.drop()
        conn = self._conn
        try:
            if conn is None:
                conn = self._conn = self._make()
            left = remaining(deadline)
            conn.socket_timeout = left
            conn.socket_connect_timeout = left
            conn.connect()
            begin_round_trip(conn, deadline)  # every read of this round trip ends by then
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                sock.settimeout(remaining(deadline))
            return exchange(conn)
        except MovedError:
            if self._cluster:
                self.reroute()
            raise
        except ResponseError as exc:
            # An error reply: the connection is in step and stays, unless the
            # server says it is no longer the one to ask (NOSCRIPT, ASK,
            # TRYAGAIN and the script's own errors say nothing of the kind;
            # on an ASK target, dropping it would send the EVAL that follows
            # a NOSCRIPT to the migrating node instead).
            if server_changed(exc):
                if self._cluster:
                    self.reroute()
                else:
                    self.drop()
            raise
        except (RedisError, OSError) as exc:
            if self._cluster:
                self.reroute()  # drops too; the slot may have moved
            else:
                self.drop()
            if isinstance(exc, RedisError):
                raise
            raise ConnectionError(str(exc)) from exc

    def reroute(self, asked: float | None = None) -> None:
        """Drop the connection and look the slot's node up again: the slot may have moved.

        ``asked``: when the caller saw the need (``client.refresh_slot_map``).
        """
        self.drop()
        if self._node_addr is not None:
            return  # an ASK target: one node on purpose, for one redirected call
        refresh_slot_map(self._client, asked)
        self._make = connection_factory(self._client, self._key, wrap=bounded_class)

    def eval_script(
        self,
        request: ScriptRequest,
        timeout: float,
        asking: bool = False,
        wait: tuple[int, int] | None = None,
    ) -> Any:
        """EVALSHA, and EVAL once on NOSCRIPT, within one overall deadline.

        With ``wait`` = ``(replicas, ms)`` the script is followed by ``WAIT
        replicas ms`` on this same connection (the one that ran it), and the
        result is ``(reply, acknowledged)``; an error reply raises unwaited.

        On a cluster, an ASK redirection (the slot is being migrated and the
        keys have moved) is followed once: ASKING + the script on the target
        node. A MOVED reply raises after the slot map was refreshed; nothing
        ran, so the caller may send again.
        """
        deadline = time.monotonic() + timeout
        script, keys, args = request
        wait_cmd = None if wait is None else wait_command(*wait)  # checked before sending
        try:
            try:
                reply = self._script(("EVALSHA", script.sha), keys, args, deadline, asking)
            except NoScriptError:
                reply = self._script(("EVAL", script.source), keys, args, deadline, asking)
        except MovedError:
            raise
        except AskError as exc:
            if asking or not self._cluster:
                raise
            target = BoundedConnection(self._client, self._key, exc.node_addr)
            try:
                return target.eval_script(request, remaining(deadline), asking=True, wait=wait)
            finally:
                target.drop()
        if wait_cmd is None:
            return reply
        wait_ms = wait_cmd[2]
        acked = self.execute(wait_cmd, wait_ms / 1000 + remaining(deadline))
        return reply, int(acked)

    def eval_many(
        self, requests: Sequence[ScriptRequest], timeout: float, asking: bool = False
    ) -> list[Any]:
        """Every ``(script, keys, args)`` as EVALSHA in one round trip, replies in order.

        Error replies are ResponseError objects in the list. The commands
        answered NOSCRIPT did not run: only they are sent again, as EVAL, in
        a second round trip within the same deadline. With ``asking`` (this
        connection goes to the node a migrating slot's keys moved to), each
        command follows its own ``ASKING``.
        """
        deadline = time.monotonic() + timeout
        replies = self._send_scripts("EVALSHA", requests, deadline, asking)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            again = self._send_scripts("EVAL", [requests[i] for i in missing], deadline, asking)
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    def _send_scripts(
        self, how: str, requests: Sequence[ScriptRequest], deadline: float, asking: bool
    ) -> list[Any]:
        commands: list[tuple[Any, ...]] = []
        for script, keys, args in requests:
            if asking:
                commands.append(("ASKING",))
            name = script.sha if how == "EVALSHA" else script.source
            commands.append((how, name, len(keys), *keys, *args))
        replies = self.execute_many(commands, remaining(deadline))
        if not asking:
            return replies
        refused = [reply for reply in replies[0::2] if isinstance(reply, Exception)]
        if refused:
            # The command after a refused ASKING met the migration on its own.
            self.drop()
            raise refused[0]
        return replies[1::2]

    def _script(
        self,
        head: tuple[str, str],
        keys: Sequence[str | bytes],
        args: Sequence[EncodableT],
        deadline: float,
        asking: bool,
    ) -> Any:
        if asking:
            self.execute(("ASKING",), remaining(deadline))
        return self.execute((*head, len(keys), *keys, *args), remaining(deadline))

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            # A dying socket must not mask the error that killed it.
            with contextlib.suppress(Exception):
                conn.disconnect()
