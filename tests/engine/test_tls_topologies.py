"""TLS together with Sentinel and with Cluster, on both engines.

The deployments are TLS-only: the data nodes replicate over TLS, the sentinels
listen on TLS (redis-py's ``sentinel_kwargs={"ssl": True, ...}``), a cluster's
bus speaks TLS (``tls-cluster yes``). The native engine asks the sentinels, and
a cluster's nodes for ``CLUSTER SLOTS``, over TLS with the client's settings,
without the GIL; ``auto`` picks it for these clients. A certificate the client
would reject is rejected the same way: an error through ``on_error``, never an
election. Failovers over TLS are in ``tests/test_failover.py``. The tests
taking ``family`` run with a redis-py client and with a valkey-py one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.exceptions as rex
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

import redlease
from helpers import (
    Events,
    ProcessContender,
    elected_token,
    gil_call_size,
    hold_gil_at_least,
    require_native,
    stays,
)
from redlease._engine import execute_one
from redlease._engine.conn.client import native_endpoint
from redlease._engine.conn.clientfamily import threaded
from redlease._engine.engines.native import NativeEngine
from redlease._scripts import fenced_file
from redlease._testing import ClusterSet, SentinelSet, TLSMaterials, key_slot
from redlease._testing._common import client_module
from tls_helpers import never_elected, require_native_tls
from topology_helpers import assert_in_family, close_all_engines, wait_leading_on

pytestmark = [pytest.mark.topology]

TTL = 1.0
STOP_WITHIN = 5.0
TAG = "{tt}"
_SentinelCls: Any = Sentinel  # redis-py leaves its constructors unannotated


@pytest.fixture(autouse=True)
def _close_engines() -> Iterator[None]:
    yield
    close_all_engines()


def _stop(e: redlease.Elector) -> None:
    began = time.monotonic()
    e.stop(timeout=STOP_WITHIN)
    assert time.monotonic() - began < STOP_WITHIN, "stop() took too long"


def _elects_renews_and_fences(
    e: redlease.Elector, events: Events, master: redis.Redis, family: str = "redis"
) -> None:
    """Elected, renewed over TLS for several TTLs, fenced; the errors reported meanwhile
    (retried) of ``family``, the client's."""
    name = e.config.name
    e.start()
    try:
        token = elected_token(e, timeout=10)
        # Several TTLs: the lease is renewed over TLS, never lost.
        assert stays(lambda: e.token() == token, 3 * TTL, interval=0.05)
        assert events.count("stepped_down") == 0, events.kinds(errors=True)
        assert e.fence_set(token, f"{name}:state", "v1")
        assert not e.fence_set(token - 1, f"{name}:state", "stale")
        assert master.get(f"{name}:state") == b"v1"
        assert int(master.get(f"{name}:fence:applied")) == token
        assert master.get(f"{name}:leader") == e.instance_id.encode()
        for error in events.values("error"):
            if isinstance(error, redis.RedisError):
                assert_in_family(error, family)
    finally:
        _stop(e)


# -- auto picks native ------------------------------------------------------------------


def test_auto_runs_tls_sentinel_and_tls_cluster_clients_natively(
    tls_sentinel_set: SentinelSet, tls_cluster_set: ClusterSet, family: str
) -> None:
    require_native_tls()
    sentinel_client = tls_sentinel_set.master_for(family=family, socket_timeout=1)
    # The endpoint of the redis-py client the engines run on (a valkey client's twin).
    endpoint, why = native_endpoint(threaded(sentinel_client).client)
    assert endpoint is not None, why
    assert endpoint.tls is not None and endpoint.sentinels is not None
    assert endpoint.sentinels.tls is not None
    e = redlease.Elector(sentinel_client, "tt-auto")
    assert (e.engine, e.engine_reason) == ("native", "")
    assert redlease.Elector(sentinel_client, "tt-auto", engine="native").engine == "native"

    cluster_client = tls_cluster_set.client(family=family)
    endpoint, why = native_endpoint(threaded(cluster_client).client)
    assert endpoint is not None and endpoint.tls is not None, why
    assert endpoint.tls.ca_certs == str(tls_cluster_set.tls.ca_file)  # type: ignore[union-attr]
    e = redlease.Elector(cluster_client, f"{TAG}:auto")
    assert (e.engine, e.engine_reason) == ("native", "")
    locker = redlease.RedisLocker(cluster_client, prefix=f"{TAG}:locks:")
    try:
        assert locker.engine == "native"
    finally:
        locker.close()


def test_a_cluster_client_from_a_rediss_url_is_tls_natively(tls_cluster_set: ClusterSet) -> None:
    require_native_tls()
    m = tls_cluster_set.tls
    assert m is not None
    node = tls_cluster_set.nodes[0]
    client = RedisCluster.from_url(
        f"rediss://127.0.0.1:{node.port}", ssl_ca_certs=str(m.ca_file), socket_timeout=2
    )
    try:
        endpoint, why = native_endpoint(client)
        assert endpoint is not None and endpoint.tls is not None, why
        assert redlease.Elector(client, f"{TAG}:url").engine == "native"
    finally:
        client.close()


# -- elect, renew, fence ------------------------------------------------------------------


def test_tls_sentinel_elects_renews_and_fences(
    tls_sentinel_set: SentinelSet, tls_engine: str, family: str
) -> None:
    events = Events()
    client = tls_sentinel_set.master_for(family=family, socket_timeout=1)
    e = redlease.Elector(client, "tt-sn", ttl=TTL, engine=tls_engine, observer=events.observer())
    assert e.engine == tls_engine
    _elects_renews_and_fences(e, events, tls_sentinel_set.master().client(), family)


def test_tls_cluster_elects_renews_and_fences(
    tls_cluster_set: ClusterSet, tls_engine: str, family: str
) -> None:
    events = Events()
    client = tls_cluster_set.client(family=family)
    name = f"{TAG}:cl"
    e = redlease.Elector(client, name, ttl=TTL, engine=tls_engine, observer=events.observer())
    assert e.engine == tls_engine
    owner = tls_cluster_set.master_for_slot(key_slot(TAG)).client()
    _elects_renews_and_fences(e, events, owner, family)


def test_a_native_lock_on_a_tls_cluster_holds_and_fences(tls_cluster_set: ClusterSet) -> None:
    require_native_tls()
    locker = redlease.RedisLocker(tls_cluster_set.client(), prefix=f"{TAG}:locks:")
    assert locker.engine == "native"
    try:
        with locker.hold("job", ttl=0.5) as held:
            time.sleep(1.0)  # two TTLs: renewed by the watchdog over TLS
            assert not held.done.is_set()
            with pytest.raises(redlease.NotAcquired):
                locker.try_acquire("job")
    finally:
        locker.close()


# -- certificates the client rejects ------------------------------------------------------


def _sentinel_client(topology: SentinelSet, *, sentinel_ca: str, master_ca: str) -> redis.Redis:
    m = topology.tls
    assert m is not None
    sentinel_kwargs = {
        **m.client_kwargs(),
        "ssl_ca_certs": sentinel_ca,
        "socket_timeout": 1.0,
        "socket_connect_timeout": 1.0,
        # As the harness's own Sentinel client: a refused sentinel costs one
        # try, not redis-py's backoff (which would outlast stop()'s bound).
        "retry": None,
    }
    manager = _SentinelCls(
        topology.sentinel_addresses(), sentinel_kwargs=sentinel_kwargs, **m.client_kwargs()
    )
    client: redis.Redis = manager.master_for(
        topology.service, ssl_ca_certs=master_ca, socket_timeout=1
    )
    return client


def test_a_tls_sentinel_master_signed_by_another_ca_is_rejected_and_never_elected(
    tls_sentinel_set: SentinelSet, tls_materials: TLSMaterials, tls_engine: str
) -> None:
    client = _sentinel_client(
        tls_sentinel_set,
        sentinel_ca=str(tls_materials.ca_file),
        master_ca=str(tls_materials.other_ca_file),
    )
    events = Events()
    e = redlease.Elector(
        client, "tt-badca", ttl=0.5, acquire_interval=0.05, engine=tls_engine,
        observer=events.observer(),
    )  # fmt: skip
    assert e.engine == tls_engine
    e.start()
    try:
        error = never_elected(e, events, timeout=15)
    finally:
        _stop(e)
    assert isinstance(error, rex.ConnectionError)
    assert "certificate verify failed" in str(error)
    assert not tls_sentinel_set.master().client().exists("tt-badca:leader")


def test_tls_sentinels_signed_by_another_ca_are_rejected_and_never_elected(
    tls_sentinel_set: SentinelSet, tls_materials: TLSMaterials, tls_engine: str
) -> None:
    client = _sentinel_client(
        tls_sentinel_set,
        sentinel_ca=str(tls_materials.other_ca_file),
        master_ca=str(tls_materials.ca_file),
    )
    events = Events()
    e = redlease.Elector(
        client, "tt-badsn", ttl=0.5, acquire_interval=0.05, engine=tls_engine,
        observer=events.observer(),
    )  # fmt: skip
    assert e.engine == tls_engine
    e.start()
    try:
        error = never_elected(e, events, timeout=15)
    finally:
        _stop(e)
    # No sentinel could be asked: redis-py's MasterNotFoundError on both engines.
    assert isinstance(error, redis.sentinel.MasterNotFoundError), repr(error)
    if tls_engine == "native":
        assert "certificate verify failed" in str(error)
    assert not tls_sentinel_set.master().client().exists("tt-badsn:leader")


def test_a_tls_cluster_signed_by_another_ca_is_rejected(
    tls_cluster_set: ClusterSet, tls_materials: TLSMaterials, tls_engine: str
) -> None:
    """redis-py's RedisCluster refuses such nodes as it starts; the native engine likewise."""
    bad_ca = str(tls_materials.other_ca_file)
    if tls_engine == "python":
        with pytest.raises((rex.RedisClusterException, rex.ConnectionError)) as info:
            tls_cluster_set.client(ssl_ca_certs=bad_ca)
        assert "certificate verify failed" in str(info.value)
        return
    # The native engine on the same endpoint but the CA the client would
    # reject the nodes with: no slot map, no write, no election.
    good = tls_cluster_set.client()
    endpoint, why = native_endpoint(good)
    assert endpoint is not None and endpoint.tls is not None, why
    bad = dataclasses.replace(endpoint, tls=dataclasses.replace(endpoint.tls, ca_certs=bad_ca))
    native = NativeEngine(bad, write_timeout=2.0)
    try:
        with pytest.raises(rex.ConnectionError) as write_info:
            execute_one(
                native,
                (fenced_file("fence_set"), [f"{TAG}:x:fence:applied", f"{TAG}:x"], [1, "v"]),
            )[0]
        assert "certificate verify failed" in str(write_info.value)
    finally:
        native.close()
    assert not good.exists(f"{TAG}:x")


def test_a_native_elector_on_a_tls_cluster_it_would_reject_is_never_elected(
    tls_cluster_set: ClusterSet, tls_materials: TLSMaterials, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The elector, not only a write: the rejection comes through on_error, no term begins."""
    require_native_tls()
    from redlease._engine.engines import select

    good = tls_cluster_set.client()
    endpoint, why = native_endpoint(good)
    assert endpoint is not None and endpoint.tls is not None, why
    bad_tls = dataclasses.replace(endpoint.tls, ca_certs=str(tls_materials.other_ca_file))
    bad = dataclasses.replace(endpoint, tls=bad_tls)
    # The client as redis-py would build it with that CA (its own constructor refuses to).
    monkeypatch.setattr(select, "native_endpoint", lambda _client: (bad, ""))
    events = Events()
    name = f"{TAG}:badca"
    e = redlease.Elector(
        good, name, ttl=0.5, acquire_interval=0.05, engine="native", observer=events.observer()
    )
    e.start()
    try:
        error = never_elected(e, events, timeout=15)
    finally:
        _stop(e)
    assert isinstance(error, rex.ConnectionError)
    assert "certificate verify failed" in str(error)
    assert not good.exists(f"{name}:leader")


# -- no OpenSSL for the native engine -------------------------------------------------


def test_without_openssl_tls_sentinel_and_cluster_clients_run_on_python(
    tls_sentinel_set: SentinelSet, tls_cluster_set: ClusterSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_native()
    from redlease._engine.engines import select

    # What the engine selection hears where the core found no OpenSSL at
    # import (a fresh interpreter shows the core saying so, in
    # test_engine_selection): Sentinel and Cluster, but no TLS.
    monkeypatch.setattr(
        select, "native_tls", lambda: (False, "no OpenSSL is loaded by Python's ssl module")
    )
    sentence = "the client uses TLS and the native engine has no OpenSSL to use: no OpenSSL is"
    for client, name in (
        (tls_sentinel_set.master_for(socket_timeout=1), "tt-nossl"),
        (tls_cluster_set.client(), f"{TAG}:nossl"),
    ):
        auto = redlease.Elector(client, name)
        assert auto.engine == "python"
        assert sentence in auto.engine_reason
        with pytest.raises(redlease.ConfigError, match="OpenSSL"):
            redlease.Elector(client, name, engine="native")


# -- the GIL ----------------------------------------------------------------------------


def _keeps_its_lease_through_a_gil_holding_call(
    client: Any, name: str, contender_code: str, leader_of: redis.Redis
) -> None:
    """A native leader with a 0.3 s lease, a 1.5 s GIL-holding call, a contender in another
    process trying meanwhile: the lease stays the leader's."""
    ttl = 0.3
    n = gil_call_size(1.5)
    e = redlease.Elector(client, name, ttl=ttl)
    assert e.engine == "native", e.engine_reason
    e.start()
    contender = None
    try:
        token = elected_token(e, timeout=10)
        contender = ProcessContender(contender_code, name, ttl)
        held = hold_gil_at_least(n, 3.2 * ttl)
        assert held > 3 * ttl, f"the C call held the GIL for only {held:.2f} s"
        assert e.token() == token
        assert leader_of.get(f"{name}:leader") == e.instance_id.encode()
        assert contender.elections() == [], "the other process took over during the call"
    finally:
        if contender is not None:
            contender.close()
        _stop(e)


def test_native_tls_sentinel_leader_keeps_its_lease_through_a_long_gil_holding_call(
    tls_sentinel_set: SentinelSet,
) -> None:
    require_native_tls()
    m = tls_sentinel_set.tls
    assert m is not None
    tls = m.client_kwargs()
    code = (
        f"tls = {tls!r}\n"
        f"client = redis.sentinel.Sentinel({tls_sentinel_set.sentinel_addresses()!r}, "
        f"sentinel_kwargs=dict(tls, socket_timeout=2), **tls).master_for("
        f"{tls_sentinel_set.service!r}, socket_timeout=2)"
    )
    _keeps_its_lease_through_a_gil_holding_call(
        tls_sentinel_set.master_for(socket_timeout=1),
        "tt-gil",
        code,
        tls_sentinel_set.master().client(),
    )


def test_native_tls_cluster_leader_keeps_its_lease_through_a_long_gil_holding_call(
    tls_cluster_set: ClusterSet,
) -> None:
    require_native_tls()
    m = tls_cluster_set.tls
    assert m is not None
    node = tls_cluster_set.nodes[0]
    code = (
        f"client = redis.cluster.RedisCluster(host='127.0.0.1', port={node.port}, "
        f"socket_timeout=2, **{m.client_kwargs()!r})"
    )
    _keeps_its_lease_through_a_gil_holding_call(
        tls_cluster_set.client(),
        f"{TAG}:gil",
        code,
        tls_cluster_set.master_for_slot(key_slot(TAG)).client(),
    )


# -- asyncio ------------------------------------------------------------------------------


def _aio_leads_and_writes(client: Any, name: str) -> None:
    """``redlease.aio`` on ``client``: native, elected, a fenced write by the leader."""
    import asyncio

    import redlease.aio

    async def scenario() -> None:
        e = redlease.aio.Elector(client, name, ttl=TTL)
        assert (e.engine, e.engine_reason) == ("native", "")
        seen: list[tuple[int, bool]] = []

        async def lead(term: redlease.Term, fencer: redlease.aio.Fencer) -> None:
            seen.append((term.token, await fencer.set(f"{name}:state", "leader-wrote")))

        stop = asyncio.Event()
        task = asyncio.ensure_future(e.run(lead, stop=stop))
        deadline = time.monotonic() + 15
        while not seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        stop.set()
        await task
        assert seen and seen[0][1], seen
        assert await client.get(f"{name}:state") == b"leader-wrote"
        await client.aclose()

    asyncio.run(asyncio.wait_for(scenario(), 40))


def test_aio_on_a_tls_sentinel_master_runs_natively(
    tls_sentinel_set: SentinelSet, family: str
) -> None:
    require_native_tls()
    m = tls_sentinel_set.tls
    assert m is not None
    tls = m.client_kwargs()
    manager: Any = client_module(family, asyncio=True).sentinel.Sentinel(
        tls_sentinel_set.sentinel_addresses(),
        sentinel_kwargs={**tls, "socket_timeout": 1.0},
        **tls,
    )
    client = manager.master_for(tls_sentinel_set.service, socket_timeout=2)
    _aio_leads_and_writes(client, "tt-aio")


def test_aio_on_a_tls_cluster_runs_natively(tls_cluster_set: ClusterSet, family: str) -> None:
    require_native_tls()
    m = tls_cluster_set.tls
    assert m is not None
    node = tls_cluster_set.nodes[0]
    client = client_module(family, asyncio=True).RedisCluster(
        host="127.0.0.1", port=node.port, socket_timeout=2, **m.client_kwargs()
    )
    _aio_leads_and_writes(client, f"{TAG}:aio")


# -- plain sentinels, a TLS master ------------------------------------------------------


@pytest.fixture
def plain_sentinels_tls_master(tls_materials: TLSMaterials) -> Iterator[SentinelSet]:
    """Sentinels listening in plain text in front of TLS-only data nodes."""
    from redlease._testing import tls_unsupported_reason

    reason = tls_unsupported_reason()
    if reason is not None:
        if os.environ.get("REDLEASE_REQUIRE_TLS") == "1":
            pytest.fail(f"REDLEASE_REQUIRE_TLS=1 but {reason}")
        pytest.skip(reason)
    topology = SentinelSet(tls=tls_materials, tls_sentinels=False).start()
    try:
        yield topology
    finally:
        topology.stop()


def test_plain_sentinels_and_a_tls_master_elect_fence_and_follow_a_failover(
    plain_sentinels_tls_master: SentinelSet, tls_engine: str
) -> None:
    """Each connection gets its own settings: the sentinels plain, the master over TLS."""
    topology = plain_sentinels_tls_master
    client = topology.master_for(socket_timeout=1)
    endpoint, why = native_endpoint(client)
    assert endpoint is not None and endpoint.sentinels is not None, why
    assert endpoint.tls is not None and endpoint.sentinels.tls is None
    events = Events()
    e = redlease.Elector(client, "tt-mix", ttl=TTL, engine=tls_engine, observer=events.observer())
    assert e.engine == tls_engine
    if tls_engine == "native":
        assert redlease.Elector(client, "tt-mix").engine == "native"
    e.start()
    try:
        token = elected_token(e, timeout=10)
        assert e.fence_set(token, "tt-mix:state", "v1")
        assert topology.master().client().wait(1, 2000) >= 1
        new_master = topology.node_at(topology.failover())
        new_token = wait_leading_on(new_master, e, timeout=TTL + 10)
        assert new_token >= token
        assert e.fence_set(new_token, "tt-mix:state", "v2")
        assert new_master.client().get("tt-mix:state") == b"v2"
    finally:
        _stop(e)
