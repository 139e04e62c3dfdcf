"""The "redlease" logger: one record per state change, never one per retry."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import time

import pytest
import redis

import redlease
from helpers import LEADER_KEY, NAME, make_elector, wait_until
from redlease._testing import RedisServer


def records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "redlease" and r.levelno == level and text in r.getMessage()
    ]


def test_library_logger_has_a_null_handler_and_no_level() -> None:
    # In a fresh interpreter: nothing configured but what the library itself did.
    code = (
        "import logging, redlease; lg = logging.getLogger('redlease'); "
        "print([type(h).__name__ for h in lg.handlers], lg.level, "
        "logging.getLogger().handlers)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['NullHandler'] 0 []"


def test_election_and_resignation_are_logged_at_info(
    client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redlease")
    e = make_elector(client, engine, instance_id="inst-a")
    with e:
        # Logged once the run holds the term, so resign() finds it.
        wait_until(lambda: records(caplog, logging.INFO, "elected"), what="the election")
        token = wait_until(e.token, what="the token")
        e.resign()
        wait_until(lambda: records(caplog, logging.INFO, "resigned"), what="the resignation")
    elected = records(caplog, logging.INFO, "elected")[0].getMessage()
    assert f"{NAME!r}" in elected and "inst-a" in elected and f"token {token}" in elected
    resigned = records(caplog, logging.INFO, "resigned")[0].getMessage()
    assert "stepped down" in resigned and f"token {token}" in resigned
    assert not records(caplog, logging.WARNING, "")


def test_lost_lease_is_logged_with_reason_lost(
    client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="redlease")
    e = make_elector(client, engine, acquire_interval=0.05)
    with e:
        token = wait_until(e.token, what="the election")
        client.set(LEADER_KEY, "thief", px=60_000)  # the next renewal answers 0
        wait_until(lambda: records(caplog, logging.INFO, "lost"), what="the lost term")
    lost = records(caplog, logging.INFO, "lost")[0].getMessage()
    assert "stepped down" in lost and f"token {token}" in lost


def test_frozen_server_gives_one_warning_and_one_recovered_line(
    redis_server: RedisServer, client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redlease")
    errors: list[Exception] = []
    observer = redlease.Observer(on_error=errors.append)
    e = make_elector(client, engine, acquire_interval=0.05, observer=observer)
    with e:
        wait_until(e.token, what="the election")
        redis_server.pause()
        try:
            # Renewals time out, the term is lost, acquires fail and back off.
            wait_until(lambda: len(errors) >= 4, timeout=15.0, what="several handled errors")
            time.sleep(0.3)
        finally:
            redis_server.resume()
        wait_until(lambda: records(caplog, logging.INFO, "recovered"), what="the recovery")
        wait_until(e.token, timeout=10.0, what="the election after the outage")
    warnings = records(caplog, logging.WARNING, "")
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "failing" in warnings[0].getMessage()
    assert len(records(caplog, logging.INFO, "recovered")) == 1
    # Every other error of the outage is still there for whoever asks for DEBUG.
    assert len(records(caplog, logging.DEBUG, "failed again")) >= len(errors) - 1 - 1
    assert records(caplog, logging.INFO, "lost")


def test_lock_watchdog_errors_are_one_warning_then_recovered(
    client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redlease")
    locker = redlease.RedisLocker(client, engine=engine)
    held = locker.acquire("job", ttl=3.0, auto_renew=True)
    key = locker.key("job")
    saved = client.dump(key)
    assert saved is not None
    try:
        # The refresh script's HGET now fails with WRONGTYPE: a handled error.
        client.set(key, "not a hash", px=60_000)
        wait_until(lambda: records(caplog, logging.WARNING, "failing"), what="the warning")
        client.restore(key, 3000, saved, replace=True)
        wait_until(lambda: records(caplog, logging.INFO, "recovered"), what="the recovery")
        assert not held.done.is_set()
    finally:
        held.release()
        locker.close()
    warnings = records(caplog, logging.WARNING, "")
    assert len(warnings) == 1 and "lock 'job'" in warnings[0].getMessage()


def test_lost_lock_is_a_warning(
    client: redis.Redis, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="redlease")
    with redlease.RedisLocker(client, engine=engine) as locker:
        held = locker.acquire("job", ttl=1.0, auto_renew=True)
        client.delete(locker.key("job"))
        assert held.done.wait(5.0)
        with pytest.raises(redlease.NotHeld):
            held.release()
    lost = records(caplog, logging.WARNING, "lost")
    assert len(lost) == 1 and "fencing token" in lost[0].getMessage()


def test_a_long_outage_says_still_failing_at_most_every_few_seconds(
    redis_server: RedisServer,
    client: redis.Redis,
    engine: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from redlease import _log

    monkeypatch.setattr(_log, "STILL_FAILING_EVERY", 0.5)  # seconds, for a short test
    caplog.set_level(logging.DEBUG, logger="redlease")
    errors: list[Exception] = []
    e = make_elector(
        client, engine, acquire_interval=0.05, observer=redlease.Observer(on_error=errors.append)
    )
    with e:
        wait_until(e.token, what="the election")
        redis_server.pause()
        try:
            wait_until(
                lambda: records(caplog, logging.WARNING, "still failing"),
                timeout=15.0,
                what="a 'still failing' line",
            )
        finally:
            redis_server.resume()
        wait_until(lambda: records(caplog, logging.INFO, "recovered"), what="the recovery")
    warnings = records(caplog, logging.WARNING, "")
    assert "failing" in warnings[0].getMessage()
    assert all("still failing" in w.getMessage() for w in warnings[1:])
    # Never two in less than the period, however many errors came in between.
    gaps = [b.created - a.created for a, b in itertools.pairwise(warnings)]
    assert all(gap >= 0.45 for gap in gaps), gaps
    assert len(warnings) <= len(errors)
