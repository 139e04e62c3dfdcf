"""After os.fork() the child is not the leader and cannot touch the parent's lease."""

from __future__ import annotations

import faulthandler
import json
import os
import time

import pytest
import redis

import redlease
from helpers import elected_token, make_elector, wait_until

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
            kw = client.connection_pool.connection_kwargs
            fresh = redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=5)
            mine = redlease.Elector(fresh, "fork-child", ttl=0.5, engine=engine)
            with mine:
                token = wait_until(mine.token, timeout=5)
                applied = mine.fence_set(token, "fork-child:value", "child")
            return {"token": token, "applied": applied}

        seen = in_child(child)
        assert seen == {"token": 1, "applied": True}
        assert e.token() == parent_token


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
        kw = client.connection_pool.connection_kwargs
        fresh = redis.Redis(host=kw["host"], port=kw["port"], socket_timeout=5)
        return {"took": handover(*pair(fresh, "fork-child"))}

    seen = in_child(child)
    assert "error" not in seen, seen
    assert isinstance(seen["took"], float) and seen["took"] < 1.0, seen
    took = handover(*parents)
    assert took < 1.0, f"the parent's follower took over {took:.3f} s after the release"
