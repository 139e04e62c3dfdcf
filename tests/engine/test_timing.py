"""One set of timing constants for both engines (``redlease._engine.rules.timing``), and WAIT's
never-0 rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from engine_helpers import KEEPER_KINDS, Server, native_ref, run_batch
from helpers import require_native
from redlease._engine.engines.python import _Pool
from redlease._engine.rules import timing as _timing
from redlease._engine.rules.replication import ReplicationGuard
from redlease._scripts import Script

# Every constant the native engine keeps in a C global of its own.
NATIVE_NAMES = (
    "RENEW_BATCH_WINDOW",
    "RENEW_RETRY_FLOOR",
    "NOTICE_READ_SLICE",
    "NOTICE_PING_AFTER",
    "NOTICE_DEAD_AFTER",
    "NOTICE_IDLE_CLOSE",
    "NOTICE_UNSUBSCRIBE_DELAY",
    "NOTICE_BACKOFF_MIN",
    "NOTICE_BACKOFF_MAX",
    "NOTICE_CONNECT_TIMEOUT",
    "MAX_TTL",
    "RESEND_PAUSE",
)

INCR = Script("incr", "return redis.call('INCR', KEYS[1])")


def test_the_native_engine_holds_the_timing_module_s_values() -> None:
    held = require_native().native_timing()
    assert held == {name: _timing.ns(getattr(_timing, name)) for name in NATIVE_NAMES}
    assert all(value > 0 for value in held.values()), held


def test_notice_backoff_doubles_to_its_cap_and_starts_over_after_a_long_session() -> None:
    pause, following = _timing.notice_backoff(_timing.NOTICE_BACKOFF_MIN, None)
    assert (pause, following) == (_timing.NOTICE_BACKOFF_MIN, 2 * _timing.NOTICE_BACKOFF_MIN)
    assert _timing.notice_backoff(_timing.NOTICE_BACKOFF_MAX, 0.5)[1] == _timing.NOTICE_BACKOFF_MAX
    pause, following = _timing.notice_backoff(_timing.NOTICE_BACKOFF_MAX, _timing.NOTICE_DEAD_AFTER)
    assert (pause, following) == (_timing.NOTICE_BACKOFF_MIN, 2 * _timing.NOTICE_BACKOFF_MIN)


def test_renew_interval_is_a_third_of_the_ttl() -> None:
    assert _timing.renew_interval(3.0) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("seconds", "ms"), [(0.1, 100), (0.3, 300), (0.1001, 101), (0.0004, 1), (1e-9, 1)]
)
def test_wait_timeout_is_whole_ms_rounded_up_and_never_0(seconds: float, ms: int) -> None:
    assert _timing.wait_ms(seconds) == ms
    assert ReplicationGuard(1, seconds).timeout_ms == ms


def test_wait_command_refuses_a_timeout_of_0_and_negative_replicas() -> None:
    assert _timing.wait_command(1, 100) == ("WAIT", 1, 100)
    with pytest.raises(ValueError, match="at least 1 ms"):
        _timing.wait_command(1, 0)
    with pytest.raises(ValueError, match="replicas >= 0"):
        _timing.wait_command(-1, 100)


def _senders(kind: str, server: Server) -> tuple[list[Callable[[int], Any]], Callable[[], None]]:
    """Each way ``kind``'s engine sends a script followed by WAIT 1 <ms>, and a closer."""
    if kind == "native":
        core = require_native()
        pool = core.Pool(server.target(), 2)
        ref = native_ref(INCR)
        return [
            lambda ms: pool.execute_wait(ref, ["k"], [], 2.0, 1, ms),
            lambda ms: run_batch(pool, [(INCR, ["k"], [])], 2.0, 1, ms),
        ], pool.close
    client = server.client()
    py = _Pool(client, 2)
    return [
        lambda ms: py.eval_script((INCR, ["k"], []), 2.0, wait=(1, ms)),
        lambda ms: py.eval_many_wait([(INCR, ["k"], [])], 2.0, 1, ms),
    ], client.close


@pytest.mark.parametrize("kind", KEEPER_KINDS)
def test_a_wait_of_0_ms_is_refused_before_anything_is_sent(
    kind: str, server: Server, rc: redis.Redis
) -> None:
    senders, close = _senders(kind, server)
    try:
        for send in senders:
            with pytest.raises(ValueError, match="at least 1 ms"):
                send(0)
        assert rc.get("k") is None, "the script ran although its WAIT was refused"
        for send in senders:
            # A real WAIT (no replica: it answers 0 once its 1 ms has passed).
            result = send(1)
            assert result[1] == 0
        assert rc.get("k") == b"2"
    finally:
        close()
