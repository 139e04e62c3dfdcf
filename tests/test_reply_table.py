"""Both engines give the same outcome for every reply at every call site (DESIGN.md section 13).

The cases come from the reply table (``redlease._engine.rules.replytable.CODES``):
every error code it names (and, where the table reads it there, the same
code wrapped in a script error as Redis 6 sends it), plus the replies that
are not codes: the site's own answer, another error, a RESP3 null and an
array no script of ours gives. Each case runs once per engine against its
own ``FakeRedis`` (a client at a fixed address) and must end the same way on
both: the same return value or the same exception class, and the same
number of script calls sent. A code added to the table is covered here
without another line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis.asyncio

import redlease
import redlease.aio
from helpers import NAME, Events, RunThread, Terms, require_native, require_probe, wait_until
from redlease._engine.rules import replytable
from redlease._testing.fake import FakeRedis, Reply, array, client_of, lock_won, won

pytestmark = pytest.mark.timeout(60)

TTL = 0.3
"""A short lease: the elector's cases retry and renew within a fraction of a second."""

_WRAP = b"ERR Error running script (call to f_%s): @user_script:1: -%s"
_TEXT = {"MOVED": b"3999 127.0.0.1:1", "ASK": b"3999 127.0.0.1:1"}


def _error(code: str) -> bytes:
    return b"-%s %s\r\n" % (code.encode(), _TEXT.get(code, b"the server says no"))


def _replies() -> dict[str, bytes | None]:
    """Every reply a case sends, by name; None: the site's own answer (a success)."""
    cases: dict[str, bytes | None] = {"answer": None}
    for code, _kind, wrapped in replytable.CODES:
        cases[code.lower()] = _error(code)
        if wrapped:
            inner = _error(code)[1:-2]
            cases[f"wrapped_{code.lower()}"] = b"-" + _WRAP % (b"0" * 40, inner) + b" \r\n"
    cases["other_error"] = b"-ERR something else\r\n"
    cases["resp3_null"] = b"_\r\n"
    cases["foreign_array"] = b"*3\r\n:1\r\n:2\r\n:3\r\n"
    return cases


REPLIES = _replies()


def outcome(call: Callable[[], Any]) -> object:
    """What ``call()`` ended in: a plain value, the class of what it returned, or what it raised."""
    try:
        value = call()
    except Exception as exc:
        return type(exc)
    if value is None or isinstance(value, (bool, int, list)):
        return value
    return f"a {type(value).__name__}"


async def outcome_async(call: Callable[[], Any]) -> object:
    try:
        value = await call()
    except Exception as exc:
        return type(exc)
    if value is None or isinstance(value, (bool, int, list)):
        return value
    return f"a {type(value).__name__}"


# -- the call sites: each answers the reply, returns (outcome, script calls sent) --------

Site = Callable[[FakeRedis, Any, str, Reply | None], tuple[object, object]]


def _queue(fake: FakeRedis, script: str, reply: Reply | None, n: int = 1) -> None:
    if reply is not None:
        fake.script(script, *([reply] * n))


def _pipelined_runs(fake: FakeRedis, script: str, sent: int) -> int:
    """The runs of ``script`` once the fake has read the ``sent`` commands a pipeline wrote at once.

    An engine may stop reading at an error the client library raises at once
    (redis-py raises LOADING as a connection error and drops the connection),
    so the rest of the batch, written before the first reply, can still be in
    the fake's socket when the call returns; the count waits for it (bounded:
    an engine that sent fewer is seen sending fewer).
    """
    deadline = time.monotonic() + 2.0
    while fake.runs(script) < sent and time.monotonic() < deadline:
        time.sleep(0.005)
    return fake.runs(script)


def _fencer(client: Any, engine: str) -> redlease.Fencer:
    return redlease.Fencer(redlease.Elector(client, NAME, ttl=TTL, engine=engine), 1)


def fenced_set(fake: FakeRedis, client: Any, engine: str, r: Reply | None) -> tuple[object, object]:
    _queue(fake, "fence_set", r)
    return outcome(lambda: _fencer(client, engine).set("k", "v")), fake.runs("fence_set")


def fenced_hset(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    _queue(fake, "fence_hset", r)
    return outcome(lambda: _fencer(client, engine).hset("h", "f", "v")), fake.runs("fence_hset")


def fenced_eval(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    # Not a script of lua/: the fake answers its EVALSHA NOSCRIPT, then its EVAL this.
    _queue(fake, "<eval>", r)
    body = "return redis.call('SET', KEYS[2], ARGV[2])"
    return outcome(lambda: _fencer(client, engine).eval(body, ["k"], ["v"])), fake.runs("<eval>")


def pipeline(fake: FakeRedis, client: Any, engine: str, r: Reply | None) -> tuple[object, object]:
    _queue(fake, "fence_set", r, 2)
    pipe = _fencer(client, engine).pipeline().set("a", "1").set("b", "2")
    return outcome(pipe.execute), _pipelined_runs(fake, "fence_set", 2)


def lock_acquire(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    fake.script("lock_acquire", lock_won(1) if r is None else r)
    locker = redlease.RedisLocker(client, engine=engine)
    return outcome(lambda: locker.try_acquire("x")), fake.runs("lock_acquire")


def _held_lock(fake: FakeRedis, client: Any, engine: str) -> Any:
    fake.script("lock_acquire", lock_won(1))
    return redlease.RedisLocker(client, engine=engine).try_acquire("x")


def lock_release(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    held = _held_lock(fake, client, engine)
    _queue(fake, "lock_release", r)
    return outcome(held.release), fake.runs("lock_release")


def lock_refresh(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    held = _held_lock(fake, client, engine)
    _queue(fake, "lock_refresh", r)
    return outcome(held.refresh), fake.runs("lock_refresh")


_PERMIT = array(b":1\r\n", b":1000\r\n")


def semaphore_acquire(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    fake.script("sem_acquire", _PERMIT if r is None else r)
    sem = redlease.RedisLocker(client, engine=engine).semaphore("s", 2)
    return outcome(sem.try_acquire), fake.runs("sem_acquire")


def semaphore_release(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    fake.script("sem_acquire", _PERMIT)
    permit = redlease.RedisLocker(client, engine=engine).semaphore("s", 2).try_acquire()
    _queue(fake, "sem_release", r)
    return outcome(permit.release), fake.runs("sem_release")


def _run_async(fake: FakeRedis, engine: str, scenario: Callable[[Any], Any]) -> object:
    async def main() -> object:
        client = redis.asyncio.Redis(port=fake.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            fencer = redlease.aio.Fencer(
                redlease.aio.Elector(client, NAME, ttl=TTL, engine=engine), 1
            )
            return await outcome_async(lambda: scenario(fencer))
        finally:
            await client.aclose()

    return asyncio.run(asyncio.wait_for(main(), 20))


def asyncio_write(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    _queue(fake, "fence_set", r)
    return _run_async(fake, engine, lambda f: f.set("k", "v")), fake.runs("fence_set")


def asyncio_pipeline(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    _queue(fake, "fence_set", r, 2)
    got = _run_async(fake, engine, lambda f: f.pipeline().set("a", "1").set("b", "2").execute())
    return got, _pipelined_runs(fake, "fence_set", 2)


def _errors(events: Events) -> list[type[BaseException]]:
    return [type(exc) for exc in events.values("error")]


def elector_acquire(
    fake: FakeRedis, client: Any, engine: str, r: Reply | None
) -> tuple[object, object]:
    """The first acquire answered the reply, the next ones elect: what was reported, and
    how many acquires it took."""
    _queue(fake, "acquire", r)
    fake.script("acquire", won(1))
    events, terms = Events(), Terms()
    # An acquire's deadline is the renewal interval (TTL/3): a long TTL gives it
    # the client's 1 s, and a short acquire interval keeps the retry quick.
    elector = redlease.Elector(
        client, NAME, ttl=3.0, acquire_interval=0.05, engine=engine, observer=events.observer()
    )
    run = RunThread(elector, terms)
    try:
        wait_until(lambda: terms.terms, 15, what="an election")
        sent = fake.runs("acquire")
    finally:
        run.stop()
    return _errors(events), sent


def renewal(fake: FakeRedis, client: Any, engine: str, r: Reply | None) -> tuple[object, object]:
    """The first renewal answered the reply: whether the term ended, and what was reported.

    Renewals are sent on a clock, so their count is compared only where the
    reply ends the term (then exactly one renewal was sent).
    """
    fake.script("acquire", won(1))
    _queue(fake, "renew", r)
    events, terms = Events(), Terms()
    elector = redlease.Elector(client, NAME, ttl=TTL, engine=engine, observer=events.observer())
    run = RunThread(elector, terms)
    try:
        wait_until(lambda: terms.terms, 15, what="an election")
        wait_until(
            lambda: events.count("stepped_down") or fake.runs("renew") >= 3, 15, what="renewals"
        )
        ended = bool(events.count("stepped_down"))
        sent: object = fake.runs("renew") if ended else "on its clock"
    finally:
        run.stop()
    return (ended, _errors(events)), sent


SITES: dict[str, Site] = {
    "fenced write": fenced_set,
    "fenced hset": fenced_hset,
    "fenced eval": fenced_eval,
    "pipeline": pipeline,
    "elector acquire": elector_acquire,
    "renewal": renewal,
    "lock acquire": lock_acquire,
    "lock release": lock_release,
    "lock refresh": lock_refresh,
    "semaphore acquire": semaphore_acquire,
    "semaphore release": semaphore_release,
    "asyncio write": asyncio_write,
    "asyncio pipeline": asyncio_pipeline,
}


def test_every_site_of_the_table_is_driven() -> None:
    driven = {
        name.replace("fenced hset", "fenced write").replace("fenced eval", "fenced write")
        for name in SITES
    }
    assert set(replytable.SITES) <= driven


@pytest.fixture(scope="module")
def native_built() -> Iterator[None]:
    require_native()
    yield


# Every site on redis-py's clients; the threaded sites on valkey-py's too (the asyncio
# sites take a redis.asyncio client: valkey's asyncio face is tests/test_valkey.py's).
_SITE_FAMILIES = [(site, "redis") for site in SITES] + [
    (site, "valkey") for site in SITES if not site.startswith("asyncio")
]


@pytest.mark.parametrize("reply", list(REPLIES))
@pytest.mark.parametrize(("site", "family"), _SITE_FAMILIES)
def test_both_engines_end_the_same(native_built: None, site: str, reply: str, family: str) -> None:
    for attempt in range(3):
        got: dict[str, tuple[object, object]] = {}
        try:
            for engine in ("python", "native"):
                with FakeRedis() as fake, client_of(fake, 1.0, family) as client:
                    got[engine] = SITES[site](fake, client, engine, REPLIES[reply])
        except AssertionError as exc:
            # A site that never reached what it tests (no election within its
            # 15 s wait, seen once on a loaded host, where a 0.1 s deadline is
            # short) is tried again, like a timeout below; on the last try it fails.
            if attempt == 2 or not str(exc).startswith("timed out after"):
                raise
            continue
        # A renewal's deadline is its interval (0.1 s here), which a loaded host
        # can stall the fake past. A timeout is tried again; a reply an engine
        # cannot read times it out on every try, and a wrong reading is no timeout.
        if got["python"] == got["native"] or not _timed_out(got):
            break
    assert got["python"] == got["native"], f"{site} answered {reply}: {got}"


def _timed_out(got: object) -> bool:
    """Whether a timeout is among the outcomes ``got`` (nested in tuples, lists, dicts)."""
    if isinstance(got, dict):
        return any(_timed_out(v) for v in got.values())
    if isinstance(got, (list, tuple)):
        return any(_timed_out(v) for v in got)
    # By name: each client family (and the builtins) has a TimeoutError of its own.
    return isinstance(got, type) and got.__name__ == "TimeoutError"


# -- the native reading of each code is the table's ---------------------------------------

_NATIVE_DONE, _NATIVE_MOVED, _NATIVE_ASK, _NATIVE_RETRY, _NATIVE_FAILOVER, _NATIVE_ERROR = range(6)
_NATIVE_CLASS = {
    replytable.NOSCRIPT: _NATIVE_ERROR,  # the native core finds NOSCRIPT where it resends it
    replytable.MOVED: _NATIVE_MOVED,
    replytable.ASK: _NATIVE_ASK,
    replytable.TRYAGAIN: _NATIVE_RETRY,
    replytable.RETRY: _NATIVE_RETRY,
    replytable.FAILOVER: _NATIVE_FAILOVER,
    replytable.NOREPLICAS: _NATIVE_FAILOVER,
    replytable.ERROR: _NATIVE_ERROR,
}
"""The table's kinds as the native core's REPLY_* classes (it folds a few together)."""


def test_the_native_core_holds_the_codes_of_the_table(native_built: None) -> None:
    """The C table the native core filled from ``replytable.CODES`` at import (``_replies.pxi``),
    read back, is the table: every code, in its order, with its kind and whether it is read
    wrapped in a script error."""
    from redlease._engine._native import _core

    assert _core.reply_codes() == replytable.CODES


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "wrapped"])
@pytest.mark.parametrize("code", [code for code, _kind, _w in replytable.CODES])
@pytest.mark.parametrize("cluster", [False, True], ids=["sentinel", "cluster"])
def test_the_native_core_reads_each_code_as_the_table_does(
    native_built: None, code: str, wrapped: bool, cluster: bool
) -> None:
    probe = require_probe()
    kind, wraps = next((k, w) for c, k, w in replytable.CODES if c == code)
    raw = _error(code)
    if wrapped:
        raw = b"-" + _WRAP % (b"0" * 40, raw[1:-2]) + b" \r\n"
    what, route = probe.reply_kind(raw, cluster)
    read_as = kind if (wraps or not wrapped) else replytable.ERROR
    assert what == _NATIVE_CLASS[read_as]
    where = replytable.CLUSTER if cluster else replytable.SENTINEL
    resent = replytable.resends(read_as, wrapped, where) and read_as != replytable.NOSCRIPT
    assert (route != _NATIVE_DONE) == resent, (what, route)


def test_a_resp3_null_is_read_as_nil_by_the_native_core(native_built: None) -> None:
    probe = require_probe()
    assert probe.reply_kind(b"_\r\n") == probe.reply_kind(b"$-1\r\n")
