"""APScheduler: three schedulers behind LeaderGates, one of which runs the jobs.

Real ``BackgroundScheduler``s (and an ``AsyncIOScheduler``) on a real
redis-server, each with its own job store and the same job, as replicas of
a service run them: exactly one runs the job at a time, its writes fenced
with the gate's fencer; a stopped leader's gate shuts its scheduler down and
another takes over, and a write with the old term's token is rejected; a
gate whose lease is taken pauses its scheduler.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from apscheduler.schedulers import SchedulerNotRunningError
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_PAUSED, STATE_RUNNING, STATE_STOPPED

import redlease
from helpers import wait_until
from redlease._testing import RedisServer
from redlease.integrations.apscheduler import LeaderGate

NAME = "reports-scheduler"
COUNT = "jobs:count"
INCR = "redis.call('incr', KEYS[2])"


class Replica:
    """One replica of the service: a scheduler with one job every 50 ms, behind a gate."""

    def __init__(self, server: RedisServer, index: int, runs: list[tuple[int, bool]]) -> None:
        self.index = index
        self.client = server.client(socket_timeout=5)
        self.scheduler = BackgroundScheduler(job_defaults={"coalesce": True, "max_instances": 1})
        self.scheduler.add_job(self.job, "interval", seconds=0.05, id="report")
        self.gate = LeaderGate(self.scheduler, self.client, NAME, ttl=1.0)
        self.runs = runs
        self.fencers: list[redlease.Fencer] = []

    def job(self) -> None:
        fencer = self.gate.fencer()
        self.fencers.append(fencer)
        self.runs.append((self.index, fencer.eval(INCR, keys=[COUNT])))


@pytest.fixture
def runs() -> list[tuple[int, bool]]:
    return []


@pytest.fixture
def replicas(redis_server: RedisServer, runs: list[tuple[int, bool]]) -> Iterator[list[Replica]]:
    made = [Replica(redis_server, i, runs) for i in range(3)]
    yield made
    for replica in made:
        replica.gate.stop(wait=False)
        replica.client.close()


def assert_inert(gate: LeaderGate, server: RedisServer) -> None:
    """A gate that does not lead hands out the inert fencer, as ``Elector.fencer()`` does."""
    fencer = gate.fencer()
    assert not fencer
    assert fencer.token == 0
    assert fencer.set("jobs:inert", "written") is False
    assert not server.client().exists("jobs:inert")  # rejected: nothing reached Redis


def runners(runs: list[tuple[int, bool]]) -> set[int]:
    return {index for index, _ in runs}


def leader_of(replicas: list[Replica]) -> Replica:
    return wait_until(
        lambda: next((r for r in replicas if r.gate.is_leader()), None), 10, what="a leader"
    )


def test_of_three_schedulers_exactly_one_runs_the_job_and_its_writes_are_fenced(
    replicas: list[Replica], runs: list[tuple[int, bool]], redis_server: RedisServer
) -> None:
    for replica in replicas:
        replica.gate.start()
    leader = leader_of(replicas)
    wait_until(lambda: len(runs) >= 10, 10, what="ten job runs")
    time.sleep(0.3)
    assert runners(runs) == {leader.index}
    assert all(applied for _, applied in runs)
    assert int(redis_server.client().get(COUNT) or 0) == sum(applied for _, applied in runs)
    for replica in replicas:
        expected = STATE_RUNNING if replica is leader else STATE_PAUSED
        assert replica.scheduler.state == expected
    for follower in (r for r in replicas if r is not leader):
        assert_inert(follower.gate, redis_server)


def test_a_stopped_leader_shuts_its_scheduler_down_and_another_takes_over(
    replicas: list[Replica], runs: list[tuple[int, bool]], redis_server: RedisServer
) -> None:
    for replica in replicas:
        replica.gate.start()
    first = leader_of(replicas)
    wait_until(lambda: len(runs) >= 3, 10, what="the first runs")
    old = first.fencers[-1]
    first.gate.stop()
    assert first.scheduler.state == STATE_STOPPED
    stopped_at = len(runs)
    second = leader_of([r for r in replicas if r is not first])
    wait_until(lambda: any(i == second.index for i, _ in runs[stopped_at:]), 10, what="runs")
    assert runners(runs[stopped_at:]) == {second.index}  # the stopped one runs nothing more
    assert second.fencers[-1].token > old.token
    assert old.eval(INCR, keys=[COUNT]) is False  # the old term's writes are rejected
    assert_inert(first.gate, redis_server)


def test_a_gate_whose_lease_is_taken_pauses_its_scheduler(
    replicas: list[Replica], runs: list[tuple[int, bool]], redis_server: RedisServer
) -> None:
    only = replicas[0]
    only.gate.start()
    wait_until(lambda: len(runs) >= 3, 10, what="the first runs")
    redis_server.client().set(f"{NAME}:leader", "intruder", px=60_000)
    wait_until(lambda: only.scheduler.state == STATE_PAUSED, 5, what="the scheduler to pause")
    time.sleep(0.2)  # a job submitted as the term ended has finished
    count = len(runs)
    time.sleep(0.5)
    assert len(runs) == count
    assert_inert(only.gate, redis_server)
    redis_server.client().delete(f"{NAME}:leader")
    wait_until(lambda: only.scheduler.state == STATE_RUNNING, 5, what="it to resume on re-election")
    wait_until(lambda: len(runs) > count, 5, what="runs again")


def test_a_gate_never_started_hands_out_the_inert_fencer(redis_server: RedisServer) -> None:
    client = redis_server.client(socket_timeout=5)
    gate = LeaderGate(BackgroundScheduler(), client, NAME, ttl=1.0)
    assert_inert(gate, redis_server)
    # The same as its elector's, which does not lead either.
    assert gate.fencer().token == gate.elector.fencer().token == 0
    client.close()


def test_an_asyncio_scheduler_is_gated_too(redis_server: RedisServer) -> None:
    runs: list[bool] = []

    async def scenario() -> None:
        scheduler = AsyncIOScheduler()
        client = redis_server.client(socket_timeout=5)
        gate = LeaderGate(scheduler, client, "aio-scheduler", ttl=1.0)

        async def job() -> None:
            fencer = gate.fencer()
            runs.append(await asyncio.to_thread(fencer.set, "aio:last", "ran"))

        scheduler.add_job(job, "interval", seconds=0.05)
        with gate:
            deadline = time.monotonic() + 10
            while len(runs) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        assert scheduler.state != STATE_RUNNING  # paused at once; shut down on the loop
        await asyncio.sleep(0.05)
        assert scheduler.state == STATE_STOPPED
        client.close()

    asyncio.run(scenario())
    assert len(runs) >= 3 and all(runs)


def test_bad_arguments_are_config_errors_and_misuse_is_refused(redis_server: RedisServer) -> None:
    client = redis_server.client()
    with pytest.raises(redlease.ConfigError, match="must be an APScheduler 3 scheduler"):
        LeaderGate(object(), client, NAME)
    with pytest.raises(redlease.ConfigError, match="ttl"):
        LeaderGate(BackgroundScheduler(), client, NAME, ttl=-1)
    with pytest.raises(redlease.ConfigError, match="empty"):
        LeaderGate(BackgroundScheduler(), client, "")
    running = BackgroundScheduler()
    running.start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            LeaderGate(running, client, NAME).start()
    finally:
        running.shutdown()
    gate = LeaderGate(BackgroundScheduler(), client, NAME)
    gate.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            gate.start()
    finally:
        gate.stop()
    gate.stop()  # twice: nothing to do


def test_a_scheduler_shut_down_behind_the_gate_ends_its_run_and_stop_says_so(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = redis_server.client(socket_timeout=5)
    scheduler = BackgroundScheduler()
    gate = LeaderGate(scheduler, client, NAME, ttl=1.0).start()
    wait_until(gate.is_leader, 10, what="election")
    scheduler.shutdown()  # not through the gate: its term has nothing left to run
    wait_until(lambda: "shut down outside the gate" in caplog.text, 10, what="the warning")
    wait_until(lambda: client.get(f"{NAME}:leader") is None, 10, what="the lease to be given up")
    time.sleep(1.0)  # no new term: the run is over, it does not contend again
    assert client.get(f"{NAME}:leader") is None
    with pytest.raises(SchedulerNotRunningError):
        gate.stop()
    assert not gate.is_leader()
    client.close()


def test_stop_waits_for_a_running_job_before_the_lease_is_released(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(socket_timeout=5)
    scheduler = BackgroundScheduler()
    started, lease_during_job = threading.Event(), []

    def slow_job() -> None:
        started.set()
        time.sleep(0.5)
        lease_during_job.append(client.get(f"{NAME}:leader"))

    scheduler.add_job(slow_job, "interval", seconds=0.05, max_instances=1)
    gate = LeaderGate(scheduler, client, NAME, ttl=1.0).start()
    assert started.wait(10)
    instance: Any = gate.elector.instance_id
    gate.stop()
    assert lease_during_job and lease_during_job[-1] == instance.encode()
    assert client.get(f"{NAME}:leader") is None
    client.close()
