"""Celery: ``FencedTask`` on a real worker and ``LeaderScheduler`` in real beats.

Every worker and beat here is a real ``celery`` process (``python -c`` calls
``make_app(...).worker_main`` / ``.start(["beat", ...])`` from this module),
on a Redis broker the test harness started. FencedTask: one run per key at
a time, the three ``on_locked`` behaviours, key templates bound to the
signature, a bad template refused before anything is queued, the lease
released on every way out (return, exception, retry, a revoke that
terminates the run), a killed worker's key freed within its ``lock_ttl``, a
lost lease seen by the run. LeaderScheduler: of two beats on
one broker only the leader's messages reach it; a beat whose lease is
taken sends nothing more; a stopped leader is replaced at once, a killed one
within its ttl.
"""

from __future__ import annotations

import ast
import gc
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

import redlease
from helpers import wait_until
from redlease._testing import RedisServer
from redlease.integrations.celery import FencedTask, LeaderScheduler, redis_client

TESTS = Path(__file__).resolve().parent
RUNS = "runs"  # a list: one JSON line per task body that ran


# -- the app every process of a test builds -------------------------------------------------


def make_app(url: str) -> Celery:
    """The Celery app of these tests, broker and results on ``url``.

    Each task body appends what it saw to the ``runs`` list, so a test reads
    which runs ran, with which lease, in which order.
    """
    app = Celery("fenced", broker=url, backend=url)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )
    store = redis.Redis.from_url(url)

    def ran(self: Any, mark: str, **seen: Any) -> None:
        held = self.lock
        record = {"mark": mark, "name": held.name, "token": held.fencing_token, "at": time.time()}
        record.update(retries=self.request.retries, task_id=self.request.id, **seen)
        store.rpush(RUNS, json.dumps(record))

    @app.task(name="t.ping")
    def ping() -> str:
        return "pong"

    @app.task(base=FencedTask, bind=True, name="t.report", lock_key="report:{customer_id}")
    def report(self: Any, customer_id: int, seconds: float = 0.0) -> int:
        ran(self, f"report:{customer_id}")
        time.sleep(seconds)
        return self.lock.fencing_token

    @app.task(base=FencedTask, bind=True, name="t.keyed", lock_key="k:{customer_id}:{region}:{tag}")
    def keyed(self: Any, customer_id: int, region: str = "eu", *, tag: str = "x") -> str:
        return self.lock.name

    # Three tasks on one key, one per on_locked, and a holder to collide with.
    @app.task(base=FencedTask, bind=True, name="t.hold", lock_key="shared:{n}")
    def hold(self: Any, n: int, seconds: float) -> None:
        ran(self, f"hold:{n}", started=time.time())
        time.sleep(seconds)
        ran(self, f"hold-end:{n}")

    @app.task(base=FencedTask, bind=True, name="t.skip", lock_key="shared:{n}", on_locked="skip")
    def skipping(self: Any, n: int) -> str:
        ran(self, f"skip:{n}")
        return "ran"

    @app.task(base=FencedTask, bind=True, name="t.raise", lock_key="shared:{n}", on_locked="raise")
    def raising(self: Any, n: int) -> str:
        ran(self, f"raise:{n}")
        return "ran"

    @app.task(
        base=FencedTask,
        bind=True,
        name="t.retry",
        lock_key="shared:{n}",
        on_locked="retry",
        max_retries=100,
        default_retry_delay=0.2,
    )
    def retrying(self: Any, n: int) -> int:
        ran(self, f"retry:{n}")
        return int(self.request.retries)

    @app.task(base=FencedTask, bind=True, name="t.fails", lock_key="fails:{n}")
    def fails(self: Any, n: int) -> None:
        ran(self, f"fails:{n}")
        raise ValueError(f"fails {n} on purpose")

    @app.task(base=FencedTask, bind=True, name="t.retries_itself", lock_key="again:{n}")
    def retries_itself(self: Any, n: int) -> int:
        ran(self, f"again:{n}")
        if self.request.retries < 2:
            raise self.retry(countdown=0.05)
        return int(self.request.retries)

    @app.task(base=FencedTask, bind=True, name="t.bad", lock_key="bad:{nope}")
    def bad(self: Any, n: int) -> None:
        ran(self, f"bad:{n}")

    @app.task(base=FencedTask, bind=True, name="t.sleeps", lock_key="sleeps:{n}", lock_ttl=1.0)
    def sleeps(self: Any, n: int) -> None:
        ran(self, f"sleeps:{n}")
        time.sleep(60)

    @app.task(base=FencedTask, bind=True, name="t.loses", lock_key="loses:{n}", lock_ttl=0.6)
    def loses(self: Any, n: int) -> bool:
        ran(self, f"loses:{n}")
        return self.lock.done.wait(10)

    return app


def make_beat_app(url: str, beat_id: str, ttl: float) -> Celery:
    """A beat app sending ``t.tick(beat_id)`` every 0.2 s, so each message names its sender."""
    app = Celery("beats", broker=url)
    app.conf.update(
        broker_connection_retry_on_startup=True,
        beat_schedule={"tick": {"task": "t.tick", "schedule": 0.2, "args": (beat_id,)}},
        redlease_beat_name="beat-test",
        redlease_beat_ttl=ttl,
    )
    return app


class Proc:
    """A celery process started from this module, its output kept in a file."""

    def __init__(self, code: str, log: Path) -> None:
        self.log = log
        self._out = log.open("w")
        script = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n" + textwrap.dedent(code)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script], stdout=self._out, stderr=subprocess.STDOUT
        )

    def output(self) -> str:
        return self.log.read_text()

    def kill(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


def start_worker(url: str, log: Path, *args: str) -> Proc:
    argv = ["worker", "--loglevel=INFO", "--without-mingle", "--without-gossip", *args]
    return Proc(
        f"""
        import test_integrations_celery as t
        t.make_app({url!r}).worker_main({argv!r})
        """,
        log,
    )


def start_beat(url: str, tmp: Path, beat_id: str, ttl: float) -> Proc:
    argv = [
        "beat",
        "-S",
        "redlease.integrations.celery:LeaderScheduler",
        "-s",
        str(tmp / f"schedule-{beat_id}"),
        "--loglevel=INFO",
    ]
    return Proc(
        f"""
        import test_integrations_celery as t
        t.make_beat_app({url!r}, {beat_id!r}, {ttl!r}).start({argv!r})
        """,
        tmp / f"beat-{beat_id}.log",
    )


# -- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture(scope="module")
def app(server: RedisServer) -> Iterator[Celery]:
    made = make_app(server.url)
    yield made
    gc.collect()  # results unsubscribe from the backend while its server still runs
    made.close()


@pytest.fixture(scope="module")
def worker(
    server: RedisServer, app: Celery, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Proc]:
    """One worker process, four threads, for the module's FencedTask tests."""
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    proc = start_worker(server.url, log, "--pool=threads", "--concurrency=4", "-n", "main@%h")
    try:
        assert app.tasks["t.ping"].delay().get(timeout=60) == "pong", proc.output()
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def store(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def locker(store: redis.Redis) -> Iterator[redlease.RedisLocker]:
    with redlease.RedisLocker(store) as made:
        yield made


def runs(store: redis.Redis, mark: str) -> list[dict[str, Any]]:
    """What the task bodies recorded under ``mark``, in the order they ran."""
    lines = [json.loads(line) for line in store.lrange(RUNS, 0, -1)]
    return [line for line in lines if line["mark"] == mark]


def unique() -> int:
    return uuid.uuid4().int % 10**9


fenced = pytest.mark.xdist_group("celery-worker")


# -- FencedTask on a worker -------------------------------------------------------------------


@fenced
def test_two_concurrent_runs_of_one_key_run_once_and_the_other_is_skipped(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    n = unique()
    first, second = (app.tasks["t.report"].delay(n, seconds=1.0) for _ in range(2))
    results = sorted([first.get(timeout=20), second.get(timeout=20)], key=lambda r: r is None)
    assert isinstance(results[0], int) and results[0] >= 1
    assert results[1] is None  # skipped: the default on_locked
    assert len(runs(store, f"report:{n}")) == 1
    assert f"skipped: 'report:{n}' is held elsewhere" in worker.output()


@fenced
def test_runs_of_different_keys_run_at_once_each_with_its_own_lock(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    a, b = unique(), unique()
    results = [app.tasks["t.report"].delay(k, seconds=1.5) for k in (a, b)]
    tokens = [r.get(timeout=20) for r in results]
    seen = [runs(store, f"report:{k}")[0] for k in (a, b)]
    assert [s["name"] for s in seen] == [f"report:{a}", f"report:{b}"]
    assert [s["token"] for s in seen] == tokens and tokens[0] != tokens[1]
    # Both ran at once: the second started before the first's 1.5 s body was over.
    assert abs(seen[0]["at"] - seen[1]["at"]) < 1.2


@fenced
def test_on_locked_raise_fails_the_run_with_not_acquired(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    n = unique()
    holding = app.tasks["t.hold"].delay(n, 1.5)
    wait_until(lambda: runs(store, f"hold:{n}"), 10, what="the holder to start")
    result = app.tasks["t.raise"].delay(n)
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(result.result, redlease.NotAcquired), result.result
    assert runs(store, f"raise:{n}") == []
    holding.get(timeout=20)


@fenced
def test_on_locked_retry_runs_after_the_holder_with_the_tasks_retry_settings(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    n = unique()
    holding = app.tasks["t.hold"].delay(n, 1.0)
    wait_until(lambda: runs(store, f"hold:{n}"), 10, what="the holder to start")
    retries = app.tasks["t.retry"].delay(n).get(timeout=30)
    holding.get(timeout=20)
    assert retries >= 1  # it was held at first: retried every default_retry_delay
    (held_until,) = [r["at"] for r in runs(store, f"hold-end:{n}")]
    (ran,) = runs(store, f"retry:{n}")
    assert ran["at"] >= held_until and ran["retries"] == retries


@fenced
def test_on_locked_skip_returns_none_without_running(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    n = unique()
    holding = app.tasks["t.hold"].delay(n, 1.0)
    wait_until(lambda: runs(store, f"hold:{n}"), 10, what="the holder to start")
    result = app.tasks["t.skip"].delay(n)
    assert result.get(timeout=20) is None and result.state == "SUCCESS"
    assert runs(store, f"skip:{n}") == []
    holding.get(timeout=20)
    assert app.tasks["t.skip"].delay(n).get(timeout=20) == "ran"  # free again: it runs


@fenced
def test_the_key_template_is_bound_to_the_signature_with_defaults(
    app: Celery, worker: Proc
) -> None:
    keyed = app.tasks["t.keyed"]
    assert keyed.delay(7).get(timeout=20) == "k:7:eu:x"
    assert keyed.apply_async(kwargs={"customer_id": 7, "region": "us"}).get(20) == "k:7:us:x"
    assert keyed.apply_async((8, "ap"), {"tag": "y"}).get(timeout=20) == "k:8:ap:y"
    assert keyed.lock_name((9,), {"tag": "z"}) == "k:9:eu:z"
    assert app.tasks["t.report"].lock_name((), {"customer_id": 3}) == "report:3"


@fenced
def test_a_template_naming_a_missing_argument_is_refused_before_anything_is_queued(
    app: Celery, store: redis.Redis
) -> None:
    bad = app.tasks["t.bad"]
    with pytest.raises(redlease.ConfigError, match=r"names nope.*signature \(n\)"):
        bad.apply_async((1,), queue="never-consumed")
    with pytest.raises(redlease.ConfigError, match="names nope"):
        bad.s(1).set(queue="never-consumed").delay()
    assert store.llen("never-consumed") == 0


@fenced
def test_a_message_that_bypassed_apply_async_fails_on_the_worker_with_config_error(
    app: Celery, worker: Proc, store: redis.Redis
) -> None:
    n = unique()
    result = app.send_task("t.bad", args=(n,))
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(result.result, redlease.ConfigError)
    assert "names nope" in str(result.result)
    assert runs(store, f"bad:{n}") == []


@fenced
def test_the_lock_is_released_after_the_task_returns(
    app: Celery, worker: Proc, locker: redlease.RedisLocker
) -> None:
    n = unique()
    token = app.tasks["t.report"].delay(n).get(timeout=20)
    assert token >= 1 and locker.holder(f"report:{n}") is None
    again = app.tasks["t.report"].delay(n).get(timeout=20)
    assert again > token  # taken again at once, with a newer token


@fenced
def test_the_lock_is_released_after_the_task_raises(
    app: Celery, worker: Proc, store: redis.Redis, locker: redlease.RedisLocker
) -> None:
    n = unique()
    result = app.tasks["t.fails"].delay(n)
    result.get(timeout=20, propagate=False)
    assert result.state == "FAILURE" and isinstance(result.result, ValueError)
    assert len(runs(store, f"fails:{n}")) == 1
    assert locker.holder(f"fails:{n}") is None


@fenced
def test_the_lock_is_released_when_the_task_retries_itself(
    app: Celery, worker: Proc, store: redis.Redis, locker: redlease.RedisLocker
) -> None:
    n = unique()
    assert app.tasks["t.retries_itself"].delay(n).get(timeout=20) == 2
    seen = runs(store, f"again:{n}")
    assert [s["retries"] for s in seen] == [0, 1, 2]  # each retry took the key again
    assert len({s["token"] for s in seen}) == 3
    assert locker.holder(f"again:{n}") is None


@fenced
def test_a_lost_lease_sets_done_and_logs_a_warning(
    app: Celery, worker: Proc, store: redis.Redis, locker: redlease.RedisLocker
) -> None:
    n = unique()
    result = app.tasks["t.loses"].delay(n)
    wait_until(lambda: locker.holder(f"loses:{n}"), 10, what="the run to hold its key")
    store.delete(locker.key(f"loses:{n}"))  # as if it had expired under the run
    assert result.get(timeout=20) is True  # self.lock.done was set while it ran
    wait_until(lambda: f"lost its lease on 'loses:{n}'" in worker.output(), 5, what="the warning")
    assert "WARNING" in worker.output()


def test_a_killed_worker_frees_its_key_within_lock_ttl(
    server: RedisServer,
    app: Celery,
    store: redis.Redis,
    locker: redlease.RedisLocker,
    tmp_path: Path,
) -> None:
    proc = start_worker(server.url, tmp_path / "w.log", "--concurrency=1", "-Q", "doomed")
    try:
        n = unique()
        app.tasks["t.sleeps"].apply_async((n,), queue="doomed")
        holder = wait_until(lambda: locker.holder(f"sleeps:{n}"), 60, what="the run to start")
        assert holder.ttl_ms <= 1000  # lock_ttl=1.0: it is renewed, never extended past that
        time.sleep(1.5)  # renewed meanwhile: still held after its ttl
        assert locker.holder(f"sleeps:{n}") is not None
        proc.kill(signal.SIGKILL)  # the prefork worker, whose pool process dies with it
        proc.proc.wait(10)
        # Within lock_ttl (1 s), with room for a busy machine.
        wait_until(lambda: locker.holder(f"sleeps:{n}") is None, 5, what="the key to be free")
        locker.try_acquire(f"sleeps:{n}", ttl=5).release()
    finally:
        proc.stop(signal.SIGKILL)


def test_a_run_revoked_with_terminate_releases_its_key(
    server: RedisServer, app: Celery, locker: redlease.RedisLocker, tmp_path: Path
) -> None:
    proc = start_worker(server.url, tmp_path / "w.log", "--concurrency=1", "-Q", "revocable")
    try:
        n = unique()
        result = app.tasks["t.hold"].apply_async((n, 60.0), queue="revocable")
        wait_until(lambda: locker.holder(f"shared:{n}"), 60, what="the run to start")
        result.revoke(terminate=True)
        # Released on the way out: its lease (lock_ttl 10 s) has not run out by then.
        wait_until(lambda: locker.holder(f"shared:{n}") is None, 5, what="the key to be free")
        result.get(timeout=20, propagate=False)
        assert result.state == "REVOKED"
    finally:
        proc.stop()


# -- what needs no worker ----------------------------------------------------------------------


def test_bad_options_are_config_errors_when_the_task_is_made(server: RedisServer) -> None:
    app = Celery("options", broker=server.url)
    cases = [
        ({"on_locked": "wait"}, "on_locked must be one of skip, retry, raise"),
        ({"lock_ttl": 0}, "lock_ttl must be positive"),
        ({"lock_ttl": 0.01}, "lock_ttl must be a finite number of seconds of at least 0.03"),
        ({"lock_ttl": True}, "lock_ttl must be a number of seconds, got bool"),
        ({"lock_wait": -1}, "lock_wait must be at least 0"),
        ({"lock_key": "r:{"}, "is not a format template"),
        ({"lock_key": "r:{}"}, r"has the field \{\}; each field must name an argument"),
        ({"lock_key": ""}, "lock_key must be a non-empty str template"),
    ]
    for options, message in cases:
        with pytest.raises(redlease.ConfigError, match=message):

            @app.task(base=FencedTask, name=f"o.{uuid.uuid4().hex}", lazy=False, **options)
            def task() -> None: ...


def test_the_client_comes_from_redlease_url_else_a_redis_broker_else_config_error(
    server: RedisServer,
) -> None:
    app = Celery("urls", broker=server.url)
    assert redis_client(app).ping()
    unix = Celery("urls", broker="redis+socket:///tmp/none.sock")
    assert redis_client(unix).connection_pool.connection_kwargs["path"] == "/tmp/none.sock"
    amqp = Celery("urls", broker="amqp://guest@localhost//")
    with pytest.raises(
        redlease.ConfigError, match=r"broker_url has the scheme .amqp.*redlease_url"
    ):
        redis_client(amqp)
    amqp.conf.redlease_url = server.url
    assert redis_client(amqp).ping()
    amqp.conf.redlease_url = "http://example.invalid/"
    with pytest.raises(redlease.ConfigError, match="redlease_url has the scheme 'http'"):
        redis_client(amqp)
    with pytest.raises(redlease.ConfigError, match="neither redlease_url nor broker_url is set"):
        redis_client(Celery("urls"))
    amqp.conf.redlease_url = "valkey://127.0.0.1:1/0"
    assert type(redis_client(amqp)).__module__.startswith("valkey")


def test_the_celery_extra_brings_what_a_redis_broker_needs(server: RedisServer) -> None:
    """``redlease[celery]`` on a ``redis://`` broker: kombu's Redis transport imports and
    connects. Plain ``celery`` lacks what that transport imports (``packaging``, ``redis``
    at the versions it needs), and a worker then dies at startup with
    ``ModuleNotFoundError``: the extra (and the test extra, which installs these tests'
    dependencies) asks for ``celery[redis]``."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: ``build`` (a test dependency) brings tomli
        import tomli as tomllib
    project = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    extras = project["project"]["optional-dependencies"]
    for extra in ("celery", "test"):
        named = [r for r in extras[extra] if r.replace(" ", "").startswith("celery")]
        assert named and all(r.replace(" ", "").startswith("celery[redis]") for r in named), (
            extra,
            named,
        )
    # What a worker does first with its broker: the transport module loads and talks.
    app = Celery("extra", broker=server.url)
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)
        assert type(connection.transport).__module__ == "kombu.transport.redis"
        channel = connection.default_channel
        assert channel.client.ping()


def test_importing_redlease_imports_neither_celery_nor_apscheduler() -> None:
    code = (
        "import sys, redlease, redlease.aio, redlease.lock, redlease.health, "
        "redlease.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'apscheduler')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- LeaderScheduler: beats against one broker --------------------------------------------


def senders(store: redis.Redis) -> list[str]:
    """The beat id each ``t.tick`` message on the broker names, oldest first."""
    found = []
    for raw in reversed(store.lrange("celery", 0, -1)):  # kombu pushes on the left
        headers = json.loads(raw)["headers"]
        assert headers["task"] == "t.tick"
        found.append(ast.literal_eval(headers["argsrepr"])[0])
    return found


@pytest.fixture
def broker() -> Iterator[RedisServer]:
    with RedisServer() as started:
        yield started


@pytest.fixture
def beats() -> Iterator[list[Proc]]:
    """The beat processes a test starts, killed after it."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop(signal.SIGKILL)


def test_of_two_beats_only_the_leader_sends(
    broker: RedisServer, beats: list[Proc], tmp_path: Path
) -> None:
    store = broker.client()
    by_id = {b: start_beat(broker.url, tmp_path, b, ttl=10.0) for b in ("A", "B")}
    beats += by_id.values()
    wait_until(lambda: len(senders(store)) >= 10, 60, what="ten sends")
    time.sleep(1.0)
    sent = senders(store)
    assert len(set(sent)) == 1, sent
    follower = by_id["B" if sent[0] == "A" else "A"]
    assert "follows: sending nothing" in follower.output()
    assert "leads: sending due tasks" not in follower.output()


def test_a_stopped_leader_is_replaced_at_once_and_sends_nothing_more(
    broker: RedisServer, beats: list[Proc], tmp_path: Path
) -> None:
    store = broker.client()
    by_id = {b: start_beat(broker.url, tmp_path, b, ttl=20.0) for b in ("A", "B")}
    beats += by_id.values()
    wait_until(lambda: len(senders(store)) >= 3, 60, what="the first sends")
    leader = senders(store)[0]
    other = "B" if leader == "A" else "A"
    by_id[leader].stop(signal.SIGTERM)  # beat's own shutdown: close() releases the lease
    stopped = time.monotonic()
    assert by_id[leader].proc.returncode is not None
    wait_until(lambda: other in senders(store), 30, what="the other beat to send")
    # The lease was handed over, not waited out: the follower polls every ttl/2 = 10 s.
    assert time.monotonic() - stopped < 5.0
    sent = senders(store)
    assert sent == sorted(sent, key=lambda s: s != leader)  # the leader's, then only the other's


def test_a_beat_whose_lease_is_taken_sends_nothing_more(
    broker: RedisServer, beats: list[Proc], tmp_path: Path
) -> None:
    store = broker.client()
    proc = start_beat(broker.url, tmp_path, "A", ttl=1.5)
    beats.append(proc)
    wait_until(lambda: len(senders(store)) >= 3, 60, what="the first sends")
    store.set("beat-test:leader", "intruder", px=60_000)  # another instance holds the lease now
    time.sleep(1.5)  # one ttl: its renewal (every 0.5 s) has found the lease gone
    count = len(senders(store))
    time.sleep(1.5)
    assert len(senders(store)) == count
    assert "follows: sending nothing" in proc.output()
    assert proc.proc.poll() is None  # following, not crashed


def test_a_killed_leader_is_replaced_within_the_ttl(
    broker: RedisServer, beats: list[Proc], tmp_path: Path
) -> None:
    store = broker.client()
    by_id = {b: start_beat(broker.url, tmp_path, b, ttl=1.5) for b in ("A", "B")}
    beats += by_id.values()
    wait_until(lambda: len(senders(store)) >= 3, 60, what="the first sends")
    leader = senders(store)[0]
    other = "B" if leader == "A" else "A"
    by_id[leader].stop(signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: other in senders(store), 30, what="the other beat to send")
    assert time.monotonic() - killed < 1.5 + 5.0  # the ttl, and room for a busy machine


def test_the_scheduler_starts_no_elector_until_its_first_tick_and_closes_twice(
    broker: RedisServer, tmp_path: Path
) -> None:
    app = make_beat_app(broker.url, "Z", ttl=2.0)
    scheduler = LeaderScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=False)
    assert scheduler.elector is None
    assert "redlease leader election 'beat-test', wrapping PersistentScheduler" in scheduler.info
    scheduler.tick()
    elector = scheduler.elector
    assert elector is not None and elector.config.ttl == 2.0
    wait_until(elector.is_leader, 10, what="the beat to lead")
    scheduler.close()
    scheduler.close()
    assert not elector.is_leader() and broker.client().get("beat-test:leader") is None


def test_a_wrapped_scheduler_that_is_not_one_is_a_config_error(broker: RedisServer) -> None:
    app = make_beat_app(broker.url, "Z", ttl=2.0)
    app.conf.redlease_beat_scheduler = "redlease.integrations.celery:LeaderScheduler"
    with pytest.raises(redlease.ConfigError, match="redlease_beat_scheduler must name"):
        LeaderScheduler(app=app, lazy=True)
