"""After os.fork() the child is not the leader and cannot touch the parent's lease."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import redis

import redlease
from helpers import elected_token, make_elector, require_native, wait_until
from redlease._testing import RedisServer
from topology_helpers import close_all_engines

LEADER_KEY = "fork:leader"
CHILD_TIMEOUT = 30.0

# Forking a process that runs threads is exactly what these tests check is
# safe; Python 3.12+ warns about it in general.
pytestmark = pytest.mark.filterwarnings(
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)


def in_child(fn: object) -> dict[str, object]:
    """Run ``fn()`` in a forked child and return the dict it produced."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_fd)
        # A child that hangs prints where, and exits: the parent then fails on
        # its exit code instead of waiting on the pipe until the suite's timeout.
        faulthandler.dump_traceback_later(CHILD_TIMEOUT, exit=True)
        try:
            result = fn()  # type: ignore[operator]
            payload = json.dumps(result).encode()
        except BaseException as exc:
            payload = json.dumps({"error": repr(exc)}).encode()
        try:
            os.write(write_fd, payload)
        finally:
            os._exit(0)  # whatever happened: the child never goes on as the test runner
    os.close(write_fd)
    chunks = []
    while chunk := os.read(read_fd, 65536):
        chunks.append(chunk)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    data: dict[str, object] = json.loads(b"".join(chunks))
    return data


def fresh_client(client: redis.Redis) -> redis.Redis:
    """A client of the child's own for ``client``'s server (none of the parent's connections)."""
    kw = client.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=5)


def test_forked_child_is_not_leader_and_cannot_end_the_parents_lease(
    client: redis.Redis, engine: str
) -> None:
    e = make_elector(client, engine, name="fork", ttl=0.5)
    with e:
        token = elected_token(e)

        def child() -> dict[str, object]:
            fencer = e.fencer()
            started = time.monotonic()
            e.stop()
            e.resign()
            return {
                "token": e.token(),
                "leader": e.is_leader(),
                "fencer": fencer.token,
                "fencer_truthy": bool(fencer),
                "write": e.fencer().set("fork:value", "from the child"),
                "stop_seconds": time.monotonic() - started,
            }

        seen = in_child(child)
        assert seen == {
            "token": None,
            "leader": False,
            "fencer": 0,
            "fencer_truthy": False,
            "write": False,
            "stop_seconds": seen["stop_seconds"],
        }, seen
        assert isinstance(seen["stop_seconds"], float) and seen["stop_seconds"] < 1.0
        # The parent still leads, still renews, and its lock was not released.
        assert e.token() == token
        assert client.get(LEADER_KEY) == e.instance_id.encode()
        time.sleep(1.0)  # two TTLs: only the parent's renewals can keep it
        assert e.token() == token
        assert client.get(LEADER_KEY) == e.instance_id.encode()
        assert client.get("fork:value") is None
    wait_until(lambda: not client.exists(LEADER_KEY), timeout=3, what="release at stop")


def test_forked_child_can_run_an_elector_of_its_own(client: redis.Redis, engine: str) -> None:
    e = make_elector(client, engine, name="fork", ttl=0.5)
    with e:
        parent_token = elected_token(e)

        def child() -> dict[str, object]:
            mine = redlease.Elector(fresh_client(client), "fork-child", ttl=0.5, engine=engine)
            with mine:
                token = wait_until(mine.token, timeout=5)
                applied = mine.fence_set(token, "fork-child:value", "child")
            return {"token": token, "applied": applied}

        seen = in_child(child)
        assert seen == {"token": 1, "applied": True}
        assert e.token() == parent_token


def test_a_child_closing_the_engines_it_inherited_leaves_the_parents_renewals_alone(
    client: redis.Redis, engine: str
) -> None:
    # A child's clean-up (or its collector, or its exit) may close or free the
    # copies of the parent's engines: a copy's renewer shares its wake-up
    # descriptor with the parent's renewer thread, which must never hear it.
    e = make_elector(client, engine, name="fork", ttl=0.5)
    with e:
        token = elected_token(e)

        def child() -> dict[str, object]:
            close_all_engines()
            gc.collect()
            return {}

        assert in_child(child) == {}
        time.sleep(1.5)  # three TTLs: only the parent's renewals can keep it
        assert e.token() == token
        assert client.get(LEADER_KEY) == e.instance_id.encode()


def test_started_followers_hear_release_notices_in_the_parent_and_in_a_forked_child(
    client: redis.Redis, engine: str
) -> None:
    # Followers poll every ~13 s here (the leader's TTL is 30 s): a takeover
    # within a second came from the release notice.
    def pair(c: redis.Redis, name: str) -> tuple[redlease.Elector, redlease.Elector]:
        leader = redlease.Elector(c, name, ttl=30, engine=engine)
        follower = redlease.Elector(c, name, ttl=30, acquire_interval=15, engine=engine)
        leader.start()
        wait_until(leader.token, timeout=5, what="the leader")
        follower.start()
        wait_until(
            lambda: c.pubsub_numsub(f"{name}:leader:released")[0][1] >= 1,
            timeout=5,
            what="the follower's subscription",
        )
        time.sleep(0.2)  # the follower's first acquire lost: it waits
        return leader, follower

    def handover(leader: redlease.Elector, follower: redlease.Elector) -> float:
        started = time.monotonic()
        leader.stop()
        wait_until(follower.token, timeout=10, interval=0.005, what="the takeover")
        took = time.monotonic() - started
        follower.stop()
        return took

    parents = pair(client, "fork-parent")  # the parent's driver listens already

    def child() -> dict[str, object]:
        return {"took": handover(*pair(fresh_client(client), "fork-child"))}

    seen = in_child(child)
    assert "error" not in seen, seen
    assert isinstance(seen["took"], float) and seen["took"] < 1.0, seen
    took = handover(*parents)
    assert took < 1.0, f"the parent's follower took over {took:.3f} s after the release"


def test_a_child_gets_every_module_wide_lock_back_unlocked(
    client: redis.Redis, engine: str
) -> None:
    # Another thread of the parent holds every registry lock of the library
    # (shared engines, asyncio twins, the driver, notice listeners, metrics)
    # while the fork happens: in the child nobody would ever let them go.
    import redlease._engine.conn.clientfamily
    import redlease._engine.engines.select  # each of these modules makes a registry lock
    import redlease._engine.notices.pynotices
    import redlease._engine.process.driver
    from redlease._engine.process.forksafe import _live

    held = threading.Event()
    done = threading.Event()

    def hold_all() -> None:
        with contextlib.ExitStack() as stack:
            for lock in list(_live):
                stack.enter_context(lock)
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold_all, daemon=True)
    holder.start()
    try:
        assert held.wait(5)
        assert len(_live) >= 4  # the registries this test is about exist

        def child() -> dict[str, object]:
            mine = redlease.Elector(fresh_client(client), "fork-locked", ttl=0.5, engine=engine)
            with mine:
                token = wait_until(mine.token, timeout=5)
            return {"token": token}

        assert in_child(child) == {"token": 1}
    finally:
        done.set()
        holder.join(5)


# Runs in a fresh interpreter whose first fork handler collects garbage: it
# runs before any handler the library registers (handlers run in the order
# they were registered), as the collector may in any process.
_COLLECT_FIRST = """
import gc, os, sys, time
os.register_at_fork(after_in_child=gc.collect)
from redlease._engine._native import _core
from redlease._engine.conn.client import Endpoint
from redlease._scripts import load

renew = load("renew")
target = _core.Target(Endpoint(host="127.0.0.1", port=int(sys.argv[1]), path=None, db=0,
                               username=None, password=None, client_name=None))
renewer = _core.Renewer(target)
lease = _core.Lease(renewer, _core.ScriptRef(renew.sha, renew.source), ["k"], ["me", 60000],
                    30.0, 60.0)
lease.begin(1, time.monotonic())  # the renewer thread now waits on its condition variable
time.sleep(0.2)
gc.disable()
cycle = [renewer, lease]
cycle.append(cycle)
del renewer, lease, cycle  # garbage, freed by the first collection
pid = os.fork()
if pid == 0:
    os._exit(0)  # reached only if freeing the parent's renewer did not wait for its thread
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_native_renewer_freed_in_a_child_before_the_fork_handlers_ran_does_not_hang(
    redis_server: RedisServer,
) -> None:
    require_native()
    done = subprocess.run(
        [sys.executable, "-c", _COLLECT_FIRST, str(redis_server.port)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT * 2,
    )
    assert done.returncode == 0, done.stderr
