"""Lease keepers: one contract suite run on both keepers, then the native thread's own cases.

The contract is ``redlease._engine.Keeper``; the ``keepers`` fixture makes
native keepers (``NativeEngine(...).keeper``) and Python keepers
(``PythonEngine(...).keeper``) with the same call, so every contract test
runs once per kind. Renewals are counted at the server (``COUNTED_RENEW``):
the protocol has no counter. Tests about the native thread itself (the GIL,
fork, its own counters, dropping it unclosed) come after, native only.
"""

from __future__ import annotations

import contextlib
import gc
import os
import selectors
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.exceptions as rex

import redlease._engine as engines
from engine_helpers import (
    RENEW,
    Keepers,
    Server,
    command,
    native_ref,
    open_fds,
    thread_ids,
    wait_state,
)
from helpers import gil_call_size, hold_gil, require_native, wait_until
from redlease._engine import ACTIVE, ENDED, IDLE, LOST
from redlease._scripts import Script

# ---------------------------------------------------------------- the contract, on both keepers


def test_state_is_the_engine_constant_in_each_state(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers()
    assert k.state == engines.IDLE
    keepers.start(k)
    assert k.state == engines.ACTIVE
    k.end()
    assert k.state == engines.ENDED
    keepers.start(k, token=8)
    assert k.state == engines.ACTIVE
    rc.delete("lease")
    assert wait_state(k, engines.LOST, 2.0) is not None
    assert k.state == engines.LOST
    assert (engines.IDLE, engines.ACTIVE, engines.LOST, engines.ENDED) == (0, 1, 2, 3)


def test_keeper_renews_past_three_ttls(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(ttl=0.3, interval=0.1)
    assert (k.state, k.token) == (IDLE, 0)
    keepers.start(k, token=11)
    assert (k.state, k.token) == (ACTIVE, 11)
    lowest = 10_000
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        lowest = min(lowest, rc.pttl("lease"))
        time.sleep(0.02)
    assert lowest > 0
    assert (k.state, k.token) == (ACTIVE, 11)
    assert keepers.renewals() >= 5
    assert k.pop_errors() == []


def test_keeper_over_a_unix_socket(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(unix=True)
    keepers.start(k)
    time.sleep(0.5)
    assert k.state == ACTIVE and keepers.renewals() >= 2
    assert rc.pttl("lease") > 0


def test_keeper_is_lost_at_once_when_the_lease_is_gone(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(ttl=1.0, interval=0.1)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 1, 2.0)
    t0 = time.monotonic()
    rc.set("lease", "someone-else")
    seen = wait_state(k, LOST, 2.0)
    assert seen is not None and seen - t0 < 0.6
    assert k.token == 0
    assert rc.get("lease") == b"someone-else"


def test_keeper_is_lost_at_the_deadline_when_the_server_hangs(
    keepers: Keepers, server: Server
) -> None:
    # The lease runs to ttl after the SEND of the last renewal the keeper
    # saw granted. The test cannot see that instant, so it brackets it:
    # `floor` is taken before the keeper has a renewal counted that was sent
    # after it (one renewal in flight at a time: the second one counted
    # after `floor` was sent after the first one's reply, so after `floor`),
    # and every renewal granted was sent before the server stopped. A time
    # taken when the test sees a renewal counted is no such bound: on a
    # loaded host it can come any time after the send (once 0.15 s, the lease
    # then looking lost 0.45 s after it).
    ttl = 0.6
    k = keepers(ttl=ttl, interval=0.15)
    keepers.start(k)
    wait_until(lambda: k.renewals >= 1, 2.0)
    floor = time.monotonic()
    counted = k.renewals
    wait_until(lambda: k.renewals >= counted + 2, 3.0, interval=0.002)
    server.pause()
    paused_at = time.monotonic()
    try:
        seen = wait_state(k, LOST, ttl + 3.0)
        assert seen is not None
        # Never before ttl from the send of its last good renewal, which it
        # also reports (1 ms for the keeper's whole-nanosecond deadline)...
        last_good = k.renewed_at
        assert floor <= last_good <= paused_at
        assert seen - last_good >= ttl - 0.001
        assert seen - floor >= ttl - 0.001
        # ...and at that deadline, not at the next renewal or a round trip's
        # end: the 0.5 s is the test thread's own lateness in seeing it.
        assert seen - paused_at <= ttl + 0.5
        assert k.token == 0
        errors = k.pop_errors()
        assert errors and all(isinstance(e, rex.TimeoutError) for e in errors)
    finally:
        server.resume()


def test_keeper_deadline_counts_from_the_acquire_when_no_renewal_succeeds(
    keepers: Keepers, server: Server
) -> None:
    k = keepers(ttl=0.4, interval=0.1)
    server.kill()
    t0 = time.monotonic()
    k.begin(3, t0)
    seen = wait_state(k, LOST, 3.0)
    assert seen is not None and 0.39 <= seen - t0 <= 0.9
    errors = k.pop_errors()
    assert errors and all(isinstance(e, rex.ConnectionError) for e in errors)
    assert not any(isinstance(e, rex.TimeoutError) for e in errors)


def test_keeper_begun_after_its_deadline_is_lost_without_renewing(
    keepers: Keepers, rc: redis.Redis
) -> None:
    k = keepers(ttl=0.3, interval=0.1)
    rc.set("lease", "me", px=5000)
    k.begin(5, time.monotonic() - 1.0)
    assert wait_state(k, LOST, 1.0) is not None
    assert keepers.renewals() == 0
    assert 0 < rc.pttl("lease") <= 5000


def test_end_clears_the_token_and_stops_renewing(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(ttl=0.3, interval=0.05)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 2, 2.0)
    k.end()
    assert (k.state, k.token) == (ENDED, 0)
    count = keepers.renewals()
    wait_until(lambda: rc.exists("lease") == 0, 2.0)
    assert keepers.renewals() == count
    k.end()
    assert k.state == ENDED


def test_a_renewal_in_flight_cannot_revive_an_ended_term(keepers: Keepers, server: Server) -> None:
    k = keepers(ttl=3.0, interval=0.4)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 1, 2.0)
    server.pause()
    try:
        time.sleep(0.6)  # the next renewal is now stuck in the paused server
        k.end()
    finally:
        server.resume()
    time.sleep(0.5)  # its reply (1: renewed) arrives for a term that is over
    assert (k.state, k.token) == (ENDED, 0)


@pytest.mark.parametrize(
    ("body", "cls"),
    [
        ("return 'yes'", rex.ResponseError),
        ("return redis.call('INCR', KEYS[1])", rex.ResponseError),
    ],
    ids=["a-string", "an-error-reply"],
)
def test_odd_renewal_replies_are_errors_until_the_deadline(
    keepers: Keepers, rc: redis.Redis, body: str, cls: type[Exception]
) -> None:
    rc.set("lease", "not a number")
    k = keepers(script=Script("odd", body), keys=["lease"], args=[], interval=0.05, ttl=0.3)
    t0 = time.monotonic()
    k.begin(1, t0)
    seen = wait_state(k, LOST, 2.0)
    assert seen is not None and seen - t0 >= 0.29
    errors = k.pop_errors()
    # A ResponseError (a reply the renewal cannot give is an UnexpectedReply,
    # a ResponseError subclass), never a loss before the deadline.
    assert errors and all(isinstance(e, cls) for e in errors), errors


def test_a_lost_term_stays_lost_after_end(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers()
    keepers.start(k)
    rc.delete("lease")
    assert wait_state(k, LOST, 2.0) is not None
    k.end()
    assert (k.state, k.token) == (LOST, 0)


def test_a_keeper_serves_term_after_term(keepers: Keepers) -> None:
    k = keepers(ttl=0.3, interval=0.05)
    for token in (1, 2, 3):
        keepers.start(k, token=token)
        wait_until(lambda token=token: keepers.renewals() >= token * 2, 2.0)
        assert (k.state, k.token) == (ACTIVE, token)
        k.end()
        assert k.token == 0


def test_keeper_survives_a_script_flush(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(ttl=0.3, interval=0.05)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 1, 2.0)
    for _ in range(3):
        rc.script_flush()
        count = keepers.renewals()
        wait_until(lambda count=count: keepers.renewals() > count + 1, 2.0)
    assert k.state == ACTIVE
    assert k.pop_errors() == []


def test_wait_wakes_on_notify_and_loss_and_times_out(keepers: Keepers, rc: redis.Redis) -> None:
    k = keepers(ttl=0.5)
    keepers.start(k)
    assert k.wait(0) is True  # begin() is a state change
    assert k.wait(0.05) is False
    k.notify()
    assert k.wait(None) is True
    with selectors.DefaultSelector() as sel:
        sel.register(k.fileno(), selectors.EVENT_READ)
        assert sel.select(0) == []
        rc.delete("lease")
        assert sel.select(2.0) != []
    assert k.wait(0) is True
    assert k.state == LOST


def test_lateness_samples_are_recorded(keepers: Keepers) -> None:
    k = keepers(ttl=0.3, interval=0.02)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 20, 3.0)
    samples = k.lateness()
    assert len(samples) >= 20
    assert all(0 <= s < 0.25 for s in samples)
    assert sorted(samples)[len(samples) // 2] < 0.05


def test_lateness_totals_bucket_every_sample_and_survive_close(keepers: Keepers) -> None:
    k = keepers(ttl=0.3, interval=0.02)
    keepers.start(k)
    # The keeper's own count too: a renewal granted at the server while the
    # term ends below is not counted by a keeper whose term is over.
    wait_until(lambda: keepers.renewals() >= 10 and k.renewals >= 10, 3.0)
    k.end()
    time.sleep(0.05)  # a round trip in flight still records its send
    samples = k.lateness()
    counts, total = k.lateness_totals()
    assert len(counts) == len(engines.LATENESS_BUCKETS) + 1
    assert sum(counts) == len(samples) >= 10
    assert total == pytest.approx(sum(samples), abs=1e-6)
    expected = [0] * len(counts)
    for sample in samples:
        expected[sum(1 for bound in engines.LATENESS_BUCKETS if sample > bound)] += 1
    assert counts == expected
    assert k.renewals >= 10
    k.close()
    assert k.lateness_totals() == (counts, total)  # still readable, never reset


def test_lateness_holds_the_newest_samples_and_counts_every_one(keepers: Keepers) -> None:
    # Past LATENESS_SAMPLES renewals the oldest samples go, one per renewal:
    # what is held slides along, oldest first, while lateness_count() and
    # lateness_totals() count every renewal. Each phase ends the term, so
    # what is read stays still.
    k = keepers(ttl=1.0, interval=0.02)

    def settled() -> tuple[list[float], int, tuple[list[int], float]]:
        k.end()
        time.sleep(0.05)
        return k.lateness(), k.lateness_count(), k.lateness_totals()

    assert (k.lateness(), k.lateness_count()) == ([], 0)
    keepers.start(k)
    wait_until(lambda: k.lateness_count() > engines.LATENESS_SAMPLES + 20, 30.0)
    first, count, (counts, total) = settled()
    held = engines.LATENESS_SAMPLES
    assert held == 128
    assert len(first) == held
    assert count > held and sum(counts) == count

    keepers.start(k, token=8)
    wait_until(lambda: k.lateness_count() >= count + 10, 10.0)
    second, later, (later_counts, later_total) = settled()
    new = later - count
    assert sum(later_counts) == later
    assert 10 <= new < held, "the test thread was held up for seconds"
    assert len(second) == held
    assert second[: held - new] == first[new:]
    # The newest are the renewals since: their lateness is what the totals added.
    assert sum(second[held - new :]) == pytest.approx(later_total - total, abs=1e-6)


def test_begin_validates_its_arguments(keepers: Keepers) -> None:
    k = keepers()
    with pytest.raises(ValueError):
        k.begin(0, time.monotonic())
    assert (k.state, k.token) == (IDLE, 0)
    k.close()
    with pytest.raises(RuntimeError):
        k.begin(1, time.monotonic())


def test_close_joins_the_thread_and_frees_every_fd(keepers: Keepers, rc: redis.Redis) -> None:
    rc.ping()  # the client's own socket is part of the baseline
    # So is the engine, with the renewal thread a native engine shares between
    # all its keepers: only what each keeper adds is counted.
    warm = keepers("warm", ttl=0.3, interval=0.05)
    keepers.start(warm, token=1)
    wait_until(lambda: keepers.renewals("warm") >= 1, 2.0)
    warm.close()
    gc.collect()
    fds, before = open_fds(), thread_ids()
    for i in range(30):
        k = keepers(f"l{i}", ttl=0.3, interval=0.05)
        keepers.start(k, token=1)
        wait_until(lambda i=i: keepers.renewals(f"l{i}") >= 1, 2.0)
        k.close()
        assert (k.state, k.token, k.fileno()) == (ENDED, 0, -1)
        assert k.wait(None) is True
        k.close()
    # A joined thread leaves /proc/self/task a moment after join() returns.
    # Threads are told apart by id, not counted: one of an earlier test that
    # ends meanwhile must not hide one of these that stays.
    wait_until(lambda: not thread_ids() - before, 3.0, what="the joined threads to be gone")
    assert open_fds() == fds


def test_close_wakes_every_waiter_and_frees_the_fds_after_them(
    keepers: Keepers,
) -> None:
    # close() used to signal the eventfd once and close it at once: one
    # waiter consumed the wake-up, the others went back to polling a closed
    # descriptor (forever, for wait(None)), or read from whatever file reused
    # its number.
    for _ in range(5):
        k = keepers()
        keepers.start(k)
        assert k.wait(1.0) is True
        fd = k.fileno()
        returned: list[bool] = []
        waiters = [
            threading.Thread(target=lambda k=k, out=returned: out.append(k.wait(None)), daemon=True)
            for _ in range(4)
        ]
        for t in waiters:
            t.start()
        time.sleep(0.2)
        k.close()
        for t in waiters:
            t.join(3.0)
        assert returned == [True] * 4
        assert k.fileno() == -1
        with pytest.raises(OSError):
            os.fstat(fd)


# ---------------------------------------------------------------- the native thread


def _start(keeper: Any, rc: redis.Redis, token: int = 7, owner: str = "me") -> None:
    """Take the lease the way acquire would, then hand it to a native ``keeper``."""
    t0 = time.monotonic()
    assert rc.set("lease", owner, px=int(keeper.ttl * 1000))
    keeper.begin(token, t0)


def test_native_keeper_counts_its_renewals_and_their_send_time(
    server: Server, rc: redis.Redis, native_keepers: Callable[..., Any]
) -> None:
    k = native_keepers(server, ttl=0.3, interval=0.1)
    assert (k.renewals, k.renewed_at, k.interval, k.ttl, k.closed) == (0, 0.0, 0.1, 0.3, False)
    before = time.monotonic()
    _start(k, rc)
    wait_until(lambda: k.renewals >= 5, 3.0)
    # begin() takes a time.monotonic() value and the thread measures with
    # CLOCK_MONOTONIC: the send time it reports is on time.monotonic()'s clock.
    assert before < k.renewed_at <= time.monotonic()
    k.close()
    assert k.closed


def test_native_loss_comes_one_ttl_after_the_last_good_renewal_was_sent(
    server: Server, rc: redis.Redis, native_keepers: Callable[..., Any]
) -> None:
    ttl = 0.6
    k = native_keepers(server, ttl=ttl, interval=0.15)
    _start(k, rc)
    wait_until(lambda: k.renewals >= 2, 2.0)
    server.pause()
    try:
        seen = wait_state(k, LOST, ttl + 3.0)
        assert seen is not None
        since_last_good = seen - k.renewed_at
        assert ttl - 0.005 <= since_last_good <= ttl + 0.5
        assert k.token == 0
        errors = k.pop_errors()
        assert errors and all(isinstance(e, rex.TimeoutError) for e in errors)
    finally:
        server.resume()


def test_native_keeper_does_not_count_a_late_reply_for_an_ended_term(
    server: Server, rc: redis.Redis, native_keepers: Callable[..., Any]
) -> None:
    k = native_keepers(server, ttl=3.0, interval=0.4)
    _start(k, rc)
    wait_until(lambda: k.renewals >= 1, 2.0)
    server.pause()
    try:
        time.sleep(0.6)  # the next renewal is now stuck in the paused server
        count = k.renewals
        k.end()
    finally:
        server.resume()
    time.sleep(0.5)  # its reply (1: renewed) arrives for a term that is over
    assert (k.state, k.token, k.renewals) == (ENDED, 0, count)


def test_native_keeper_validates_interval_and_ttl(server: Server) -> None:
    native = require_native()
    with pytest.raises(ValueError):
        native.Lease(native.Renewer(server.target()), native_ref(RENEW), ["k"], ["me", 100], 0, 1.0)


def test_keeper_holds_the_lease_while_the_gil_is_held(
    server: Server, rc: redis.Redis, native_keepers: Callable[..., Any]
) -> None:
    k = native_keepers(server, ttl=0.3, interval=0.1)
    _start(k, rc, token=21)
    # One C call that never releases the GIL, calibrated to about 1.5 s.
    n = gil_call_size(1.5)
    monitor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time, redis
            r = redis.Redis(port={server.port}, socket_timeout=5)
            r.ping()
            print("ready", flush=True)
            sys.stdin.readline()
            lowest, end = 10**9, time.monotonic() + 1.2
            while time.monotonic() < end:
                lowest = min(lowest, r.pttl("lease"))
                time.sleep(0.005)
            print(lowest, flush=True)
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert monitor.stdout is not None and monitor.stdin is not None
    try:
        assert monitor.stdout.readline().strip() == "ready"
        before = k.renewals
        monitor.stdin.write("go\n")
        monitor.stdin.flush()
        held = hold_gil(n)
        during = k.renewals - before
        out, _ = monitor.communicate(timeout=30)
    finally:
        if monitor.poll() is None:
            monitor.kill()
    assert held > 0.6  # at least two TTLs without the GIL
    assert (k.state, k.token) == (ACTIVE, 21)
    assert during >= held / 0.1 / 2
    assert int(out.strip()) > 0, "the lease lapsed while the GIL was held"
    assert max(k.lateness()) < 0.3


def test_a_dropped_keeper_stops_its_thread_and_frees_its_fds(
    server: Server, rc: redis.Redis
) -> None:
    native = require_native()
    ref = native_ref(RENEW)
    rc.ping()  # the client's own socket is part of the baseline
    gc.collect()
    fds, before = open_fds(), thread_ids()
    for i in range(10):
        k = native.Lease(native.Renewer(server.target()), ref, [f"d{i}"], ["me", 300], 0.05, 0.3)
        rc.set(f"d{i}", "me", px=300)
        k.begin(1, time.monotonic())
        wait_until(lambda k=k: k.renewals >= 1, 2.0)
        del k
    gc.collect()
    wait_until(lambda: not thread_ids() - before and open_fds() == fds, 3.0)
    wait_until(lambda: rc.exists(*[f"d{i}" for i in range(10)]) == 0, 2.0)


def test_close_aborts_a_renewal_in_flight(
    server: Server, rc: redis.Redis, native_keepers: Callable[..., Any]
) -> None:
    # Native only: close() cancels the thread's round trip through an eventfd.
    # The Python keeper's close() waits for its renewal in flight to end,
    # which its own timeout (at most one interval) bounds.
    k = native_keepers(server, ttl=10.0, interval=1.0)
    _start(k, rc)
    wait_until(lambda: k.renewals >= 1, 2.0)
    server.pause()
    try:
        time.sleep(1.3)  # the second renewal is now waiting on the paused server
        t0 = time.monotonic()
        k.close()
        assert time.monotonic() - t0 < 1.0
    finally:
        server.resume()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_cannot_renew_or_use_the_parents_sockets(
    server: Server, rc: redis.Redis, pool: Any, native_keepers: Callable[..., Any]
) -> None:
    ttl = 0.5
    k = native_keepers(server, ttl=ttl, interval=0.1)
    _start(k, rc, token=9)
    assert command(pool, ["SET", "who", "parent"], 2.0) == b"OK"
    wait_until(lambda: k.renewals >= 1, 2.0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        with contextlib.suppress(BaseException):
            assert k.token == 0 and k.state in (ENDED, IDLE)
            try:
                k.begin(10, time.monotonic())
            except RuntimeError:
                pass
            else:
                raise AssertionError("begin() worked in the child")
            assert k.wait(0) is False
            # The inherited pool opens its own connection in the child.
            assert command(pool, ["CLIENT", "SETNAME", "child"], 2.0) == b"OK"
            assert command(pool, ["GET", "who"], 2.0) == b"parent"
            time.sleep(ttl * 3)
            code = 0
        os._exit(code)
    try:
        assert (k.state, k.token) == (ACTIVE, 9)
        k.end()
        # Nothing renews the lease any more: not the parent (ended), not the child.
        wait_until(lambda: rc.exists("lease") == 0, ttl + 1.0)
        assert k.wait(0) is True
        # The parent's own connection is still in step with its replies.
        for i in range(20):
            assert command(pool, ["ECHO", i], 2.0) == str(i).encode()
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_lose_ends_an_active_term_at_once_and_reports_why(
    keepers: Keepers, rc: redis.Redis
) -> None:
    k = keepers(ttl=5.0, interval=0.05)
    keepers.start(k)
    wait_until(lambda: keepers.renewals() >= 1, 2.0)
    k.lose(redis.exceptions.ConnectionError("the sentinels switched the master"))
    assert (k.state, k.token) == (LOST, 0)
    assert k.wait(1.0), "a loss wakes the waiter"
    errors = k.pop_errors()
    assert [type(e) for e in errors][-1:] == [redis.exceptions.ConnectionError]
    assert "switched the master" in str(errors[-1])
    count = keepers.renewals()
    time.sleep(0.2)
    assert keepers.renewals() == count, "a lost term is not renewed"


def test_lose_leaves_a_term_that_is_not_active_alone(keepers: Keepers) -> None:
    k = keepers(ttl=1.0, interval=0.05)
    k.lose(redis.exceptions.ConnectionError("no term yet"))
    assert k.state != LOST and k.pop_errors() == []
    keepers.start(k)
    k.end()
    k.lose(redis.exceptions.ConnectionError("after the end"))
    assert k.state == ENDED and k.pop_errors() == []
