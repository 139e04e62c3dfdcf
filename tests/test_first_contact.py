"""First contact (DESIGN.md section 16): a client pointed at the wrong server fails at start().

What retrying cannot mend (a wrong or missing password, an ACL user without
the scripts, a db index out of range, a peer that does not speak RESP) is
raised by ``Elector.start()`` and ``run()``, ``aio.Elector.start()`` (and its
``run()`` and ``async with``), ``Partitions.start()`` and
``aio.Partitions.start()``, as the client family's own exception, naming
the endpoint and never the password. What it can mend (a refused port, a
server that never answers) is not: start() returns and the run retries. The
contact is made once per connection pool: a later start on the same client
makes none, and a failure after it is handled as every run failure is.

Every case runs on both engines and both client families, against servers
and listeners the tests start.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import redlease
import redlease.aio
from helpers import (
    HTTP_400,
    LOOPBACK,
    BlackHole,
    ClosedPort,
    answering,
    elected_token,
    family_base_error,
    family_errors,
    wait_until,
)
from redlease._engine.rules import replies, replytable
from redlease._testing import RedisServer
from redlease._testing.fake import FakeRedis, client_of

pytestmark = [pytest.mark.usefixtures("engines_closed"), pytest.mark.timeout(60)]

PASSWORD = "s3cret-first-contact"
WRONG = "wr0ng-first-contact"
TTL = 1.0


@pytest.fixture
def http_port() -> Iterator[int]:
    """A loopback port that answers like an HTTP server."""
    with answering(HTTP_400) as port:
        yield port


@pytest.fixture
def locked_server(redis_server: RedisServer) -> RedisServer:
    """``redis_server`` with ``requirepass`` set, and an ACL user who may not run scripts."""
    admin = redis_server.client()
    admin.execute_command(
        "ACL", "SETUSER", "noscripts", "on", f">{PASSWORD}", "~*", "&*", "+@all", "-@scripting"
    )
    admin.config_set("requirepass", PASSWORD)
    admin.close()
    return redis_server


# -- the cases: (client settings, the family's exception class name) ---------------------


def _wrong_password(server: RedisServer) -> dict[str, Any]:
    return {"port": server.port, "password": WRONG}


def _no_password(server: RedisServer) -> dict[str, Any]:
    return {"port": server.port}


def _no_scripts(server: RedisServer) -> dict[str, Any]:
    return {"port": server.port, "username": "noscripts", "password": PASSWORD}


def _db_out_of_range(server: RedisServer) -> dict[str, Any]:
    return {"port": server.port, "password": PASSWORD, "db": 9999}


REFUSED: dict[str, tuple[Callable[[RedisServer], dict[str, Any]], str]] = {
    "wrong_password": (_wrong_password, "AuthenticationError"),
    "no_password": (_no_password, "AuthenticationError"),
    "no_script_permission": (_no_scripts, "NoPermissionError"),
    "db_out_of_range": (_db_out_of_range, "ResponseError"),
}


def _make(family: str, *, asyncio: bool = False, **settings: Any) -> Any:
    """A client of ``family`` for the loopback address and ``settings`` (5 s timeouts)."""
    settings = {"socket_timeout": 5, "socket_connect_timeout": 5, **settings}
    if family == "valkey":
        import valkey
        import valkey.asyncio

        cls: Any = valkey.asyncio.Valkey if asyncio else valkey.Valkey
    else:
        import redis
        import redis.asyncio

        cls = redis.asyncio.Redis if asyncio else redis.Redis
    return cls(host=LOOPBACK, **settings)


def _check_raised(exc: BaseException, family: str, cls_name: str, port: int) -> None:
    assert isinstance(exc, getattr(family_errors(family), cls_name)), repr(exc)
    text = str(exc)
    assert f"{LOOPBACK}:{port}" in text, text
    assert PASSWORD not in text and WRONG not in text, text


def _start_raises(start: Callable[[], object], family: str, cls_name: str, port: int) -> None:
    with pytest.raises(Exception) as caught:
        start()
    _check_raised(caught.value, family, cls_name, port)


# -- threaded faces --------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(REFUSED))
def test_elector_start_and_run_raise_what_retrying_cannot_mend(
    locked_server: RedisServer, engine: str, family: str, case: str
) -> None:
    settings, cls_name = REFUSED[case]
    client = _make(family, **settings(locked_server))
    elector = redlease.Elector(client, "fc:elect", ttl=TTL, engine=engine)
    _start_raises(elector.start, family, cls_name, locked_server.port)
    assert elector.token() is None
    # Nothing was left running: run() contacts again (a refusal is not remembered) and raises.
    _start_raises(lambda: elector.run(stop=threading.Event()), family, cls_name,
                  locked_server.port)
    # ``with elector:`` starts it: the same refusal.
    with pytest.raises(Exception) as caught:
        elector.__enter__()
    _check_raised(caught.value, family, cls_name, locked_server.port)
    client.close()


@pytest.mark.parametrize("case", list(REFUSED))
def test_partitions_start_raises_what_retrying_cannot_mend(
    locked_server: RedisServer, engine: str, family: str, case: str
) -> None:
    settings, cls_name = REFUSED[case]
    client = _make(family, **settings(locked_server))
    group = redlease.Partitions(client, "fc:group", 2, ttl=TTL, engine=engine)
    _start_raises(group.start, family, cls_name, locked_server.port)
    assert group.owned() == {}
    group.stop(1)  # nothing runs: returns at once
    client.close()


def test_a_peer_that_does_not_speak_resp_is_raised(
    http_port: int, engine: str, family: str
) -> None:
    client = _make(family, port=http_port)
    elector = redlease.Elector(client, "fc:http", ttl=TTL, engine=engine)
    _start_raises(elector.start, family, "InvalidResponse", http_port)
    group = redlease.Partitions(client, "fc:http-group", 2, ttl=TTL, engine=engine)
    _start_raises(group.start, family, "InvalidResponse", http_port)
    client.close()


def test_a_refused_port_is_retried_until_a_server_appears(engine: str, family: str) -> None:
    closed = ClosedPort()
    port = closed.port
    client = _make(family, port=port)
    elector = redlease.Elector(client, "fc:refused", ttl=TTL, engine=engine)
    try:
        elector.start()  # refused: the run retries, start() does not raise
        assert elector.token() is None
        closed.close()
        server = RedisServer(port_picker=lambda: port)
        server.start()
        try:
            assert elected_token(elector, timeout=20) > 0
        finally:
            elector.stop(10)
            server.stop()
    finally:
        closed.close()
        client.close()


def test_a_server_that_never_answers_does_not_hang_start(
    black_hole: BlackHole, engine: str, family: str
) -> None:
    client = _make(family, port=black_hole.port, socket_timeout=60)
    elector = redlease.Elector(client, "fc:hole", ttl=TTL, engine=engine)
    began = time.monotonic()
    elector.start()  # a timeout is retried: start() returns once its bound passed
    elector.stop(10)
    # Bounded by the elector's acquire bound (a third of the TTL), not the socket's 60 s.
    assert time.monotonic() - began < 20
    assert elector.token() is None
    group = redlease.Partitions(client, "fc:hole-group", 2, ttl=TTL, engine=engine)
    group.start()
    group.stop(10)
    client.close()


# -- the table, entry by entry, on both engines --------------------------------------------


def _wire(known: str) -> bytes:
    """The error reply a server sends for a ``REFUSALS`` entry: ``-CODE text`` or ``-ERR text``."""
    if known.isupper():
        return b"-%s the server says no\r\n" % known.encode()
    return b"-ERR %s\r\n" % known.encode()


@pytest.mark.parametrize(
    "known", [known for known, _fix in replytable.REFUSALS if known != replytable.NOT_RESP]
)
def test_every_refusal_of_the_table_is_raised_by_start(
    fake: FakeRedis, engine: str, family: str, known: str
) -> None:
    """Each entry of ``replytable.REFUSALS``, answered to the first contact, is raised by
    start() on both engines (an entry added is covered without another line); the peer
    that is not RESP is the HTTP listener's test above."""
    fake.script("leader", _wire(known))
    with client_of(fake, 5, family) as client:
        elector = redlease.Elector(client, "fc:table", ttl=TTL, engine=engine)
        with pytest.raises(family_base_error(family)) as caught:
            elector.start()
        assert replies.refusal_of(caught.value) is not None
        assert f"{LOOPBACK}:{fake.port}" in str(caught.value)
    assert fake.runs("leader") == 1


@pytest.mark.parametrize("code", ["LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN"])
def test_what_retrying_mends_is_not_raised_by_start(
    fake: FakeRedis, engine: str, family: str, code: str
) -> None:
    fake.script("leader", b"-%s not now\r\n" % code.encode())
    with client_of(fake, 5, family) as client:
        elector = redlease.Elector(client, "fc:mends", ttl=TTL, engine=engine)
        elector.start()
        elector.stop(10)
    assert fake.runs("leader") == 1


# -- once per connection pool ----------------------------------------------------------------


class _Errors(redlease.Observer):
    def __init__(self) -> None:
        self.errors: list[Exception] = []

    def on_error(self, exc: Exception) -> None:
        self.errors.append(exc)


def test_the_contact_is_made_once_per_pool(
    redis_server: RedisServer, engine: str, family: str
) -> None:
    """After one start on a client contacted its server, later starts on it make no round
    trip: the password changed under it, a second elector on the same client starts (and
    reports the failures as any run does) while a new client with the same settings raises."""
    admin = redis_server.client()
    admin.config_set("requirepass", PASSWORD)
    admin = redis_server.client(password=PASSWORD)
    client = _make(family, port=redis_server.port, password=PASSWORD)
    first = redlease.Elector(client, "fc:once-1", ttl=TTL, engine=engine)
    first.start()
    assert elected_token(first) > 0
    first.stop(10)

    admin.config_set("requirepass", "another-" + PASSWORD)
    admin.client_kill_filter(_type="normal", skipme=True)  # every connection authenticates again

    observer = _Errors()
    second = redlease.Elector(client, "fc:once-2", ttl=TTL, engine=engine, observer=observer)
    second.start()  # no contact: nothing raised; the run meets the refusal and reports it
    try:
        refused = family_errors(family).AuthenticationError
        # (A connection killed above may be reported first, as a ConnectionError.)
        wait_until(
            lambda: any(isinstance(exc, refused) for exc in observer.errors),
            timeout=10,
            what="the run's refusal reported to on_error",
        )
        assert second.token() is None
    finally:
        second.stop(10)
    fresh = _make(family, port=redis_server.port, password=PASSWORD)
    _start_raises(
        redlease.Elector(fresh, "fc:once-3", ttl=TTL, engine=engine).start,
        family,
        "AuthenticationError",
        redis_server.port,
    )
    fresh.close()
    client.close()
    admin.close()


def test_a_second_elector_on_a_client_sends_no_contact(
    redis_server: RedisServer, engine: str, family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted at the engine the electors share: the first start sends one contact (a read
    of who leads; the runs themselves never send one), the next ten on the client none."""
    client = _make(family, port=redis_server.port)
    electors = [
        redlease.Elector(client, f"fc:count-{i}", ttl=TTL, engine=engine) for i in range(11)
    ]
    shared = electors[0]._core.engine
    assert all(elector._core.engine is shared for elector in electors)
    reads: list[object] = []
    real = shared.call_one

    def counted(script: Any, *args: Any) -> Any:
        if script.name == "leader":
            reads.append(args)
        return real(script, *args)

    monkeypatch.setattr(shared, "call_one", counted)
    try:
        electors[0].start()
        assert len(reads) == 1
        for elector in electors[1:]:
            elector.start()
        assert len(reads) == 1
    finally:
        for elector in electors:
            elector.stop(10)
        client.close()


# -- asyncio faces ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(REFUSED))
def test_aio_faces_raise_what_retrying_cannot_mend(
    locked_server: RedisServer, engine: str, family: str, case: str
) -> None:
    settings, cls_name = REFUSED[case]
    port = locked_server.port

    async def main() -> None:
        client = _make(family, asyncio=True, **settings(locked_server))
        try:
            elector = redlease.aio.Elector(client, "fc:aio", ttl=TTL, engine=engine)
            _start_raises(elector.start, family, cls_name, port)
            with pytest.raises(Exception) as caught:
                await elector.run(stop=asyncio.Event())
            _check_raised(caught.value, family, cls_name, port)
            with pytest.raises(Exception) as caught:
                async with elector:
                    pass
            _check_raised(caught.value, family, cls_name, port)
            group = redlease.aio.Partitions(client, "fc:aio-group", 2, ttl=TTL, engine=engine)
            with pytest.raises(Exception) as caught:
                await group.start()
            _check_raised(caught.value, family, cls_name, port)
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_aio_start_retries_a_refused_port(engine: str, family: str) -> None:
    async def main() -> None:
        closed = ClosedPort()
        client = _make(family, asyncio=True, port=closed.port)
        try:
            elector = redlease.aio.Elector(client, "fc:aio-refused", ttl=TTL, engine=engine)
            elector.start()
            assert elector.token() is None
            await asyncio.wait_for(elector.stop(), 10)
        finally:
            closed.close()
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 30))


# -- locks: they raised at once before, and still do --------------------------------------------


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_lock_raises_a_refusal_at_once_naming_the_endpoint(
    locked_server: RedisServer, engine: str, family: str, case: str
) -> None:
    settings, cls_name = REFUSED[case]
    client = _make(family, **settings(locked_server))
    locker = redlease.RedisLocker(client, engine=engine)
    _start_raises(lambda: locker.try_acquire("fc:lock"), family, cls_name, locked_server.port)
    client.close()


def test_a_lock_on_a_refused_port_raises_the_connection_error(
    engine: str, family: str
) -> None:
    closed = ClosedPort()
    client = _make(family, port=closed.port)
    try:
        with pytest.raises(family_errors(family).ConnectionError):
            redlease.RedisLocker(client, engine=engine).try_acquire("fc:lock")
    finally:
        closed.close()
        client.close()
