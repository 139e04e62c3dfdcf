"""valkey-py clients: served natively, errors of valkey-py's family, valkey-py forced on nobody.

The behavioural suites run with valkey-py clients through the ``family``
fixture (the ``client`` fixture, the fake-server suites, the Sentinel and
Cluster suites). What is particular to the family is here: which engine a
valkey client gets, that every error the library lets out is one a valkey
caller catches (raised, and reported to ``on_error``), that a redis-py user
never imports valkey-py, and the command line's ``valkey://`` URLs. The
servers are the tests' own redis-servers: they speak the protocol valkey-py
speaks (the pytest header names the binary).
"""

from __future__ import annotations

import asyncio
import pickle
import subprocess
import sys
from typing import Any

import pytest
import redis
import redis.exceptions

import redlease
import redlease.aio
from helpers import (
    ClosedPort,
    Events,
    make_elector,
    require_native,
    require_valkey,
    wait_until,
)
from redlease._engine.conn.clientfamily import REDIS, family_of, threaded
from redlease._engine.rules.replies import UnexpectedReply
from redlease._testing import RedisServer

require_valkey()  # skips the module without valkey-py (fails with REDLEASE_REQUIRE_VALKEY=1)
import valkey  # noqa: E402
import valkey.asyncio  # noqa: E402
import valkey.exceptions  # noqa: E402

pytestmark = pytest.mark.timeout(120)


# -- which engine ----------------------------------------------------------------


@pytest.mark.parametrize("how", ["tcp", "unix", "acl user and db"])
def test_auto_runs_a_valkey_client_natively_and_it_elects_and_fences(how: str) -> None:
    require_native()
    server = RedisServer(unix=how == "unix").start()
    try:
        kwargs: dict[str, Any] = {}
        if how == "acl user and db":
            admin = server.client()
            admin.execute_command("ACL", "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all")
            admin.close()
            kwargs = {"username": "app", "password": "s3cret", "db": 3}
        client = server.client(family="valkey", socket_timeout=5, **kwargs)
        e = redlease.Elector(client, "svc", ttl=2)
        assert (e.engine, e.engine_reason) == ("native", "")
        with e:
            token = wait_until(e.token, 10, what="election")
            assert e.fence_set(token, "k", "v") is True
            assert e.fence_set(token - 1, "k", "stale") is False
        assert client.get("k") == b"v"
        if how == "acl user and db":
            assert server.client(db=3).get("k") == b"v"
            assert server.client().get("k") is None  # not db 0
        client.close()
    finally:
        server.stop()


def test_a_valkey_tls_client_runs_natively(tls_server: RedisServer, engine: str) -> None:
    client = tls_server.client(family="valkey", socket_timeout=5)
    e = make_elector(client, engine, ttl=2.0)
    assert e.engine == engine
    with e:
        token = wait_until(e.token, 10, what="election")
        assert e.fence_set(token, "k", "tls") is True
    assert client.get("k") == b"tls"
    locker = redlease.RedisLocker(client, engine=engine)
    with locker.hold("job") as held:
        assert held.fencing_token > 0


def test_a_valkey_client_with_a_credential_provider_runs_on_python_and_says_why(
    redis_server: RedisServer,
) -> None:
    provider = valkey.UsernamePasswordCredentialProvider("default", "")
    client = redis_server.client(family="valkey", credential_provider=provider)
    e = redlease.Elector(client, "svc")
    assert e.engine == "python"
    assert "credential_provider" in e.engine_reason
    with pytest.raises(redlease.ConfigError, match="credential_provider"):
        redlease.Elector(client, "svc", engine="native")


def test_electors_on_one_valkey_client_share_one_twin_and_one_engine(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(family="valkey")
    a = redlease.Elector(client, "a")
    b = redlease.Elector(client, "b")
    assert a._core.engine is b._core.engine
    assert threaded(client) is threaded(client)
    assert isinstance(threaded(client).client, redis.Redis)
    assert threaded(client).family.name == "valkey"


def test_the_threaded_and_asyncio_front_ends_refuse_each_others_valkey_clients(
    redis_server: RedisServer,
) -> None:
    with pytest.raises(redlease.ConfigError, match=r"asyncio .*redlease\.aio"):
        redlease.Elector(redis_server.client(family="valkey", asyncio=True), "svc")
    with pytest.raises(redlease.ConfigError, match=r"redlease\.Elector"):
        redlease.aio.Elector(redis_server.client(family="valkey"), "svc")


def test_a_valkey_sentinel_replica_client_is_refused_with_the_reason(
    sentinel_set: Any,
) -> None:
    manager = sentinel_set.manager(family="valkey")
    replica = manager.slave_for(sentinel_set.service)
    with pytest.raises(redlease.ConfigError, match="replica"):
        redlease.Elector(replica, "svc")


# -- errors come in the client's family ---------------------------------------------


def test_a_redis_error_is_adopted_in_place_and_caught_by_both_families() -> None:
    family = family_of(valkey.Valkey())
    error = redis.exceptions.AskError("3999 127.0.0.1:6381")
    assert family.adopt(error) is error
    assert isinstance(error, valkey.exceptions.AskError)
    assert isinstance(error, valkey.exceptions.ResponseError)
    assert isinstance(error, redis.exceptions.AskError)
    assert error.node_addr == ("127.0.0.1", 6381)  # its own attributes kept
    assert type(error).__name__ == "AskError"
    # Our own subclasses find their family's class along their bases.
    ours = family.adopt(UnexpectedReply("fence_set answered [1, 2, 3]"))
    assert isinstance(ours, UnexpectedReply)
    assert isinstance(ours, valkey.exceptions.ResponseError)
    # Pickled (say, to another process) it is valkey-py's own class.
    back = pickle.loads(
        pickle.dumps(redis_error := family.adopt(redis.exceptions.TimeoutError("t")))
    )
    assert type(back) is valkey.exceptions.TimeoutError and back.args == redis_error.args
    # Anything else, and every error for redis-py, is left alone.
    other = ValueError("x")
    assert family.adopt(other) is other and type(other) is ValueError
    plain = redis.exceptions.ConnectionError("c")
    assert REDIS.adopt(plain) is plain and type(plain) is redis.exceptions.ConnectionError


def test_fenced_writes_and_pipelines_raise_valkey_errors(
    redis_server: RedisServer, engine: str
) -> None:
    client = redis_server.client(family="valkey", socket_timeout=1)
    e = make_elector(client, engine)
    client.set("text", "not a number")
    with pytest.raises(valkey.exceptions.ResponseError):
        e.fence_eval(1, "return redis.call('INCR', KEYS[1])", keys=["text"])
    with pytest.raises(valkey.exceptions.ResponseError):
        e.fence_pipeline(1).set("a", "1").eval(
            "return redis.call('INCR', KEYS[1])", keys=["text"]
        ).execute()
    redis_server.pause()
    try:
        with pytest.raises(valkey.exceptions.TimeoutError):
            e.fence_set(1, "k", "v")
    finally:
        redis_server.resume()
    redis_server.kill()
    with pytest.raises(valkey.exceptions.ConnectionError):
        e.fence_set(1, "k", "v")


def test_on_error_gets_valkey_errors(closed_port: ClosedPort, engine: str) -> None:
    client = valkey.Valkey(host="127.0.0.1", port=closed_port.port, socket_timeout=1)
    events = Events()
    e = make_elector(client, engine, observer=events.observer(), ttl=0.5)
    with e:
        errors = wait_until(lambda: events.values("error"), 10, what="an error reported")
    assert isinstance(errors[0], valkey.exceptions.ConnectionError), repr(errors[0])


def test_leader_on_an_unreachable_server_raises_a_valkey_error(
    closed_port: ClosedPort, engine: str
) -> None:
    client = valkey.Valkey(host="127.0.0.1", port=closed_port.port, socket_timeout=1)
    with pytest.raises(valkey.exceptions.ConnectionError):
        make_elector(client, engine).leader()


def test_a_valkey_lockers_redis_errors_are_valkey_errors(
    closed_port: ClosedPort, engine: str
) -> None:
    client = valkey.Valkey(host="127.0.0.1", port=closed_port.port, socket_timeout=1)
    locker = redlease.RedisLocker(client, engine=engine)
    with pytest.raises(valkey.exceptions.ConnectionError):
        locker.try_acquire("job")


def test_asyncio_valkey_writes_and_locks_raise_valkey_errors(
    redis_server: RedisServer, engine: str
) -> None:
    async def scenario() -> None:
        client = redis_server.client(family="valkey", asyncio=True, socket_timeout=1)
        e = redlease.aio.Elector(client, "svc", ttl=1.0, engine=engine)
        locker = redlease.aio.RedisLocker(client, engine=engine)
        try:
            await client.set("text", "x")
            with pytest.raises(valkey.exceptions.ResponseError):
                await e.fence_eval(1, "return redis.call('INCR', KEYS[1])", keys=["text"])
            async with locker.hold("job") as held:
                assert held.fencing_token > 0
            redis_server.kill()
            with pytest.raises(valkey.exceptions.ConnectionError):
                await e.fence_set(1, "k", "v")
            with pytest.raises(valkey.exceptions.ConnectionError):
                await locker.try_acquire("job")
        finally:
            await e.stop()
            await locker.close()
            await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 60))


# -- valkey-py is never forced on anyone ---------------------------------------------


def test_a_redis_py_user_never_imports_valkey(redis_server: RedisServer) -> None:
    code = f"""
import sys, redis, redlease, redlease.aio, redlease.metrics
client = redis.Redis(host="127.0.0.1", port={redis_server.address[1]})
e = redlease.Elector(client, "svc", ttl=1)
with e:
    import time
    while e.token() is None:
        time.sleep(0.01)
    assert e.fence_set(e.token(), "k", "v")
with redlease.RedisLocker(client).hold("job"):
    pass
assert not [m for m in sys.modules if m.split(".")[0] == "valkey"], "valkey imported"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
