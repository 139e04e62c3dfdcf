"""Native connections: scripts and commands over a Pool, handshakes, deadlines, failures."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
import redis
import redis.exceptions as rex
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine_helpers import Server, command, endpoint_at, lua, native_ref
from helpers import require_native, require_probe
from redlease._scripts import Script

native = require_native()


def test_every_reply_type_from_a_script_matches_redis_py(pool: Any, rc: redis.Redis) -> None:
    body = (
        "return {1, 'two', {3, {}, 'four'}, false, redis.status_reply('FINE'), "
        "redis.error_reply('ERR nested'), -5}"
    )
    script = Script("shapes", body)
    got = pool.execute(native_ref(script), [], [], 2.0)
    want = rc.eval(body, 0)
    assert isinstance(got[5], rex.ResponseError) and type(got[5]) is type(want[5])
    assert str(got[5]) == str(want[5])
    got[5] = want[5] = None
    assert got == want == [1, b"two", [3, [], b"four"], None, b"FINE", None, -5]
    assert pool.execute(lua("return redis.status_reply('OK')"), [], [], 2.0) == b"OK"
    assert pool.execute(lua("return nil"), [], [], 2.0) is None


def test_keys_and_args_reach_the_script_verbatim(pool: Any) -> None:
    echo = lua("return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4]}")
    got = pool.execute(echo, ["k1", b"k\xff2"], [1.25, -3, "é", b"\x00"], 2.0)
    assert got == [b"k1", b"k\xff2", b"1.25", b"-3", "é".encode(), b"\x00"]


def test_plain_commands_round_trip_over_tcp_and_unix(server: Server) -> None:
    for target in (server.target(), server.unix_target()):
        p = native.Pool(target)
        try:
            assert command(p, ["SET", "k", 3.5], 2.0) == b"OK"
            assert command(p, ["GET", "k"], 2.0) == b"3.5"
            assert command(p, ["GET", "missing"], 2.0) is None
            assert command(p, ["RPUSH", "l", "a", "b"], 2.0) >= 2
            assert command(p, ["LRANGE", "l", 0, -1], 2.0)[:2] == [b"a", b"b"]
            assert p.connections == 1
        finally:
            p.close()
        assert p.connections == 0


def test_large_values_cross_many_reads(pool: Any) -> None:
    big = os.urandom(3 * 1024 * 1024)
    assert command(pool, ["SET", "big", big], 5.0) == b"OK"
    assert command(pool, ["GET", "big"], 5.0) == big


def test_auth_with_username_and_password_and_db(server: Server, rc: redis.Redis) -> None:
    rc.execute_command("ACL", "SETUSER", "alice", "on", ">s3cret", "~*", "&*", "+@all")
    p = native.Pool(server.target(username="alice", password="s3cret", db=5))
    try:
        assert command(p, ["ACL", "WHOAMI"], 2.0) == b"alice"
        assert command(p, ["SET", "in5", "yes"], 2.0) == b"OK"
    finally:
        p.close()
    assert server.client(db=5).get("in5") == b"yes"
    assert rc.get("in5") is None


def test_auth_with_password_only(server: Server, rc: redis.Redis) -> None:
    rc.config_set("requirepass", "pw")
    p = native.Pool(server.target(password="pw"))
    try:
        assert command(p, ["PING"], 2.0) == b"PONG"
    finally:
        p.close()


def test_auth_errors_have_redis_py_types(server: Server, rc: redis.Redis) -> None:
    rc.config_set("requirepass", "pw")
    bad = native.Pool(server.target(password="wrong"))
    none = native.Pool(server.target())
    with pytest.raises(rex.AuthenticationError) as native_bad:
        command(bad, ["PING"], 2.0)
    with pytest.raises(rex.AuthenticationError) as native_none:
        command(none, ["PING"], 2.0)
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
        assert command(p, ["CLIENT", "GETNAME"], 2.0) == b"redlease-test"
    finally:
        p.close()


def test_noscript_is_recovered_by_eval(pool: Any, rc: redis.Redis) -> None:
    script = lua("return 'loaded ' .. ARGV[1]")
    assert pool.execute(script, [], ["once"], 2.0) == b"loaded once"
    rc.script_flush()
    assert rc.script_exists(script.sha.decode()) == [False]
    assert pool.execute(script, [], ["twice"], 2.0) == b"loaded twice"
    assert rc.script_exists(script.sha.decode()) == [True]


def test_script_and_command_errors_match_redis_py(pool: Any, rc: redis.Redis) -> None:
    rc.rpush("list", "x")
    body = "return redis.call('INCR', KEYS[1])"
    with pytest.raises(rex.ResponseError) as native_script:
        pool.execute(lua(body), ["list"], [], 2.0)
    with pytest.raises(rex.ResponseError) as py_script:
        rc.eval(body, 1, "list")
    assert type(native_script.value) is type(py_script.value)
    assert str(native_script.value) == str(py_script.value)
    with pytest.raises(rex.ResponseError) as native_cmd:
        command(pool, ["INCR", "list"], 2.0)
    with pytest.raises(rex.ResponseError) as py_cmd:
        rc.incr("list")
    assert type(native_cmd.value) is type(py_cmd.value)
    assert str(native_cmd.value) == str(py_cmd.value)
    assert "WRONGTYPE" in str(native_cmd.value)
    with pytest.raises(rex.NoScriptError) as py_noscript:
        rc.evalsha("0" * 40, 0)
    parsed = require_probe().parse_reply(b"-" + str(py_noscript.value).encode() + b"\r\n")
    assert parsed is not None and type(parsed[0]) is rex.ResponseError
    # After an error reply the connection is still in step.
    assert command(pool, ["PING"], 2.0) == b"PONG"


def test_a_paused_server_times_out_within_the_bound(server: Server, pool: Any) -> None:
    assert command(pool, ["PING"], 2.0) == b"PONG"
    server.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            pool.execute(lua("return 1"), [], [], 0.3)
        elapsed = time.monotonic() - t0
        assert 0.25 <= elapsed < 1.5
        fresh = native.Pool(server.target())
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            command(fresh, ["PING"], 0.3)
        assert time.monotonic() - t0 < 1.5
    finally:
        server.resume()
    # The timed-out connection was dropped; the next call opens a new one.
    assert command(pool, ["PING"], 2.0) == b"PONG"


class _Interrupted(Exception):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals")
@pytest.mark.parametrize("restarting", [False, True], ids=["interrupting", "sa_restart"])
def test_a_signal_handler_can_interrupt_a_call_waiting_on_the_server(
    server: Server, pool: Any, restarting: bool
) -> None:
    # With SA_RESTART (siginterrupt False) the kernel restarts a plain blocking
    # read after the handler; a call waiting for its reply must still let a
    # raising handler end it, not sleep on until its timeout.
    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    assert command(pool, ["PING"], 2.0) == b"PONG"
    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.siginterrupt(signal.SIGALRM, not restarting)
    server.pause()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        with pytest.raises(_Interrupted):
            pool.execute(lua("return 1"), [], [], 10.0)
        assert time.monotonic() - t0 < 3.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        server.resume()
    assert command(pool, ["ECHO", "in step"], 2.0) == b"in step"


def test_each_call_keeps_its_own_timeout_after_a_longer_one(server: Server, pool: Any) -> None:
    # A long call first, then a short one on the same connection while the
    # server is paused: the short one times out at its own bound.
    assert command(pool, ["PING"], 30.0) == b"PONG"
    server.pause()
    try:
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            pool.execute(lua("return 1"), [], [], 0.3)
        assert 0.25 <= time.monotonic() - t0 < 1.5
    finally:
        server.resume()
    assert command(pool, ["PING"], 30.0) == b"PONG"


def test_a_signal_handler_may_close_the_pool_its_thread_is_calling(server: Server) -> None:
    # A cleanup handler (say, SIGTERM -> locker.close()) runs on the main
    # thread while that thread is inside a call holding a connection. close()
    # used to wait for that connection's lock, held by its own thread: a
    # deadlock no timeout ends.
    code = textwrap.dedent(
        f"""
        import signal, time
        from redlease._engine._native import _core as native
        from redlease._engine._native._probe import command
        from redlease._engine.conn.client import Endpoint
        endpoint = Endpoint("127.0.0.1", {server.port}, None, 0, None, None, None)
        pool = native.Pool(native.Target(endpoint), 1)
        assert command(pool, ["PING"], 2.0) == b"PONG"
        closed = []
        def close_pool(signum, frame):
            pool.close()
            closed.append(True)
        signal.signal(signal.SIGALRM, close_pool)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        t0 = time.monotonic()
        # The server answers after a second; the handler runs meanwhile.
        assert command(pool, ["BLPOP", "nothing", 1], 5.0) is None
        assert closed == [True]
        assert time.monotonic() - t0 < 3.0
        # The connection the handler could not close went once the call was done.
        assert pool.connections == 0
        assert command(pool, ["PING"], 2.0) == b"PONG"
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
        assert command(pool, ["PING"], 10.0) == b"PONG"
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
        p = native.Pool(native.Target(endpoint_at(port)))
        t0 = time.monotonic()
        with pytest.raises(rex.TimeoutError, match="connecting"):
            command(p, ["PING"], 0.3)
        assert 0.25 <= time.monotonic() - t0 < 1.5
    finally:
        for f in fillers:
            f.close()
        listener.close()


def test_a_closed_port_raises_connection_error(closed_port: Any) -> None:
    p = native.Pool(native.Target(endpoint_at(closed_port.port)))
    t0 = time.monotonic()
    with pytest.raises(rex.ConnectionError, match="refused") as info:
        command(p, ["PING"], 2.0)
    assert not isinstance(info.value, rex.TimeoutError)
    assert time.monotonic() - t0 < 1.0
    missing = native.Pool(native.Target(endpoint_at(path="/nonexistent/redis.sock")))
    with pytest.raises(rex.ConnectionError):
        command(missing, ["PING"], 2.0)


def test_a_server_that_went_away_raises_connection_error(server: Server, pool: Any) -> None:
    assert command(pool, ["PING"], 2.0) == b"PONG"
    server.kill()
    with pytest.raises(rex.ConnectionError):
        command(pool, ["PING"], 2.0)


def test_a_connection_the_server_closed_while_idle_is_replaced(pool: Any, rc: redis.Redis) -> None:
    assert command(pool, ["CLIENT", "SETNAME", "victim"], 2.0) == b"OK"
    rc.client_kill_filter(_type="normal", skipme=True)
    time.sleep(1.2)
    assert command(pool, ["PING"], 2.0) == b"PONG"


def test_many_threads_share_a_pool(pool: Any, rc: redis.Redis) -> None:
    incr = lua("return redis.call('INCRBY', KEYS[1], ARGV[1])")
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
