"""TLS on the native engine: OpenSSL driven without the GIL, against real TLS servers.

Every server here is a TLS-only redis-server started by the test harness
(certificates minted by ``trustme``). Where both engines can be asked the
same question (does this certificate verify?) the ``engine`` fixture runs
the test on each: they must agree.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions as rex

import redlease
import redlease.aio
from engine_helpers import command
from helpers import (
    Events,
    ProcessContender,
    elected_token,
    gil_call_size,
    hold_gil_at_least,
    wait_until,
)
from redlease._engine import ACTIVE, LOST, execute_one
from redlease._testing import RedisServer, TLSMaterials
from redlease.lock import DEFAULT_PREFIX, RedisLocker
from tls_helpers import (
    SECRET_KEY_PASSWORD,
    ca_der,
    encrypted_client_key,
    garbage_file,
    never_elected,
    require_native_tls,
    tls_client,
)

pytestmark = pytest.mark.topology

MakeServer = Callable[..., RedisServer]


# -- the happy path -------------------------------------------------------------------


def test_auto_runs_a_tls_client_natively_and_it_elects_renews_fences_and_resigns(
    tls_server: RedisServer,
) -> None:
    require_native_tls()
    client = tls_client(tls_server)
    e = redlease.Elector(client, "tls", ttl=0.5)
    assert (e.engine, e.engine_reason) == ("native", "")
    with e:
        token = elected_token(e)
        run = e._core.run
        assert run is not None
        assert e.fence_set(token, "tls:state", "leader-wrote")
        assert client.get("tls:fence:applied") == str(token).encode()
        time.sleep(1.5)  # three TTLs: only renewals over TLS keep it
        assert e.token() == token
        assert run.keeper.state == ACTIVE
        assert run.keeper.renewals >= 5
        assert e.fence_hset(token, "tls:h", "f", 1)
    assert client.get("tls:state") == b"leader-wrote"
    assert not client.exists("tls:leader"), "stop() resigns"


def test_an_elector_with_a_short_renew_interval_leads_over_tls(
    tls_server: RedisServer, tls_engine: str
) -> None:
    # Its calls' bounds are short: a fresh connection's TLS handshake may
    # take all of one, and the reply must still be read (a step's minimum).
    e = redlease.Elector(
        tls_client(tls_server), "tls-short", ttl=2.0, renew_interval=0.02, engine=tls_engine
    )
    with e:
        elected_token(e)


def test_a_stale_token_is_fenced_out_over_tls(tls_server: RedisServer) -> None:
    require_native_tls()
    client = tls_client(tls_server)
    old = redlease.Elector(client, "tls", ttl=0.5, engine="native")
    with old:
        stale = elected_token(old)
    new = redlease.Elector(client, "tls", ttl=0.5, engine="native")
    with new:
        current = elected_token(new)
        assert current > stale
        assert not old.fence_set(stale, "tls:state", "stale")
        assert new.fence_set(current, "tls:state", "current")
    assert client.get("tls:state") == b"current"


def test_redis_locker_on_tls_keeps_the_lock_with_the_native_watchdog(
    tls_server: RedisServer,
) -> None:
    require_native_tls()
    client = tls_client(tls_server)
    locker = RedisLocker(client)
    try:
        assert (locker.engine, locker.engine_reason) == ("native", "")
        held = locker.try_acquire("job", ttl=0.3, auto_renew=True)
        time.sleep(1.0)
        assert client.pttl(f"{DEFAULT_PREFIX}key:job") > 0
        assert not held.done.is_set()
        held.release()
        assert not client.exists(f"{DEFAULT_PREFIX}key:job")
    finally:
        locker.close()


@pytest.mark.parametrize("form", ["ca_data_pem", "ca_data_der", "ca_path"])
def test_the_ca_given_as_data_or_as_a_directory_verifies_the_server(
    tls_server: RedisServer, tls_materials: TLSMaterials, tls_engine: str, form: str
) -> None:
    ca: dict[str, Any] = {
        "ca_data_pem": {"ssl_ca_data": tls_materials.ca_data},
        "ca_data_der": {"ssl_ca_data": ca_der(tls_materials)},
        "ca_path": {"ssl_ca_path": str(tls_materials.ca_path)},
    }[form]
    client = tls_client(tls_server, ssl_ca_certs=None, **ca)
    e = redlease.Elector(client, "tls", ttl=1.0, engine=tls_engine)
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "tls:state", form)
    assert client.get("tls:state") == form.encode()


def test_a_host_name_is_checked_against_the_certificate(
    make_tls_server: MakeServer, tls_engine: str
) -> None:
    # "localhost" is a name (SNI, name check), not an address.
    good = make_tls_server()
    e = redlease.Elector(tls_client(good, host="localhost"), "tls", engine=tls_engine)
    with e:
        elected_token(e)
    mismatched = make_tls_server(mismatched=True)
    events = Events()
    client = tls_client(mismatched, host="localhost", ssl_check_hostname=True)
    e = redlease.Elector(client, "tls", engine=tls_engine, observer=events.observer())
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.ConnectionError)
    assert "certificate verify failed" in str(error)
    assert "mismatch" in str(error).lower()


# -- certificates the client must reject ----------------------------------------------


def test_a_server_signed_by_another_ca_is_rejected_and_never_elected(
    tls_server: RedisServer, tls_materials: TLSMaterials, tls_engine: str
) -> None:
    events = Events()
    client = tls_client(tls_server, ssl_ca_certs=str(tls_materials.other_ca_file))
    e = redlease.Elector(
        client, "tls", ttl=0.5, acquire_interval=0.05, engine=tls_engine,
        observer=events.observer(),
    )  # fmt: skip
    assert e.engine == tls_engine
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.ConnectionError)
    assert "certificate verify failed" in str(error)
    assert not tls_client(tls_server).exists("tls:leader")


def test_a_hostname_mismatch_is_rejected_only_when_the_hostname_is_checked(
    make_tls_server: MakeServer, tls_engine: str
) -> None:
    server = make_tls_server(mismatched=True)  # a certificate for redis.invalid
    events = Events()
    checked = tls_client(server, ssl_check_hostname=True)
    e = redlease.Elector(checked, "tls", engine=tls_engine, observer=events.observer())
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.ConnectionError)
    assert "certificate verify failed" in str(error)
    assert "127.0.0.1" in str(error)

    unchecked = tls_client(server, ssl_check_hostname=False)
    e = redlease.Elector(unchecked, "tls", engine=tls_engine)
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "tls:state", "unchecked")


def test_cert_reqs_none_accepts_a_certificate_from_any_ca(
    make_tls_server: MakeServer, tls_materials: TLSMaterials, tls_engine: str
) -> None:
    server = make_tls_server(mismatched=True)
    client = tls_client(
        server, ssl_ca_certs=str(tls_materials.other_ca_file), ssl_cert_reqs="none"
    )
    e = redlease.Elector(client, "tls", engine=tls_engine)
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "tls:state", "unverified")


def test_a_tls_client_of_a_plain_server_fails_to_connect(
    redis_server: RedisServer, tls_engine: str
) -> None:
    events = Events()
    client = redis.Redis(
        host="127.0.0.1", port=redis_server.port, ssl=True, ssl_cert_reqs="none",
        socket_timeout=1, socket_connect_timeout=1,
    )  # fmt: skip
    e = redlease.Elector(
        client, "tls", acquire_interval=0.05, engine=tls_engine, observer=events.observer()
    )
    with e:
        error = never_elected(e, events)
    # The server takes the ClientHello for the start of a command and waits
    # for its end, or answers it in plain text: a timeout or a failed handshake.
    assert isinstance(error, (rex.ConnectionError, rex.TimeoutError))


def test_a_tls_handshake_that_is_never_answered_times_out_at_the_deadline(
    black_hole: Any,
) -> None:
    core = require_native_tls()
    from redlease._engine.conn.client import native_endpoint

    client = redis.Redis(host="127.0.0.1", port=black_hole.port, ssl=True, socket_timeout=0.3)
    endpoint, _ = native_endpoint(client)
    pool = core.Pool(core.Target(endpoint), 1)
    try:
        started = time.monotonic()
        with pytest.raises(rex.TimeoutError, match="connecting"):
            command(pool, ["PING"], 0.3)
        took = time.monotonic() - started
        assert 0.25 <= took < 1.0, f"the handshake gave up after {took:.2f} s"
        assert pool.connections == 0
    finally:
        pool.close()
    events = Events()
    e = redlease.Elector(client, "tls", ttl=0.5, engine="native", observer=events.observer())
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.TimeoutError)


# -- mutual TLS -----------------------------------------------------------------------


def test_mutual_tls_with_a_client_certificate_elects(
    make_tls_server: MakeServer, tls_engine: str
) -> None:
    server = make_tls_server("yes")
    client = tls_client(server)  # the test client certificate, from the harness
    assert client.connection_pool.connection_kwargs["ssl_certfile"]
    e = redlease.Elector(client, "tls", engine=tls_engine)
    with e:
        token = elected_token(e)
        assert e.fence_set(token, "tls:state", "mutual")


def test_mutual_tls_with_an_encrypted_key_and_its_password_elects(
    make_tls_server: MakeServer, tls_materials: TLSMaterials, tmp_path: Path, tls_engine: str
) -> None:
    server = make_tls_server("yes")
    key = encrypted_client_key(tls_materials, tmp_path, SECRET_KEY_PASSWORD)
    client = tls_client(server, ssl_keyfile=str(key), ssl_password=SECRET_KEY_PASSWORD)
    e = redlease.Elector(client, "tls", engine=tls_engine)
    assert SECRET_KEY_PASSWORD not in repr(e)
    with e:
        elected_token(e)


def test_mutual_tls_without_a_client_certificate_fails_to_connect(
    make_tls_server: MakeServer, tls_engine: str
) -> None:
    server = make_tls_server("yes")
    events = Events()
    client = tls_client(server, ssl_certfile=None, ssl_keyfile=None)
    e = redlease.Elector(
        client, "tls", acquire_interval=0.05, engine=tls_engine, observer=events.observer()
    )
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.ConnectionError)


def test_a_client_certificate_from_another_ca_is_refused_by_the_server(
    make_tls_server: MakeServer, tls_materials: TLSMaterials
) -> None:
    require_native_tls()
    server = make_tls_server("yes")
    events = Events()
    client = tls_client(
        server,
        ssl_certfile=str(tls_materials.other_client_cert_file),
        ssl_keyfile=str(tls_materials.other_client_key_file),
    )
    e = redlease.Elector(client, "tls", engine="native", observer=events.observer())
    with e:
        error = never_elected(e, events)
    assert isinstance(error, rex.ConnectionError)


# -- settings that cannot work: ConfigError up front --------------------------------------


def _bad_settings(m: TLSMaterials, d: Path) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """Each broken setting, and what the error must name."""
    missing = d / "missing.pem"
    garbage = garbage_file(d)
    return {
        "missing ca file": ({"ssl_ca_certs": str(missing)}, ["ssl_ca_certs", str(missing)]),
        "garbage ca file": ({"ssl_ca_certs": str(garbage)}, ["ssl_ca_certs", str(garbage)]),
        "garbage ca data": ({"ssl_ca_certs": None, "ssl_ca_data": "junk"}, ["ssl_ca_data"]),
        "missing ca dir": ({"ssl_ca_path": str(d / "nowhere")}, ["ssl_ca_path", "nowhere"]),
        "missing cert file": (
            {"ssl_certfile": str(missing), "ssl_keyfile": str(m.client_key_file)},
            ["ssl_certfile", str(missing)],
        ),
        "garbage cert file": (
            {"ssl_certfile": str(garbage), "ssl_keyfile": str(m.client_key_file)},
            ["ssl_certfile", str(garbage)],
        ),
        "garbage key file": (
            {"ssl_certfile": str(m.client_cert_file), "ssl_keyfile": str(garbage)},
            ["ssl_keyfile", str(garbage)],
        ),
        "key of another certificate": (
            {"ssl_certfile": str(m.client_cert_file), "ssl_keyfile": str(m.server_key_file)},
            ["ssl_keyfile", str(m.server_key_file), "does not match"],
        ),
    }


BAD = [
    "missing ca file",
    "garbage ca file",
    "garbage ca data",
    "missing ca dir",
    "missing cert file",
    "garbage cert file",
    "garbage key file",
    "key of another certificate",
]


@pytest.mark.parametrize("case", BAD)
def test_a_tls_file_that_cannot_be_used_is_a_config_error_naming_it(
    tls_materials: TLSMaterials, tmp_path: Path, case: str
) -> None:
    require_native_tls()
    settings, named = _bad_settings(tls_materials, tmp_path)[case]
    # No server: nothing is connected to, the settings fail when the engine is built.
    kwargs: dict[str, Any] = {"ssl_ca_certs": str(tls_materials.ca_file), **settings}
    client = redis.Redis(port=7, ssl=True, **kwargs)
    for make in (
        lambda: redlease.Elector(client, "tls"),
        lambda: redlease.Elector(client, "tls", engine="native"),
        lambda: RedisLocker(client),
    ):
        with pytest.raises(redlease.ConfigError) as info:
            make()
        message = str(info.value)
        for part in named:
            assert part in message, f"{part!r} not in {message!r}"


def test_a_wrong_key_password_is_a_config_error_that_never_shows_it(
    tls_materials: TLSMaterials, tmp_path: Path
) -> None:
    require_native_tls()
    key = encrypted_client_key(tls_materials, tmp_path, SECRET_KEY_PASSWORD)
    wrong = "wrong-" + SECRET_KEY_PASSWORD
    base = {"ssl": True, "ssl_ca_certs": str(tls_materials.ca_file)}
    cert = {"ssl_certfile": str(tls_materials.client_cert_file), "ssl_keyfile": str(key)}
    for password in (wrong, None):
        client = redis.Redis(port=7, **base, **cert, ssl_password=password)
        with pytest.raises(redlease.ConfigError) as info:
            redlease.Elector(client, "tls", engine="native")
        shown = "\n".join([str(info.value), repr(info.value), str(info.value.__cause__)])
        assert "ssl_keyfile" in shown and str(key) in shown
        assert SECRET_KEY_PASSWORD not in shown
        if password is None:
            assert "ssl_password" in shown
    # The right password builds; nothing shown of the elector or engine has it.
    client = redis.Redis(port=7, **base, **cert, ssl_password=SECRET_KEY_PASSWORD)
    e = redlease.Elector(client, "tls", engine="native")
    engine = e._core.engine
    shown = "\n".join([repr(e), repr(engine), repr(getattr(engine, "endpoint", None))])
    assert SECRET_KEY_PASSWORD not in shown


# -- a frozen TLS server ------------------------------------------------------------------


def test_a_frozen_tls_server_costs_the_term_at_its_deadline_and_bounds_every_call(
    tls_server: RedisServer,
) -> None:
    require_native_tls()
    ttl = 1.0
    socket_timeout = 0.5
    client = tls_client(tls_server, socket_timeout=socket_timeout)
    e = redlease.Elector(client, "tls", ttl=ttl, engine="native")
    terms: list[redlease.Term] = []

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term)
        term.wait()

    e.start(lead)
    try:
        wait_until(lambda: terms, timeout=5, what="election")
        term = terms[0]
        run = e._core.run
        assert run is not None
        keeper = run.keeper
        time.sleep(0.2)
        tls_server.pause()
        paused = time.monotonic()
        started = time.monotonic()
        with pytest.raises(rex.TimeoutError):
            e.fence_set(term.token, "tls:state", "frozen")
        took = time.monotonic() - started
        assert socket_timeout - 0.05 <= took < socket_timeout + 0.5, f"write took {took:.2f} s"
        assert wait_until(lambda: keeper.state == LOST, timeout=ttl + 2)
        lost_after = time.monotonic() - paused
        renew = e.config.renew_interval
        assert ttl - renew - 0.1 <= lost_after <= ttl + 0.5, f"lost {lost_after:.2f} s in"
        assert term.wait(2.0) and term.reason == "lost"
        assert e.token() is None
    finally:
        stopping = time.monotonic()
        e.stop()
        stopped_in = time.monotonic() - stopping
        tls_server.resume()
    assert stopped_in < 2.0, f"stop() took {stopped_in:.2f} s against a frozen server"


# -- the point of the native engine, on TLS ---------------------------------------------

GIL_NAME = "gil-tls"
GIL_TTL = 0.3


def start_tls_contender(server: RedisServer) -> ProcessContender:
    """An elector for the same name in another process, over TLS, reporting each election."""
    kwargs = tls_client(server).connection_pool.connection_kwargs
    settings = {
        key: kwargs[key]
        for key in ("host", "port", "ssl_ca_certs", "ssl_cert_reqs", "ssl_check_hostname")
    }
    client = f"client = redis.Redis(ssl=True, socket_timeout=2, **{settings!r})"
    return ProcessContender(client, GIL_NAME, GIL_TTL)


@pytest.fixture
def tls_contender(tls_server: RedisServer) -> Iterator[Callable[[], ProcessContender]]:
    started: list[ProcessContender] = []

    def start() -> ProcessContender:
        started.append(start_tls_contender(tls_server))
        return started[-1]

    try:
        yield start
    finally:
        for contender in started:
            contender.close()


def test_a_native_tls_leader_keeps_its_lease_through_a_long_gil_holding_call(
    tls_server: RedisServer, tls_contender: Callable[[], ProcessContender]
) -> None:
    require_native_tls()
    n = gil_call_size(1.5)
    client = tls_client(tls_server)
    terms: list[redlease.Term] = []

    def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
        terms.append(term)
        term.wait()

    e = redlease.Elector(client, GIL_NAME, ttl=GIL_TTL)
    assert e.engine == "native"
    e.start(lead)
    try:
        wait_until(lambda: terms, timeout=5, what="our election")
        contender = tls_contender()  # starts once we lead: it must not win the first election
        token = terms[0].token
        held = hold_gil_at_least(n, 3.2 * GIL_TTL)  # up to five TTLs without the GIL
        assert held > 3 * GIL_TTL, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        assert not terms[0].ended()
        assert client.get(f"{GIL_NAME}:leader") == e.instance_id.encode()
        assert contender.elections() == [], "the other process took over during the call"
    finally:
        e.stop()


# -- asyncio ---------------------------------------------------------------------------


def test_the_asyncio_elector_on_a_tls_client_runs_natively(
    tls_server: RedisServer, tls_materials: TLSMaterials
) -> None:
    require_native_tls()

    async def scenario() -> None:
        client = redis.asyncio.Redis(
            host="127.0.0.1",
            port=tls_server.port,
            ssl=True,
            ssl_ca_certs=str(tls_materials.ca_file),
            ssl_cert_reqs="required",
            socket_timeout=5,
        )
        e = redlease.aio.Elector(client, "aio-tls", ttl=0.5)
        assert (e.engine, e.engine_reason) == ("native", "")
        seen: list[tuple[int, bool]] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            seen.append((term.token, await fencer.set("aio-tls:state", "leader-wrote")))

        stop = asyncio.Event()
        task = asyncio.ensure_future(e.run(lead, stop=stop))
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await task
        assert seen and seen[0][1]
        assert await client.get("aio-tls:state") == b"leader-wrote"
        assert not await client.exists("aio-tls:leader")
        await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 30))


# -- the core on TLS: pools, keepers, idle connections ----------------------------------


@pytest.fixture
def tls_endpoint(tls_server: RedisServer) -> Any:
    require_native_tls()
    from redlease._engine.conn.client import native_endpoint

    endpoint, why = native_endpoint(tls_client(tls_server))
    assert endpoint is not None and endpoint.tls is not None, why
    return endpoint


def test_a_pool_moves_large_values_and_serves_threads_over_tls(tls_endpoint: Any) -> None:
    core = require_native_tls()
    target = core.Target(tls_endpoint)
    assert target.tls and "tls=True" in repr(target)
    pool = core.Pool(target, 3)
    try:
        big = os.urandom(3 * 1024 * 1024)  # many TLS records each way
        assert command(pool, ["SET", "big", big], 5.0) == b"OK"
        assert command(pool, ["GET", "big"], 5.0) == big
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                for j in range(200):
                    value = f"{i}-{j}".encode() * (1 + j % 50)
                    assert command(pool, ["SET", f"k{i}", value], 5.0) == b"OK"
                    assert command(pool, ["GET", f"k{i}"], 5.0) == value
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert 1 <= pool.connections <= 3
    finally:
        pool.close()


def test_an_idle_tls_connection_is_kept_and_a_closed_one_replaced(
    tls_endpoint: Any, tls_server: RedisServer
) -> None:
    core = require_native_tls()
    pool = core.Pool(core.Target(tls_endpoint), 1)
    try:
        first = command(pool, ["CLIENT", "ID"], 5.0)
        time.sleep(1.3)  # past the idle probe: TLS housekeeping alone must not cost it
        assert command(pool, ["CLIENT", "ID"], 5.0) == first
        tls_client(tls_server).client_kill_filter(_id=first)
        time.sleep(1.3)
        assert command(pool, ["CLIENT", "ID"], 5.0) != first
    finally:
        pool.close()


def test_a_native_keeper_renews_over_tls_past_three_ttls(tls_endpoint: Any) -> None:
    core = require_native_tls()
    from redlease._engine.engines.native import NativeEngine
    from redlease._scripts import load

    engine = NativeEngine(tls_endpoint, write_timeout=2.0)
    try:
        keys = ["k:leader", "k:fence", "k:fence:applied"]
        token, _, _ = execute_one(engine, (load("acquire"), keys, ["me", 300]), timeout=2.0)[0]
        keeper = engine.keeper((load("renew"), ["k:leader"], ["me", 300]), interval=0.1, ttl=0.3)
        # On a fixed address the engine's shared renewer keeps it, over TLS too.
        assert isinstance(keeper, core.Lease)
        keeper.begin(token, time.monotonic())
        time.sleep(1.0)
        assert keeper.state == ACTIVE
        assert keeper.renewals >= 6
    finally:
        engine.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_leaves_the_parents_tls_connections_alone(tls_endpoint: Any) -> None:
    core = require_native_tls()
    from redlease._engine.engines.native import NativeEngine
    from redlease._scripts import load

    engine = NativeEngine(tls_endpoint, write_timeout=2.0)
    pool = core.Pool(core.Target(tls_endpoint), 1)
    try:
        keys = ["f:leader", "f:fence", "f:fence:applied"]
        token, _, _ = execute_one(engine, (load("acquire"), keys, ["me", 500]), timeout=2.0)[0]
        keeper = engine.keeper((load("renew"), ["f:leader"], ["me", 500]), interval=0.02, ttl=0.5)
        keeper.begin(token, time.monotonic())
        parent_id = command(pool, ["CLIENT", "ID"], 2.0)
        wait_until(lambda: keeper.renewals >= 3, 2.0)
        pid = os.fork()  # the keeper thread may be inside OpenSSL right now
        if pid == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                # The inherited pool makes a TLS connection of its own.
                child_id = command(pool, ["CLIENT", "ID"], 2.0)
                if child_id != parent_id and keeper.token == 0:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # Nothing was said on the parent's connections in the child's name.
        assert command(pool, ["CLIENT", "ID"], 2.0) == parent_id
        renewals = keeper.renewals
        time.sleep(0.3)
        assert keeper.state == ACTIVE and keeper.renewals > renewals
    finally:
        pool.close()
        engine.close()


# -- a TLS server that stalls or lies, under a fenced write ----------------------------

STALL_BOUND = 0.5
"""The client's socket_timeout in the stalled-handshake tests: the write's bound."""


def fenced_write_error(client: Any, engine: str, front: str) -> tuple[BaseException, float]:
    """The error one fenced write on ``client`` (threaded or asyncio) raised, and its time."""
    started = time.monotonic()
    try:
        if front == "sync":
            redlease.Elector(client, "tls", engine=engine).fence_set(1, "tls:k", "v")
        else:

            async def write() -> None:
                e = redlease.aio.Elector(client, "tls", engine=engine)
                try:
                    await e.fence_set(1, "tls:k", "v")
                finally:
                    await e.stop()
                    await client.aclose()

            asyncio.run(asyncio.wait_for(write(), 30))
    except Exception as exc:
        return exc, time.monotonic() - started
    pytest.fail("the fenced write returned instead of raising")


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_fenced_write_whose_tls_handshake_stalls_ends_at_its_bound(
    black_hole: Any, tls_engine: str, front: str
) -> None:
    module: Any = redis if front == "sync" else redis.asyncio
    client = module.Redis(
        host="127.0.0.1", port=black_hole.port, ssl=True,
        socket_timeout=STALL_BOUND, socket_connect_timeout=STALL_BOUND,
    )  # fmt: skip
    error, took = fenced_write_error(client, tls_engine, front)
    assert isinstance(error, (rex.TimeoutError, rex.ConnectionError)), repr(error)
    assert took < STALL_BOUND + 1.5, f"the write gave up after {took:.2f} s"
    assert black_hole.accepted >= 1  # it did connect, and the handshake went unanswered


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_a_fenced_write_to_a_certificate_for_another_host_is_refused_unsent(
    make_tls_server: MakeServer, tls_engine: str, front: str
) -> None:
    server = make_tls_server(mismatched=True)  # a certificate for redis.invalid
    client = server.client(
        asyncio=front == "asyncio", ssl_check_hostname=True,
        socket_timeout=2, socket_connect_timeout=2,
    )  # fmt: skip
    error, took = fenced_write_error(client, tls_engine, front)
    assert isinstance(error, rex.ConnectionError), repr(error)
    assert "certificate verify failed" in str(error), str(error)
    assert took < 2.0, f"refused after {took:.2f} s"
    assert not tls_client(server, ssl_check_hostname=False).exists("tls:k")
