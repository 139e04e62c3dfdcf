"""The Cython core on its own: RESP2, native connections, the keeper thread, fork safety.

Every test runs against a private redis-server started here (loopback TCP
and a unix socket), so it may pause or kill it. Timing bounds are generous:
the machines running this are small and shared.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

native = pytest.importorskip("redlease._engine._native._core")

from helpers import (  # noqa: E402
    BlackHole,
    gil_call_size,
    hold_gil,
)
from redlease._engine import ACTIVE, ENDED, IDLE, LOST  # noqa: E402
from redlease._engine.client import Endpoint  # noqa: E402
from redlease._engine.native import NativeEngine  # noqa: E402
from redlease._scripts import Script, fenced_file, load  # noqa: E402
from redlease._testing import RedisServer  # noqa: E402

RENEW = load("renew")
RENEW_REF = native.ScriptRef(RENEW.sha, RENEW.source)


# ---------------------------------------------------------------- a private server


def _endpoint_at(port: int = 6379, *, path: str | None = None, **kwargs: Any) -> Endpoint:
    """An ``Endpoint`` for a loopback port, or for a unix socket ``path``."""
    fields: dict[str, Any] = {
        "host": None if path else "127.0.0.1",
        "port": port,
        "path": path,
        "db": 0,
        "username": None,
        "password": None,
        "client_name": None,
    }
    fields.update(kwargs)
    return Endpoint(**fields)


class Server:
    """One private redis-server listening on a loopback port and a unix socket at once.

    The harness's ``RedisServer`` with a second listener, so each test can
    reach the same server over TCP and over a unix socket.
    """

    def __init__(self, *extra: str) -> None:
        self._sock_dir = tempfile.mkdtemp(prefix="rlnative")
        self.sock = os.path.join(self._sock_dir, "redis.sock")
        self._server = RedisServer(
            args=["--unixsocket", self.sock, "--unixsocketperm", "700", *extra]
        )
        try:
            self._server.start()
        except BaseException:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            raise
        port = self._server.port
        assert port is not None
        self.port: int = port

    @property
    def paused(self) -> bool:
        return self._server.paused

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def target(self, **kwargs: Any) -> Any:
        return native.Target(_endpoint_at(self.port, **kwargs))

    def unix_target(self, **kwargs: Any) -> Any:
        return native.Target(_endpoint_at(path=self.sock, **kwargs))

    def pause(self) -> None:
        self._server.pause()

    def resume(self) -> None:
        self._server.resume()

    def kill(self) -> None:
        self._server.kill()

    def stop(self) -> None:
        self._server.stop()
        shutil.rmtree(self._sock_dir, ignore_errors=True)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def rc(server: Server) -> Iterator[redis.Redis]:
    c = server.client()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def pool(server: Server) -> Iterator[Any]:
    p = native.Pool(server.target(), 2)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def keepers() -> Iterator[Callable[..., Any]]:
    made: list[Any] = []

    def make(server: Server, key: str = "lease", owner: str = "me", *, ttl: float = 0.3,
             interval: float = 0.1, unix: bool = False) -> Any:
        target = server.unix_target() if unix else server.target()
        k = native.Keeper(target, RENEW_REF, [key], [owner, int(ttl * 1000)], interval, ttl)
        made.append(k)
        return k

    try:
        yield make
    finally:
        for k in made:
            k.close()


def _ref(script: Script) -> Any:
    return native.ScriptRef(script.sha, script.source)


def _lua(body: str) -> Any:
    return _ref(Script("test", body))


def _wait_for(predicate: Callable[[], bool], timeout: float, step: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def _wait_state(keeper: Any, state: int, timeout: float) -> float | None:
    """The monotonic time ``keeper`` was seen in ``state``, or None on timeout."""
    deadline = time.monotonic() + timeout
    while keeper.state != state:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        keeper.wait(min(left, 0.05))
    return time.monotonic()


def _start(keeper: Any, rc: redis.Redis, token: int = 7, owner: str = "me") -> None:
    """Take the lease the way acquire would, then hand it to ``keeper``."""
    t0 = time.monotonic()
    assert rc.set("lease", owner, px=int(keeper.ttl * 1000))
    keeper.begin(token, t0)


# ---------------------------------------------------------------- encoding


def test_each_argument_type_is_encoded_like_redis_py() -> None:
    encoded = native._encode_command(
        ["SET", b"k\x00", 42, -7, 2**70, 1.5, 0.1, 1e100, "é", bytearray(b"ba"), memoryview(b"mv")]
    )
    expected = (
        b"*11\r\n$3\r\nSET\r\n$2\r\nk\x00\r\n$2\r\n42\r\n$2\r\n-7\r\n"
        b"$22\r\n1180591620717411303424\r\n$3\r\n1.5\r\n$3\r\n0.1\r\n$6\r\n1e+100\r\n"
        b"$2\r\n\xc3\xa9\r\n$2\r\nba\r\n$2\r\nmv\r\n"
    )
    assert encoded == expected


def test_int_and_float_text_matches_repr() -> None:
    for value in (0, -(2**63), 2**63 - 1, 2**64, 3.0, -0.0, 1 / 3, 1e-310, float("inf")):
        text = repr(value).encode()
        assert native._encode_command([value]) == b"*1\r\n$%d\r\n%s\r\n" % (len(text), text)


@pytest.mark.parametrize("value", [True, False, None, [1], {"a": 1}, object()])
def test_unencodable_arguments_raise_type_error_naming_the_type(value: object) -> None:
    with pytest.raises(TypeError, match=type(value).__name__):
        native._encode_command(["SET", "k", value])


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("data", "value"),
    [
        (b":0\r\n", 0),
        (b":-9223372036854775808\r\n", -(2**63)),
        (b"+OK\r\n", b"OK"),
        (b"$-1\r\n", None),
        (b"$0\r\n\r\n", b""),
        (b"$5\r\na\r\nbc\r\n", b"a\r\nbc"),
        (b"*-1\r\n", None),
        (b"*0\r\n", []),
        (b"*3\r\n:1\r\n*2\r\n$1\r\na\r\n*0\r\n$-1\r\n", [1, [b"a", []], None]),
    ],
)
def test_each_reply_type_is_parsed(data: bytes, value: object) -> None:
    assert native._parse_reply(data + b"+next\r\n") == (value, len(data))


def test_error_replies_use_redis_py_exception_classes() -> None:
    cases = {
        b"-ERR unknown command\r\n": rex.ResponseError,
        b"-WRONGTYPE Operation against a key\r\n": rex.ResponseError,
        b"-NOSCRIPT No matching script\r\n": rex.NoScriptError,
        b"-NOAUTH Authentication required.\r\n": rex.AuthenticationError,
        b"-WRONGPASS invalid username-password pair\r\n": rex.AuthenticationError,
        b"-READONLY You can't write\r\n": rex.ReadOnlyError,
        b"-BUSY Redis is busy running a script\r\n": rex.ResponseError,
    }
    for data, cls in cases.items():
        parsed = native._parse_reply(data)
        assert parsed is not None
        assert type(parsed[0]) is cls, data
    nested = native._parse_reply(b"*2\r\n:1\r\n-NOSCRIPT gone\r\n")
    assert nested is not None
    assert type(nested[0][1]) is rex.NoScriptError


def test_incomplete_replies_ask_for_more() -> None:
    whole = b"*2\r\n$5\r\nhello\r\n:12\r\n"
    for cut in range(len(whole)):
        assert native._parse_reply(whole[:cut]) is None
    assert native._parse_reply(whole) == ([b"hello", 12], len(whole))


@pytest.mark.parametrize(
    "data",
    [b"?1\r\n", b":1x\r\n", b"$3\r\nabcde\r\n", b"$-2\r\n", b":1\rX", b":99999999999999999999\r\n"],
)
def test_malformed_replies_are_rejected(data: bytes) -> None:
    with pytest.raises(ValueError):
        native._parse_reply(data)


def _in_child(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter: a crash there fails the test, not the whole run."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=60,
    )


def test_array_counts_that_overflow_the_element_tally_are_rejected() -> None:
    # Two huge counts used to wrap the count of elements still owed, so the
    # reply "completed" with far fewer nodes than its arrays claim and turning
    # it into Python objects read past the end of the node array.
    child = _in_child(
        """
        from redlease._engine._native import _core as native
        for data in (
            b"*2\\r\\n*9223372036854775807\\r\\n",
            b"*3\\r\\n*4611686018427387904\\r\\n*4611686018427387904\\r\\n",
        ):
            try:
                got = native._parse_reply(data)
            except ValueError:
                continue
            assert got is None, got
        print("fine")
        """
    )
    assert child.returncode == 0 and child.stdout.strip() == "fine", child.stderr[-2000:]


def test_a_reply_nested_deeper_than_the_c_stack_does_not_crash() -> None:
    # Only a broken or hostile server sends this, but it must not take the
    # process down: the reply is built without recursing once per level.
    child = _in_child(
        """
        import socket, threading
        from redlease._engine._native import _core as native
        from redlease._engine.client import Endpoint
        depth = 300000
        data = b"*1\\r\\n" * depth + b":7\\r\\n"
        value, used = native._parse_reply(data)
        assert used == len(data)
        for _ in range(depth):
            (value,) = value
        assert value == 7
        # The same reply from a server, read on a thread with a small stack.
        listener = socket.create_server(("127.0.0.1", 0))
        def serve():
            conn, _ = listener.accept()
            conn.recv(1024)
            conn.sendall(b"*1\\r\\n" * 20000 + b":7\\r\\n")
            conn.recv(1024)
            conn.close()
        threading.Thread(target=serve, daemon=True).start()
        threading.stack_size(256 * 1024)
        out = []
        def call():
            port = listener.getsockname()[1]
            endpoint = Endpoint("127.0.0.1", port, None, 0, None, None, None)
            pool = native.Pool(native.Target(endpoint))
            out.append(pool.command(["PING"], 5.0))
            pool.close()
        t = threading.Thread(target=call)
        t.start()
        t.join()
        value = out[0]
        for _ in range(20000):
            (value,) = value
        assert value == 7
        print("fine")
        """
    )
    assert child.returncode == 0 and child.stdout.strip() == "fine", child.stderr[-2000:]


# ---------------------------------------------------------------- connections


def test_every_reply_type_from_a_script_matches_redis_py(pool: Any, rc: redis.Redis) -> None:
    body = (
        "return {1, 'two', {3, {}, 'four'}, false, redis.status_reply('FINE'), "
        "redis.error_reply('ERR nested'), -5}"
    )
    script = Script("shapes", body)
    got = pool.execute(_ref(script), [], [], 2.0)
    want = rc.eval(body, 0)
    assert isinstance(got[5], rex.ResponseError) and type(got[5]) is type(want[5])
    assert str(got[5]) == str(want[5])
    got[5] = want[5] = None
    assert got == want == [1, b"two", [3, [], b"four"], None, b"FINE", None, -5]
    assert pool.execute(_lua("return redis.status_reply('OK')"), [], [], 2.0) == b"OK"
    assert pool.execute(_lua("return nil"), [], [], 2.0) is None


def test_keys_and_args_reach_the_script_verbatim(pool: Any) -> None:
    echo = _lua("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4]}")
    got = pool.execute(echo, ["k1", b"k\xff2"], [1.25, -3, "é", b"\x00"], 2.0)
    assert got == [b"k1", b"k\xff2", b"1.25", b"-3", "é".encode(), b"\x00"]


def test_plain_commands_round_trip_over_tcp_and_unix(server: Server) -> None:
    for target in (server.target(), server.unix_target()):
        p = native.Pool(target)
        try:
            assert p.command(["SET", "k", 3.5], 2.0) == b"OK"
            assert p.command(["GET", "k"], 2.0) == b"3.5"
            assert p.command(["GET", "missing"], 2.0) is None
            assert p.command(["RPUSH", "l", "a", "b"], 2.0) >= 2
            assert p.command(["LRANGE", "l", 0, -1], 2.0)[:2] == [b"a", b"b"]
            assert p.connections == 1
        finally:
            p.close()
        assert p.connections == 0


def test_large_values_cross_many_reads(pool: Any) -> None:
    big = os.urandom(3 * 1024 * 1024)
    assert pool.command(["SET", "big", big], 5.0) == b"OK"
    assert pool.command(["GET", "big"], 5.0) == big


def test_auth_with_username_and_password_and_db(server: Server, rc: redis.Redis) -> None:
    rc.execute_command("ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all")
    p = native.Pool(server.target(username="alice", password="s3cret", db=5))
    try:
        assert p.command(["ACL", "WHOAMI"], 2.0) == b"alice"
        assert p.command(["SET", "in5", "yes"], 2.0) == b"OK"
    finally:
        p.close()
    assert server.client(db=5).get("in5") == b"yes"
    assert rc.get("in5") is None


def test_auth_with_password_only(server: Server, rc: redis.Redis) -> None:
    rc.config_set("requirepass", "pw")
    p = native.Pool(server.target(password="pw"))
    try:
        assert p.command(["PING"], 2.0) == b"PONG"
    finally:
        p.close()


def test_auth_errors_have_redis_py_types(server: Server, rc: redis.Redis) -> None:
    rc.config_set("requirepass", "pw")
    bad = native.Pool(server.target(password="wrong"))
    none = native.Pool(server.target())
    with pytest.raises(rex.AuthenticationError) as native_bad:
        bad.command(["PING"], 2.0)
    with pytest.raises(rex.AuthenticationError) as native_none:
        none.command(["PING"], 2.0)
    once = Retry(NoBackoff(), 0)
    with pytest.raises(rex.AuthenticationError) as py_bad:
        server.client(password="wrong", retry=once).ping()
    with pytest.raises(rex.AuthenticationError) as py_none:
        server.client(retry=once, protocol=2).ping()
    assert type(native_bad.value) is type(py_bad.value)
    assert type(native_none.value) is type(py_none.value)
    assert bad.connections == 0


def test_client_name_is_set_on_connect(server: Server, rc: redis.Redis) -> None:
    p = native.Pool(server.target(client_name="redlease-test"))
    try:
        assert p.command(["CLIENT", "GETNAME"], 2.0) == b"redlease-test"
    finally:
        p.close()


def test_noscript_is_recovered_by_eval(pool: Any, rc: redis.Redis) -> None:
    script = _lua("return 'loaded ' .. ARGV[1]")
    assert pool.execute(script, [], ["once"], 2.0) == b"loaded once"
    rc.script_flush()
    assert rc.script_exists(script.sha.decode()) == [False]
    assert pool.execute(script, [], ["twice"], 2.0) == b"loaded twice"
    assert rc.script_exists(script.sha.decode()) == [True]


def test_script_and_command_errors_match_redis_py(pool: Any, rc: redis.Redis) -> None:
    rc.rpush("list", "x")
    body = "return redis.call('INCR', KEYS[1])"
    with pytest.raises(rex.ResponseError) as native_script:
        pool.execute(_lua(body), ["list"], [], 2.0)
    with pytest.raises(rex.ResponseError) as py_script:
        rc.eval(body, 1, "list")
    assert type(native_script.value) is type(py_script.value)
    assert str(native_script.value) == str(py_script.value)
    with pytest.raises(rex.ResponseError) as native_cmd:
        pool.command(["INCR", "list"], 2.0)
    with pytest.raises(rex.ResponseError) as py_cmd:
        rc.incr("list")
    assert type(native_cmd.value) is type(py_cmd.value)
    assert str(native_cmd.value) == str(py_cmd.value)
    assert "WRONGTYPE" in str(native_cmd.value)
    with pytest.raises(rex.NoScriptError) as py_noscript:
        rc.evalsha("0" * 40, 0)
    parsed = native._parse_reply(b"-" + str(py_noscript.value).encode() + b"\r\n")
    assert parsed is not None and type(parsed[0]) is rex.ResponseError
    # After an error reply the connection is still in step.
    assert pool.command(["PING"], 2.0) == b"PONG"


def test_a_paused_server_times_out_within_the_bound(server: Server, pool: Any) -> None:
    assert pool.command(["PING"], 2.0) == b"PONG"
    server.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            pool.execute(_lua("return 1"), [], [], 0.3)
        elapsed = time.monotonic() - t0
        assert 0.25 <= elapsed < 1.5
        fresh = native.Pool(server.target())
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            fresh.command(["PING"], 0.3)
        assert time.monotonic() - t0 < 1.5
    finally:
        server.resume()
    # The timed-out connection was dropped; the next call opens a new one.
    assert pool.command(["PING"], 2.0) == b"PONG"


class _Interrupted(Exception):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_a_signal_handler_can_interrupt_a_call_waiting_on_the_server(
    server: Server, pool: Any
) -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    assert pool.command(["PING"], 2.0) == b"PONG"
    previous = signal.signal(signal.SIGALRM, interrupt)
    server.pause()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(_Interrupted):
            pool.command(["PING"], 10.0)
        assert time.monotonic() - t0 < 3.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        server.resume()
    assert pool.command(["ECHO", "in step"], 2.0) == b"in step"


def test_a_signal_handler_may_close_the_pool_its_thread_is_calling(server: Server) -> None:
    # A cleanup handler (say, SIGTERM -> locker.close()) runs on the main
    # thread while that thread is inside a call holding a connection. close()
    # used to wait for that connection's lock, held by its own thread: a
    # deadlock no timeout ends.
    code = textwrap.dedent(
        f"""
        import signal, time
        from redlease._engine._native import _core as native
        from redlease._engine.client import Endpoint
        endpoint = Endpoint("127.0.0.1", {server.port}, None, 0, None, None, None)
        pool = native.Pool(native.Target(endpoint), 1)
        assert pool.command(["PING"], 2.0) == b"PONG"
        closed = []
        def close_pool(signum, frame):
            pool.close()
            closed.append(True)
        signal.signal(signal.SIGALRM, close_pool)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        # The server answers after a second; the handler runs meanwhile.
        assert pool.command(["BLPOP", "nothing", 1], 5.0) is None
        assert closed == [True]
        assert time.monotonic() - t0 < 3.0
        # The connection the handler could not close went once the call was done.
        assert pool.connections == 0
        assert pool.command(["PING"], 2.0) == b"PONG"
        print("fine")
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=15
        )
    except subprocess.TimeoutExpired:
        pytest.fail("close() from a signal handler deadlocked its own call")
    assert done.returncode == 0 and done.stdout.strip() == "fine", done.stderr[-2000:]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
def test_a_signal_handler_that_returns_lets_the_call_go_on(server: Server, pool: Any) -> None:
    calls: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: calls.append(signum))
    server.pause()
    resumer = threading.Timer(0.5, server.resume)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        resumer.start()
        assert pool.command(["PING"], 10.0) == b"PONG"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resumer.join()
        server.resume()
    assert calls == [signal.SIGALRM]


def test_a_connect_that_hangs_times_out_within_the_bound() -> None:
    # A listener that never accepts and whose queue is full drops new SYNs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
            fillers.append(f)
        time.sleep(0.1)
        p = native.Pool(native.Target(_endpoint_at(port)))
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError, match="connecting"):
            p.command(["PING"], 0.3)
        assert 0.25 <= time.monotonic() - t0 < 1.5
    finally:
        for f in fillers:
            f.close()
        listener.close()


def test_a_closed_port_raises_connection_error(closed_port: Any) -> None:
    p = native.Pool(native.Target(_endpoint_at(closed_port.port)))
    t0 = time.monotonic()
    with pytest.raises(rex.ConnectionError, match="refused") as info:
        p.command(["PING"], 2.0)
    assert not isinstance(info.value, rex.TimeoutError)
    assert time.monotonic() - t0 < 1.0
    missing = native.Pool(native.Target(_endpoint_at(path="/nonexistent/redis.sock")))
    with pytest.raises(rex.ConnectionError):
        missing.command(["PING"], 2.0)


def test_a_server_that_went_away_raises_connection_error(server: Server, pool: Any) -> None:
    assert pool.command(["PING"], 2.0) == b"PONG"
    server.kill()
    with pytest.raises(rex.ConnectionError):
        pool.command(["PING"], 2.0)


def test_a_connection_the_server_closed_while_idle_is_replaced(pool: Any, rc: redis.Redis) -> None:
    assert pool.command(["CLIENT", "SETNAME", "victim"], 2.0) == b"OK"
    rc.client_kill_filter(_type="normal", skipme=True)
    time.sleep(1.2)
    assert pool.command(["PING"], 2.0) == b"PONG"


def test_many_threads_share_a_pool(pool: Any, rc: redis.Redis) -> None:
    incr = _lua("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(300):
                pool.execute(incr, ["counter"], [1], 5.0)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert int(rc.get("counter") or 0) == 8 * 300
    assert 1 <= pool.connections <= 2


# ---------------------------------------------------------------- the keeper


def test_native_clock_is_time_monotonic() -> None:
    # begin() takes a time.monotonic() value; the keeper measures with CLOCK_MONOTONIC.
    assert abs(native._monotonic() - time.monotonic()) < 0.01


def test_keeper_renews_past_three_ttls(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, ttl=0.3, interval=0.1)
    assert (k.state, k.token) == (IDLE, 0)
    _start(k, rc, token=11)
    assert (k.state, k.token) == (ACTIVE, 11)
    lowest = 10_000
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        lowest = min(lowest, rc.pttl("lease"))
        time.sleep(0.02)
    assert lowest > 0
    assert (k.state, k.token) == (ACTIVE, 11)
    assert k.renewals >= 5
    assert k.pop_errors() == []


def test_keeper_over_a_unix_socket(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, unix=True)
    _start(k, rc)
    time.sleep(0.5)
    assert k.state == ACTIVE and k.renewals >= 2
    assert rc.pttl("lease") > 0


def test_keeper_is_lost_at_once_when_the_lease_is_gone(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=1.0, interval=0.1)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 1, 2.0)
    t0 = time.monotonic()
    rc.set("lease", "someone-else")
    seen = _wait_state(k, LOST, 2.0)
    assert seen is not None and seen - t0 < 0.6
    assert k.token == 0
    assert rc.get("lease") == b"someone-else"


def test_keeper_is_lost_at_the_deadline_when_the_server_hangs(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    ttl = 0.6
    k = keepers(server, ttl=ttl, interval=0.15)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 2, 2.0)
    server.pause()
    try:
        seen = _wait_state(k, LOST, ttl + 3.0)
        assert seen is not None
        since_last_good = seen - k.renewed_at
        assert ttl - 0.005 <= since_last_good <= ttl + 0.5
        assert k.token == 0
        errors = k.pop_errors()
        assert errors and all(isinstance(e, rex.TimeoutError) for e in errors)
    finally:
        server.resume()


def test_keeper_deadline_counts_from_the_acquire_when_no_renewal_succeeds(
    server: Server, keepers: Any
) -> None:
    k = keepers(server, ttl=0.4, interval=0.1)
    server.kill()
    t0 = time.monotonic()
    k.begin(3, t0)
    seen = _wait_state(k, LOST, 3.0)
    assert seen is not None and 0.39 <= seen - t0 <= 0.9
    errors = k.pop_errors()
    assert errors and all(isinstance(e, rex.ConnectionError) for e in errors)
    assert not any(isinstance(e, rex.TimeoutError) for e in errors)


def test_keeper_begun_after_its_deadline_is_lost_without_renewing(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=0.3, interval=0.1)
    rc.set("lease", "me", px=5000)
    k.begin(5, time.monotonic() - 1.0)
    assert _wait_state(k, LOST, 1.0) is not None
    assert k.renewals == 0
    assert 0 < rc.pttl("lease") <= 5000


def test_keeper_holds_the_lease_while_the_gil_is_held(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=0.3, interval=0.1)
    _start(k, rc, token=21)
    # One C call that never releases the GIL, calibrated to about 1.5 s.
    n = gil_call_size(1.5)
    monitor = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time, redis
            r = redis.Redis(port={server.port}, socket_timeout=5)
            r.ping()
            print("ready", flush=True)
            sys.stdin.readline()
            lowest, end = 10**9, time.monotonic() + 1.2
            while time.monotonic() < end:
                lowest = min(lowest, r.pttl("lease"))
                time.sleep(0.005)
            print(lowest, flush=True)
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert monitor.stdout is not None and monitor.stdin is not None
    try:
        assert monitor.stdout.readline().strip() == "ready"
        before = k.renewals
        monitor.stdin.write("go\n")
        monitor.stdin.flush()
        held = hold_gil(n)
        during = k.renewals - before
        out, _ = monitor.communicate(timeout=30)
    finally:
        if monitor.poll() is None:
            monitor.kill()
    assert held > 0.6  # at least two TTLs without the GIL
    assert (k.state, k.token) == (ACTIVE, 21)
    assert during >= held / 0.1 / 2
    assert int(out.strip()) > 0, "the lease lapsed while the GIL was held"
    assert max(k.lateness()) < 0.3


def test_end_clears_the_token_and_stops_renewing(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=0.3, interval=0.05)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 2, 2.0)
    k.end()
    assert (k.state, k.token) == (ENDED, 0)
    count = k.renewals
    assert _wait_for(lambda: rc.exists("lease") == 0, 2.0)
    assert k.renewals == count
    k.end()
    assert k.state == ENDED


def test_a_renewal_in_flight_cannot_revive_an_ended_term(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=3.0, interval=0.4)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 1, 2.0)
    server.pause()
    try:
        time.sleep(0.6)  # the next renewal is now stuck in the paused server
        count = k.renewals
        k.end()
    finally:
        server.resume()
    time.sleep(0.5)  # its reply (1: renewed) arrives for a term that is over
    assert (k.state, k.token, k.renewals) == (ENDED, 0, count)


def test_odd_renewal_replies_are_errors_until_the_deadline(
    server: Server, rc: redis.Redis
) -> None:
    for body, cls in (
        ("return 'yes'", rex.ResponseError),
        ("return redis.call('INCR', KEYS[1])", rex.ResponseError),
    ):
        rc.set("lease", "not a number")
        ref = _lua(body)
        with native.Keeper(server.target(), ref, ["lease"], [], 0.05, 0.3) as k:
            t0 = time.monotonic()
            k.begin(1, t0)
            seen = _wait_state(k, LOST, 2.0)
            assert seen is not None and seen - t0 >= 0.29
            errors = k.pop_errors()
            assert errors and all(type(e) is cls for e in errors), errors


def test_a_lost_term_stays_lost_after_end(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server)
    _start(k, rc)
    rc.delete("lease")
    assert _wait_state(k, LOST, 2.0) is not None
    k.end()
    assert (k.state, k.token) == (LOST, 0)


def test_a_keeper_serves_term_after_term(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, ttl=0.3, interval=0.05)
    for token in (1, 2, 3):
        _start(k, rc, token=token)
        assert _wait_for(lambda token=token: k.renewals >= token * 2, 2.0)
        assert (k.state, k.token) == (ACTIVE, token)
        k.end()
        assert k.token == 0


def test_keeper_survives_a_script_flush(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, ttl=0.3, interval=0.05)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 1, 2.0)
    for _ in range(3):
        rc.script_flush()
        count = k.renewals
        assert _wait_for(lambda count=count: k.renewals > count + 1, 2.0)
    assert k.state == ACTIVE
    assert k.pop_errors() == []


def test_wait_wakes_on_notify_and_loss_and_times_out(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    k = keepers(server, ttl=0.5)
    _start(k, rc)
    assert k.wait(0) is True  # begin() is a state change
    assert k.wait(0.05) is False
    k.notify()
    assert k.wait(None) is True
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(k.fileno(), selectors.EVENT_READ)
        assert sel.select(0) == []
        rc.delete("lease")
        assert sel.select(2.0) != []
    assert k.wait(0) is True
    assert k.state == LOST


def test_lateness_samples_are_recorded(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, ttl=0.3, interval=0.02)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 20, 3.0)
    samples = k.lateness()
    assert len(samples) >= 20
    assert all(0 <= s < 0.25 for s in samples)
    assert sorted(samples)[len(samples) // 2] < 0.05


def test_begin_validates_its_arguments(server: Server, keepers: Any) -> None:
    k = keepers(server)
    with pytest.raises(ValueError):
        k.begin(0, time.monotonic())
    with pytest.raises(ValueError):
        native.Keeper(server.target(), RENEW_REF, ["k"], ["me", 100], 0, 1.0)
    k.close()
    with pytest.raises(RuntimeError):
        k.begin(1, time.monotonic())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_close_joins_the_thread_and_frees_every_fd(server: Server, rc: redis.Redis) -> None:
    rc.ping()  # the client's own socket is part of the baseline
    gc.collect()
    fds, threads = _open_fds(), _threads()
    for i in range(30):
        k = native.Keeper(server.target(), RENEW_REF, [f"l{i}"], ["me", 300], 0.05, 0.3)
        rc.set(f"l{i}", "me", px=300)
        k.begin(1, time.monotonic())
        assert _wait_for(lambda k=k: k.renewals >= 1, 2.0)
        k.close()
        assert (k.state, k.token, k.fileno()) == (ENDED, 0, -1)
        assert k.wait(None) is True
        k.close()
    assert _threads() == threads
    assert _open_fds() == fds


def test_close_wakes_every_waiter_and_frees_the_fds_after_them(
    server: Server, rc: redis.Redis, keepers: Any
) -> None:
    # close() used to signal the eventfd once and close it at once: one
    # waiter consumed the wake-up, the others went back to polling a closed
    # descriptor (forever, for wait(None)), or read from whatever file reused
    # its number.
    for _ in range(5):
        k = keepers(server)
        _start(k, rc)
        assert k.wait(1.0) is True
        fd = k.fileno()
        returned: list[bool] = []
        waiters = [
            threading.Thread(
                target=lambda k=k, out=returned: out.append(k.wait(None)), daemon=True
            )
            for _ in range(4)
        ]
        for t in waiters:
            t.start()
        time.sleep(0.2)
        k.close()
        for t in waiters:
            t.join(3.0)
        assert returned == [True] * 4
        assert k.fileno() == -1
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_dropped_keeper_stops_its_thread_and_frees_its_fds(
    server: Server, rc: redis.Redis
) -> None:
    rc.ping()  # the client's own socket is part of the baseline
    gc.collect()
    fds, threads = _open_fds(), _threads()
    for i in range(10):
        k = native.Keeper(server.target(), RENEW_REF, [f"d{i}"], ["me", 300], 0.05, 0.3)
        rc.set(f"d{i}", "me", px=300)
        k.begin(1, time.monotonic())
        assert _wait_for(lambda k=k: k.renewals >= 1, 2.0)
        del k
    gc.collect()
    assert _wait_for(lambda: _threads() == threads and _open_fds() == fds, 3.0)
    assert _wait_for(lambda: rc.exists(*[f"d{i}" for i in range(10)]) == 0, 2.0)


def test_close_aborts_a_renewal_in_flight(server: Server, rc: redis.Redis, keepers: Any) -> None:
    k = keepers(server, ttl=10.0, interval=1.0)
    _start(k, rc)
    assert _wait_for(lambda: k.renewals >= 1, 2.0)
    server.pause()
    try:
        time.sleep(1.3)  # the second renewal is now waiting on the paused server
        t0 = time.monotonic()
        k.close()
        assert time.monotonic() - t0 < 1.0
    finally:
        server.resume()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_cannot_renew_or_use_the_parents_sockets(
    server: Server, rc: redis.Redis, pool: Any, keepers: Any
) -> None:
    ttl = 0.5
    k = keepers(server, ttl=ttl, interval=0.1)
    _start(k, rc, token=9)
    assert pool.command(["SET", "who", "parent"], 2.0) == b"OK"
    assert _wait_for(lambda: k.renewals >= 1, 2.0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        with contextlib.suppress(BaseException):
            assert k.token == 0 and k.state in (ENDED, IDLE)
            try:
                k.begin(10, time.monotonic())
            except RuntimeError:
                pass
            else:
                raise AssertionError("begin() worked in the child")
            assert k.wait(0) is False
            # The inherited pool opens its own connection in the child.
            assert pool.command(["CLIENT", "SETNAME", "child"], 2.0) == b"OK"
            assert pool.command(["GET", "who"], 2.0) == b"parent"
            time.sleep(ttl * 3)
            code = 0
        os._exit(code)
    try:
        assert (k.state, k.token) == (ACTIVE, 9)
        k.end()
        # Nothing renews the lease any more: not the parent (ended), not the child.
        assert _wait_for(lambda: rc.exists("lease") == 0, ttl + 1.0)
        assert k.wait(0) is True
        # The parent's own connection is still in step with its replies.
        for i in range(20):
            assert pool.command(["ECHO", i], 2.0) == str(i).encode()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---------------------------------------------------------------- the engine


def _endpoint(server: Server, **kwargs: Any) -> Endpoint:
    fields: dict[str, Any] = {
        "host": "127.0.0.1", "port": server.port, "path": None, "db": 0,
        "username": None, "password": None, "client_name": None,
    }
    fields.update(kwargs)
    return Endpoint(**fields)


def test_engine_runs_fenced_writes_and_control_scripts(server: Server, rc: redis.Redis) -> None:
    engine = NativeEngine(_endpoint(server, db=2, client_name="eng"), write_timeout=None)
    try:
        assert engine.name == "native"
        assert engine.write_timeout == 30.0
        fence_set = fenced_file("fence_set")
        assert engine.write(fence_set, ["applied", "x"], [5, "five"]) == 1
        assert engine.write(fence_set, ["applied", "x"], [4, "four"]) == 0
        assert engine.write(fence_set, ["applied", "x"], [5, b"again"]) == 1
        db2 = server.client(db=2)
        assert db2.get("x") == b"again"
        assert db2.get("applied") == b"5"
        acquire = load("acquire")
        keys = ["n:leader", "n:fence", "n:fence:applied"]
        token, pttl = engine.call(acquire, keys, ["me", 500], 2.0)
        assert token == 1 and pttl == 500
        k = engine.keeper(RENEW, ["n:leader"], ["me", 500], interval=0.1, ttl=0.5)
        k.begin(token, time.monotonic())
        time.sleep(0.7)
        assert k.state == ACTIVE and db2.pttl("n:leader") > 0
        assert engine.call(load("release"), ["n:leader"], ["me"], 2.0) == 1
        assert _wait_state(k, LOST, 2.0) is not None
    finally:
        engine.close()
    assert k.closed


def test_engine_over_a_unix_socket_with_a_write_timeout(server: Server) -> None:
    engine = NativeEngine(_endpoint(server, host=None, path=server.sock), write_timeout=0.3)
    try:
        assert engine.write(fenced_file("fence_hset"), ["ap", "h"], [1, "f", 2.5]) == 1
        server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(rex.TimeoutError):
                engine.write(fenced_file("fence_hset"), ["ap", "h"], [1, "f", 3])
            assert time.monotonic() - t0 < 1.5
            with pytest.raises(rex.TimeoutError):
                engine.call(load("release"), ["n:leader"], ["me"], 0.2)
        finally:
            server.resume()
        # A timed-out write may still have been applied: the outcome is unknown,
        # and the engine says so with TimeoutError rather than guessing.
        assert server.client().hget("h", "f") in (b"2.5", b"3")
        assert engine.write(fenced_file("fence_hset"), ["ap", "h"], [2, "f", 4]) == 1
    finally:
        engine.close()


SECRET = "pw-that-must-never-show-7f3a9c"


def _shown(obj: Any) -> str:
    """Everything a log line or a traceback could show of ``obj``."""
    if isinstance(obj, BaseException):
        return " ".join([str(obj), repr(obj), *map(repr, obj.args)])
    return repr(obj) + str(obj)


def test_no_repr_or_error_shows_the_password(
    server: Server, rc: redis.Redis, closed_port: Any
) -> None:
    rc.config_set("requirepass", "the-right-one")
    endpoint = _endpoint_at(server.port, username="default", password=SECRET, client_name="sec")
    target = native.Target(endpoint)
    pool = native.Pool(target)
    keeper = native.Keeper(target, _lua("return 1"), ["k"], [SECRET], 0.05, 0.3)
    engine = NativeEngine(endpoint, write_timeout=0.3)
    shown = [target, pool, keeper, engine, endpoint]
    try:
        assert target.username == "default" and not hasattr(target, "password")
        # The server refuses the password: the error names the address, not the secret.
        with pytest.raises(rex.AuthenticationError) as refused:
            pool.command(["PING"], 2.0)
        shown.append(refused.value)
        with pytest.raises(rex.AuthenticationError) as refused_call:
            engine.call(load("release"), ["n:leader"], ["me"], 2.0)
        shown.append(refused_call.value)
        keeper.begin(1, time.monotonic())
        assert _wait_state(keeper, LOST, 3.0) is not None
        errors = keeper.pop_errors()
        assert errors and all(isinstance(e, rex.AuthenticationError) for e in errors)
        shown.extend(errors)
        # No server at all, and a server that never answers.
        closed = native.Pool(native.Target(_endpoint_at(closed_port.port, password=SECRET)))
        with pytest.raises(rex.ConnectionError) as unreachable:
            closed.command(["PING"], 2.0)
        shown += [closed, unreachable.value]
        hole = BlackHole()
        try:
            silent = native.Pool(native.Target(_endpoint_at(hole.port, password=SECRET)))
            with pytest.raises(rex.TimeoutError) as timed_out:
                silent.command(["PING"], 0.2)
            shown += [silent, timed_out.value]
        finally:
            hole.close()
    finally:
        keeper.close()
        engine.close()
        pool.close()
    for obj in shown:
        assert SECRET not in _shown(obj), type(obj).__name__
