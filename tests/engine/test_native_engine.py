"""NativeEngine, the Engine protocol over the core: fenced writes, control scripts, keepers."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
import redis.exceptions as rex

from engine_helpers import RENEW, Server, command, endpoint_at, lua, wait_state
from helpers import BlackHole, require_native
from redlease._engine import ACTIVE, LOST, execute_one
from redlease._scripts import fenced_file, load

native = require_native()

from redlease._engine.engines.native import NativeEngine  # noqa: E402


def test_engine_runs_fenced_writes_and_control_scripts(server: Server, rc: redis.Redis) -> None:
    engine = NativeEngine(server.endpoint(db=2, client_name="eng"), write_timeout=None)
    try:
        assert engine.name == "native"
        assert engine.write_timeout == 30.0
        fence_set = fenced_file("fence_set")
        assert execute_one(engine, (fence_set, ["applied", "x"], [5, "five"]))[0] == 1
        assert execute_one(engine, (fence_set, ["applied", "x"], [4, "four"]))[0] == 0
        assert execute_one(engine, (fence_set, ["applied", "x"], [5, b"again"]))[0] == 1
        db2 = server.client(db=2)
        assert db2.get("x") == b"again"
        assert db2.get("applied") == b"5"
        acquire = load("acquire")
        keys = ["n:leader", "n:fence", "n:fence:applied"]
        token, pttl, holder = execute_one(engine, (acquire, keys, ["me", 500]), timeout=2.0)[0]
        assert token == 1 and pttl == 500 and holder == b"me"
        k = engine.keeper((RENEW, ["n:leader"], ["me", 500]), interval=0.1, ttl=0.5)
        k.begin(token, time.monotonic())
        time.sleep(0.7)
        assert k.state == ACTIVE and db2.pttl("n:leader") > 0
        assert execute_one(engine, (load("release"), ["n:leader"], ["me"]), timeout=2.0)[0] == 1
        assert wait_state(k, LOST, 2.0) is not None
    finally:
        engine.close()
    assert k.closed


def test_engine_over_a_unix_socket_with_a_write_timeout(server: Server) -> None:
    engine = NativeEngine(server.endpoint(unix=True), write_timeout=0.3)
    try:
        assert execute_one(engine, (fenced_file("fence_hset"), ["ap", "h"], [1, "f", 2.5]))[0] == 1
        server.pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(rex.TimeoutError):
                execute_one(engine, (fenced_file("fence_hset"), ["ap", "h"], [1, "f", 3]))[0]
            assert time.monotonic() - t0 < 1.5
            with pytest.raises(rex.TimeoutError):
                execute_one(engine, (load("release"), ["n:leader"], ["me"]), timeout=0.2)[0]
        finally:
            server.resume()
        # A timed-out write may still have been applied: the outcome is unknown,
        # and the engine says so with TimeoutError rather than guessing.
        assert server.client().hget("h", "f") in (b"2.5", b"3")
        assert execute_one(engine, (fenced_file("fence_hset"), ["ap", "h"], [2, "f", 4]))[0] == 1
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
    endpoint = server.endpoint(username="default", password=SECRET, client_name="sec")
    target = native.Target(endpoint)
    pool = native.Pool(target)
    keeper = native.Lease(native.Renewer(target), lua("return 1"), ["k"], [SECRET], 0.05, 0.3)
    engine = NativeEngine(endpoint, write_timeout=0.3)
    shown = [target, pool, keeper, engine, endpoint]
    try:
        assert target.username == "default" and not hasattr(target, "password")
        # The server refuses the password: the error names the address, not the secret.
        with pytest.raises(rex.AuthenticationError) as refused:
            command(pool, ["PING"], 2.0)
        shown.append(refused.value)
        with pytest.raises(rex.AuthenticationError) as refused_call:
            execute_one(engine, (load("release"), ["n:leader"], ["me"]), timeout=2.0)[0]
        shown.append(refused_call.value)
        keeper.begin(1, time.monotonic())
        assert wait_state(keeper, LOST, 3.0) is not None
        errors = keeper.pop_errors()
        assert errors and all(isinstance(e, rex.AuthenticationError) for e in errors)
        shown.extend(errors)
        # No server at all, and a server that never answers.
        closed = native.Pool(native.Target(endpoint_at(closed_port.port, password=SECRET)))
        with pytest.raises(rex.ConnectionError) as unreachable:
            command(closed, ["PING"], 2.0)
        shown += [closed, unreachable.value]
        hole = BlackHole()
        try:
            silent = native.Pool(native.Target(endpoint_at(hole.port, password=SECRET)))
            with pytest.raises(rex.TimeoutError) as timed_out:
                command(silent, ["PING"], 0.2)
            shown += [silent, timed_out.value]
        finally:
            hole.close()
    finally:
        keeper.close()
        engine.close()
        pool.close()
    for obj in shown:
        assert SECRET not in _shown(obj), type(obj).__name__
